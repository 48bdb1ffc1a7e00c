"""The model-error interval (rlhfsim.sim.modelerror, rlhfsim.sim.uncertainty): a phase's record widens that phase
(bias shifts it, k widens a small sample), a serial step is its phases combined, an overlapped one takes the step's
record, the record of a field run leaves its own source out, an overlay's fitted terms are drawn and its misfit added,
and simulate / plan / report show the interval by default on a GPU only."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from rlhfsim.cli import main
from rlhfsim.costs.profile import load_profile
from rlhfsim.scenario import load_scenario
from rlhfsim.sim import modelerror as me
from rlhfsim.sim import uncertainty as U
from rlhfsim.sim.run import simulate_uncertain

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "scenarios" / "baseline.yaml"    # sync PPO on 4 x A100: phases serial, simulates in ~15 ms
Z = me.Z90


def rows(spec: dict[str, tuple[str, float, dict[str, float]]]) -> list[dict]:
    """Residual rows from {run: (source_group, step residual, {phase: residual})}."""
    return [{"run": k, "source_group": g, "step": s, "phases": ph} for k, (g, s, ph) in spec.items()]


def record(bias: float, sigma: float, n: int = 1000) -> me.PhaseError:
    return me.PhaseError(bias, sigma, n, 1.0)


def test_phase_record_bias_spread_and_small_sample_factor():
    r = me.PhaseError.of([-0.2, -0.4, -0.6])
    assert r.bias == pytest.approx(-0.4) and r.sigma == pytest.approx(0.2) and r.n == 3
    # a normal sample's prediction interval: t(0.95, 2) sqrt(1 + 1/3) / z(0.95) (t from the Cornish-Fisher series)
    assert r.k == pytest.approx(2.92 * math.sqrt(4 / 3) / Z, rel=0.015)
    lo, hi = r.factors()
    assert lo == pytest.approx(math.exp(0.4 - Z * r.k * 0.2)) and hi == pytest.approx(math.exp(0.4 + Z * r.k * 0.2))
    assert me.t95(24) == pytest.approx(1.7109, abs=1e-3) and me.t95(4) == pytest.approx(2.1318, abs=2e-3)


def test_record_of_residuals_leaves_a_source_out_and_pools_rho():
    res = rows({"a": ("s1", -0.1, {"generate": -0.5, "actor_train": -0.1}),
                "b": ("s2", -0.3, {"generate": -0.9, "actor_train": -0.3}),
                "c": ("s3", 0.1, {"generate": -0.1, "actor_train": 0.1}),
                "d": ("s3", 0.0, {"generate": -0.3, "actor_train": 0.0}),
                "x": ("bad", -2.0, {"generate": -3.0})})
    err = me.from_residuals(res, "t")
    assert err.runs == ("a", "b", "c", "d", "x") and err.sources == 4
    assert err.phases["generate"].n == 5 and err.phases["actor_train"].n == 4
    loso = me.from_residuals(res, "t", exclude_source="bad")
    assert "x" not in loso.runs and loso.phases["generate"].bias == pytest.approx(-0.45)
    # generate and actor_train move together run by run here: rho near 1, estimated from 4 pairs -> too few (1)
    assert loso.rho == 1.0
    many = rows({f"r{i}": (f"s{i}", 0.0, {"generate": g, "actor_train": a, "reference": -a})
                 for i, (g, a) in enumerate([(-1, -1), (1, 1), (-1, 1), (1, -1), (0.5, 0.5), (-0.5, -0.5)])})
    assert 0.0 <= me.from_residuals(many, "t").rho < 0.5   # uncorrelated and anti-correlated pairs pool low
    assert me.from_residuals(res[:2], "t") is None          # fewer than MIN_RUNS runs: no record


def test_phase_interval_is_shifted_by_the_bias_and_the_point_may_fall_outside():
    err = me.ModelError(record(0.0, 0.1), {"generate": record(-0.7, 0.05)}, 1.0, "t")
    w = me.widen(err, [(10.0, {"generate": 6.0, "actor_train": 4.0})])
    lo, hi = w["phases_s_interval"]["generate"]
    # predicted too fast by e^0.7 on every run: the measured generation lies above the point
    assert lo == pytest.approx(6.0 * math.exp(0.7 - Z * 0.05), rel=0.01) and hi == pytest.approx(6.0 * math.exp(0.7 + Z * 0.05), rel=0.01)
    assert lo > 6.0
    assert w["phase_records"]["actor_train"]["record"] == "step"   # no record of its own: the step's


def test_serial_step_is_its_phases_combined_and_overlapped_takes_the_steps_record():
    err = me.ModelError(record(0.0, 0.3), {"generate": record(-0.5, 0.5), "actor_train": record(0.0, 0.05)}, 1.0, "t")
    gen_bound = me.widen(err, [(10.0, {"generate": 9.0, "actor_train": 1.0})])
    train_bound = me.widen(err, [(10.0, {"generate": 1.0, "actor_train": 9.0})])
    assert gen_bound["step_from"] == train_bound["step_from"] == "phases"
    # rho = 1: every phase moves with one draw, so the step's bounds are the sum of its phases' bounds (the
    # step from 4,096 stratified draws, the phases in closed form)
    for w in (gen_bound, train_bound):
        assert w["step_time_s_interval"][0] == pytest.approx(sum(v[0] for v in w["phases_s_interval"].values()), rel=1e-3)
        assert w["step_time_s_interval"][1] == pytest.approx(sum(v[1] for v in w["phases_s_interval"].values()), rel=1e-3)
    width = lambda w: w["step_time_s_interval"][1] / w["step_time_s_interval"][0]  # noqa: E731
    assert width(gen_bound) > 3 * width(train_bound) > 0   # a generation-bound step carries generation's error
    # independent phases (rho = 0) partly cancel: a narrower step than rho = 1
    indep = me.widen(me.ModelError(err.step, err.phases, 0.0, "t"), [(10.0, {"generate": 5.0, "actor_train": 5.0})])
    assert width(indep) < width(me.widen(err, [(10.0, {"generate": 5.0, "actor_train": 5.0})]))
    # overlapped phases (spans sum past the step): the step's own record
    over = me.widen(err, [(10.0, {"generate": 9.0, "reward": 8.0, "actor_train": 1.0})])
    assert over["step_from"] == "step"
    lo, hi = over["step_time_s_interval"]
    assert math.log(hi / lo) == pytest.approx(2 * Z * 0.3, rel=0.05)


def test_each_pair_of_phases_takes_its_own_correlation_where_enough_runs_measure_it():
    # 6 runs: reference moves with actor_train run by run, generation is unrelated to both; reward is logged by 2
    # runs only, so its pairs are too few (MIN_PAIRS = 5) and take the pooled rho
    g, a = [1, -1, 1, -1, 0.5, -0.5], [1, 1, -1, -1, 0.5, -0.5]
    res = rows({f"r{i}": (f"s{i}", 0.0, {"generate": g[i], "actor_train": a[i], "reference": 2 * a[i],
                                          **({"reward": 0.1 * i} if i < 2 else {})}) for i in range(6)})
    err = me.from_residuals(res, "t")
    # by hand: the mean product of the standardised residuals (sample sd, n - 1) is (n - 1) / n x Pearson's r
    assert err.corr[me.pair_key("reference", "actor_train")] == pytest.approx(5 / 6)
    assert err.corr["actor_train|generate"] == pytest.approx(statistics.fmean(x * y for x, y in zip(g, a)) / (
        statistics.stdev(g) * statistics.stdev(a)))
    assert "generate|reward" not in err.corr and err.correlation("generate", "reward") == err.rho
    assert err.correlation("generate", "generate") == 1.0
    assert err.summary()["correlations"]["actor_train|reference"] == pytest.approx(5 / 6, abs=1e-3)


def test_the_step_draws_its_phases_with_their_pairs_correlations():
    recs = {"generate": record(0.0, 0.3), "actor_train": record(0.0, 0.3)}
    point = [(10.0, {"generate": 5.0, "actor_train": 5.0})]
    width = lambda err: (lambda iv: iv[1] / iv[0])(me.widen(err, point)["step_time_s_interval"])  # noqa: E731
    tied = me.ModelError(record(0.0, 0.3), recs, 1.0, "t")
    measured_apart = me.ModelError(record(0.0, 0.3), recs, 1.0, "t", corr={"actor_train|generate": 0.0})
    independent = me.ModelError(record(0.0, 0.3), recs, 0.0, "t")
    # the pair's own correlation (0) wins over the pooled rho (1): the same draws as rho = 0
    assert width(measured_apart) == pytest.approx(width(independent)) and width(measured_apart) < width(tied)
    # two equal independent halves: the step's log spread is about sigma / sqrt(2) (a sum of log-normals, not of
    # their logs, so not exactly); tied together it is sigma itself
    assert math.log(width(tied)) == pytest.approx(2 * Z * 0.3, rel=0.02)
    assert math.log(width(independent)) == pytest.approx(2 * Z * 0.3 / math.sqrt(2), rel=0.03)
    # pairs measured one at a time need not make a correlation matrix: the nearest one is drawn from
    z = me.correlated(me._normals(3), np.array([[1.0, 1.0, -1.0], [1.0, 1.0, 1.0], [-1.0, 1.0, 1.0]]))
    assert np.all(np.isfinite(z)) and np.allclose(z.std(axis=0), 1.0, atol=0.02)


def test_hindsight_width_is_the_narrowest_window_holding_the_share():
    # by hand: 3 of 4 residuals fit in [0, 0.2] (width e^0.2); all 4 need [0, 1.0]
    assert me.hindsight_width([1.0, 0.0, 0.2, 0.1], 0.75) == pytest.approx(math.exp(0.2))
    assert me.hindsight_width([1.0, 0.0, 0.2, 0.1], 1.0) == pytest.approx(math.exp(1.0))
    assert me.hindsight_width([0.3], 0.9) == 1.0 and me.hindsight_width([], 0.9) is None


def test_old_file_without_residuals_is_read_centred():
    doc = json.loads((ROOT / "rlhfsim" / "profiles" / "model-error" / "field-dev.json").read_text())
    err = me.from_doc({k: v for k, v in doc.items() if k != "residuals"})
    assert err.step.bias == 0.0 and err.step.sigma == doc["step_sigma"] and err.rho == 1.0
    assert set(err.phases) <= set(doc["phase_sigma"])


def field_row(run_id: str, pred: float, meas: float, gen_p: float, gen_m: float) -> dict:
    return {"id": run_id, "gpu": "h100-sxm", "predicted_step_s": pred, "measured_step_s": meas,
            "predicted_phases_s": {"gen": gen_p, "update_actor": pred - gen_p},
            "measured_phases_s": {"gen": gen_m, "update_actor": meas - gen_m}}


def test_loso_coverage_keeps_a_runs_own_source_out_of_its_record():
    # four well-predicted sources and one source predicted 3x too fast: its own interval must not know it
    table = [field_row(f"R{i}", 10.0, 10.0 * (1 + 0.05 * (i % 3 - 1)), 5.0, 5.0 * (1 + 0.05 * (i % 3 - 1)))
             for i in range(8)] + [field_row("BAD", 10.0, 30.0, 5.0, 25.0)]
    groups = {f"R{i}": f"src{i // 2}" for i in range(8)} | {"BAD": "slow"}
    cov = me.loso_coverage(table, groups)
    by = {r["id"]: r for r in cov["rows"]}
    assert not by["BAD"]["inside"] and by["BAD"]["interval_90_s"][1] < 30.0
    assert cov["runs"] == 9 and cov["inside"] == sum(r["inside"] for r in cov["rows"])
    assert cov["median_width"] == pytest.approx(sorted(r["width"] for r in cov["rows"])[4])
    assert set(cov["phase_coverage"]) == {"generate", "actor_train"}
    # records made of some runs only (the dev half's): the others are widened but never widen
    dev = me.loso_coverage(table, groups, record_runs={f"R{i}" for i in range(8)})
    assert dev["runs"] == 9 and {r["id"]: r for r in dev["rows"]}["R0"]["width"] < by["R0"]["width"]
    # the file a writer makes of these rows reads back as the same record
    doc = me.model_error_doc(table, groups, "t", "leave-one-source-out", "2026-12-07")
    back = me.from_doc(json.loads(json.dumps(doc)))
    assert back.runs == tuple(groups) and back.sources == 5 and "leave-one-source-out" in back.source
    assert doc["residuals"][-1]["phases"]["generate"] == pytest.approx(math.log(5 / 25), abs=1e-5)


@pytest.fixture()
def synthetic_error(tmp_path, monkeypatch):
    """A leave-one-source-out file in place of the bundled one: generation 2x too fast (bias -ln 2, sigma 0.1),
    training well predicted (sigma 0.05)."""
    res = rows({f"r{i}": (f"s{i}", -0.3 + 0.02 * (i % 3 - 1),
                          {"generate": -math.log(2) + 0.1 * (i % 3 - 1), "actor_train": 0.05 * (i % 3 - 1)})
                for i in range(30)})
    d = tmp_path / "model-error"
    d.mkdir()
    (d / "field-loso.json").write_text(json.dumps({"source": "synthetic", "method": "leave-one-source-out",
                                                   "date": "2026-12-07", "runs": [r["run"] for r in res],
                                                   "step_sigma": 0.3, "phase_sigma": {}, "residuals": res}))
    monkeypatch.setattr(U, "MODEL_ERROR_DIR", d)
    return me.from_residuals(res, "synthetic")


def test_gpu_default_profile_is_analytic_and_labelled_by_what_it_rests_on(synthetic_error):
    sc = load_scenario(BASELINE)
    base, unc = simulate_uncertain(sc, steps=3)
    # nothing is drawn on the datasheet default profile (every operation held): no re-simulation, and the label
    # says field error, never "measured"
    assert unc["draws"] == 0 and unc["source"] == "field error" and unc["ops_by_source"]["held"]
    assert "measured" not in unc["source"] and "leave-one-source-out" in unc["note"]
    gen = base.summary["phases_s"]["generate"]
    lo, hi = unc["phases_s_interval"]["generate"]
    k = synthetic_error.phases["generate"].k * synthetic_error.phases["generate"].sigma
    assert lo == pytest.approx(gen * 2 * math.exp(-Z * k), rel=0.02) and hi == pytest.approx(gen * 2 * math.exp(Z * k), rel=0.02)
    assert unc["model_error"]["step_from"] == "phases" and not unc["point_inside"]   # generation 2x: above the point
    # a CPU prediction carries no model error and draws its parameters (the prior here) as before
    cpu_base, cpu = simulate_uncertain(load_scenario(ROOT / "tests" / "fixtures" / "tiny.yaml"), draws=4)
    assert cpu["model_error"] is None and cpu["draws"] == 4 and cpu["source"] in ("prior", "measured+prior")


def overlay(tmp_path: Path, with_spread: bool) -> Path:
    """A from-run overlay over the default profile: one fitted term (the engine's host time per decode step) with
    its intervals, and one run whose gen and update_actor the fit matched within 10% and 5%."""
    prof = load_profile("default")
    base_val = prof["operations"]["decode:vllm"]["overhead_s"]
    fit = {"terms": [{"term": "engine_host_s", "path": "operations.decode:vllm.overhead_s", "base": base_val,
                      "fitted": 0.01, "interval": [0.0095, 0.0105], "interval_misfit": [0.006, 0.014],
                      "at_bound": False}],
           "runs": [{"id": "pilot", "measured_s": {"timing_s/gen": 10.0, "timing_s/update_actor": 5.0,
                                                   "timing_s/step": 15.0},
                     "fitted_s": {"timing_s/gen": 11.0, "timing_s/update_actor": 4.75, "timing_s/step": 15.75}}]}
    if with_spread:
        fit["spread"] = {"paths": ["operations.decode:vllm.overhead_s"], "kinds": ["seconds"], "scales": [2e-3],
                         "x": [5.0], "frames": [1.0], "lower": [0.0], "upper": [None],
                         "cov_bootstrap": [[0.01]], "cov_misfit": [[1.0]]}
    path = tmp_path / "overlay.json"
    path.write_text(json.dumps({"schema_version": prof["schema_version"], "name": "pilot", "gpu": "a100-80gb",
                                "extends": "default", "provenance": {"source": "fitted-from-run"},
                                "operations": {"decode:vllm": {"overhead_s": 0.01, "source": "fitted-from-run",
                                                          "samples": None, "covariance": None}},
                                "from_run": fit}))
    return path


@pytest.mark.parametrize("with_spread", [False, True])
def test_overlay_draws_its_fitted_terms_and_adds_its_misfit(tmp_path, synthetic_error, with_spread):
    sc = load_scenario(BASELINE)
    base, unc = simulate_uncertain(sc, profile=str(overlay(tmp_path, with_spread)), steps=3, draws=6)
    assert unc["draws"] == 6 and unc["ops_by_source"]["fit"] == ["operations.decode:vllm.overhead_s"]
    assert unc["source"] == "fit misfit+fitted terms" and "prior" not in unc["source"]
    draws = unc["step_time_s_draws"]
    assert len(set(draws)) == 6   # the fitted term moves the step: no two draws alike
    # the misfit: s^2 = RSS / (N - k) over the run's two logged phases and one fitted term
    s = math.sqrt((math.log(1.1) ** 2 + math.log(0.95) ** 2) / (2 - 1))
    rec = unc["model_error"]["phase_records"]
    assert rec["generate"]["sigma"] == pytest.approx(s, abs=1e-4) and rec["generate"]["bias"] == 0.0
    assert rec["actor_train"]["sigma"] == pytest.approx(s, abs=1e-4)
    assert rec["reference"]["sigma"] == pytest.approx(synthetic_error.phases.get("reference", synthetic_error.step).sigma, abs=1e-4)
    lo, hi = unc["step_time_s_interval"]
    plo, phi = unc["parameter_step_time_s_interval"]
    assert lo < plo <= phi < hi   # the misfit widens what the terms' draws give


def test_spread_draws_follow_the_fits_joint_spread_and_bounds():
    spread = {"paths": ["a.eff", "b.s", "c.held"], "kinds": ["eff", "seconds", "eff"], "scales": [1.0, 1e-3, 1.0],
              "x": [math.log(0.5), 2.0, math.log(1.0)], "frames": [0.8, 1.0, 1.0],
              "lower": [math.log(1e-3), 0.0, math.log(1e-3)], "upper": [0.0, None, 0.0],
              "cov_bootstrap": [[0.01, 0, 0], [0, 0.5, 0], [0, 0, 0]], "cov_misfit": [[0.03, 0, 0], [0, 3.5, 0], [0, 0, 0]]}
    d = U.term_draws({"spread": spread}, 4000, np.random.default_rng(0))
    assert set(d) == {"a.eff", "b.s"}   # no spread: held
    a = np.log(np.asarray(d["a.eff"]) / 0.8)
    assert np.median(a) == pytest.approx(math.log(0.5), abs=0.02) and np.std(a) == pytest.approx(0.2, rel=0.1)
    assert min(d["b.s"]) == 0.0 and np.median(d["b.s"]) == pytest.approx(2e-3, rel=0.1)   # clipped at 0, scaled


def test_cli_shows_the_interval_on_a_gpu_by_default_and_not_on_a_cpu(synthetic_error):
    run = CliRunner()
    doc = json.loads(run.invoke(main, ["simulate", str(BASELINE), "--steps", "3", "--format", "json"]).output)
    assert doc["step_time_s_interval"][0] < doc["step_time_s_interval"][1] and doc["uncertainty"]["draws"] == 0
    off = json.loads(run.invoke(main, ["simulate", str(BASELINE), "--steps", "3", "--no-uncertainty", "--format", "json"]).output)
    assert "step_time_s_interval" not in off and off["step_time_s"] == doc["step_time_s"]
    text = run.invoke(main, ["simulate", str(BASELINE), "--steps", "3"]).output
    assert "90% interval" in text and "the model's own error" in text
    cpu = json.loads(run.invoke(main, ["simulate", str(ROOT / "tests" / "fixtures" / "tiny.yaml"), "--format", "json"]).output)
    assert "step_time_s_interval" not in cpu


def test_plan_rows_carry_the_interval_and_the_report_shows_it(tmp_path, synthetic_error):
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"name: iv\nbase: {ROOT / 'tests' / 'fixtures' / 'plan_base_tiny.yaml'}\n"
                    "axes:\n  generation.max_batch: [2, 4]\n")
    run = CliRunner()
    res = run.invoke(main, ["plan", str(plan), "--workers", "1", "-o", str(tmp_path / "p"), "--format", "json"])
    assert res.exit_code == 0, res.output
    best = json.loads(res.output)["best"]
    assert best["step_time_lo_s"] < best["step_time_hi_s"] and best["step_time_lo_s"] > 0
    assert "step_time_lo_s" in (tmp_path / "p" / "results.csv").read_text().splitlines()[0]
    res = run.invoke(main, ["report", str(tmp_path / "p"), "-o", str(tmp_path / "p.html")])
    assert res.exit_code == 0, res.output
    assert "step time 90% interval" in (tmp_path / "p.html").read_text()
    res = run.invoke(main, ["plan", str(plan), "--workers", "1", "-o", str(tmp_path / "q"), "--format", "json",
                            "--no-uncertainty"])
    assert json.loads(res.output)["best"]["step_time_lo_s"] is None


def test_openrlhf_overlay_misfit_covers_each_timers_phases(synthetic_error):
    fit = {"terms": [{"term": "engine_host_s", "at_bound": False}],
           "runs": [{"id": "o", "framework": "openrlhf",
                     "measured_s": {"timing/generation": 10.0, "timing/make_experience": 4.0, "timing/ppo_train": 6.0,
                                    "timing_s/step": 20.0},
                     "fitted_s": {"timing/generation": 10.5, "timing/make_experience": 3.8, "timing/ppo_train": 6.0,
                                  "timing_s/step": 20.3}}]}
    err = U.overlay_error(fit, synthetic_error)
    s = math.sqrt((math.log(1.05) ** 2 + math.log(0.95) ** 2) / (3 - 1))
    for p in ("generate", "reward", "reference", "critic_fwd", "actor_train", "critic_train"):
        assert err.record(p)[1].sigma == pytest.approx(s)
    assert err.record("weight_sync")[1] is synthetic_error.record("weight_sync")[1]   # timing/broadcast not logged
    # as many logged timers as fitted terms: the misfit is unmeasured, the field record widens every phase
    fit["terms"] *= 3
    assert U.overlay_error(fit, synthetic_error).phases == synthetic_error.phases


def test_field_table_rows_from_an_earlier_run_gives_the_coverage_without_refitting(tmp_path, monkeypatch, capsys):
    import importlib.util

    script = ROOT / "scenarios" / "examples" / "field" / "field_table.py"
    spec = importlib.util.spec_from_file_location("field_table", script)
    ft = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ft)
    # five dev runs of five sources and one test run, predictions made up: the coverage is computed from these rows
    made = [("F5", "dev", 10.0, 11.0), ("F9", "dev", 10.0, 9.0), ("J1", "dev", 10.0, 10.5), ("C1", "dev", 10.0, 12.0),
            ("F1", "dev", 10.0, 9.5), ("A1", "test", 10.0, 30.0)]
    rows_ = [{**field_row(i, p, m, p / 2, m / 2), "half": h} for i, h, p, m in made]
    path = tmp_path / "loso.json"
    path.write_text(json.dumps({"rows": rows_, "summary": {}, "folds": [], "options": {}}))
    monkeypatch.setattr("sys.argv", ["field_table.py", "--loso", "--rows-from", str(path), "--json"])
    ft.main()
    cov = json.loads(capsys.readouterr().out)["coverage"]
    by = {r["id"]: r for r in cov["rows"]}
    assert set(by) == {i for i, *_ in made} and not by["A1"]["inside"]     # 3x too fast: no record says so
    assert cov["test"]["hindsight_width"]["90%"] == 1.0 and cov["dev"]["inside"] == sum(
        by[i]["inside"] for i, h, *_ in made if h == "dev")
    monkeypatch.setattr("sys.argv", ["field_table.py", "--loso", "--rows-from", str(tmp_path / "none.json")])
    with pytest.raises(SystemExit) as bad:
        ft.main()
    err = capsys.readouterr().err
    assert bad.value.code == 2 and err.startswith("--rows-from: expected") and len(err.splitlines()) == 1

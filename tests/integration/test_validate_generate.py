"""`rlhfsim validate --generate N --seed S` end to end on N=1 drawn from tiny ranges (seconds), and the
one-line errors of bad --generate values. No timing thresholds: a smoke test of the mechanism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "validate" / "generate-tiny-ranges.json"
# the quick CPU grid's host cost terms at their smallest, page faults off (tests/integration/test_validate.py)
TINY_HOST_TERMS = json.loads((TINY.parent / "tiny-host-terms.json").read_text())


def test_generate_one_writes_the_set_and_reports_errors_per_scenario_and_phase(tmp_path):
    out = tmp_path / "gen"
    r = subprocess.run([sys.executable, "-m", "rlhfsim.cli", "validate", "--generate", "1", "--seed", "3",
                        "--ranges", str(TINY), "--out", str(out), "--steps", "2", "--threads", "1",
                        "--profile", "cpu", "--format", "json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "seed 3" in r.stderr and "--generate 1 --seed 3 --ranges" in r.stderr
    meta = json.loads((out / "generated.json").read_text())
    assert meta["seed"] == 3 and meta["n"] == 1 and meta["ranges"]["layers"] == {"range": [1, 2]}
    assert meta["ranges"]["engine"]["choices"] == ["static", "continuous"]   # untouched entries as documented
    (name,) = meta["scenarios"]
    assert (out / name).is_file() and all((out / m).is_file() for m in meta["models"])
    doc = json.loads(r.stdout)
    assert doc["profile"] == "cpu" and doc["generated"]["seed"] == 3 and doc["generated"]["ranges"] == meta["ranges"]
    assert doc["steps_run"] == "sequential"   # a drawn scenario stands for a job running alone
    assert doc["scenarios"][0]["visits"] == 1  # nothing calibrated here: one block, one visit
    assert "generic_profile" not in doc       # --profile cpu: nothing calibrated
    (s,) = doc["scenarios"]
    assert s["name"] == Path(name).stem and s["profile"] == "cpu"
    assert doc["median_abs_error_pct"] == doc["max_abs_error_pct"] == pytest.approx(abs(s["error_pct"]))
    assert {"generate", "actor_train", "weight_sync"} <= set(s["phases"]) and "generation_ops" in s
    # one scenario after another: its own device check, from the probes just before and after its steps
    assert {"gemm", "gemv_2MiB"} <= set(s["device_ratios"]) and all(v > 0 for v in s["device_ratios"].values())
    assert set(doc["phase_median_abs_error_pct"]) <= set(s["phases"])
    saved = json.loads((out / "validation.json").read_text())
    assert saved["scenarios"][0]["error_pct"] == s["error_pct"] and saved["generated"]["seed"] == 3


@pytest.mark.parametrize("args, where", [
    (["--generate", "0"], "--generate"),
    (["--generate", "abc"], "--generate"),
    (["--generate", "101"], "--generate"),
    (["--generate", "2", "--seed", "-1"], "--seed"),
    (["--generate", "2", "--scenario", "x.yaml"], "--generate"),
    (["--generate", "1", "--device", "cuda"], "--device"),
    (["--seed", "4", "--scenario", "x.yaml"], "--seed"),
    (["--generate", "1", "--sequential", "--round-robin"], "--round-robin"),
    (["--generate", "1", "--round-robin", "--visits", "2"], "--visits"),
    (["--generate", "1", "--visits", "0"], "--visits"),
    (["--generate", "1", "--visits", "two"], "--visits"),
    (["--scenario", "x.yaml", "--framework", "trl", "--visits", "2"], "--visits"),
    ([], "--scenario"),
])
def test_bad_generate_values_are_one_line_exit_2(args, where, tmp_path):
    r = subprocess.run([sys.executable, "-m", "rlhfsim.cli", "validate", *args], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "RLHFSIM_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and where in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "validate" / "generated").exists() or not any((tmp_path / "validate" / "generated").iterdir())


def test_lean_calibration_of_new_shapes_keeps_every_operating_point_and_measures_roles(tmp_path):
    from calibrate.running.grid import QUICK_CPU
    from calibrate.validation.calibration import is_new_shape, operating_points
    from calibrate.validation.scenario import prepare
    from rlhfsim.models.catalog import CATALOG
    from rlhfsim.validate_gen import draw, write_set

    paths = write_set(draw(6, 21, tmp_path), tmp_path)
    prepared = [prepare(p, "cpu", 3, 1) for p in paths]
    assert all(is_new_shape(s) for _, setup, _, _ in prepared for s in setup.shapes.values())
    assert not is_new_shape(CATALOG["small-qwen2"])
    full, lean = operating_points(prepared, "cpu"), operating_points(prepared, "cpu", lean=True)
    for k in ("prefill", "decode", "score", "train"):
        own = set(map(tuple, full[k])) - set(getattr(QUICK_CPU, k))   # the scenarios' operating points
        assert own <= set(map(tuple, lean[k])), k
        assert len(lean[k]) <= len(own) + 3 and len(lean[k]) < len(full[k]), k
    actors = {setup.shapes[r].name for _, setup, _, _ in prepared for r in ("actor", "reference")}
    rewards = {setup.shapes["reward"].name for _, setup, _, _ in prepared if "reward" in setup.shapes}
    assert set(lean["actor_models"]) == actors
    assert not (rewards - actors) & set(lean["actor_models"])   # reward-only shapes: scoring only
    streamed = {sc.schedule.intra.chunk_tokens for sc, _, _, _ in prepared
                if sc.schedule.kind == "oppo" and sc.schedule.intra.enabled and sc.models.reward.kind == "model"}
    assert set(lean["chunk_sizes"]) == (streamed or {min(QUICK_CPU.chunk_sizes)})
    # the measured cost terms, leanly: each actor's own sampling point, two matrices, the trained widths
    assert {(sc.generation.max_batch, setup.shapes["actor"].vocab) for sc, setup, _, _ in prepared} <= set(lean["sampling"])
    assert len(lean["sampling"]) < len(QUICK_CPU.sampling) + len(prepared) and len(lean["gemm"]) == 4
    trained = {setup.shapes[r].hidden for _, setup, _, _ in prepared for r in ("actor", "critic") if r in setup.shapes}
    assert trained <= set(lean["widths"]) and min(QUICK_CPU.widths) in lean["widths"]


def test_a_role_restricted_calibration_measures_what_it_plans(tmp_path):
    from calibrate.running.journal import journal_path, read_journal
    from calibrate.running.run import run_calibration
    from rlhfsim.models.catalog import CATALOG

    grid = {"score": [[1, 16]], "strategies": [[2, 16]], "prefill": [[1, 16], [2, 16]], "decode": [[1, 16], [2, 16]],
            "chunk_batches": [1], "chunk_prefixes": [0], "chunk_sizes": [8], "train": [[1, 16]],
            "interference": [[1, 16, 1, 8]], "interference_s": 0.05, "point_budget_s": 0.01, "max_iters": 3,
            "gen_runtimes": [], "step_iters": 0, "actor_models": ["tiny-qwen2"], "critic_models": ["tiny-qwen2"],
            **TINY_HOST_TERMS}
    reward = CATALOG["small-qwen2"]
    out = tmp_path / "p.json"
    prof = run_calibration("cpu", models=[CATALOG["tiny-qwen2"], reward], runtimes=["eager"], out=out,
                           progress=False, grid=grid, threads=1, cache_dir=tmp_path / "c")
    pts = [r for r in read_journal(journal_path(out)) if r.get("kind") == "point"]
    by_model = {(r["op"], r["model"]) for r in pts}
    assert ("prefill", "tiny-qwen2") in by_model and ("train", "tiny-qwen2") in by_model
    assert {op for op, m in by_model if m == reward.name} <= {"score", "chunk_prefill"}
    assert prof["operations"]["prefill"]["n_points"] == 2


def test_new_shapes_are_calibrated_per_scenario_and_both_profiles_predict_the_same_steps(tmp_path, monkeypatch):
    import calibrate.validation.calibration as C
    import calibrate.validation.run as V
    from rlhfsim.validate_gen import draw, write_set

    monkeypatch.setenv("RLHFSIM_CACHE_DIR", str(tmp_path / "cache"))
    tiny = {"score": [[1, 16], [2, 32]], "prefill": [[1, 16], [2, 32]], "decode": [[1, 16], [2, 32]],
            "train": [[1, 16], [2, 32]], "passes": 1, "point_budget_s": 0.01, "gen_runtimes": [],
            "strategies": [[2, 32]], "chunk_batches": [1], "chunk_prefixes": [0], "chunk_sizes": [8],
            "interference": [[2, 16, 1, 8]], "runtime_score": [[1, 16]], "interference_s": 0.05, "step_iters": 0,
            **TINY_HOST_TERMS}
    monkeypatch.setattr(C, "operating_points", lambda prepared, kind, lean=False: tiny)
    ranges = json.loads(TINY.read_text())
    paths = write_set(draw(2, 8, tmp_path / "gen", ranges), tmp_path / "gen", ranges)
    doc = V.validate(paths, "cpu", "cpu,quick", 2, threads=1, progress=False)
    assert doc["profile"] == "cpu" and [b["profile"] for b in doc["other_profiles"]] == ["quick"]
    (quick,) = doc["other_profiles"]
    own = [s["profile"] for s in quick["scenarios"]]
    assert len(set(own)) == 2 and all(Path(p).is_file() for p in own)   # one calibration per scenario
    for blind, cal in zip(doc["scenarios"], quick["scenarios"]):
        assert blind["measured_step_time_s"] == cal["measured_step_time_s"]   # the same measured steps


def test_generic_profile_is_measured_in_passes_around_the_steps_and_predicts_them(tmp_path, monkeypatch):
    """``--profile generic``: a quick generic calibration of this CPU (here on a tiny grid, one catalog
    decoder) is measured in passes alternating with the steps, extended with the hand-over pattern of its
    decoders, and predicts the steps; the document names its path."""
    import calibrate.validation.run as V
    from rlhfsim.costs.profile import load_profile
    from rlhfsim.models.catalog import CATALOG

    grid = {k: v for k, v in json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "validate"
                                         / "tiny-generic-grid.json").read_text()).items()}
    real = V.measure_generic

    def tiny(device, threads, out, progress=True, **kw):
        return real(device, threads, out, progress, models=[CATALOG["tiny-qwen2"]], grid=grid, handover=(2, 8, 4),
                    **{**kw, "runtimes": ["eager"]})

    monkeypatch.setattr(V, "measure_generic", tiny)
    fix = Path(__file__).resolve().parents[1] / "fixtures" / "validate"
    doc = V.validate([fix / "tiny-sync.yaml"], "cpu", "generic,cpu", 2, threads=1, progress=False, sequential=True,
                     generic_out=tmp_path / "generic-profile.json")
    path = tmp_path / "generic-profile.json"
    prof = load_profile(str(path))
    assert prof["name"] == "generic" and "kv_decoder" in prof["interference"]["handover"]
    # measured in GENERIC_PASSES passes (the scenario's steps between two of them), samples pooled, and the
    # device state probes of every pass kept for the device check
    assert {p.get("passes") for p in prof["points"] if p["op"] == "prefill"} == {V.GENERIC_PASSES}
    assert len(prof["device"]["state_probes"]) == 2 * V.GENERIC_PASSES
    assert {p["model"] for p in prof["points"] if p["op"] in ("prefill", "decode", "train")} == {"tiny-qwen2"}
    assert doc["profile"] == "generic" and doc["generic_profile"] == str(path)
    assert doc["other_profiles"][0]["profile"] == "cpu"
    assert doc["steps_run"] == "sequential" and doc["scenarios"][0]["predicted_step_time_s"] > 0
    assert [c["profile"] for c in doc["device_check"]["profiles"]][0] == "generic"
    # each profile's own per-scenario check; the generic profile has the dispatch probe (version 2)
    assert "dispatch" in doc["scenarios"][0]["device_ratios"]
    assert "gemm" in doc["other_profiles"][0]["scenarios"][0]["device_ratios"]
    # one visit per block (the scenario ran before, between and after the passes), every visit's steps pooled
    s = doc["scenarios"][0]
    assert s["visits"] == V.GENERIC_PASSES + 1 == len(s["measured_step_time_s_visits"]) == len(s["error_pct_visits"])
    assert s["measured_step_time_s"] == pytest.approx(sum(s["measured_step_time_s_visits"]) / s["visits"])
    assert s["checks"]["visits_trained_the_same_ids"] is True
    for t, e in zip(s["measured_step_time_s_visits"], s["error_pct_visits"]):
        assert e == pytest.approx(100 * (s["predicted_step_time_s"] - t) / t)


def test_generate_defaults_to_a_generic_profile_measured_now_and_the_bundled_one():
    from calibrate.validation.calibration import GENERIC, profile_list
    from calibrate.validation.generated import BLIND_PROFILE

    assert profile_list(BLIND_PROFILE) == [GENERIC, "cpu"]


def test_generic_profile_needs_a_cpu(tmp_path):
    from calibrate.validation.calibration import measure_generic

    with pytest.raises(Exception, match="--profile generic: expected --device cpu"):
        measure_generic("cuda", 1, tmp_path / "g.json", False)


def test_steps_blocks_around_calibration_passes():
    """One scenario after another: P calibration passes sit between P + 1 blocks of whole scenarios, one
    block before the first pass and one after the last, every scenario once, in order."""
    from calibrate.validation.run import step_blocks

    assert [list(b) for b in step_blocks(10, 3)] == [[0, 1], [2, 3, 4], [5, 6, 7], [8, 9]]
    # with visits: every (scenario, visit) once, visit-major; one visit per block puts every scenario in every block
    from calibrate.validation.run import visit_blocks

    assert visit_blocks(3, 4, 3) == [[(0, v), (1, v), (2, v)] for v in range(4)]
    assert visit_blocks(10, 1, 3) == [[(j, 0) for j in b] for b in step_blocks(10, 3)]
    assert visit_blocks(3, 2, 0) == [[(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]]
    for n in range(1, 6):
        for v in range(1, 5):
            for p in range(0, 4):
                runs = [r for b in visit_blocks(n, v, p) for r in b]
                assert sorted(runs) == sorted((j, k) for j in range(n) for k in range(v))
                assert all(runs.index((j, k)) < runs.index((j, k + 1)) for j in range(n) for k in range(v - 1))
    assert [list(b) for b in step_blocks(3, 0)] == [[0, 1, 2]]           # nothing measured: one block
    for n in range(1, 12):
        for p in range(0, 4):
            assert [j for b in step_blocks(n, p) for j in b] == list(range(n))

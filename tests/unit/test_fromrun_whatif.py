"""``rlhfsim whatif``: a fitted run with something changed, under the same fitted terms, on play-verl's GRPO run
(F5, its launch and its log as posted, fitted by ``rlhfsim calibrate --from-run``: tests/fixtures/fromrun/
f5-overlay.json, kept so that these tests need no fit): nothing changed gives the fitted numbers; a change of
lengths or cap carries the fitted shape re-derived, with a note; 2x GPUs, 2x responses and another schedule each
get a 90% interval; ``python -m rlhfsim.fromrun.compare`` prices a scenario the same way. (The fit itself, and
that the overlay's own what-if command reproduces the fitted step: tests/unit/test_fromrun_fit.py.)"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rlhfsim.cli import main
from rlhfsim.fromrun.whatif import Change, capped_mean, mu_for_mean, overlay_draws, split_sets, whatif

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "scenarios" / "examples" / "field" / "playverl-h100-qwen2.5-0.5b-grpo.sh"
SETS = ("actor_rollout_ref.rollout.max_num_seqs=1024", "actor_rollout_ref.rollout.enforce_eager=True")
STEP = "timing_s/step"


OVERLAY = ROOT / "tests" / "fixtures" / "fromrun" / "f5-overlay.json"


@pytest.fixture(scope="module")
def overlay():
    return str(OVERLAY)


def rows(doc: dict) -> dict:
    return {r["phase"]: r for r in doc["runs"][0]["rows"]}


def test_sets_are_launch_settings_or_scenario_paths():
    ch = split_sets(["trainer.n_gpus_per_node=16", "schedule.kind=oppo", "algorithm.adv_estimator=gae",
                     "algorithm.group_size=4", "cluster.gpu=h200"])
    assert ch.launch == ("trainer.n_gpus_per_node=16", "algorithm.adv_estimator=gae")
    assert ch.scenario == (("schedule.kind", "oppo"), ("algorithm.group_size", 4), ("cluster.gpu", "h200"))


def test_nothing_changed_is_the_fitted_run_and_a_cap_change_moves_it_with_a_note(overlay):
    rec = json.loads(Path(overlay).read_text())["from_run"]["runs"][0]
    same = whatif(overlay, Change(), draws=0)
    assert all(r["change_pct"] == 0 for r in same["runs"][0]["rows"] if r["change_pct"] is not None)
    assert "the fitted shape carried" in same["runs"][0]["notes"][0]
    # a longer cap: the fitted lognormal cut later, so the mean and generation grow (they did not move before)
    cap = rec["lengths"]["response_cap"]
    longer = whatif(overlay, split_sets([f"data.max_response_length={2 * cap}"]), draws=0)
    shape = rec["lengths"]["response_shape"]
    assert longer["runs"][0]["lengths"]["block"]["median"] == pytest.approx(shape["block"]["median"], abs=0.01)
    assert longer["runs"][0]["lengths"]["mean_response"] > rec["lengths"]["response"] + 1
    assert rows(longer)["timing_s/gen"]["change_pct"] > 0.5
    assert f"cut at the new cap {2 * cap}" in longer["runs"][0]["notes"][0]


def test_a_new_mean_keeps_the_fitted_log_sd():
    sigma, cap = 0.33, 384
    mu = mu_for_mean(282.4, sigma, cap)
    assert capped_mean(mu, sigma, cap) == pytest.approx(282.4, rel=1e-9)


@pytest.mark.parametrize("args", [["--set", "trainer.nnodes=2"],
                                  ["--mean-response-len", "2x", "--set", "data.max_response_length=384"],
                                  ["--set", "schedule.kind=oppo"]])
def test_each_whatif_prints_an_interval(overlay, args):
    r = CliRunner().invoke(main, ["whatif", overlay, *args, "--draws", "6", "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    step = rows(doc)[STEP]
    lo, hi = step["whatif_interval_s"]
    assert lo < hi and lo <= step["whatif_s"] * 1.05 and hi >= step["whatif_s"] * 0.95
    assert doc["draws"] == 6


def test_the_table_names_the_interval_and_the_lengths(overlay):
    text = CliRunner().invoke(main, ["whatif", overlay, "--set", "trainer.nnodes=2", "--draws", "3"]).output
    assert "90% interval" in text and "interval: 3 draws of the fitted terms" in text
    assert "note: response lengths: the fitted shape carried" in text


def test_twice_the_responses_needs_room_under_the_cap_one_line(overlay):
    r = CliRunner().invoke(main, ["whatif", overlay, "--mean-response-len", "2x"])
    assert r.exit_code == 2 and "raise the cap too" in r.output and len(r.output.strip().splitlines()) == 1


def test_draws_scatter_the_fitted_terms_around_their_values(overlay):
    from rlhfsim.costs.profile import load_profile
    from rlhfsim.fromrun import terms as T

    prof = load_profile(overlay)
    draws = overlay_draws(prof, 64, seed=1)
    for t in prof["from_run"]["terms"]:
        vals = [T.get_value(d, t["path"]) for d in draws]
        if t["at_bound"]:
            continue
        assert min(vals) < t["fitted"] < max(vals)
        assert math.isclose(sorted(vals)[32], t["fitted"], rel_tol=0.25)


def test_compare_applies_the_fitted_shape(overlay, tmp_path):
    from rlhfsim.fromrun.compare import side_by_side
    from rlhfsim.importers import ImportOptions, import_verl

    rec = json.loads(Path(overlay).read_text())["from_run"]["runs"][0]
    res = import_verl(LAUNCH.read_text(), ImportOptions(gpu="h100-sxm", mean_response_len=rec["lengths"]["response"],
                                                        mean_prompt_len=rec["lengths"]["prompt"], sets=SETS))
    path = tmp_path / "same.yaml"
    path.write_text(yaml.safe_dump(res.scenario))
    out = side_by_side(overlay, str(path))
    step = next(r for r in out["rows"] if r["phase"] == STEP)
    assert abs(step["change_pct"]) < 0.5 and "the fitted shape carried" in out["notes"][0]


def test_the_interval_carries_the_fits_misfit(overlay):
    """With no draws of the terms the interval is the fit's misfit alone: each timer's span times the misfit
    record's factors (s^2 = RSS / (N - k) over the fit's logged timers), the same record ``simulate --profile
    OVERLAY`` widens with; with draws it is at least as wide as the draws' own spread."""
    from rlhfsim.costs.profile import load_profile
    from rlhfsim.hardware.catalog import get_gpu
    from rlhfsim.sim.uncertainty import model_error

    change = split_sets(["trainer.nnodes=2"])
    alone = whatif(overlay, change, draws=0)
    assert alone["interval_misfit"].startswith("the fit's misfit")
    err = model_error(load_profile(overlay), get_gpu("h100-sxm"))
    lo_f, hi_f = err.record("generate")[1].factors(0.90)
    gen = rows(alone)["timing_s/gen"]
    assert gen["whatif_interval_s"] == pytest.approx([gen["whatif_s"] * lo_f, gen["whatif_s"] * hi_f], rel=1e-9)
    step = rows(alone)[STEP]
    assert step["whatif_interval_s"][0] < step["whatif_s"] < step["whatif_interval_s"][1]
    drawn = whatif(overlay, change, draws=6)
    width = {d: rows(doc)[STEP]["whatif_interval_s"][1] / rows(doc)[STEP]["whatif_interval_s"][0]
             for d, doc in (("alone", alone), ("drawn", drawn))}
    assert width["drawn"] >= width["alone"] * 0.9

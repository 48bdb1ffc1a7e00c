"""Defects of ``rlhfsim calibrate --from-run`` met by a new user (issue 54), each pinned on a real public run
(play-verl's GRPO launch and log, F5 of the field table): a launch that is not UTF-8, a run priced on a GPU of
another software stack, and the spans a verl release timed."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from rlhfsim.cli import main
from rlhfsim.costs.model import CostModel, with_stack_rate
from rlhfsim.costs.profile import load_profile
from rlhfsim.fromrun.fit import RunSpec, predict, prepare, verl_spans
from rlhfsim.fromrun.overlay import overlay_doc
from rlhfsim.hardware.catalog import get_gpu, stack_factor

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "scenarios" / "examples" / "field" / "playverl-h100-qwen2.5-0.5b-grpo.sh"
LOG = ROOT / "scenarios" / "examples" / "fromrun" / "logs" / "verl_grpo_qwen2.5b_8gpu.log.steps.gz"
SETS = ("actor_rollout_ref.rollout.max_num_seqs=1024", "actor_rollout_ref.rollout.enforce_eager=True")


def test_a_launch_that_is_not_utf8_is_read_as_import_reads_it_and_binary_is_one_line(tmp_path):
    latin1 = tmp_path / "latin1.sh"
    latin1.write_bytes(b"# r\xe9sum\xe9 of the run (Latin-1)\n" + LAUNCH.read_bytes())
    run = prepare(RunSpec("F5", latin1, LOG, "h100-sxm", SETS))
    same = prepare(RunSpec("F5", LAUNCH, LOG, "h100-sxm", SETS)).scenario
    assert run.scenario.model_dump(exclude={"description"}) == same.model_dump(exclude={"description"})
    binary = tmp_path / "binary.sh"
    binary.write_bytes(LAUNCH.read_bytes()[:200] + b"\x00\xff\xfe" + LAUNCH.read_bytes()[200:])
    r = CliRunner().invoke(main, ["calibrate", "--from-run", str(binary), str(LOG), "--gpu", "h100-sxm",
                                  "-o", str(tmp_path / "o.json")])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "binary.sh" in r.output and "expected a verl launch as text" in r.output and "Traceback" not in r.output


def test_the_fit_prices_a_run_as_simulate_does_on_a_gpu_of_another_stack(tmp_path):
    """MI300X under ROCm sustains 0.64 of the reference stack's GEMM rate (catalog.SUSTAINED): ``simulate`` scales
    the default profile's efficiencies by it; the fit's base and the overlay must price with the same numbers."""
    from rlhfsim.sim.run import simulate

    mi = get_gpu("mi300x")
    assert stack_factor(mi.name) < 0.9
    base = load_profile("default")
    run = prepare(RunSpec("F5", LAUNCH, LOG, "mi300x", SETS))
    assert predict(run, base)["timing_s/step"] == pytest.approx(
        simulate(run.scenario, profile="default", max_work=None).summary["step_time_s"], rel=1e-9)   # the same profile
    # an overlay that fitted nothing but the advantage keeps every other operation as the base priced it here
    fake = {"terms": [{"term": "adv_per_token_s", "path": "step.adv_per_token_s", "fitted": 2e-7}],
            "unidentified": [], "warnings": [], "runs": [], "rms_log_residual": 0.0, "evaluations": 0, "options": {},
            "spread": None, "profile": base}
    doc = overlay_doc(fake, "default", base, "fromrun-mi", "mi300x", "test", tmp_path)
    (tmp_path / "o.json").write_text(json.dumps(doc))
    over = CostModel.load(mi, str(tmp_path / "o.json")).profile
    scaled = with_stack_rate(base, mi)
    for op, params in scaled["operations"].items():
        assert over["operations"][op]["compute_eff"] == pytest.approx(params["compute_eff"], rel=1e-12), op
    assert over["step"]["adv_per_token_s"] == 2e-7


def test_a_verl_01_run_is_compared_in_the_spans_its_release_timed():
    """verl 0.1 (eric-haibin-lin/verl-data, PPO Qwen2.5-0.5B; launch: the config the run printed) times the reward
    inside ``adv`` and the old log-probs inside ``gen``: the fit compares the simulator's reward + adv with the
    logged adv, and its old_log_prob + generate with the logged gen (not a reward and an old_log_prob the log
    never had). The GPU is not named in the log; h100-sxm only prices it."""
    from rlhfsim.contracts import VERL_PHASE_KEYS
    from rlhfsim.costs.model import CostModel as CM
    from rlhfsim.sim.run import simulate

    launch = ROOT / "tests" / "fixtures" / "fromrun" / "verl-data-qwen2.5-0.5b-ppo-v0.1.yaml"
    log = ROOT / "tests" / "data" / "logs" / "verl-data-qwen2.5-0.5b-ppo-v0.1.log.gz"
    run = prepare(RunSpec("v01", launch, log, "h100-sxm", ("algorithm.use_kl_in_reward=True",), "0.1"))
    assert run.reward_in_adv and run.old_log_prob_in_gen
    assert "timing_s/reward" not in run.measured and "timing_s/old_log_prob" not in run.measured
    base = load_profile("default")
    pred = predict(run, base)
    raw = simulate(run.scenario, cost=CM(run.gpu, base), max_work=None).summary["phases_s"]
    assert raw["reward"] > 0 and raw["old_log_prob"] > 0
    assert pred["timing_s/adv"] == pytest.approx(raw["adv"] + raw["reward"], rel=1e-9)
    gen = raw["generate"] + raw["old_log_prob"] + (raw.get("weight_sync", 0.0) if run.fold_weights else 0.0)
    assert pred["timing_s/gen"] == pytest.approx(gen, rel=1e-9)
    assert VERL_PHASE_KEYS["reward"] not in pred and VERL_PHASE_KEYS["old_log_prob"] not in pred


def test_the_reward_is_compared_inside_adv_where_the_release_timed_it_there():
    phases = {"timing_s/gen": 5.0, "timing_s/reward": 0.3, "timing_s/retokenize": 0.1, "timing_s/adv": 0.01,
              "timing_s/update_weights": 0.2}
    old = verl_spans(phases, weight_sync_in_gen=True, reward_in_adv=True)
    assert old == pytest.approx({"timing_s/gen": 5.2, "timing_s/adv": 0.41})
    new = verl_spans(phases, weight_sync_in_gen=False, reward_in_adv=False)
    assert new == pytest.approx({"timing_s/gen": 5.0, "timing_s/reward": 0.4, "timing_s/adv": 0.01,
                                 "timing_s/update_weights": 0.2})


def test_calibrate_help_groups_its_three_modes():
    out = CliRunner().invoke(main, ["calibrate", "-h"]).output
    heads = [ln for ln in out.splitlines() if ln and not ln.startswith(" ") and ln.endswith(":")]
    assert [h.split(" ")[0] for h in heads] == ["Every", "--from-run", "--from-ops", "Measuring"], heads
    runs = out.index("--from-run LAUNCH LOG: fit")
    assert runs < out.index("  --warmup") < out.index("--from-ops DIR: fit") < out.index("  --quick")
    assert out.index("Every mode") < out.index("  --gpu NAME") < runs


def test_a_log_whose_mean_response_exceeds_the_launch_cap_names_the_cap_and_the_line(tmp_path):
    """F5's log (responses up to 192 tokens, mean 141) with the launch's cap set to 128: the log's mean does not fit
    under the cap, so launch and log are not one run; the refusal names the launch setting and the log line, not
    --mean-response-len (which the user never gave)."""
    r = CliRunner().invoke(main, ["calibrate", "--from-run", str(LAUNCH), str(LOG), "--gpu", "h100-sxm",
                                  "--set", "data.max_response_length=128", "-o", str(tmp_path / "o.json")])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert r.output.startswith("error: data.max_response_length: the launch") and "caps responses at 128" in r.output
    assert "response_length/max:192" in r.output and "--mean-response-len" not in r.output


def test_a_bin_of_steps_under_the_cap_still_has_the_whole_log_checked_against_it():
    """play-verl's Qwen2-7B "min" run (F7): its steady steps cut into bins by the longest response
    (``pool.bins``); the first bin's longest is 857 tokens, while the warm-up step and the other bins reach 1024. With
    the launch's cap set to 857, prepared bin by bin, the first bin alone fits under the cap, but the log is not
    the launch's run: the agreement check names the first step past the cap (step 1, 1024 tokens), from the whole
    log, not only the bin's steps."""
    from rlhfsim.fromrun.agree import LaunchLogMismatch
    from rlhfsim.fromrun.fit import prepare_steady
    from rlhfsim.fromrun.logs import read_log, steady_steps
    from rlhfsim.fromrun.pool import bins

    launch = ROOT / "scenarios" / "examples" / "field" / "playverl-h100-qwen2-7b-ppo-min.sh"
    log = ROOT / "scenarios" / "examples" / "fromrun" / "logs" / "verl_qwen2_7b_min.log.steps.gz"
    sets = ("actor_rollout_ref.rollout.max_num_seqs=1024", "critic.model.use_remove_padding=False",
            "actor_rollout_ref.rollout.enforce_eager=True")
    steady = steady_steps(read_log(log), log.name, 1, 3)
    label, first = bins(steady)[0]
    assert label.startswith("response_length/max 363-857") and max(
        s.metrics["response_length/max"] for s in first.kept) == 857
    spec = RunSpec("F7", launch, log, "h100-sxm", sets + ("data.max_response_length=857",), "0.3")
    with pytest.raises(LaunchLogMismatch) as e:
        prepare_steady(spec, first)
    assert "caps responses at 857" in str(e.value) and "response_length/max:1024 (step 1," in str(e.value)
    assert prepare_steady(replace(spec, sets=sets), first).lengths["response_cap"] == 1024   # the launch's own cap

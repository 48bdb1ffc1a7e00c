"""``rlhfsim calibrate --from-run`` on an OpenRLHF run (rlhfsim.fromrun.frameworks): OpenRLHF's own example launch
(dotted flags, tests/data/openrlhf/) with a console log of ``✨ Global step N: {...}`` lines as OpenRLHF >= 0.9.6 prints
them. No public OpenRLHF log with its timers was found (docs/from-run.md), so the log is written from the simulator
under a known profile change and fitted back to it: the timers map to the simulator's phases, a rule reward counts in
generation, the step is the timers' sum, and the framework is told from the launch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from rlhfsim.cli import main
from rlhfsim.costs.profile import load_profile
from rlhfsim.fromrun import terms as T
from rlhfsim.fromrun.fit import RunSpec, predict, prepare
from rlhfsim.fromrun.frameworks import OPENRLHF_TIMERS, FrameworkError, phase_groups

DATA = Path(__file__).resolve().parents[1] / "data" / "openrlhf"
LAUNCH = DATA / "3c3be623-train_ppo_with_reward_fn.sh"   # PPO, a reward function, 2+2+4 GPUs
SETS = ("rollout.batch_size=64", "train.batch_size=64", "data.max_len=1024")      # a small step, so the fit runs in a few seconds
VERL_LAUNCH = Path(__file__).resolve().parents[2] / "scenarios" / "examples" / "field" / "playverl-h100-qwen2.5-0.5b-grpo.sh"
TRAIN = "operations.train.compute_eff"


def openrlhf_log(path: Path, timers: dict, n: int = 8, noise: float = 0.01, seed: int = 5) -> Path:
    """OpenRLHF's console: ``logger.info(f"✨ Global step {global_step}: {log_status}")`` (ppo_trainer.py), the status
    dict's repr with the four timers and their sum; step 1 slow (warm-up)."""
    rng = np.random.default_rng(seed)
    lines = ["Episode [1/1]:   0%|          | 0/40 [00:00<?, ?it/s]"]
    for step in range(1, n + 1):
        f = 3.0 if step == 1 else 1.0
        t = {k: timers[k] * f * (1 + noise * rng.standard_normal()) for k in OPENRLHF_TIMERS}
        status = {"policy_loss": -0.01, "critic_loss": 0.2, "response_length": 180.0, "total_length": 330.0,
                  "actor_lr": 5e-07, "rollout/response_length_mean": 180.0, "rollout/truncated_rate": 0.0, **t,
                  "timing/step_total": sum(t.values())}
        lines.append(f"(PPOTrainer pid=4242) INFO 08-13 10:00:0{step % 10} ppo_trainer.py:547] ✨ Global step {step}: {status}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def base():
    return load_profile("default")


@pytest.fixture(scope="module")
def truth(tmp_path_factory, base):
    """The launch simulated with training at 0.6 x the default efficiency, written as OpenRLHF's log."""
    d = tmp_path_factory.mktemp("orlhf")
    probe = prepare(RunSpec("probe", LAUNCH, openrlhf_log(d / "probe.log", dict.fromkeys(OPENRLHF_TIMERS, 1.0)),
                            "h100-sxm", SETS))
    eff = T.get_value(base, TRAIN) * 0.6
    return openrlhf_log(d / "truth.log", predict(probe, T.with_values(base, {TRAIN: eff}))), eff


def test_openrlhf_run_is_prepared_with_its_own_timers(truth):
    run = prepare(RunSpec("r", LAUNCH, truth[0], "h100-sxm", SETS))
    assert run.framework == "openrlhf" and run.steady.framework == "openrlhf"
    assert set(run.measured) == {*OPENRLHF_TIMERS, "timing_s/step"}
    assert run.lengths["response"] == pytest.approx(180.0) and run.lengths["prompt"] == pytest.approx(150.0)
    assert run.scenario.models.reward.kind == "rule" and run.scenario.workload.prompts_per_step == 64
    # a rule reward is scored in the rollout worker: inside timing/generation
    assert phase_groups(run.scenario)["timing/generation"] == ("generate", "reward")
    pred = predict(run, load_profile("default"))
    assert pred["timing_s/step"] == pytest.approx(sum(pred[k] for k in OPENRLHF_TIMERS))
    assert not run.fold_weights and not run.reward_in_adv


def test_cli_fits_an_openrlhf_run_and_refuses_a_mismatch_in_one_line(truth, tmp_path):
    log, eff = truth
    out = tmp_path / "o.json"
    args = ["calibrate", "--from-run", str(LAUNCH), str(log), "--gpu", "h100-sxm", "-o", str(out)]
    for s in SETS:
        args += ["--set", s]
    res = CliRunner().invoke(main, args + ["--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    run = doc["runs"][0]
    assert run["framework"] == "openrlhf" and set(run["measured_s"]) == {*OPENRLHF_TIMERS, "timing_s/step"}
    # the fit recovers the training efficiency the log was written with, from OpenRLHF's own timers
    train = next(t for t in doc["terms"] if t["path"] == TRAIN)
    assert train["fitted"] / train.get("frame", 1.0) == pytest.approx(eff, rel=0.05)
    assert abs(run["fitted_error_pct"]["timing/ppo_train"]) < 3
    assert {d["phase"] for d in train["determined_by"]} <= set(OPENRLHF_TIMERS)
    # a verl launch with an OpenRLHF log
    bad = CliRunner().invoke(main, ["calibrate", "--from-run", str(VERL_LAUNCH), str(log), "--gpu", "h100-sxm",
                                    "-o", str(tmp_path / "x.json")])
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1
    assert "expected an OpenRLHF launch for an OpenRLHF log, got a launch running verl's trainer" in bad.stderr
    ver = CliRunner().invoke(main, args + ["--verl-version", "0.4"])
    assert ver.exit_code == 2 and ver.stderr.startswith("error: --verl-version: expected only with a verl run")
    # a what-if on the overlay: rebuilt by OpenRLHF's importer, priced in its timers, with the fit's misfit interval
    wi = CliRunner().invoke(main, ["whatif", str(out), "--set", "actor.num_gpus_per_node=8", "--set",
                                   "trainer.nnodes=2", "--draws", "0", "--format", "json"])
    assert wi.exit_code == 0, wi.output
    w = json.loads(wi.stdout)["runs"][0]
    rows = {r["phase"]: r for r in w["rows"]}
    assert set(rows) == {*OPENRLHF_TIMERS, "timing_s/step"}
    assert rows["timing/ppo_train"]["change_pct"] < 0 and rows["timing/generation"]["change_pct"] == pytest.approx(0)
    lo, hi = rows["timing_s/step"]["whatif_interval_s"]
    assert lo < rows["timing_s/step"]["whatif_s"] < hi
    assert any(n.startswith("trainer.nnodes=2 is not priced") for n in w["notes"])   # not an OpenRLHF flag


def test_a_log_before_openrlhf_timed_its_steps_is_one_line(tmp_path):
    # 0.8.5-0.9.5: 'Experience making completed in' and a status line without timers: no step time to fit
    lines = []
    for s in range(1, 6):
        lines.append(f"INFO experience_maker.py:610] ✨ Experience making completed in 0:00:4{s}")
        lines.append(f"INFO ppo_trainer.py:525] ✨ Global step {s}: {{'policy_loss': 0.1, 'response_length': 200.0}}")
    log = tmp_path / "old.log"
    log.write_text("\n".join(lines) + "\n")
    res = CliRunner().invoke(main, ["calibrate", "--from-run", str(LAUNCH), str(log), "--gpu", "h100-sxm",
                                    "-o", str(tmp_path / "o.json")])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "timing_s/step" in res.stderr


def test_framework_switch_errors():
    with pytest.raises(FrameworkError, match="--framework: expected one of verl, openrlhf"):
        from rlhfsim.fromrun.frameworks import detect
        detect("trl", "", "verl")

"""`rlhfsim validate` end to end on tiny models (seconds): the real run did what the scenario says, and
the command's JSON has the contracted shape. No timing thresholds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from calibrate.validation.run import validate  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "validate"
# Grid fields over the quick CPU grid's host cost terms, as small as they still measure: two matrices, two
# footprints, two narrow widths at one MLP ratio on 64 tokens; page faults off (a fixed ladder of 8-128 MiB
# fills, about 15 s a calibration on two cores, with no smaller setting)
TINY_HOST_TERMS = json.loads((FIX / "tiny-host-terms.json").read_text())


@pytest.fixture(scope="module")
def doc():
    return validate([FIX / "tiny-sync.yaml", FIX / "tiny-oppo.yaml"], "cpu", "cpu", None, threads=1, progress=False)


def test_sync_real_run_generates_scores_and_trains_what_the_scenario_says(doc):
    s = doc["scenarios"][0]
    c = s["checks"]
    # Same rollouts on both sides: 4 per step, each trained once, in the same steps.
    assert [sorted(x) for x in c["measured_trained_ids"]] == [sorted(x) for x in c["predicted_trained_ids"]]
    assert all(len(x) == 4 for x in c["measured_trained_ids"])
    # Synchronous: every token of every trained rollout generated, on both sides.
    assert c["measured_generated_tokens"] == c["predicted_generated_tokens"]
    assert c["measured_chunks_scored"] == 0
    assert c["measured_deferred"] == c["predicted_deferred"] == [0, 0]
    # Fresh pages of the sequential phases' minibatches, recorded in the step and priced beside
    # (calibrate.cpu.pagefaults): tiny logits, so the profile prices none.
    pf = s["page_faults"]
    assert {"reference", "actor_train", "critic_train"} <= set(pf)
    for ph, v in pf.items():
        assert v["minibatches_per_step"] >= 1 and v["measured_mib"] >= 0 and v["priced_mib"] == 0


def test_oppo_real_run_streams_chunks_and_carries_deferred(doc):
    s = doc["scenarios"][1]
    c = s["checks"]
    trained = [i for step in c["measured_trained_ids"] for i in step]
    assert len(trained) == len(set(trained)) == 3 * 4  # B per step, none twice
    assert all(d == 2 for d in c["measured_deferred"])  # delta rollouts carried every step
    assert all(d == 2 for d in c["predicted_deferred"])
    assert c["measured_chunks_scored"] >= len(trained)  # at least one chunk per trained rollout
    assert "reward" in s["phases"] and "generate" in s["phases"]


def test_json_contract_through_the_cli():
    out = subprocess.run([sys.executable, "-m", "rlhfsim.cli", "validate", "--device", "cpu", "--scenario",
                          str(FIX / "tiny-sync.yaml"), "--profile", "cpu", "--threads", "1", "--format", "json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    (s,) = d["scenarios"]
    assert d["steps_run"] == "round-robin"   # the default with --scenario
    assert set(s) >= {"name", "measured_step_time_s", "predicted_step_time_s", "error_pct", "phases"}
    assert s["error_pct"] == pytest.approx(100 * (s["predicted_step_time_s"] - s["measured_step_time_s"]) / s["measured_step_time_s"])
    for ph in ("generate", "reward", "reference", "critic_fwd", "actor_train", "critic_train", "weight_sync"):
        assert set(s["phases"][ph]) == {"measured_s", "predicted_s", "error_pct"}
    # The device state check: probes before and after the steps, the bundled profile compared with them.
    dc = d["device_check"]
    assert len(dc["probes"]) == 2 and all(p["gemm_gflop_s"] > 0 for p in dc["probes"])
    (c,) = dc["profiles"]
    assert c["profile"] == "cpu" and c["local_cpu_model"] == dc["probes"][0]["cpu_model"]
    assert dc["warnings"] == c["warnings"]
    for w in c["warnings"]:   # each warning reaches the user on stderr, one line
        assert f"warning: {w}" in out.stderr


def test_bad_scenario_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((FIX / "tiny-sync.yaml").read_text().replace("schedule: {kind: sync}", "schedule: {kind: partial, token_budget: 4}"))
    out = subprocess.run([sys.executable, "-m", "rlhfsim.cli", "validate", "--scenario", str(bad), "--profile", "cpu"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "schedule.kind" in out.stderr and "Traceback" not in out.stderr


def test_quick_calibration_covers_the_scenarios_operating_points():
    from calibrate.running.grid import QUICK_CPU
    from calibrate.validation.calibration import OPERATING_SAMPLE, operating_points
    from calibrate.validation.scenario import draw_rollouts, prepare

    prepared = [prepare(FIX / n, "cpu", 3, 1) for n in ("tiny-sync.yaml", "tiny-oppo.yaml")]
    pts = operating_points(prepared, "cpu")
    assert set(QUICK_CPU.decode) <= set(pts["decode"]) and set(QUICK_CPU.train) <= set(pts["train"])
    for sc, setup, _, _ in prepared:
        used = draw_rollouts(setup, OPERATING_SAMPLE)
        mb = sc.generation.max_batch
        mid = sum(p + r / 2 for p, r in used) / len(used)
        # decode at the scenario's batch and (to 16 tokens) its mean mid-response context
        assert any(b == mb and abs(c - mid) <= 8 for b, c in pts["decode"])
        assert any(b == sc.algorithm.minibatch_size for b, _ in pts["train"])
    assert pts["passes"] > 1
    # the executor records every sampled token's log-prob: the predicted side prices that recorder
    assert all(sc.generation.sampling_logprobs for sc, _, _, _ in prepared)
    # tiny-sync generates with hf_generate (the static engine's default): its runtime is calibrated at the
    # same operating points; tiny-oppo runs kv_decoder, whose costs are the plain points
    assert pts["gen_runtimes"] == ["hf_generate"]
    sc, setup, _, _ = prepared[0]
    used = draw_rollouts(setup, OPERATING_SAMPLE)
    mid = sum(p + r / 2 for p, r in used) / len(used)
    assert any(b == sc.generation.max_batch and abs(c - mid) <= 8 for b, c in pts["gen_decode"])
    # co-running in the hand-over pattern at the streaming scenario's own point, none for the other
    from calibrate.validation.calibration import handover_shape

    sync, oppo = prepared
    assert handover_shape(sync[0], sync[1], draw_rollouts(sync[1], OPERATING_SAMPLE)) is None
    assert handover_shape(oppo[0], oppo[1], draw_rollouts(oppo[1], OPERATING_SAMPLE)) == (
        "kv_decoder", "tiny-qwen2", "tiny-qwen2", 4, 16, 8)   # prompts of 8 tokens round up to 16
    # the grid (and so the cached calibration) does not depend on how many steps are validated
    assert operating_points([prepare(FIX / "tiny-sync.yaml", "cpu", 5, 1)], "cpu") == \
        operating_points([prepare(FIX / "tiny-sync.yaml", "cpu", 2, 1)], "cpu")


def test_default_calibration_alternates_passes_with_blocks_of_steps(tmp_path, monkeypatch):
    import calibrate.validation.calibration as C
    import calibrate.validation.run as R
    from calibrate.executor import RoundRobin
    from calibrate.running.journal import journal_path, read_journal

    monkeypatch.setenv("RLHFSIM_CACHE_DIR", str(tmp_path))
    tiny = {"score": [[1, 16], [2, 32]], "prefill": [[1, 16], [2, 32]], "decode": [[1, 16], [2, 32]],
            "train": [[1, 16], [2, 32]], "passes": 2, "point_budget_s": 0.01, "gen_runtimes": []}
    monkeypatch.setattr(C, "operating_points", lambda prepared, kind, lean=False: tiny)
    monkeypatch.setattr(C, "corun_shape", lambda sc, rollouts: None)
    order = []
    real_cal, real_run = R.calibrate_passes, RoundRobin.run
    monkeypatch.setattr(R, "calibrate_passes", lambda *a, **k: (order.append(("calibrate", a[5])), real_cal(*a, **k)))
    monkeypatch.setattr(RoundRobin, "run", lambda self, until=None: (order.append(("steps", self.done, until)), real_run(self, until)))
    grid_extra = {"strategies": [[2, 32]], "chunk_batches": [1], "chunk_prefixes": [0], "chunk_sizes": [8],
                  "interference": [[2, 16, 1, 8]], "runtime_score": [[1, 16]], "interference_s": 0.05}
    # the CPU host terms at their smallest (what is asserted is the order of passes and steps, not them)
    grid_extra.update(TINY_HOST_TERMS)
    tiny.update(grid_extra)
    doc = validate([FIX / "tiny-sync.yaml"], "cpu", None, 4, threads=1, progress=False)
    # P = 2 passes between P + 1 blocks of the 4 steps: one block before the first pass, one after the last
    assert order == [("steps", 0, 1), ("calibrate", 1), ("steps", 1, 3), ("calibrate", 2), ("steps", 3, 4)]
    (path,) = tmp_path.joinpath("validate").glob("profile-*[0-9a-f].json")
    assert not list(tmp_path.joinpath("validate").glob("*.partial*"))
    passes = {r.get("pass", 0) for r in read_journal(journal_path(path)) if r.get("kind") == "point"}
    assert passes == {0, 1}
    assert doc["scenarios"][0]["profile"] == str(path) and len(doc["scenarios"][0]["checks"]["measured_trained_ids"]) == 4
    # a second run uses the cached calibration: no pass measured, every step in one block
    order.clear()
    validate([FIX / "tiny-sync.yaml"], "cpu", None, 4, threads=1, progress=False)
    assert order == [("steps", 0, 4)]


def test_generation_operations_are_timed_in_the_step_and_priced_at_their_shapes(doc):
    for s in doc["scenarios"]:
        g = s["generation_ops"]
        ops = g["operations"]
        assert ops, s["name"]
        for name, v in ops.items():
            assert name in {"prefill", "decode", "generate_call"}
            assert v["calls_per_step"] > 0 and v["measured_s"] > 0 and v["predicted_s"] > 0
            assert v["measured_ms_per_call"] == pytest.approx(1e3 * v["measured_s"] / v["calls_per_step"])
        # The operations lie inside the generate span; what is left is host work between them.
        assert 0 <= g["outside_ops_s"] < g["generate_span_s"]
        assert g["generate_span_s"] == pytest.approx(s["phases"]["generate"]["measured_s"])


def test_phase_calls_are_timed_in_the_step_and_priced_as_the_simulator_prices_them(doc):
    """Every call of the sequential phases (reward, reference, critic values, training minibatches) is
    timed inside the step with its shape and priced alone at it (``phase_operations``): the calls lie
    inside their phase's span, and priced call by call they sum to the simulator's own phase prediction
    on the same rollouts (the forward passes exactly: the same pieces in the same order)."""
    sync, oppo = doc["scenarios"]
    ops = sync["phase_ops"]
    assert set(ops) == {"reward", "reference", "critic_fwd", "actor_train", "critic_train"}
    assert ops["actor_train"]["calls_per_step"] == ops["critic_train"]["calls_per_step"] == 2   # 4 rollouts / 2, 1 epoch
    for ph, v in ops.items():
        span = sync["phases"][ph]["measured_s"]
        assert 0.5 * span <= v["measured_s"] <= span * (1 + 1e-9), ph
        assert v["measured_ms_per_call"] == pytest.approx(1e3 * v["measured_s"] / v["calls_per_step"])
        assert v["first_call_error_pct"] is not None and v["other_calls_error_pct"] is not None
        assert 1 <= v["rows_per_call"] <= 4 and v["rows_per_call"] < v["tokens_per_call"], ph   # 4 rollouts a step
    for ph in ("reward", "reference", "critic_fwd"):
        assert ops[ph]["predicted_s"] == pytest.approx(sync["phases"][ph]["predicted_s"], rel=1e-9), ph
    for ph in ("actor_train", "critic_train"):   # shuffled minibatches: the pieces may pad differently
        assert ops[ph]["predicted_s"] == pytest.approx(sync["phases"][ph]["predicted_s"], rel=0.25), ph
    # intra-step streaming scores in the scorer thread (scoring_ops), not as reward forward calls
    assert "reward" not in oppo["phase_ops"] and {"reference", "actor_train"} <= set(oppo["phase_ops"])

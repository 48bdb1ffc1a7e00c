"""Megatron's uneven pipelines (execution.megatron.ROLE.first_stage_layers / last_stage_layers) and expert tensor
parallelism (etp): the split against Megatron-core's rule, the one-line errors, the slowest stage pricing the
pipeline, the largest stage holding the weights, and the verl importer's keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhfsim.costs import parallel as P
from rlhfsim.costs import terms as T
from rlhfsim.costs.model import LINK_EFF, CostModel
from rlhfsim.errors import ScenarioError
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import load_model
from rlhfsim.scenario.checks import build_setup
from rlhfsim.scenario.loader import load_scenario, parse_set

ROOT = Path(__file__).resolve().parents[2]
MEGATRON = ROOT / "scenarios" / "examples" / "megatron-pp.yaml"   # qwen3-30b-a3b (48 layers), 16 H100s, tp 2 pp 4 vpp 2 ep 2
H100 = get_gpu("h100-sxm")
NO_VPP = "execution.megatron.actor.vpp=1"


def _load(*sets):
    return load_scenario(MEGATRON, overrides=[parse_set(s) for s in sets])


def _error(*sets) -> str:
    with pytest.raises(ScenarioError) as e:
        _load(*sets)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def _lay(**kw) -> P.Layout:
    d = dict(tp=1, pp=1, vpp=1, cp=1, ep=1, pool_gpus=8, gpus_per_node=8, spans_nodes=False)
    d.update(kw)
    return P.Layout(**d)


# --- the split, as megatron-core's get_num_layers_to_build makes it ------------------------------------------
def test_stage_layers_split_the_rest_evenly_between_first_and_last():
    assert P.stage_layers(48, 4) == (12, 12, 12, 12)
    assert P.stage_layers(61, 16, 3, 2) == (3,) + (4,) * 14 + (2,)      # DeepSeek-V3 in NeMo RL's n8g recipes
    assert P.stage_layers(61, 8, 7, 6) == (7,) + (8,) * 6 + (6,)        # and n4g
    assert P.stage_layers(94, 8, 11, 11) == (11,) + (12,) * 6 + (11,)   # Qwen3-235B-A22B
    assert P.stage_layers(94, 4, 23, 23) == (23, 24, 24, 23)
    assert P.stage_layers(48, 4, first=9) == (9, 13, 13, 13)           # only the first set: the last is a middle one
    assert P.stage_layers(48, 2, 20, 28) == (20, 28)                    # no middle stage
    for bad in ((61, 16, None, None), (61, 16, 3, 3), (48, 2, 20, 20), (48, 2, 50, None)):
        with pytest.raises(ValueError):
            P.stage_layers(*bad)


def test_uneven_stages_that_do_not_add_up_are_one_line_errors_naming_the_field():
    where = "execution.megatron.actor"
    _load(NO_VPP, f"{where}.first_stage_layers=10", f"{where}.last_stage_layers=10")   # 10 + 2 x 14 + 10
    msg = _error(NO_VPP, f"{where}.first_stage_layers=10", f"{where}.last_stage_layers=11")
    assert msg.startswith(f"{where}.first_stage_layers: expected stage layers that add up to qwen3-30b-a3b's 48")
    assert "27 layers left to split evenly over the 2 middle stages" in msg and "got 10 (first) + 11 (last) over pp 4" in msg
    msg = _error(NO_VPP, f"{where}.pp=2", f"{where}.first_stage_layers=20", f"{where}.last_stage_layers=20")
    assert msg.startswith(f"{where}.first_stage_layers: expected stage layers that add up") and "all 48 layers" in msg
    assert _error(f"{where}.last_stage_layers=11").startswith(   # vpp 2: each virtual stage whole
        f"{where}.last_stage_layers: expected a multiple of vpp (2: each virtual stage whole), got 11")
    assert _error(NO_VPP, f"{where}.pp=1", f"{where}.ep=2", f"{where}.last_stage_layers=8").startswith(
        f"{where}.last_stage_layers: expected pp >= 2")
    assert _error(NO_VPP, f"{where}.first_stage_layers=0").startswith(f"{where}.first_stage_layers: expected a number >= 1")
    # without them, pp that does not divide the layers says how to split them
    assert "first_stage_layers / last_stage_layers" in _error(f"{where}.vpp=5")


# --- pricing: the slowest stage sets the pace, the largest holds the weights ---------------------------------
def test_the_slowest_stage_prices_the_call():
    cost = CostModel.load(H100, "default")
    m = load_model("qwen3-30b-a3b")
    kw = dict(logprob=True)

    def call(**lay):
        return cost.framework_call(True, m, "bfloat16", 8192, 4, 1, layout=_lay(pp=4, **lay), **kw).total_s

    even = call()
    # short first and last stages leave the middle ones (20 layers, no head) the slowest: dearer than the even split's
    # last stage of 12 layers and the LM head (Qwen3-30B-A3B's head weighs about 4.5 of its layers)
    mid = cost.framework_call(True, P.stage_shape(m, 4, 20), "bfloat16", 8192, 4, 1, "value", layout=None, sp=1,
                              ulysses=False).total_s
    assert call(first=4, last=4) > even
    assert call(first=4, last=4) == pytest.approx(mid + P.p2p_s(cost, m, "bfloat16", 8192, _lay(pp=4)))
    # 10 + 14 + 14 + 10: the middle stages' 14 layers without the head cost less than 10 layers with it
    assert call(first=10, last=10) < even
    # a long last stage is the slowest: its layers and the LM head
    last = cost.framework_call(True, P.stage_shape(m, 4, 18), "bfloat16", 8192, 4, 1, layout=None, ulysses=False,
                               **kw).total_s
    assert call(first=6, last=18) == pytest.approx(last + P.p2p_s(cost, m, "bfloat16", 8192, _lay(pp=4)))
    # the last stage with fewer layers than the rest: the head is priced where it is, not on the slowest stage
    assert call(first=12, last=12) == pytest.approx(even)
    assert P.stage_shape(m, 4, 14).moe_layers == 14 and P.stage_shape(load_model("deepseek-v3"), 16, 4).moe_layers == 4


def test_a_pipeline_step_is_the_slowest_stage_times_micro_batches_plus_fill_and_drain():
    # (m + (p - 1) / v) calls of the slowest stage: the bubble on top of its m calls
    t, m, p = 3.0, 8, 4
    assert t * m + P.bubble_s(t * m, m, p) == pytest.approx(t * (m + p - 1))
    uneven = explain_train(NO_VPP, "execution.megatron.actor.first_stage_layers=4",
                           "execution.megatron.actor.last_stage_layers=4")
    even = explain_train(NO_VPP)
    assert uneven[T.PIPELINE_BUBBLE] > even[T.PIPELINE_BUBBLE]   # middle stages of 20 layers against 12 and the head


def explain_train(*sets) -> dict:
    from rlhfsim.sim.explain import explain
    return explain(_load(*sets), steps=2)["phases"]["actor_train"]["terms_s"]


def test_the_largest_stage_holds_the_weights_and_sets_the_optimizer_step():
    even = build_setup(_load(NO_VPP)).resident_bytes[0]
    uneven = build_setup(_load(NO_VPP, "execution.megatron.actor.first_stage_layers=6",
                               "execution.megatron.actor.last_stage_layers=6")).resident_bytes[0]
    m = load_model("qwen3-30b-a3b")
    assert uneven > even   # 18 layers' share of the weights against 12
    weights = m.params("lm") * 2 / 2 - m.moe_layers * m.num_experts * m.expert_params * 2 / 2 * (1 - 1 / 2)
    assert uneven - even == pytest.approx(weights * (18 / 48 - 1 / 4))
    lay = P.layout_of(build_setup(_load(NO_VPP, "execution.megatron.actor.first_stage_layers=6",
                                        "execution.megatron.actor.last_stage_layers=6")), "actor")
    assert lay.uneven and P.largest_stage(m, lay) == 18 and P.largest_stage(m, _lay(pp=4)) is None


# --- expert tensor parallelism ------------------------------------------------------------------------------
def test_expert_tensor_parallelism_carves_ep_out_of_the_stage():
    where = "execution.megatron.actor"
    # tp 2 x pp 4 on 16 GPUs: dp 2; ep 4 does not divide dp x cp, but with etp 1 it divides the stage's tp x dp (4)
    assert _error(f"{where}.ep=4").startswith(f"{where}.ep: expected ep to divide dp x cp (2:")
    sc = _load(f"{where}.ep=4", f"{where}.etp=1")
    assert sc.execution.megatron.actor.etp == 1
    assert _error(f"{where}.ep=4", f"{where}.etp=2").startswith(f"{where}.ep: expected ep x etp (4 x 2) to divide a stage's")
    # its group is ep x etp consecutive GPUs; the routed experts split over etp, not tp
    cost = CostModel.load(H100, "default")
    m = load_model("qwen3-30b-a3b")
    far = dict(tp=2, cp=2, ep=4, pool_gpus=32, spans_nodes=True)
    assert P.ep_alltoall_s(cost, m, "bfloat16", 4096, _lay(**far, etp=1)) < P.ep_alltoall_s(cost, m, "bfloat16", 4096, _lay(**far))
    per = 4096 / 4 * 8 * 2048 * 2 * 3 / 4
    want = 4 * 48 * (per / (H100.intra_node_bw * LINK_EFF) + P.LATENCY_S)
    assert P.ep_alltoall_s(cost, m, "bfloat16", 4096, _lay(**far, etp=1)) == pytest.approx(want)
    base = build_setup(_load(f"{where}.ep=2")).resident_bytes[0]
    etp1 = build_setup(_load(f"{where}.ep=2", f"{where}.etp=1")).resident_bytes[0]
    assert etp1 - base == pytest.approx(m.moe_layers * m.num_experts * m.expert_params * 2 / 2 * (1 - 1 / 2) / 4)


# --- the verl importer ---------------------------------------------------------------------------------------
def test_verl_maps_the_stage_layers_and_expert_tensor_parallelism_and_round_trips():
    from rlhfsim.importers import ImportOptions, import_verl
    from rlhfsim.importers.verl_export import export_verl
    mg = "actor_rollout_ref.actor.megatron"
    launch = ("python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer algorithm.adv_estimator=grpo "
              "actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B actor_rollout_ref.rollout.n=8 data.train_batch_size=64 "
              "actor_rollout_ref.actor.ppo_mini_batch_size=64 trainer.nnodes=4 trainer.n_gpus_per_node=8 "
              "actor_rollout_ref.rollout.tensor_model_parallel_size=8 "
              f"{mg}.tensor_model_parallel_size=2 {mg}.pipeline_model_parallel_size=4 {mg}.expert_model_parallel_size=8 "
              f"{mg}.expert_tensor_parallel_size=1 +{mg}.override_transformer_config.num_layers_in_first_pipeline_stage=11 "
              f"+{mg}.override_transformer_config.num_layers_in_last_pipeline_stage=11 "
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 actor_rollout_ref.rollout.gpu_memory_utilization=0.5")
    opts = ImportOptions(gpu="h100-sxm", mean_response_len=400, mean_prompt_len=200)
    res = import_verl(launch, opts, "launch")
    assert res.scenario["execution"]["megatron"]["actor"] == {
        "pp": 4, "vpp": 1, "cp": 1, "ep": 8, "etp": 1, "first_stage_layers": 11, "last_stage_layers": 11}
    status = {s.key: s.status for s in res.settings}
    assert status[f"{mg}.override_transformer_config.num_layers_in_first_pipeline_stage"] == "mapped"
    assert status[f"{mg}.expert_tensor_parallel_size"] == "mapped"
    overrides, o2 = export_verl(res.scenario)
    back = import_verl(" ".join(overrides), ImportOptions(**{k: getattr(o2, k) for k in (
        "gpu", "mean_response_len", "mean_prompt_len", "steps")}), "launch")
    assert back.scenario == res.scenario


def test_the_cli_refuses_a_split_that_does_not_add_up_in_one_line_and_exits_2():
    from click.testing import CliRunner

    from rlhfsim.cli import main
    res = CliRunner().invoke(main, ["explain", str(MEGATRON), "--set", NO_VPP, "--set",
                                    "execution.megatron.actor.first_stage_layers=10", "--set",
                                    "execution.megatron.actor.last_stage_layers=11"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.stderr.count("\n") == 1 and "execution.megatron.actor.first_stage_layers: expected stage layers" in res.stderr

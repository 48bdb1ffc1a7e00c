"""Megatron-LM's parallelism (execution.megatron; rlhfsim.costs.parallel): the schema's errors, each term's limits and
its value composed by hand, and `rlhfsim explain` showing the terms."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhfsim.costs import parallel as P
from rlhfsim.costs import terms as T
from rlhfsim.costs.model import LINK_EFF, CostModel
from rlhfsim.errors import ScenarioError
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import load_model
from rlhfsim.scenario.loader import load_scenario, parse_set
from rlhfsim.sim.explain import explain

ROOT = Path(__file__).resolve().parents[2]
MEGATRON = ROOT / "scenarios" / "examples" / "megatron-pp.yaml"
MOE = ROOT / "scenarios" / "examples" / "moe-qwen3-30b-a3b.yaml"
DENSE = ROOT / "scenarios" / "verl-ppo.yaml"
H100 = get_gpu("h100-sxm")


def _load(path, *sets):
    return load_scenario(path, overrides=[parse_set(s) for s in sets])


def _error(path, *sets) -> str:
    with pytest.raises(ScenarioError) as e:
        _load(path, *sets)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# --- the schema ------------------------------------------------------------------------------------
def test_inconsistent_degrees_are_one_line_errors_naming_the_field():
    moe = ("placement.tp.actor=2", "execution.sharding=none")
    assert _error(MOE, *moe, "execution.megatron.actor.pp=3").startswith("execution.megatron.actor: expected tp x pp x cp")
    assert _error(MOE, *moe, "execution.megatron.actor.vpp=2").startswith("execution.megatron.actor.vpp: expected pp > 1")
    msg = _error(MOE, *moe, "execution.megatron.actor.pp=2", "execution.megatron.actor.vpp=5")
    assert msg.startswith("execution.megatron.actor.pp: expected pp x vpp (2 x 5) to divide") and "48 layers" in msg
    assert _error(MOE, *moe, "execution.megatron.actor.ep=3").startswith("execution.megatron.actor.ep: expected ep to divide dp x cp")
    assert _error(MOE, "placement.tp.actor=2", "execution.megatron.actor.pp=2").startswith("execution.sharding: expected none")
    assert _error(MOE, *moe, "execution.megatron.actor.pp=2", "execution.ulysses_sequence_parallel_size=2").startswith(
        "execution.ulysses_sequence_parallel_size: expected 1")
    assert "dense model" in _error(DENSE, "execution.megatron.actor.ep=2")
    assert _error(MOE, "execution.megatron.actor.ep=0").startswith("execution.megatron.actor.ep: expected a number >= 1")


def test_a_stage_and_an_expert_shard_hold_less_of_the_weights():
    from rlhfsim.scenario.checks import build_setup
    moe = ("placement.tp.actor=2", "execution.sharding=none")
    pool = build_setup(_load(MOE, *moe)).resident_bytes[0]
    staged = build_setup(_load(MOE, *moe, "execution.megatron.actor.pp=2")).resident_bytes[0]
    sharded = build_setup(_load(MOE, *moe, "execution.megatron.actor.ep=2")).resident_bytes[0]
    m = load_model("qwen3-30b-a3b")
    weights = m.params("lm") * 2 / 2
    assert pool - staged == pytest.approx(weights / 2)
    assert pool - sharded == pytest.approx(m.moe_layers * m.num_experts * m.expert_params * 2 / 2 / 2)


def test_the_defaults_set_no_layout():
    s = _load(DENSE)
    assert s.execution.megatron.actor.pp == 1
    from rlhfsim.scenario.checks import build_setup
    setup = build_setup(s)
    assert all(P.layout_of(setup, r) is None for r in ("actor", "critic", "reference", "reward", "rollout"))


# --- the terms, limits and values by hand -------------------------------------------------------------
def _lay(**kw) -> P.Layout:
    d = dict(tp=1, pp=1, vpp=1, cp=1, ep=1, pool_gpus=8, gpus_per_node=8, spans_nodes=False)
    d.update(kw)
    return P.Layout(**d)


def test_pipeline_bubble_is_none_without_a_pipeline_and_shrinks_with_micro_batches_and_virtual_stages():
    assert P.bubble_s(10.0, 8, 1) == 0.0
    assert P.bubble_s(10.0, 4, 4, 1) == pytest.approx(10.0 * 3 / 4)        # (p - 1) / (v m) of the calls
    assert P.bubble_s(10.0, 4, 4, 2) == pytest.approx(10.0 * 3 / 8)
    assert P.bubble_s(10.0, 8, 4) < P.bubble_s(10.0, 4, 4)
    # as a fraction of the pipeline's time: (p - 1) / (v m + p - 1), Narayanan et al. 2021
    b = P.bubble_s(10.0, 6, 4, 2)
    assert b / (10.0 + b) == pytest.approx(3 / (2 * 6 + 3))


def test_stage_shape_holds_its_share_of_the_layers():
    m = load_model("qwen3-30b-a3b")
    s = P.stage_shape(m, 4)
    assert (s.layers, s.moe_layers, s.vocab) == (12, 12, m.vocab) and P.stage_shape(m, 1) is m


def test_expert_all_to_all_by_hand_and_none_at_ep_1_or_dense():
    cost = CostModel.load(H100, "default")
    moe, dense = load_model("qwen3-30b-a3b"), load_model("qwen2.5-7b")
    assert P.ep_alltoall_s(cost, moe, "bfloat16", 4096, _lay(ep=1)) == 0.0
    assert P.ep_alltoall_s(cost, dense, "bfloat16", 4096, _lay(ep=4)) == 0.0
    lay = _lay(tp=2, ep=4)
    per = 4096 / 2 * 8 * 2048 * 2 * 3 / 4                       # tokens / tp x top-k x hidden x bytes x (ep - 1) / ep
    want = 4 * 48 * (per / (H100.intra_node_bw * LINK_EFF) + P.LATENCY_S)   # dispatch + combine, forward + backward
    assert P.ep_alltoall_s(cost, moe, "bfloat16", 4096, lay) == pytest.approx(want)
    # an expert group past one node's GPUs crosses the inter-node link
    far = _lay(tp=2, ep=8, pool_gpus=32, spans_nodes=True)
    assert P.ep_alltoall_s(cost, moe, "bfloat16", 4096, far) > P.ep_alltoall_s(cost, moe, "bfloat16", 4096, _lay(tp=2, ep=4, pool_gpus=32, spans_nodes=True))
    assert far.inter_node(2 * 8) and not far.inter_node(8)


def test_pipeline_p2p_and_context_ring_by_hand():
    cost = CostModel.load(H100, "default")
    m = load_model("qwen3-30b-a3b")
    assert P.p2p_s(cost, m, "bfloat16", 4096, _lay()) == 0.0 and P.cp_s(cost, m, "bfloat16", 4096, _lay()) == 0.0
    bw = H100.intra_node_bw * LINK_EFF
    got = P.p2p_s(cost, m, "bfloat16", 4096, _lay(tp=2, pp=4, vpp=2))
    assert got == pytest.approx(2 * 2 * (4096 * 2048 * 2 / 2 / bw + P.LATENCY_S))
    got = P.cp_s(cost, m, "bfloat16", 4096, _lay(tp=2, cp=2))
    kv = 2 * m.kv_heads * m.head_dim
    assert got == pytest.approx(3 * 1 * m.layers * (4096 / 2 * kv * 2 / 2 / bw + P.LATENCY_S))
    # a forward-only call sends activations only, passes keys and values round once, dispatches and combines once
    lay = _lay(tp=2, pp=4, vpp=2, cp=2, ep=2)
    for f, half in ((P.p2p_s, 2), (P.cp_s, 3), (P.ep_alltoall_s, 2)):
        assert f(cost, m, "bfloat16", 4096, lay, False) * half == pytest.approx(f(cost, m, "bfloat16", 4096, lay, True))


def test_a_training_call_carries_its_megatron_terms_and_sums_to_its_price():
    cost = CostModel.load(H100)
    m = load_model("qwen3-30b-a3b")
    lay = _lay(tp=2, pp=2, cp=2, ep=2, pool_gpus=16, gpus_per_node=8, spans_nodes=True)
    call = cost.framework_call(True, m, "bfloat16", 8192, 4, 2, layout=lay, logprob=True)
    t = call.terms()
    assert {T.PP_P2P, T.CP_COMM, T.EP_ALLTOALL} <= set(t) and sum(t.values()) == pytest.approx(call.total_s)
    # the same stage's call without the layout, its experts at the layout's expert parallelism (expert_gemm)
    bare = cost.framework_call(True, P.stage_shape(m, 2), "bfloat16", 8192, 4, 2, sp=2, ulysses=False, logprob=True,
                               ep=2)
    assert call.device_s == pytest.approx(bare.device_s + t[T.PP_P2P] + t[T.CP_COMM] + t[T.EP_ALLTOALL])


# --- the simulator and explain -------------------------------------------------------------------------
def test_explain_shows_the_bubble_the_p2p_and_the_all_to_all():
    doc = explain(_load(MEGATRON), steps=2)
    train = doc["phases"]["actor_train"]
    for t in (T.PIPELINE_BUBBLE, T.PP_P2P, T.EP_ALLTOALL):
        assert train["terms_s"].get(t, 0.0) > 0, t
    assert sum(train["terms_s"].values()) == pytest.approx(train["span_s"], rel=1e-9)
    old = doc["phases"]["old_log_prob"]   # forward-only passes run through the pipeline too
    assert old["terms_s"].get(T.PIPELINE_BUBBLE, 0.0) > 0 and old["terms_s"].get(T.EP_ALLTOALL, 0.0) > 0
    assert sum(old["terms_s"].values()) == pytest.approx(old["span_s"], rel=1e-9)
    # fewer micro-batches per pipeline, a larger bubble; context parallelism adds its ring
    few = explain(_load(MEGATRON, "execution.micro_batch.ppo_micro_batch_size_per_gpu=64"), steps=2)
    assert few["phases"]["actor_train"]["terms_s"][T.PIPELINE_BUBBLE] > train["terms_s"][T.PIPELINE_BUBBLE]
    cp = explain(_load(MEGATRON, "execution.megatron.actor.cp=2"), steps=2)
    assert cp["phases"]["actor_train"]["terms_s"][T.CP_COMM] > 0


# --- the verl importer ---------------------------------------------------------------------------------
A2 = ROOT / "scenarios" / "examples" / "field" / "a-verldata-gpg-qwen2-7b-megatron.sh"


def _import_verl(text: str, source: str = "launch", **kw):
    from rlhfsim.importers import ImportOptions, import_verl
    return import_verl(text, ImportOptions(**{"gpu": "a100-80gb", "mean_response_len": 160, "mean_prompt_len": 94, **kw}),
                       source)


def test_the_field_tables_megatron_run_imports_with_its_pipeline_mapped():
    res = _import_verl(A2.read_text(), str(A2.relative_to(ROOT)))
    status = {s.key: (s.status, s.target) for s in res.settings}
    pp = "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"
    assert status[pp][0] == "mapped" and status[pp][1].startswith("execution.megatron.actor.pp")
    assert status["actor_rollout_ref.ref.megatron.pipeline_model_parallel_size"][0] == "mapped"
    assert not any("megatron" in s.key for s in res.settings if s.status == "unmapped")
    sc = res.scenario
    assert sc["placement"]["tp"]["actor"] == 2 and sc["execution"]["megatron"] == {"actor": {"pp": 2, "vpp": 1, "cp": 1, "ep": 1}}
    assert "execution" in sc and sc["execution"]["sharding"] == "none"
    doc = explain(load_scenario(sc), steps=2)
    assert doc["phases"]["actor_train"]["terms_s"][T.PIPELINE_BUBBLE] > 0


def test_every_megatron_degree_maps_and_round_trips():
    from rlhfsim.importers.verl_export import export_verl
    launch = ("python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer algorithm.adv_estimator=grpo "
              "actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B actor_rollout_ref.rollout.n=8 data.train_batch_size=64 "
              "actor_rollout_ref.actor.ppo_mini_batch_size=64 trainer.nnodes=2 trainer.n_gpus_per_node=8 "
              "actor_rollout_ref.rollout.tensor_model_parallel_size=4 "
              "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 "
              "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 "
              "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2 "
              "actor_rollout_ref.actor.megatron.context_parallel_size=2 "
              "actor_rollout_ref.actor.megatron.expert_model_parallel_size=4 "
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 "
              "actor_rollout_ref.rollout.gpu_memory_utilization=0.5")
    res = _import_verl(launch, gpu="h100-sxm", mean_response_len=400, mean_prompt_len=200)
    assert res.scenario["execution"]["megatron"]["actor"] == {"pp": 2, "vpp": 2, "cp": 2, "ep": 4}
    doc = explain(load_scenario(res.scenario), steps=2)
    train = doc["phases"]["actor_train"]["terms_s"]
    assert all(train.get(t, 0) > 0 for t in (T.PIPELINE_BUBBLE, T.PP_P2P, T.CP_COMM, T.EP_ALLTOALL))
    overrides, opts = export_verl(res.scenario)
    assert _import_verl(" ".join(overrides), **{k: getattr(opts, k) for k in ("gpu", "mean_response_len",
                                                                           "mean_prompt_len", "steps")}).scenario == res.scenario


def test_megatrons_cpu_optimizer_maps_to_optimizer_offload_and_a_partial_fraction_does_not():
    base = ("python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer algorithm.adv_estimator=grpo "
            "actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B actor_rollout_ref.rollout.n=8 data.train_batch_size=64 "
            "actor_rollout_ref.actor.ppo_mini_batch_size=64 trainer.nnodes=2 trainer.n_gpus_per_node=8 "
            "actor_rollout_ref.rollout.tensor_model_parallel_size=4 "
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 "
            "actor_rollout_ref.actor.megatron.expert_model_parallel_size=4 "
            "+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload=True ")
    kw = dict(gpu="h100-sxm", mean_response_len=400, mean_prompt_len=200)
    whole = _import_verl(base + "+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_offload_fraction=1.", **kw)
    assert whole.scenario["execution"]["offload"]["actor"]["optimizer"] is True
    status = {s.key: s.status for s in whole.settings}
    assert status["actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload"] == "mapped"
    default = _import_verl(base, **kw)   # Megatron's default fraction is 1
    assert default.scenario["execution"]["offload"]["actor"]["optimizer"] is True
    part = _import_verl(base + "+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_offload_fraction=0.5", **kw)
    assert part.scenario["execution"]["offload"]["actor"]["optimizer"] is False
    with pytest.raises(Exception) as e:
        _import_verl(base + "+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_offload_fraction=2", **kw)
    assert "optimizer_offload_fraction" in str(e.value) and "\n" not in str(e.value)


def test_an_expert_parallel_rank_reduces_its_own_experts_gradients_over_its_expert_data_parallel_group():
    cost = CostModel.load(H100, "default")
    m = load_model("qwen3-30b-a3b")
    routed = m.moe_layers * m.num_experts * m.expert_params
    dense = m.params("lm") - routed
    act = 2   # bf16 gradients
    # tp 1, dp 32, ep 8: dense gradients over all 32 GPUs, each rank's 1/8 of the experts over the 4 that hold them
    got = cost.optimizer(m, "bfloat16", 1, 32, "lm", True, ep=8)
    adam = cost.optimizer(m, "bfloat16", 1, 32, "lm", True, grad_allreduce=False).total_s
    want = cost.allreduce_s(dense * act, 32, True) + cost.allreduce_s(routed / 8 * act, 4, True)
    assert got.total_s - adam == pytest.approx(want, rel=1e-12)
    # far less than every gradient over the 32 (the pricing before expert parallelism counted)
    assert got.total_s < cost.optimizer(m, "bfloat16", 1, 32, "lm", True).total_s / 3
    # etp 1 under tp 2: a rank holds 1/8 of the experts whole; ep x etp = 8 of 2 x 16 GPUs: an expert group of 4
    two = cost.optimizer(m, "bfloat16", 2, 16, "lm", True, ep=8, etp=1)
    adam2 = cost.optimizer(m, "bfloat16", 2, 16, "lm", True, grad_allreduce=False).total_s
    assert two.total_s - adam2 == pytest.approx(cost.allreduce_s(dense / 2 * act, 16, True)
                                                 + cost.allreduce_s(routed / 8 * act, 4, True), rel=1e-12)
    # context parallelism: its ranks hold the same weights, so the state and the reduction span dp x cp
    cp = cost.optimizer(m, "bfloat16", 1, 16, "lm", True, cp=2)
    assert cp.total_s == pytest.approx(cost.optimizer(m, "bfloat16", 1, 32, "lm", True).total_s, rel=1e-12)
    # a dense model ignores ep (the check refuses it; the price stays the plain one)
    dense_m = load_model("qwen3-32b")
    assert cost.optimizer(dense_m, "bfloat16", 1, 8, "lm", ep=4).total_s == cost.optimizer(dense_m, "bfloat16", 1, 8, "lm").total_s

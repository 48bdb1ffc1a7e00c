"""A generation engine's tensor parallelism beyond one NVLink domain (vLLM at TP 16 or 32 on 8-GPU nodes): the
scenario check, the all-reduces priced over the inter-node link (cost term tp_inter_node) by hand, and the term in
prefill, decode and `rlhfsim explain`."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhfsim.costs import flops as fl
from rlhfsim.costs import terms as T
from rlhfsim.costs.model import LINK_EFF, CostModel
from rlhfsim.errors import ScenarioError
from rlhfsim.hardware.catalog import INTER_NODE_ALLREDUCE_S, get_gpu
from rlhfsim.models.catalog import load_model
from rlhfsim.scenario.loader import load_scenario, parse_set

ROOT = Path(__file__).resolve().parents[2]
MEGATRON = ROOT / "scenarios" / "examples" / "megatron-pp.yaml"   # qwen3-30b-a3b on 2 x 8 H100s
H100 = get_gpu("h100-sxm")


def _load(*sets):
    return load_scenario(MEGATRON, overrides=[parse_set(s) for s in sets])


def _error(*sets) -> str:
    with pytest.raises(ScenarioError) as e:
        _load(*sets)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_generation_tp_may_span_whole_nodes_and_training_tp_may_not():
    assert _load("placement.tp.rollout=16").placement.tp.rollout == 16
    assert _error("placement.tp.rollout=12").startswith("placement.tp.rollout: expected a TP degree dividing")
    msg = _error("cluster.nodes=3", "placement.tp.rollout=12")
    assert msg.startswith("placement.tp.rollout: expected TP within one NVLink domain (<= 8) or whole domains (a multiple of 8")
    assert _error("placement.tp.actor=16", "execution.megatron.actor.pp=1", "execution.megatron.actor.vpp=1").startswith(
        "placement.tp.actor: expected TP within one NVLink domain")


def test_inter_node_all_reduces_by_hand():
    cost = CostModel.load(H100, "default")
    m = load_model("qwen3-30b-a3b")
    nbytes = fl.tp_allreduce_bytes(m, "bfloat16", 32, 16)
    want = nbytes / (H100.inter_node_bw * LINK_EFF) + 2 * m.layers * INTER_NODE_ALLREDUCE_S
    assert cost._tp_comm_s(m, "bfloat16", 32, 16, inter_node=True) == pytest.approx(want)
    # the small-message time dominates a decode step's all-reduces, and is dearer than inside a node
    assert 2 * m.layers * INTER_NODE_ALLREDUCE_S > 0.8 * want
    assert cost._tp_comm_s(m, "bfloat16", 32, 16, inter_node=True) > cost._tp_comm_s(m, "bfloat16", 32, 16)
    assert cost._tp_comm_s(m, "bfloat16", 32, 1, inter_node=True) == 0.0


def test_decode_and_prefill_carry_the_term_and_sum_to_their_price():
    cost = CostModel.load(H100, "default")
    m = load_model("qwen3-30b-a3b")
    far = cost.decoder(m, "bfloat16", 16, "vllm", tp_inter_node=True)
    near = cost.decoder(m, "bfloat16", 16, "vllm")
    p = far.price(64, 64 * 1000, 10)
    t = p.terms()
    assert t[T.TP_INTER_NODE] == pytest.approx(10 * cost._tp_comm_s(m, "bfloat16", 64, 16, inter_node=True))
    assert sum(t.values()) == pytest.approx(p.total_s) and T.TP_INTER_NODE not in near.price(64, 64 * 1000, 10).terms()
    assert p.total_s > near.price(64, 64 * 1000, 10).total_s
    fwd = cost.prefill_step(m, "bfloat16", 4096, 8, 16, "vllm", tp_inter_node=True)
    ft = fwd.terms()
    assert ft[T.TP_INTER_NODE] == pytest.approx(cost._tp_comm_s(m, "bfloat16", 4096, 16, inter_node=True))
    assert sum(ft.values()) == pytest.approx(fwd.total_s) and ft[T.KERNELS] > 0
    assert T.TP_INTER_NODE not in cost.prefill_step(m, "bfloat16", 4096, 8, 16, "vllm").terms()


def test_explain_shows_the_inter_node_all_reduces_in_generation():
    from rlhfsim.sim.explain import explain
    doc = explain(_load("placement.tp.rollout=16", "steps=2", "warmup_steps=1", "workload.prompts_per_step=16", "algorithm.minibatch_size=128"), steps=2)
    gen = doc["phases"]["generate"]["terms_s"]
    assert gen.get(T.TP_INTER_NODE, 0.0) > 0
    near = explain(_load("placement.tp.rollout=8", "steps=2", "warmup_steps=1", "workload.prompts_per_step=16", "algorithm.minibatch_size=128"), steps=2)
    assert T.TP_INTER_NODE not in near["phases"]["generate"]["terms_s"]

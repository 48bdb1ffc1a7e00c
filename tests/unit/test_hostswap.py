"""NeMo RL's host swap (execution.offload.megatron_swap; rlhfsim.costs.hostswap, cost term host_swap): the bytes a GPU
moves over its host link in a colocated step with a Megatron policy worker, counted by hand, and the weight update's
phase carrying exactly that time, off by default."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhfsim.costs import hostswap as H
from rlhfsim.costs import terms as T
from rlhfsim.errors import ScenarioError
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import load_model
from rlhfsim.scenario.loader import load_scenario, parse_set
from rlhfsim.scenario.schema import RoleParallel
from rlhfsim.sim.explain import explain
from rlhfsim.sim.run import simulate

ROOT = Path(__file__).resolve().parents[2]
MOE = ROOT / "scenarios" / "examples" / "moe-qwen3-30b-a3b.yaml"
# Megatron at TP 2, EP 2 on one 8-GPU node, a reference model, a small step (fast)
SMALL = ("placement.tp.actor=2", "execution.sharding=none", "execution.megatron.actor.ep=2",
         "models.reference.model=qwen3-30b-a3b", "placement.tp.reference=2", "execution.megatron.reference.ep=2",
         "workload.prompts_per_step=8", "workload.max_response_tokens=256", "workload.response_length.median=128",
         "workload.response_length.p99=250", "algorithm.minibatch_size=64", "steps=2", "warmup_steps=1")


def _load(*sets):
    return load_scenario(MOE, overrides=[parse_set(s) for s in (*SMALL, *sets)])


def test_rank_bytes_follow_the_megatron_layout():
    m = load_model("qwen3-30b-a3b")
    routed = m.moe_layers * m.num_experts * m.expert_params
    whole = m.params("lm") * 2
    assert H.rank_weight_bytes(m, "bfloat16", 1, RoleParallel()) == whole
    # EP 8: the dense part whole, 1/8 of the routed experts
    assert H.rank_weight_bytes(m, "bfloat16", 1, RoleParallel(ep=8)) == pytest.approx(whole - routed * 2 * 7 / 8, rel=1e-12)
    # TP 2 x PP 2: a quarter of everything
    assert H.rank_weight_bytes(m, "bfloat16", 2, RoleParallel(pp=2)) == pytest.approx(whole / 4, rel=1e-12)


def test_swap_bytes_by_hand():
    m = load_model("qwen3-30b-a3b")
    lay = RoleParallel(ep=8, etp=1)
    w = H.rank_weight_bytes(m, "bfloat16", 1, lay)
    parts = H.swap_parts_bytes(m, "bfloat16", 1, lay, 32, reference=True)
    assert parts == {"params": pytest.approx(2 * w), "optimizer": pytest.approx(2 * 12 * m.params("lm") / 32),
                     "reference": pytest.approx(3 * w)}
    assert H.swap_parts_bytes(m, "bfloat16", 1, lay, 32, reference=False)["reference"] == 0.0
    # Qwen3-30B-A3B at EP 8 on 32 GPUs: about 10 GB of weights a GPU, 11 GB of optimizer state
    assert 9e9 < w < 11e9 and 10e9 < parts["optimizer"] / 2 < 12e9


def test_the_weight_update_phase_carries_the_swap_and_explain_names_it():
    on = simulate(_load("execution.offload.megatron_swap=true"), max_work=0)
    off = simulate(_load(), max_work=0)
    parts = on.summary["weight_sync_parts_s"]
    assert "host_swap_s" not in off.summary["weight_sync_parts_s"]
    m = load_model("qwen3-30b-a3b")
    gpu = get_gpu("h100-sxm")
    w = H.rank_weight_bytes(m, "bfloat16", 2, RoleParallel(ep=2))
    eff = on.summary["step_costs"]["host_copy_eff"]["value"]
    want = (5 * w + 2 * 12 * m.params("lm") / 8) / (gpu.host_link_bw * eff)
    assert parts["host_swap_s"] == pytest.approx(want, rel=1e-9)
    grow = on.summary["phases_s"]["weight_sync"] - off.summary["phases_s"]["weight_sync"]
    assert grow == pytest.approx(parts["host_swap_s"], rel=1e-9)
    doc = explain(_load("execution.offload.megatron_swap=true"), steps=2)
    sync = doc["phases"]["weight_sync"]
    assert sync["terms_s"][T.HOST_SWAP] == pytest.approx(parts["host_swap_s"], rel=1e-9)
    assert sum(sync["terms_s"].values()) == pytest.approx(sync["span_s"], rel=1e-9)
    assert T.HOST_SWAP in doc["terms"]


def test_term_is_registered():
    assert T.term(T.HOST_SWAP.name) is T.HOST_SWAP and T.HOST_SWAP.module == "rlhfsim.costs.hostswap"


def test_only_a_colocated_megatron_step_swaps():
    with pytest.raises(ScenarioError) as e:
        load_scenario(MOE, overrides=[parse_set("execution.offload.megatron_swap=true")])   # MOE is FSDP
    assert str(e.value) == "execution.offload.megatron_swap: expected execution.sharding none (a Megatron worker), got fsdp"
    pools = ('placement={"kind": "pools", "tp": {"actor": 2, "reference": 2, "rollout": 4}, "pools": [{"name": "t", '
             '"gpus": 4, "roles": ["actor", "reference"]}, {"name": "g", "gpus": 4, "roles": ["rollout"]}]}')
    with pytest.raises(ScenarioError) as e:
        _load(pools, "execution.weight_sync.kind=nccl", "execution.offload.megatron_swap=true")
    assert str(e.value).startswith("execution.offload.megatron_swap: expected generation on the actor's pool")


@pytest.mark.parametrize("kind", ["copy", "reshard"])
def test_the_swap_is_paid_whatever_the_updates_kind(kind):
    """The host swap is the Megatron worker's, not the update's: a plain device copy (kind copy) pays it as reshard does."""
    on = explain(_load(f"execution.weight_sync.kind={kind}", "execution.offload.megatron_swap=true"), steps=2)
    off = explain(_load(f"execution.weight_sync.kind={kind}"), steps=2)
    swap = on["phases"]["weight_sync"]["terms_s"][T.HOST_SWAP]
    assert swap > 0
    grow = on["phases"]["weight_sync"]["span_s"] - off["phases"]["weight_sync"]["span_s"]
    assert grow == pytest.approx(swap, rel=1e-9)
    assert sum(on["phases"]["weight_sync"]["terms_s"].values()) == pytest.approx(on["phases"]["weight_sync"]["span_s"],
                                                                                rel=1e-9)

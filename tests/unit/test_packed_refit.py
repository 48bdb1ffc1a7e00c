"""NeMo RL's separate-pool refit (execution.weight_sync.packed): the gather by Megatron-Bridge's hops, the bucketed
broadcast, and the three stages as a pipeline over the buckets (CostModel.packed_sync_parts)."""

from __future__ import annotations

import math

import pytest

from conftest import make_dict
from rlhfsim.costs import terms as T
from rlhfsim.costs.model import LINK_EFF, LINK_LATENCY_S, REFIT_BUCKET_MAX_BYTES, REFIT_BUCKET_MEM_FRAC, CostModel
from rlhfsim.costs.parallel import Layout
from rlhfsim.errors import ScenarioError
from rlhfsim.hardware.catalog import GPUS
from rlhfsim.models.catalog import CATALOG
from rlhfsim.scenario import load_scenario
from rlhfsim.scenario.checks import build_setup
from rlhfsim.sim.explain import explain

H100 = GPUS["h100-sxm"]
DSV3 = CATALOG["deepseek-v3"]
SMALL = CATALOG["qwen2.5-0.5b"]   # 1 GB of bf16 weights: one bucket on an 80 GB card
MID = CATALOG["qwen2.5-7b"]       # 15 GB: about ten


def _buckets(m, gpu) -> int:
    w = m.params("lm") * 2
    return math.ceil(w / min(REFIT_BUCKET_MEM_FRAC * gpu.mem_bytes, REFIT_BUCKET_MAX_BYTES))


def test_the_slowest_stage_whole_the_others_one_bucket():
    cost = CostModel.load(H100)
    serial = cost.nccl_sync_parts(MID, "bfloat16", 8, True, 1, True)
    packed = cost.packed_sync_parts(MID, "bfloat16", None, 8, True, 1, True)
    b = _buckets(MID, H100)
    assert b > 1
    slowest = max(serial, key=serial.get)
    for k, v in serial.items():
        assert packed[k] == pytest.approx(v if k == slowest else v / b, rel=1e-12)
    assert sum(packed.values()) < sum(serial.values())
    assert sum(packed.values()) >= max(serial.values())
    # weights within one bucket: nothing to overlap, the three one after the other
    assert _buckets(SMALL, H100) == 1
    one = cost.packed_sync_parts(SMALL, "bfloat16", None, 8, True, 1, True)
    assert one == cost.nccl_sync_parts(SMALL, "bfloat16", 8, True, 1, True)


def test_megatron_gather_by_hop_and_link():
    cost = CostModel.load(H100)
    w = DSV3.params("lm") * 2
    w_e = DSV3.moe_layers * DSV3.num_experts * DSV3.expert_params * 2
    w_d = w - w_e
    lay = Layout(tp=1, pp=16, vpp=1, cp=1, ep=16, pool_gpus=256, gpus_per_node=8, spans_nodes=True, etp=1)
    bw = H100.inter_node_bw * LINK_EFF
    pp_hop = (w_d + w_e / 16) * 15 / 16 / bw + LINK_LATENCY_S
    ep_hop = w_e * 15 / 16 / bw + LINK_LATENCY_S   # 16 GPUs: two 8-GPU nodes
    full = cost.packed_sync_parts(DSV3, "bfloat16", lay, 256, True, 32, True)
    b = _buckets(DSV3, H100)
    gather = full["gather_s"] * (1 if max(full, key=full.get) == "gather_s" else b)
    assert gather == pytest.approx(pp_hop + ep_hop, rel=1e-9)
    # experts inside one node: the expert all-gather crosses NVLink and the gather is faster
    lay8 = Layout(tp=1, pp=16, vpp=1, cp=1, ep=8, pool_gpus=256, gpus_per_node=8, spans_nodes=True, etp=1)
    g8 = cost.packed_sync_parts(DSV3, "bfloat16", lay8, 256, True, 32, True)["gather_s"] * b
    assert g8 < gather
    # the refit is about one pass of the whole weights over the inter-node link, not two
    t = sum(full.values())
    assert w / bw < t < 1.1 * w / bw


def _pools(packed: bool, kind: str = "nccl") -> dict:
    d = make_dict("gpu", {"execution": {"weight_sync": {"kind": kind, "packed": packed}}})
    d["models"]["actor"]["model"] = "qwen2.5-7b"   # weights over several buckets
    d["placement"] = {"kind": "pools", "pools": [
        {"name": "train", "gpus": 2, "roles": ["actor", "critic", "reference"]},
        {"name": "gen", "gpus": 1, "roles": ["rollout"]}, {"name": "rm", "gpus": 1, "roles": ["reward"]}]}
    d["cluster"] = {"gpu": "a100-80gb", "nodes": 2, "gpus_per_node": 2}
    return d


def test_explain_terms_sum_to_the_shorter_span():
    docs = {p: explain(load_scenario(_pools(p)), steps=3) for p in (False, True)}
    span = {p: docs[p]["phases"]["weight_sync"]["span_s"] for p in docs}
    assert span[True] < span[False]
    terms = docs[True]["phases"]["weight_sync"]["terms_s"]
    parts = docs[True]["weight_sync_parts_s"]
    assert terms[T.POOL_WEIGHT_TRANSFER] == pytest.approx(parts["broadcast_s"], rel=1e-12)
    assert sum(terms.values()) == pytest.approx(span[True], rel=1e-9)


def test_packed_needs_nccl():
    with pytest.raises(ScenarioError) as e:
        build_setup(load_scenario(_pools(True, kind="copy")))
    assert e.value.path == "execution.weight_sync.packed"


def test_a_plan_searching_shared_pools_drops_packed(tmp_path):
    """The search's colocated and copy placements leave nccl, so they leave its bucketed form too (a scenario with
    packed and another kind is refused)."""
    import yaml

    from rlhfsim.plan import load_plan
    from test_parallel_search import BASE

    base = {**BASE, "placement": {"kind": "pools", "tp": {"actor": 1, "reference": 1, "rollout": 2}, "pools": [
        {"name": "train", "gpus": 8, "roles": ["actor", "reference"]}, {"name": "gen", "gpus": 8, "roles": ["rollout"]}]},
        "execution": {**BASE["execution"], "weight_sync": {"kind": "nccl", "packed": True}}}
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump({"base": base, "search": {"parallelism": {
        "actor": {"ep": [8]}, "pools": ["colocated", {"generation_gpus": 8, "weight_sync": "copy"},
                                         {"generation_gpus": 8, "weight_sync": "nccl"}]}}}, sort_keys=False))
    plan = load_plan(p)
    seen = []
    for c in plan.configs:
        ws = c.scenario.execution.weight_sync
        build_setup(c.scenario)
        seen.append((c.values["pools"], ws.kind, ws.packed))
    assert sorted(seen) == [("base", "nccl", True), ("colocated", "reshard", False), ("split 8 gen", "copy", False),
                            ("split 8 gen", "nccl", True)], seen

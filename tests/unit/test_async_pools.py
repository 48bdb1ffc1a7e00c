"""Disaggregated async pools: the weight transfer between a training pool and a generation pool (the term
pool_weight_transfer: its link, its bytes, nothing when the pools are shared), ``execution.weight_sync.kind: nccl`` as
verl's one_step_off and fully_async recipes run it, and the staleness an async schedule reaches for k = 1..8."""

from __future__ import annotations

import copy

import pytest

from conftest import make_dict
from rlhfsim.costs import terms as T
from rlhfsim.costs.model import LINK_EFF, LINK_LATENCY_S, CostModel
from rlhfsim.errors import ScenarioError
from rlhfsim.hardware.catalog import GPUS
from rlhfsim.models.catalog import CATALOG
from rlhfsim.scenario import load_scenario
from rlhfsim.scenario.checks import build_setup, pools_span_nodes
from rlhfsim.sim.explain import explain
from rlhfsim.sim.run import simulate

GPU = GPUS["a100-80gb"]
SHAPE = CATALOG["qwen2.5-0.5b"]


def _pools(train: int, gen: int, per_node: int, kind: str = "nccl", gen_first: bool = False) -> dict:
    """GPU_SMALL (tests/conftest.py) on ``train`` + ``gen`` + 1 (the reward model) GPUs, ``per_node`` a node."""
    pools = [{"name": "train", "gpus": train, "roles": ["actor", "critic", "reference"]},
             {"name": "gen", "gpus": gen, "roles": ["rollout"]}]
    if gen_first:
        pools.reverse()
    pools.append({"name": "rm", "gpus": 1, "roles": ["reward"]})
    total = train + gen + 1
    d = make_dict("gpu", {"execution": {"weight_sync": {"kind": kind}}})
    d["placement"] = {"kind": "pools", "pools": pools}
    d["cluster"] = {"gpu": "a100-80gb", "nodes": -(-total // per_node), "gpus_per_node": per_node}
    return d


def _cost() -> CostModel:
    return CostModel.load(GPU)


def test_transfer_is_the_whole_weights_over_the_link():
    cost = _cost()
    w = SHAPE.params("lm") * 2   # bfloat16
    intra = cost.pool_transfer_s(SHAPE, "bfloat16", inter_node=False)
    inter = cost.pool_transfer_s(SHAPE, "bfloat16", inter_node=True)
    assert intra == pytest.approx(w / (GPU.intra_node_bw * LINK_EFF) + LINK_LATENCY_S, rel=1e-12)
    assert inter == pytest.approx(w / (GPU.inter_node_bw * LINK_EFF) + LINK_LATENCY_S, rel=1e-12)
    assert inter > intra   # the inter-node link is the slower one in the catalog
    # float32 weights are twice the bytes
    assert cost.pool_transfer_s(SHAPE, "float32", False) - LINK_LATENCY_S == pytest.approx(2 * (intra - LINK_LATENCY_S))


def test_link_choice_by_the_nodes_the_two_pools_span():
    # 2 + 1 + 1 on one 4-GPU node: NVLink; on 2-GPU nodes the gen pool (GPU 2) is on the second node
    one = build_setup(load_scenario(_pools(2, 1, per_node=4)))
    two = build_setup(load_scenario(_pools(2, 1, per_node=2)))
    a, r = one.pool_of("actor"), one.pool_of("rollout")
    assert not pools_span_nodes(a, r, 4)
    a2, r2 = two.pool_of("actor"), two.pool_of("rollout")
    assert not a2.spans_nodes and not r2.spans_nodes   # neither pool spans nodes alone...
    assert pools_span_nodes(a2, r2, 2)                 # ...but the transfer between them does


def _sync_terms(d: dict) -> dict:
    doc = explain(load_scenario(d), steps=3)
    return doc["phases"]["weight_sync"]["terms_s"], doc


def test_nccl_parts_and_terms():
    d = _pools(2, 1, per_node=2)   # the two pools on different nodes
    terms, doc = _sync_terms(d)
    cost = _cost()
    parts = doc["weight_sync_parts_s"]
    assert parts["broadcast_s"] == pytest.approx(cost.pool_transfer_s(SHAPE, "bfloat16", inter_node=True), rel=1e-12)
    assert terms[T.POOL_WEIGHT_TRANSFER] == pytest.approx(parts["broadcast_s"], rel=1e-12)
    assert terms[T.WEIGHT_SYNC] == pytest.approx(parts["gather_s"] + parts["load_s"], rel=1e-9)
    assert sum(terms.values()) == pytest.approx(doc["phases"]["weight_sync"]["span_s"], rel=1e-9)
    assert T.POOL_WEIGHT_TRANSFER in doc["terms"]
    # the same pools inside one node cross NVLink: faster
    terms1, _ = _sync_terms(_pools(2, 1, per_node=4))
    assert terms1[T.POOL_WEIGHT_TRANSFER] < terms[T.POOL_WEIGHT_TRANSFER]


def test_copy_to_a_separate_pool_is_the_transfer_term():
    terms, doc = _sync_terms(_pools(2, 1, per_node=4, kind="copy"))
    cost = _cost()
    expect = cost.weight_sync_s(SHAPE, "bfloat16", 1, inter_node=False, same_pool=False)
    assert terms[T.POOL_WEIGHT_TRANSFER] == pytest.approx(expect, rel=1e-12)
    assert not terms.get(T.WEIGHT_SYNC)


@pytest.mark.parametrize("kind", ["copy", "reshard"])
def test_no_transfer_when_the_pools_are_shared(kind):
    d = make_dict("colocated", {"execution": {"weight_sync": {"kind": kind}}})
    terms, _ = _sync_terms(d)
    assert not terms.get(T.POOL_WEIGHT_TRANSFER)
    assert terms[T.WEIGHT_SYNC] > 0


def test_nccl_needs_a_generation_pool_of_its_own():
    d = make_dict("colocated", {"execution": {"weight_sync": {"kind": "nccl"}}})
    with pytest.raises(ScenarioError) as e:
        build_setup(load_scenario(d))
    assert e.value.path == "execution.weight_sync.kind"


def _async(k: int, gen: int = 1) -> dict:
    d = _pools(2, gen, per_node=8)
    d["schedule"] = {"kind": "async", "max_staleness": k}
    d["steps"], d["warmup_steps"] = 12, 0
    return d


@pytest.mark.parametrize("k", range(1, 9))
def test_staleness_reached_never_exceeds_k(k):
    s = simulate(load_scenario(_async(k))).summary["schedule_stats"]
    hist = {int(x): n for x, n in s["staleness_hist"].items()}
    assert s["staleness_max"] == max(hist) <= k
    assert s["staleness_mean"] == pytest.approx(sum(x * n for x, n in hist.items()) / sum(hist.values()))
    assert min(hist) == 0   # the first batch is generated by the first policy


def test_staleness_reached_grows_with_k_when_training_is_the_bottleneck():
    # one generation GPU per training GPU against a 0.5B actor: generation outruns training, so the queue fills
    # to k and the steady batches are k steps old: the bound binds
    reached = []
    for k in (1, 2, 4, 8):
        d = _async(k, gen=2)
        d["workload"]["response_length"] = {"kind": "fixed", "value": 16}
        d["workload"]["max_response_tokens"] = 16
        d["steps"] = 3 * k + 4
        s = simulate(load_scenario(d)).summary["schedule_stats"]
        reached.append(s["staleness_max"])
    assert reached == [1, 2, 4, 8]


def test_staleness_beyond_the_schema_bound_names_its_path():
    d = _async(1)
    d["schedule"]["max_staleness"] = -1
    with pytest.raises(ScenarioError) as e:
        load_scenario(copy.deepcopy(d))
    assert "schedule" in e.value.path


def test_simulate_prints_the_staleness_reached(tmp_path):
    import yaml
    from click.testing import CliRunner

    from rlhfsim.cli import main

    path = tmp_path / "async.yaml"
    path.write_text(yaml.safe_dump(_async(2)))
    out = CliRunner().invoke(main, ["simulate", str(path), "--steps", "6"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    line = next(ln for ln in out.output.splitlines() if ln.startswith("staleness reached"))
    st = simulate(load_scenario(_async(2)), steps=6).summary["schedule_stats"]
    assert st["staleness_max"] >= 1
    assert f"mean {st['staleness_mean']:.2f}, max {st['staleness_max']} steps" in line
    sync = tmp_path / "sync.yaml"
    sync.write_text(yaml.safe_dump(_pools(2, 1, per_node=8)))
    out = CliRunner().invoke(main, ["simulate", str(sync), "--steps", "3"], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "staleness reached" not in out.output

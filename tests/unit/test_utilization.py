"""Busy and active GPU utilization, and training priced per data-parallel rank.

busy: per GPU, the union of its intervals; active: per GPU, the sum of its intervals' kernel seconds
(clipped to the window in proportion), capped by its busy time. Both as fractions of the pool's GPU-time.
Expected values are composed by hand from the cost model's parts.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest

from rlhfsim.costs.model import CostModel
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.scenario import load_scenario
from rlhfsim.scenario.checks import build_setup
from rlhfsim.sim import stages
from rlhfsim.sim.recorder import Interval
from rlhfsim.sim.rollouts import Rollout
from rlhfsim.sim.run import compare, simulate
from rlhfsim.sim.schedules import SCHEDULES
from rlhfsim.sim.simulation import Simulation, gpu_busy_active, pool_utilization

# Generation, scoring and training on pools of their own, so each pool's utilization shows one kind of work.
SEPARATE = {"kind": "pools", "pools": [
    {"name": "gen", "gpus": 1, "roles": ["rollout"]},
    {"name": "train", "gpus": 2, "roles": ["actor", "critic", "reference"]},
    {"name": "rm", "gpus": 1, "roles": ["reward"]},
]}


def _profile(**ops) -> dict:
    """The bundled default profile with operation parameters replaced: ``train={"overhead_s": 1.0}``, without
    its framework section (these tests check the roofline's active/busy split, not the host's dispatch)."""
    doc = copy.deepcopy(CostModel.load(get_gpu("a100-80gb"), "default").profile)   # the datasheet-derived profile
    doc.pop("framework", None)
    for op, values in ops.items():
        doc["operations"][op].update(values)
    return doc


def _zero_overheads() -> dict:
    # Every operation, the generation runtimes' own prefill:RT/decode:RT included.
    ops = CostModel.load(get_gpu("a100-80gb"), "default").profile["operations"]
    doc = _profile(**{op: {"overhead_s": 0.0, "overhead_per_layer_s": 0.0} for op in ops})
    doc["generation"] = {}  # no call overhead, no chunk handoff
    return doc


@pytest.fixture(scope="module")
def separate(scenario_dict):
    """The small GPU scenario (A100s) on separate pools, under ``schedule``, top-level keys replaced."""
    def make(schedule: str = "sync", **over) -> dict:
        d = scenario_dict("gpu", schedule=schedule)
        assert d["cluster"]["gpu"] == "a100-80gb"
        d["placement"] = copy.deepcopy(SEPARATE)
        d.update(over)
        return d

    return make


def _run(d: dict, profile: dict | None = None, steps: int = 4):
    sc = load_scenario(d)
    cost = CostModel(build_setup(sc).gpu, profile if profile is not None else _profile())
    return simulate(sc, steps=steps, cost=cost)


# --- the definition, on hand-made intervals ---------------------------------------------------------

def test_gpu_busy_active_unions_busy_and_caps_active():
    assert gpu_busy_active([]) == (0.0, 0.0)
    # Disjoint: busy adds up, active adds up.
    assert gpu_busy_active([(0.0, 1.0, 0.5), (2.0, 4.0, 1.5)]) == (3.0, 2.0)
    # Overlapping [0, 3] and [1, 2]: busy is the union (3 s); active 2.5 + 1 = 3.5 capped at 3.
    assert gpu_busy_active([(0.0, 3.0, 2.5), (1.0, 2.0, 1.0)]) == (3.0, 3.0)
    # Overlapping, under the cap: active is the plain sum.
    assert gpu_busy_active([(1.0, 2.0, 0.25), (0.0, 3.0, 1.0)]) == (3.0, 1.25)


def test_pool_utilization_clips_active_in_proportion_to_the_window():
    rec = SimpleNamespace(intervals=[
        Interval(0, "p", 0, 2, "actor", "actor_train", 0.0, 4.0, 2.0),   # both GPUs, half active
        Interval(0, "p", 1, 1, "rollout", "generate", 5.0, 7.0),         # GPU 1, active_s None: all of it
        Interval(0, "cpu", 0, 1, "reward", "reward", 0.0, 10.0, 0.0),   # not a GPU pool: ignored
    ])
    sim = SimpleNamespace(rec=rec, locks={"p": None}, setup=SimpleNamespace(pools=[SimpleNamespace(name="p", gpus=2)]))
    busy, active = pool_utilization(sim, 2.0, 6.0)
    # Window [2, 6] (4 s x 2 GPUs = 8 GPU-s). GPU 0: train [2, 4] busy 2 s, active 2.0 x 2/4 = 1 s.
    # GPU 1: the same plus generate [5, 6]: busy 3 s, active 1 + 1 = 2 s.
    assert busy == {"p": pytest.approx(5.0 / 8.0)}
    assert active == {"p": pytest.approx(3.0 / 8.0)}


# --- summaries ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_summary_has_busy_and_active_with_active_at_most_busy(schedule, separate):
    s = _run(separate(schedule)).summary
    assert s["gpu_busy"] == s["gpu_utilization"]
    assert set(s["gpu_busy"]) == set(s["gpu_active"]) == {"gen", "train", "rm"}
    for pool, busy in s["gpu_busy"].items():
        assert 0.0 < s["gpu_active"][pool] <= busy + 1e-12 <= 1.0 + 1e-12, pool


def test_compare_rows_carry_busy_and_active(separate):
    out, results = compare(load_scenario(separate()), ["sync", "oppo"], steps=3)
    for name, row in out["variants"].items():
        assert row["gpu_busy"] == results[name].summary["gpu_busy"] == row["gpu_utilization"]
        assert row["gpu_active"] == results[name].summary["gpu_active"]


def test_zero_overheads_make_active_equal_busy(separate):
    # Every cost is kernel time (communication counts as active), so every interval is all active.
    s = _run(separate("oppo"), _zero_overheads()).summary
    for pool, busy in s["gpu_busy"].items():
        assert s["gpu_active"][pool] == pytest.approx(busy, rel=1e-9), pool


def test_training_overheads_leave_the_train_pool_busy_but_not_active(separate):
    base = _run(separate()).summary
    slow = _run(separate(), _profile(train={"overhead_s": 2.0}, prefill={"overhead_s": 0.5})).summary
    assert slow["gpu_active"]["train"] < 0.5 * slow["gpu_busy"]["train"]
    # the datasheet profile carried to the A100 (catalog.carried_compute_eff): its kernels are short enough that the
    # fixed overheads are a fifth of the busy time (0.78 active)
    assert base["gpu_active"]["train"] > 0.7 * base["gpu_busy"]["train"]


def test_large_decode_overhead_makes_generation_mostly_inactive(separate):
    res = _run(separate(), _profile(decode={"overhead_s": 0.05}))
    if all(iv.active_s is None for iv in res.intervals if iv.phase == "generate"):
        pytest.skip("generation does not record active_s yet (rlhfsim/sim/generation.py)")
    s = res.summary
    assert s["gpu_active"]["gen"] < 0.5 * s["gpu_busy"]["gen"]


def test_rule_reward_has_no_gpu_active_time(separate):
    d = separate()
    d["models"]["reward"] = {"kind": "rule", "workers": 4, "cpu_s_per_sample": 0.01}
    d["placement"]["pools"] = [p for p in d["placement"]["pools"] if p["name"] != "rm"]
    d["cluster"]["gpus_per_node"] = 3
    res = _run(d)
    cpu = [iv for iv in res.intervals if iv.pool == "cpu"]
    assert cpu and all(iv.active == 0.0 for iv in cpu)
    assert "cpu" not in res.summary["gpu_active"]


def test_weight_sync_is_all_active(separate):
    res = _run(separate())
    syncs = [iv for iv in res.intervals if iv.phase == "weight_sync"]
    assert syncs and all(iv.active == pytest.approx(iv.end_s - iv.start_s, rel=1e-12) for iv in syncs)


@pytest.mark.parametrize("runtime, placement, copied", [
    ("hf_generate", None, False),        # TRL: generate() on the trained policy itself, same GPUs
    ("hf_static", None, False),
    ("kv_decoder", None, True),          # a decoder holding its own copy of the weights
    ("hf_generate", SEPARATE, True),     # generation on other GPUs: the weights still travel
])
def test_weight_sync_copies_only_when_generation_holds_other_weights(scenario_dict, runtime, placement, copied):
    d = scenario_dict("colocated")
    d["generation"] = {**d["generation"], "engine": "static", "runtime": runtime}
    if placement is not None:
        d["placement"] = copy.deepcopy(placement)
    syncs = [iv for iv in _run(d, steps=2).intervals if iv.phase == "weight_sync"]
    assert len(syncs) == 2
    assert all((iv.end_s - iv.start_s > 0) == copied for iv in syncs)


# --- training priced per rank, forward passes per replica --------------------------------------------

def _sim(d: dict) -> Simulation:
    setup = build_setup(load_scenario(d))
    return Simulation(setup, CostModel(setup.gpu, _profile()))


def _rows(lengths: list[tuple[int, int]]) -> list[Rollout]:
    return [Rollout(i, p, r) for i, (p, r) in enumerate(lengths)]


def test_each_rank_pads_to_its_own_longest_row(separate):
    # 2 ranks (train pool of 2 GPUs, TP 1), one minibatch of 3 rows, one of them long. The shuffle deals
    # order[0] and order[2] to rank 0, order[1] to rank 1; put the long row at order[1].
    d = separate(algorithm={"kind": "ppo", "ppo_epochs": 1, "minibatch_size": 3})
    sim = _sim(d)
    order = np.random.default_rng([sim.seed, 2]).permutation(3)  # the sim's shuffle stream, unused so far
    lengths = [(16, 40)] * 3
    lengths[order[1]] = (16, 900)
    rows = _rows(lengths)
    cost, s = sim.cost, sim.setup
    m, dt = s.shapes["actor"], s.dtypes["actor"]
    opt, opt_active = cost.optimizer(m, dt, 1, 2, "lm", False)
    rank0 = cost.train(m, dt, 2 * 56, 2, 1, "lm")    # two short rows, padded to 56
    rank1 = cost.train(m, dt, 1 * 916, 1, 1, "lm")   # the long row alone
    sim.env.process(stages.train(sim.env, sim, 0, "actor", rows))
    sim.env.run()
    want = max(rank0[0], rank1[0]) + opt
    assert sim.env.now == pytest.approx(want, rel=1e-12)
    # Pricing both ranks with the global longest row (2 rows of 916 each) would cost more.
    assert want < cost.train(m, dt, 2 * 916, 2, 1, "lm").total_s + opt
    (iv,) = [iv for iv in sim.rec.intervals if iv.phase == "actor_train"]
    assert (iv.gpu0, iv.n_gpus, iv.start_s, iv.end_s) == (0, 2, 0.0, sim.env.now)
    slowest = max(rank0, rank1, key=tuple)
    # Active: the slowest rank's kernels and the optimizer's; the other rank waits inside the all-reduce.
    assert iv.active_s == pytest.approx(slowest[1] + opt_active, rel=1e-12)


def test_equal_ranks_with_one_long_row_wait_for_it(separate):
    # 4 rows over 2 ranks (2 each): the long row's rank pads its short row to it; the other rank does not.
    d = separate(algorithm={"kind": "ppo", "ppo_epochs": 1, "minibatch_size": 4})
    sim = _sim(d)
    order = np.random.default_rng([sim.seed, 2]).permutation(4)
    lengths = [(16, 40)] * 4
    lengths[order[0]] = (16, 900)  # rank 0 gets order[0] and order[2]
    cost, s = sim.cost, sim.setup
    m, dt = s.shapes["actor"], s.dtypes["actor"]
    opt, opt_active = cost.optimizer(m, dt, 1, 2, "lm", False)
    long_rank = cost.train(m, dt, 2 * 916, 2, 1, "lm")
    short_rank = cost.train(m, dt, 2 * 56, 2, 1, "lm")
    sim.env.process(stages.train(sim.env, sim, 0, "actor", _rows(lengths)))
    sim.env.run()
    assert sim.env.now == pytest.approx(long_rank[0] + opt, rel=1e-12)
    assert short_rank[0] < long_rank[0]
    (iv,) = [iv for iv in sim.rec.intervals if iv.phase == "actor_train"]
    assert iv.active_s == pytest.approx(long_rank[1] + opt_active, rel=1e-12)
    assert iv.active_s < iv.end_s - iv.start_s  # the host overheads of one train call and one optimizer step


def test_forward_pass_pads_per_replica_micro_batch(separate):
    # The reference on the 2-GPU train pool: 2 replicas, rows dealt round-robin, micro-batches of max_batch
    # (8) within a replica, each padded to its own longest row.
    sim = _sim(separate())
    lengths = [(16, 900), (16, 40), (16, 40), (16, 40)]  # replica 0: rows 0, 2; replica 1: rows 1, 3
    cost, s = sim.cost, sim.setup
    m, dt = s.shapes["reference"], s.dtypes["reference"]
    kw = dict(op="prefill", runtime=sim.forward_runtime("reference"), head=s.head("reference"), all_logits=True)
    rep0 = cost.forward(m, dt, 2 * 916, 2, 1, **kw)
    rep1 = cost.forward(m, dt, 2 * 56, 2, 1, **kw)
    sim.env.process(stages.forward_pass(sim.env, sim, 0, "reference", _rows(lengths)))
    sim.env.run()
    ivs = sorted((iv for iv in sim.rec.intervals if iv.phase == "reference"), key=lambda iv: iv.gpu0)
    assert [iv.end_s - iv.start_s for iv in ivs] == [pytest.approx(rep0[0]), pytest.approx(rep1[0])]
    assert [iv.active_s for iv in ivs] == [pytest.approx(rep0[1]), pytest.approx(rep1[1])]
    assert sim.env.now == pytest.approx(rep0[0])

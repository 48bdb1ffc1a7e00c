"""A generation shared across KV capacities (rlhfsim.plan.fastpath.share, the demands a continuous engine records:
rlhfsim.sim.engines.continuous): a generation covers exactly the capacities its demands allow, and what the fast path
prices from a generation simulated at another capacity equals ``simulate()`` of the configuration itself."""

from __future__ import annotations

import copy
import dataclasses
from collections import defaultdict, deque

import pytest
import yaml

from rlhfsim.costs.model import CostModel
from rlhfsim.costs.profile import default_profile_for, load_profile
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.plan import fastpath as fp
from rlhfsim.plan import load_plan, run_plan
from rlhfsim.scenario.checks import build_setup
from rlhfsim.scenario.loader import load_scenario
from rlhfsim.sim.engines.base import Engine
from rlhfsim.sim.run import simulate

from test_parallel_search import BASE, SEARCH

SMALL = {
    "name": "kv-small",
    "models": {"actor": {"model": "qwen2.5-0.5b"}, "reference": {"model": "qwen2.5-0.5b"}, "reward": {"kind": "rule"}},
    "cluster": {"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 8},
    "placement": {"kind": "colocated", "tp": {"actor": 1, "reference": 1, "rollout": 2}},
    "algorithm": {"kind": "grpo", "group_size": 4, "minibatch_size": 16},
    "workload": {"prompts_per_step": 8, "prompt_length": {"kind": "normal", "mean": 128, "std": 32},
                 "response_length": {"kind": "lognormal", "median": 300, "p99": 900},
                 "max_prompt_tokens": 256, "max_response_tokens": 1024},
    "generation": {"engine": "continuous", "runtime": "vllm", "max_batch": 64},
    "schedule": {"kind": "sync"},
    "steps": 3, "warmup_steps": 1, "seed": 0,
    "execution": {"old_log_prob": True},
}


def _cost():
    return CostModel(get_gpu("h100-sxm"), load_profile(default_profile_for("h100-sxm")))


def _same(a: fp.Generation, b: fp.Generation) -> bool:
    return (a.gen_s == b.gen_s and a.generated == b.generated
            and [[(r.id, r.prompt_len, r.response_len) for r in rs] for rs in a.rows]
            == [[(r.id, r.prompt_len, r.response_len) for r in rs] for rs in b.rows])


@pytest.mark.parametrize("path", ["detached", "token-budget", "prefix-caching", "event-clock", "watermark",
                                  "watermark-event-clock"])
def test_a_generation_covers_exactly_the_capacities_its_demands_allow(path, monkeypatch):
    """The four ways a continuous replica runs (``plan``'s own loop; ``_run`` on the deferred clock with a token budget
    and chunked prefill, or with prefix caching; ``_run`` on the event clock): simulated at a capacity it covers, the
    generation is the same bit for bit; the smallest such capacity is the bound itself (one token less is not covered),
    and below it the capacity changes the generation. ``watermark``: long prompts and short answers, the cache's peak
    at an admission, so that the admission rule under the watermark sets the bound, not the decode segments."""
    doc = copy.deepcopy(SMALL)
    if path.startswith("watermark"):
        doc["workload"].update(prompt_length={"kind": "normal", "mean": 1800, "std": 100}, max_prompt_tokens=2560,
                               response_length={"kind": "lognormal", "median": 8, "p99": 40})
    if path == "token-budget":
        doc["generation"].update(max_num_batched_tokens=512, chunked_prefill=True)
    elif path == "prefix-caching":
        doc["generation"]["prefix_caching"] = True
    if path.endswith("event-clock"):
        monkeypatch.setattr(Engine, "DETACH", False)
    s, cost = build_setup(load_scenario(doc)), _cost()
    top = fp.simulate_generation(dataclasses.replace(s, kv_capacity_tokens=10**7), cost)
    assert 0 < top.kv_need <= top.kv_room < 10**7
    lowest = next(c for c in range(top.kv_room, 3 * top.kv_room) if top.covers(c))
    assert lowest >= top.kv_room and fp.kv_limits(lowest)[1] >= top.kv_need and not top.covers(lowest - 1)
    assert (lowest > top.kv_room) == path.startswith("watermark")   # which rule sets the bound
    covered, below = [lowest, lowest + 1, lowest + 97, 2 * lowest, 10**6], [lowest - 1, lowest - 40, lowest // 2]
    for c in covered:
        gen = fp.simulate_generation(dataclasses.replace(s, kv_capacity_tokens=c), cost)
        assert top.covers(c) and _same(gen, top), c
        assert (gen.kv_need, gen.kv_room) == (top.kv_need, top.kv_room)   # the same decisions, the same demands
    changed = 0
    for c in below:
        assert not top.covers(c)
        gen = fp.simulate_generation(dataclasses.replace(s, kv_capacity_tokens=c), cost)
        changed += not _same(gen, top)
        # a run the capacity constrained covers its own capacity only
        assert gen.covers(c) and not gen.covers(c + 1) and not gen.covers(10**7)
    # the bound is sufficient, not necessary: one token below it a refused admission can still land on the same step
    # (the watermark case under today's prices), so only half the cache is sure to change the generation
    assert changed >= 1


def test_a_static_engine_records_no_demand():
    doc = copy.deepcopy(SMALL)
    doc["generation"] = {"engine": "static", "runtime": "hf_generate", "max_batch": 64}
    s = build_setup(load_scenario(doc))
    gen = fp.simulate_generation(s, _cost())
    assert (gen.kv_need, gen.kv_room) == (0, 0) and gen.covers(1) and gen.covers(10**9)


def test_priced_rows_across_capacities_equal_the_full_simulation(tmp_path):
    """A search whose layouts leave the engine different KV capacities (a small cache fraction so that some are below
    the demands): each generation group's largest capacity covers some members at smaller capacities, the rest get
    generations of their own; rows priced from a generation simulated at another capacity, and the others, equal
    ``simulate()`` of their own scenario to 1e-9 relative."""
    base = copy.deepcopy(BASE)
    base["generation"]["kv_cache_fraction"] = 0.003
    p = tmp_path / "plan-kv.yaml"
    p.write_text(yaml.safe_dump({"base": base, "search": {"parallelism": SEARCH}}, sort_keys=False))
    plan = load_plan(p)
    cost = CostModel(get_gpu("h100-sxm"), plan.profiles["h100-sxm"])
    groups = defaultdict(list)
    for c in plan.configs:
        if c.scenario is not None:
            s = build_setup(c.scenario)
            if fp.eligible(s, cost) is None:
                groups[fp.generation_key(s)].append((c, s))
    pairs = {(k, s.kv_capacity_tokens) for k, g in groups.items() for _, s in g}
    shared = [(gen, members) for g in groups.values() for gen, members in fp.share(g, cost)]
    assert len(groups) < len(shared) < len(pairs)   # some capacities shared, some below the demands
    across = [(gen, c, s) for gen, m in shared for c, s in m if s.kv_capacity_tokens != gen.capacity]
    alone = [(gen, m[0][0], m[0][1]) for gen, m in shared if {s.kv_capacity_tokens for _, s in m} == {gen.capacity}]
    assert len(across) >= 4 and len(alone) >= 2
    for gen, c, s in across[::max(len(across) // 4, 1)][:4] + alone[:2]:
        full = simulate(c.scenario, cost=cost).summary
        m = fp.metrics(gen, s, cost)
        assert m["step_time_s"] == pytest.approx(full["step_time_s"], rel=1e-9)
        assert m["phases_s"]["generate"] == pytest.approx(full["phases_s"]["generate"], rel=1e-9)
    o = run_plan(plan, out=tmp_path / "out", workers=1, uncertainty=False)
    assert o.generations == len(shared)
    priced = {r["config"]: r for r in o.rows if r["method"] == fp.FAST}
    for gen, c, s in across[:2]:
        assert priced[c.id]["step_time_s"] == pytest.approx(fp.metrics(gen, s, cost)["step_time_s"], rel=1e-12)


def test_admission_records_the_last_demand_it_tests():
    """``_admit``'s demands rise row by row: it records the cache after its last admitted row (when a rule was tested)
    or the demand it refused."""
    from types import SimpleNamespace as NS

    from rlhfsim.sim.engines.continuous import ContinuousEngine

    def admit(n_live, kv_live, limit, prompts, max_batch=64):
        eng = NS(kv_need=0)
        queue = deque(NS(prompt_len=p, generated=0) for p in prompts)
        got = ContinuousEngine._admit(eng, queue, n_live, kv_live, limit, max_batch)
        return len(got), eng.kv_need

    assert admit(2, 100, 1000, [10, 20, 30]) == (3, 100 + 2 + 11 + 21 + 31)
    assert admit(2, 100, 140, [10, 20, 30]) == (2, 165)          # the third refused: its demand, above the limit
    assert admit(0, 0, 5, [10, 20]) == (1, 11 + 21)              # the first into an empty batch is not tested
    assert admit(0, 0, 100, [10]) == (1, 0)                      # nothing tested: nothing recorded
    assert admit(2, 100, 1000, [10, 20, 30], max_batch=3) == (1, 113)

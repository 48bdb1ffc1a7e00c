"""Hypothesis properties of the simulator over random small scenarios and schedules:

- every prompt is generated, scored and trained exactly once (nothing lost, nothing twice), also when
  the generation runtime charges a per-call overhead and a pause at every chunk boundary (pauses that a
  stop can interrupt);
- durations are non-negative, steps follow each other;
- a synchronous step never gets faster when every response gets longer;
- the same seed gives identical output.
"""

from __future__ import annotations

import copy
import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from rlhfsim.costs.model import CostModel
from rlhfsim.scenario import load_scenario
from rlhfsim.scenario.checks import build_setup
from rlhfsim.sim.schedules import SCHEDULES


@st.composite
def length_dists(draw, cap: int):
    kind = draw(st.sampled_from(["fixed", "normal", "lognormal", "pareto", "mixture"]))
    if kind == "fixed":
        return {"kind": "fixed", "value": draw(st.integers(1, cap))}
    if kind == "normal":
        return {"kind": "normal", "mean": draw(st.floats(1, cap)), "std": draw(st.floats(0, cap / 2))}
    if kind == "lognormal":
        med = draw(st.floats(2, cap / 2))
        return {"kind": "lognormal", "median": med, "p99": med * draw(st.floats(1.2, 30))}
    if kind == "pareto":
        return {"kind": "pareto", "scale": draw(st.floats(1, cap / 4)), "alpha": draw(st.floats(0.5, 4))}
    return {"kind": "mixture", "components": [
        {"weight": draw(st.floats(0.1, 3)), "dist": {"kind": "fixed", "value": draw(st.integers(1, cap))}},
        {"weight": draw(st.floats(0.1, 3)), "dist": {"kind": "lognormal", "median": 20, "p99": 400}}]}


@st.composite
def schedules(draw):
    kind = draw(st.sampled_from(list(SCHEDULES) + ["oppo"]))  # oppo twice: the most knobs
    if kind == "oppo":
        s = {"kind": "oppo",
             "intra": {"enabled": draw(st.booleans()), "chunk_tokens": draw(st.integers(4, 200)),
                       "stream_reference_critic": draw(st.booleans())},
             "inter": {"enabled": draw(st.booleans()), "delta": draw(st.integers(0, 8)),
                       "keep_kv": draw(st.booleans())}}
        if draw(st.booleans()):
            s["intra"]["adaptive"] = {"window_steps": draw(st.integers(1, 4)),
                                      "candidates": draw(st.lists(st.integers(4, 128), min_size=1, max_size=3))}
        if draw(st.booleans()):
            s["inter"]["adaptive"] = {"window_steps": draw(st.integers(2, 3)), "min": 0,
                                      "max": draw(st.integers(1, 8)), "step": draw(st.integers(1, 4))}
        return s
    if kind == "partial":
        return {"kind": "partial", "token_budget": draw(st.integers(1, 300)), "extra_prompts": draw(st.integers(0, 4))}
    if kind == "async":
        return {"kind": "async", "max_staleness": draw(st.integers(0, 3))}
    # A schedule without a strategy of its own here: one of its registered examples.
    return copy.deepcopy(draw(st.sampled_from(list(SCHEDULES[kind].EXAMPLES.values()))))


@st.composite
def scenarios(draw, make):
    base = draw(st.sampled_from(["gpu", "colocated", "cpu"]))
    d = make(base)
    cap = draw(st.integers(8, 400))
    w = d["workload"]
    w["max_response_tokens"] = cap
    w["max_prompt_tokens"] = draw(st.integers(4, 128))
    w["prompt_length"] = draw(length_dists(w["max_prompt_tokens"]))
    w["response_length"] = draw(length_dists(cap))
    w["prompts_per_step"] = draw(st.integers(1, 10))
    if base == "cpu":
        d["algorithm"]["group_size"] = draw(st.integers(1, 4))
    rollouts = w["prompts_per_step"] * d["algorithm"].get("group_size", 1)
    d["algorithm"]["minibatch_size"] = draw(st.integers(1, rollouts))
    d["algorithm"]["ppo_epochs"] = draw(st.integers(1, 2))
    d["generation"]["engine"] = draw(st.sampled_from(["static", "continuous"]))
    d["generation"]["max_batch"] = draw(st.integers(1, 12))
    # A tiny KV cache sometimes, so that admission control and recompute preemption are exercised.
    d["generation"]["kv_cache_fraction"] = draw(st.sampled_from([0.9, 0.9, 1e-4, 3e-4]))
    if base == "cpu":
        d["generation"]["kv_cache_fraction"] = min(d["generation"]["kv_cache_fraction"] * 20, 0.9)
    d["schedule"] = draw(schedules())
    d["seed"] = draw(st.integers(0, 2**31))
    return d


@st.composite
def gen_costs(draw, d: dict):
    """None (the bundled profile) or the bundled profile with generation-runtime costs: a call overhead
    and a chunk handoff (fixed plus per row) for both default runtimes."""
    if draw(st.booleans()):
        return None
    setup = build_setup(load_scenario(d))
    prof = copy.deepcopy(CostModel.load(setup.gpu).profile)
    prof["generation"] = {rt: {"call_overhead_s": draw(st.floats(0, 0.05)), "handoff_s": draw(st.floats(0, 0.05)),
                               "handoff_per_row_s": draw(st.floats(0, 0.005))} for rt in ("hf_generate", "vllm")}
    return CostModel(setup.gpu, prof)


@given(data=st.data())
def test_nothing_lost_nothing_twice_no_negative_durations(data, scenario_dict, tracked, conservation):
    d = data.draw(scenarios(scenario_dict))
    steps = data.draw(st.integers(1, 5))
    run = tracked(d, steps=steps, cost=data.draw(gen_costs(d)))
    conservation(run)
    assert len(run.records) == steps


@st.composite
def length_lists(draw):
    n = draw(st.integers(1, 8))
    steps = 2
    base = draw(st.lists(st.tuples(st.integers(1, 64), st.integers(1, 300)), min_size=n * steps, max_size=n * steps))
    more = draw(st.lists(st.integers(0, 200), min_size=n * steps, max_size=n * steps))
    return n, base, [(p, r + m) for (p, r), m in zip(base, more)]


@given(data=st.data())
def test_sync_step_never_faster_when_every_response_is_longer(data, scenario_dict, tracked):
    base = data.draw(st.sampled_from(["gpu", "colocated", "cpu"]))
    n, short, long = data.draw(length_lists())
    d = scenario_dict(base)
    d["algorithm"] = {"kind": "ppo", "minibatch_size": data.draw(st.integers(1, n))}
    d["workload"]["prompts_per_step"] = n
    d["workload"]["max_response_tokens"] = 512
    d["generation"]["engine"] = data.draw(st.sampled_from(["static", "continuous"]))
    d["generation"]["max_batch"] = data.draw(st.integers(1, 8))
    d["models"].pop("critic", None)
    a = tracked(d, steps=2, rollouts=short)
    b = tracked(d, steps=2, rollouts=long)
    for ra, rb in zip(a.records, b.records):
        tol = 1e-12 * max(ra.end_s, rb.end_s, 1.0)  # spans are differences of absolute times
        assert rb.step_time_s >= ra.step_time_s - tol, (ra.step_time_s, rb.step_time_s)
        for ph, t in ra.phases_s.items():
            assert rb.phases_s[ph] >= t - tol, ph


@given(data=st.data())
def test_same_seed_identical_output(data, scenario_dict, tracked):
    d = data.draw(scenarios(scenario_dict))
    cost = data.draw(gen_costs(d))
    a, b = tracked(d, steps=3, cost=cost), tracked(d, steps=3, cost=cost)
    assert [dataclasses.asdict(r) for r in a.records] == [dataclasses.asdict(r) for r in b.records]
    assert a.sim.rec.intervals == b.sim.rec.intervals

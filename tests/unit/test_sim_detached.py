"""Detached replicas (rlhfsim.sim.engines.deferred): a generation nothing outside the replicas can see or
change runs on the deferred clock, one SimPy event per replica. It must give exactly what the event clock
gives, bit for bit: the same step records, the same busy intervals, the same rows finished in the same
order. ``Engine.DETACH = False`` forces the event clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import SCHEDULE_CONFIGS
from rlhfsim.scenario import load_scenario
from rlhfsim.sim.engines.base import Engine
from rlhfsim.sim.generation import Generation


def _runs(monkeypatch, tracked, sc, steps):
    seen = {}
    orig = Generation.__init__

    def init(self, sim, req):  # which clock each generation ran on
        orig(self, sim, req)
        seen.setdefault(Engine.DETACH, []).append(self.engine.detached)

    monkeypatch.setattr(Generation, "__init__", init)
    a = tracked(sc, steps=steps)
    monkeypatch.setattr(Engine, "DETACH", False)
    b = tracked(sc, steps=steps)
    monkeypatch.setattr(Engine, "DETACH", True)
    return a, b, seen


def _same(a, b):
    assert [r.__dict__ for r in a.records] == [r.__dict__ for r in b.records]
    assert a.sim.rec.intervals == b.sim.rec.intervals
    key = [(r.id, r.generated, r.finished_at, r.kv_resident, r.paused, r.tokens_by_step) for r in a.taken]
    assert key == [(r.id, r.generated, r.finished_at, r.kv_resident, r.paused, r.tokens_by_step) for r in b.taken]


@pytest.mark.parametrize("schedule", [s for s in SCHEDULE_CONFIGS if not s.startswith("oppo")])  # OPPO: below
@pytest.mark.parametrize("engine", ["static", "continuous"])
@pytest.mark.parametrize("base", ["gpu", "colocated", "cpu"])
def test_detached_equals_event_clock(base, engine, schedule, scenario_dict, tracked, monkeypatch):
    sc = load_scenario(scenario_dict(base, {"generation": {"engine": engine}}, schedule=schedule))
    a, b, seen = _runs(monkeypatch, tracked, sc, 4)
    # Generation without a stop or a stream runs detached (tail batching's long rounds would; its short
    # rounds stop at the first B finished and stay on the event clock, as OPPO's do).
    assert (schedule.startswith("tail") or all(seen[True])) and not any(seen[False])
    _same(a, b)


@pytest.mark.parametrize("schedule", ["sync", "partial"])
def test_detached_equals_event_clock_under_kv_pressure(schedule, scenario_dict, tracked, monkeypatch):
    # A cache of about 1,300 tokens: admissions wait for room, rows are preempted and readmitted.
    d = scenario_dict("gpu", {"generation": {"engine": "continuous", "max_batch": 16, "kv_cache_fraction": 0.0002}},
                      schedule=schedule)
    d["workload"]["prompts_per_step"] = 32
    sc = load_scenario(d)
    preempted = []
    orig = Generation.run

    def run(self):
        res = yield from orig(self)
        preempted.append(res.preemptions)
        return res

    monkeypatch.setattr(Generation, "run", run)
    a, b, _ = _runs(monkeypatch, tracked, sc, 3)
    _same(a, b)
    assert sum(preempted) > 0


def test_streaming_and_stops_stay_on_the_event_clock(scenario_dict, tracked, monkeypatch):
    sc = load_scenario(scenario_dict("gpu", schedule="oppo"))
    _, _, seen = _runs(monkeypatch, tracked, sc, 2)
    assert not any(seen[True])


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 600)), min_size=1, max_size=48),
       max_batch=st.integers(1, 12), kv_fraction=st.sampled_from([0.0001, 0.0002, 0.0005, 0.9]),
       budget=st.sampled_from([None, 1, 7, 64]), engine=st.sampled_from(["static", "continuous"]))
def test_detached_equals_event_clock_on_random_rows(lengths, max_batch, kv_fraction, budget, engine, scenario_dict,
                                                     tracked):
    # Any rows, slots, cache size and token budget: the deferred clock replays the event clock exactly.
    gen = {"engine": engine, "max_batch": max_batch, "kv_cache_fraction": kv_fraction}
    d = scenario_dict("gpu", {"generation": gen}, schedule="sync" if budget is None else "partial")
    if budget is not None:
        d["schedule"]["token_budget"] = budget
    d["workload"]["prompts_per_step"] = max(len(lengths) // 2, 1)
    d["algorithm"]["minibatch_size"] = d["workload"]["prompts_per_step"]
    sc = load_scenario(d)
    rows = lengths * (400 // len(lengths) + 1)  # more than 2 steps can draw, whatever they carry over
    a = tracked(sc, steps=2, rollouts=rows)
    Engine.DETACH = False
    try:
        b = tracked(sc, steps=2, rollouts=rows)
    finally:
        Engine.DETACH = True
    _same(a, b)

"""The speed work of issue 12 at 65,536 rollouts: each fast path gives what the plain code it replaced
gives (written out here as it was), and the garbage collector's pause is restored and costs nothing in
memory (a step's rows are freed by reference counting, not left to the collector)."""

from __future__ import annotations

import gc

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfsim.costs.model import CostModel
from rlhfsim.scenario import load_scenario
from rlhfsim.scenario.checks import build_setup
from rlhfsim.sim import stages
from rlhfsim.sim.rollouts import Rollout
from rlhfsim.sim.simulation import Simulation, collector_paused


def _sim(scenario_dict, over: dict | None = None, schedule: str | None = None) -> Simulation:
    setup = build_setup(load_scenario(scenario_dict("gpu", over, schedule=schedule)))
    return Simulation(setup, CostModel.load(setup.gpu))


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(1, 20_000), max_size=70), mb=st.integers(1, 20), dp=st.integers(1, 9))
def test_padding_on_arrays_equals_padding_row_by_row(tokens, mb, dp):
    rows = [Rollout(i, 1, t - 1 if t > 1 else 1) for i, t in enumerate(tokens)]
    arr = stages._row_tokens(rows)
    assert arr.tolist() == [r.prompt_len + r.response_len for r in rows]
    # forward passes: micro-batches of mb consecutive rows, each padded to its longest
    want = [(len(rows[i:i + mb]), max(r.prompt_len + r.response_len for r in rows[i:i + mb]))
            for i in range(0, len(rows), mb)]
    assert stages._padded_microbatches(arr, mb) == want
    # training: minibatches of mb rows dealt round-robin over dp ranks, each rank padded to its longest
    want_counts, want_lengths = [], []
    for i in range(0, len(rows), mb):
        part = rows[i:i + mb]
        mine = [part[k::dp] for k in range(min(dp, len(part)))]
        want_counts.append([len(m) for m in mine])
        want_lengths.append([max(r.prompt_len + r.response_len for r in m) for m in mine])
    assert stages._rank_longest(arr, mb, dp) == (want_counts, want_lengths)


def test_record_step_equals_the_row_by_row_record(scenario_dict):
    sim = _sim(scenario_dict)
    rng = np.random.default_rng(3)
    rows = []
    for i in range(200):
        admitted = int(rng.integers(-1, 4))  # -1: a row made outside the stream (no admission step)
        r = Rollout(int(rng.integers(0, 10_000)), int(rng.integers(1, 500)), int(rng.integers(1, 900)), admitted)
        for k in range(max(admitted, 0), 4):
            if rng.random() < 0.6:
                r.tokens_by_step[k] = int(rng.integers(1, 300))
        rows.append(r)
    for step in (0, 2, 3):
        rec = sim.record_step(step, 0.0, rows, 7, deferred=1)
        assert rec.trained_ids == [r.id for r in rows] and rec.trained_rollouts == len(rows)
        assert rec.lengths == [(r.id, r.prompt_len, r.response_len) for r in rows]
        assert rec.response_tokens == sum(r.response_len for r in rows)
        assert rec.off_policy_tokens == sum(n for r in rows for k, n in r.tokens_by_step.items() if k < step)
        assert rec.deferral_ages == [step - r.admitted_step for r in rows]
        assert rec.generated_tokens == 7 and rec.deferred == 1


def test_collector_paused_restores_the_collector_state():
    was = gc.isenabled()
    try:
        for before in (True, False):
            (gc.enable if before else gc.disable)()
            with collector_paused():
                assert not gc.isenabled()
            assert gc.isenabled() == before
    finally:
        (gc.enable if was else gc.disable)()


def test_run_pauses_the_collector_and_restores_it(scenario_dict, monkeypatch):
    sim = _sim(scenario_dict)
    seen = []
    orig = sim.record_step

    def record_step(*a, **kw):
        seen.append(gc.isenabled())
        return orig(*a, **kw)

    monkeypatch.setattr(sim, "record_step", record_step)
    was = gc.isenabled()
    sim.run(2)
    assert seen == [False, False] and gc.isenabled() == was


def test_a_steps_rows_are_freed_without_the_collector(scenario_dict):
    # No reference cycle holds the rows of a finished synchronous step (the deferred clocks refer to
    # their engine, so the engine must not keep them): pausing the collector costs no memory.
    sim = _sim(scenario_dict, {"generation": {"engine": "continuous"}}, schedule="sync")
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        sim.run(2)
        alive = [o for o in gc.get_objects() if type(o) is Rollout]  # type(): no __class__ lookups
    finally:
        if was:
            gc.enable()
    assert sim.rec.steps and not alive

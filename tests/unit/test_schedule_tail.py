"""Tail batching (rlhfsim/sim/schedules/tail.py): short rounds stop at the first B finished and defer
the rest; a long round runs the deferred tail alone, to completion, once it holds a batch."""

from __future__ import annotations

import pytest

from conftest import make_dict
from rlhfsim.scenario import load_scenario
from rlhfsim.sim.run import simulate


def _run(steps=9, **sched):
    return simulate(load_scenario(make_dict("gpu", schedule="tail") | {"schedule": {"kind": "tail", **sched}}), steps=steps)


def test_rounds_alternate_and_every_step_trains_a_batch():
    res = _run(extra_prompts=8)
    B = res.setup.rollouts_per_step
    assert all(r.trained_rollouts == B for r in res.steps)
    long_rounds = [r for r in res.steps if r.delta == 0]
    short_rounds = [r for r in res.steps if r.delta == 8]
    assert long_rounds and short_rounds and len(long_rounds) + len(short_rounds) == len(res.steps)
    for r in long_rounds:
        # A long round trains rollouts admitted in earlier steps only (no new prompts)...
        assert r.deferral_ages and all(age > 0 for age in r.deferral_ages)
    for r in short_rounds:
        assert r.deferred_in == 0 or r.deferred_in < B  # ready rollouts carried between short rounds only
    # ...and starts once the tail holds a batch: after each short round the buffer grew by at most 8 x g.
    for prev, r in zip(res.steps, res.steps[1:]):
        if r.delta == 0:
            assert prev.deferred >= B


def test_trained_ids_are_unique_over_the_run():
    res = _run(extra_prompts=6)
    ids = [i for r in res.steps for i in r.trained_ids]
    assert len(ids) == len(set(ids))


def test_extra_prompts_zero_is_sync():
    a = _run(steps=4, extra_prompts=0)
    b = simulate(load_scenario(make_dict("gpu", schedule="sync")), steps=4)
    assert [r.step_time_s for r in a.steps] == pytest.approx([r.step_time_s for r in b.steps], rel=1e-12)


def test_short_rounds_are_faster_than_sync_and_keep_kv_saves_recompute():
    sync = simulate(load_scenario(make_dict("gpu", schedule="sync")), steps=9)
    tail = _run(extra_prompts=8)
    short = [r.step_time_s for r in tail.steps if r.delta == 8]
    assert sum(short) / len(short) < sync.summary["step_time_s"]
    kept = _run(extra_prompts=8, keep_kv=True)
    assert sum(r.step_time_s for r in kept.steps) <= sum(r.step_time_s for r in tail.steps)

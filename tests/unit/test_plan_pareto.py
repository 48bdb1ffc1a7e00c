"""Pareto front of step time against cost, best configuration per objective, and the sentence on what
dominates the best configuration's step, on synthetic rows."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfsim.plan.results import explain, pareto_front, pick_best


def row(t, c, gpus=8, feasible=True, **kw):
    return {"step_time_s": t, "cost_per_1000_steps": c, "gpus": gpus, "feasible": feasible, **kw}


def brute_front(rows):
    ok = [r for r in rows if r["feasible"]]

    def dominates(a, b):
        return (a["step_time_s"] <= b["step_time_s"] and a["cost_per_1000_steps"] <= b["cost_per_1000_steps"]
                and (a["step_time_s"], a["cost_per_1000_steps"]) != (b["step_time_s"], b["cost_per_1000_steps"]))

    return [r for r in ok if not any(dominates(o, r) for o in ok)]


def test_front_on_known_points():
    a, b, c, d = row(10, 100), row(20, 50), row(15, 120), row(30, 50)   # c dominated by a; d by b
    e = row(5, 300, feasible=False)                                     # infeasible never counts
    front = pareto_front([c, d, a, b, e])
    assert front == [a, b]


def test_equal_points_are_all_kept_and_same_time_higher_cost_dropped():
    a1, a2, worse = row(10, 100), row(10, 100), row(10, 101)
    assert pareto_front([worse, a1, a2]) == [a1, a2]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(1, 12), st.booleans()), max_size=40))
def test_front_matches_brute_force(points):
    rows = [row(float(t), float(c), feasible=f) for t, c, f in points]
    got = pareto_front(rows)
    want = brute_front(rows)
    assert sorted(map(id, got)) == sorted(map(id, want))
    times = [r["step_time_s"] for r in got]
    assert times == sorted(times)


def test_best_per_objective_and_bound():
    fast = row(10, 300, gpus=16)
    cheap = row(40, 100, gpus=4)
    mid = row(20, 150, gpus=8)
    slow_small = row(80, 120, gpus=2)
    rows = [fast, cheap, mid, slow_small, row(1, 1, gpus=1, feasible=False)]
    assert pick_best(rows, "min_step_time", None) is fast
    assert pick_best(rows, "min_cost", None) is cheap
    assert pick_best(rows, "min_cost", 30) is mid
    assert pick_best(rows, "min_gpus", 50) is cheap
    assert pick_best(rows, "min_gpus", 100) is slow_small
    assert pick_best(rows, "min_cost", 5) is None


def test_best_ties_go_to_faster_then_earlier():
    a, b, c = row(20, 100), row(10, 100), row(10, 100)
    assert pick_best([a, b, c], "min_cost", None) is b


def test_explain_names_the_dominant_phase_and_its_share():
    r = row(40.0, 1.0, generate_s=30.0, reward_s=29.0, actor_train_s=6.0, weight_sync_s=None,
            util_actor=0.8, util_reward=0.07, util_all=None)
    s = explain(r)
    assert s.startswith("generation spans 75% of the step; ")
    assert "reward scoring, overlapped with it, spans 72%" in s
    assert s.endswith("busy: actor 80%, reward 7%.")
    s = explain({**r, "active_actor": 0.55, "active_reward": 0.05, "active_all": None})
    assert s.endswith("busy: actor 80%, reward 7%; active: actor 55%, reward 5%.")
    s = explain(row(10.0, 1.0, generate_s=2.0, actor_train_s=6.0))
    assert s.startswith("actor training spans 60% of the step; actor training is compute-bound")

"""Schedules: conservation for every schedule, the equivalences that tie OPPO/async back to sync, seeds."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import SCHEDULE_CONFIGS
from rlhfsim.scenario import load_scenario
from rlhfsim.sim.schedules import SCHEDULES

SCHEDULE_NAMES = list(SCHEDULE_CONFIGS)  # every registered schedule's examples
REL = 1e-9


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= REL * max(abs(x), abs(y), 1.0) for x, y in zip(a, b))


def test_registry_names_match_config_kinds():
    for kind, cls in SCHEDULES.items():
        assert cls.NAME == kind
        assert cls.Config.model_fields["kind"].default == kind
        assert cls.EXAMPLES and all(ex["kind"] == kind for ex in cls.EXAMPLES.values())


@pytest.mark.parametrize("base", ["gpu", "colocated", "cpu"])
@pytest.mark.parametrize("schedule", SCHEDULE_NAMES)
def test_no_rollout_lost_or_trained_twice(base, schedule, scenario_dict, tracked, conservation):
    run = tracked(scenario_dict(base, schedule=schedule), steps=6)
    conservation(run)


@pytest.mark.parametrize("engine", ["static", "continuous"])
@pytest.mark.parametrize("schedule", SCHEDULE_NAMES)
def test_conservation_under_both_engines(engine, schedule, scenario_dict, tracked, conservation):
    run = tracked(scenario_dict("gpu", {"generation": {"engine": engine}}, schedule=schedule), steps=5)
    conservation(run)


@pytest.mark.parametrize("schedule", [*SCHEDULES, "oppo-nokv"])
def test_conservation_with_kv_preemption(schedule, scenario_dict, tracked, conservation):
    # A KV cache of about 1,900 tokens holds a dozen sequences at most, so the continuous engine admits
    # fewer than max_batch and preempts (recomputes) the newest sequence when the cache fills.
    d = scenario_dict("gpu", {"generation": {"kv_cache_fraction": 0.0003, "max_batch": 16}}, schedule=schedule)
    run = tracked(d, steps=4)
    conservation(run)
    assert 1000 < run.sim.setup.kv_capacity_tokens < 3000


@pytest.mark.parametrize("engine", ["static", "continuous"])
@pytest.mark.parametrize("schedule", ["oppo", "oppo-inter", "oppo-nokv", "partial"])
def test_simultaneous_finishes_are_not_lost(engine, schedule, scenario_dict, tracked, conservation):
    # Equal lengths make every replica finish its batch at the same instant; the stop after the first B
    # finished interrupts replicas whose last decode segment ends at that very time. Their rollouts
    # finished and must be counted, not dropped.
    d = scenario_dict("colocated", {
        "cluster": {"gpus_per_node": 4},
        "placement": {"tp": {"rollout": 1}},
        "workload": {"prompts_per_step": 8},
        "generation": {"engine": engine, "max_batch": 4},
        "algorithm": {"minibatch_size": 4},
    }, schedule=schedule)
    d["workload"]["prompt_length"] = {"kind": "fixed", "value": 64}
    d["workload"]["response_length"] = {"kind": "fixed", "value": 100}
    if schedule.startswith("oppo"):
        d["schedule"]["inter"]["delta"] = 8
    run = tracked(d, steps=4)
    conservation(run)


def test_rule_reward_is_never_streamed(scenario_dict, tracked, conservation):
    d = scenario_dict("gpu", schedule="oppo")
    d["models"]["reward"] = {"kind": "rule", "cpu_s_per_sample": 0.01, "workers": 4}
    d["placement"] = {"kind": "colocated"}
    run = tracked(d, steps=4)
    conservation(run)
    assert "reward" not in run.sim.scorers
    cpu = [iv for iv in run.sim.rec.intervals if iv.pool == "cpu"]
    assert len(cpu) == 4
    assert cpu[0].end_s - cpu[0].start_s == pytest.approx(4 * 0.01)  # ceil(16 / 4 workers) x 0.01 s


# --- equivalences -------------------------------------------------------------------------------------
@pytest.mark.parametrize("base", ["gpu", "colocated"])
@pytest.mark.parametrize("engine", ["static", "continuous"])
def test_free_scoring_makes_intra_step_equal_to_sync(base, engine, scenario_dict, tracked, free_cost):
    # The reward model must be a shape no other role uses, so only it becomes free.
    over = {"generation": {"engine": engine},
            "models": {"actor": {"model": "qwen2.5-1.5b"}, "critic": {"model": "qwen2.5-1.5b"},
                       "reference": {"model": "qwen2.5-1.5b"}, "reward": {"model": "qwen2.5-0.5b"}}}
    sync = load_scenario(scenario_dict(base, over, schedule="sync"))
    intra = load_scenario(scenario_dict(base, over, schedule="oppo-intra"))
    cost = free_cost(sync)
    a = tracked(sync, steps=4, cost=cost)
    b = tracked(intra, steps=4, cost=cost)
    assert "reward" in b.sim.scorers and b.sim.scorers["reward"].chunks > 0
    assert _close(a.step_times, b.step_times), (a.step_times, b.step_times)
    # The same work was done, only the reward phase vanished.
    assert [r.trained_ids for r in a.records] == [r.trained_ids for r in b.records]


def test_free_scoring_cost_model_is_free_for_the_reward_only(scenario_dict, free_cost):
    sc = load_scenario(scenario_dict("colocated"))
    cost = free_cost(sc)
    from rlhfsim.scenario.checks import build_setup

    s = build_setup(sc)
    assert cost.forward(s.shapes["reward"], "bfloat16", 1000, 4).total_s == 0.0
    assert cost.chunk_prefill(s.shapes["reward"], "bfloat16", 256, 4, 1000).total_s == 0.0
    assert cost.forward(s.shapes["critic"], "bfloat16", 1000, 4).total_s > 0.0


def test_scoring_cost_matters_when_not_free(scenario_dict, tracked):
    # Control for the test above: with real costs intra-step streaming does change step times.
    over = {"models": {"actor": {"model": "qwen2.5-1.5b"}, "critic": {"model": "qwen2.5-1.5b"},
                       "reference": {"model": "qwen2.5-1.5b"}, "reward": {"model": "qwen2.5-0.5b"}}}
    a = tracked(scenario_dict("gpu", over, schedule="sync"), steps=4)
    b = tracked(scenario_dict("gpu", over, schedule="oppo-intra"), steps=4)
    assert not _close(a.step_times, b.step_times)


@pytest.mark.parametrize("base", ["gpu", "colocated", "cpu"])
@pytest.mark.parametrize("engine", ["static", "continuous"])
def test_delta_zero_makes_inter_step_equal_to_sync(base, engine, scenario_dict, tracked):
    over = {"generation": {"engine": engine}}
    a = tracked(scenario_dict(base, over, schedule="sync"), steps=5)
    d = scenario_dict(base, over, schedule="oppo-inter")
    d["schedule"]["inter"]["delta"] = 0
    b = tracked(d, steps=5)
    assert a.step_times == b.step_times
    assert [r.trained_ids for r in a.records] == [r.trained_ids for r in b.records]
    assert all(r.deferred == 0 for r in b.records)


@pytest.mark.parametrize("base", ["gpu", "colocated", "cpu"])
@pytest.mark.parametrize("engine", ["static", "continuous"])
def test_async_staleness_zero_equals_sync(base, engine, scenario_dict, tracked):
    over = {"generation": {"engine": engine}}
    a = tracked(scenario_dict(base, over, schedule="sync"), steps=5)
    d = scenario_dict(base, over, schedule="async")
    d["schedule"]["max_staleness"] = 0
    b = tracked(d, steps=5)
    assert _close([r.start_s for r in a.records], [r.start_s for r in b.records])
    assert _close(a.step_times, b.step_times)
    assert [r.trained_ids for r in a.records] == [r.trained_ids for r in b.records]
    assert all(r.staleness == 0 for r in b.records)


def test_async_runs_ahead_with_its_own_rollout_pool(scenario_dict, tracked, conservation):
    # Generation on its own GPUs: with staleness 1 batch k+1 is generated while batch k trains.
    over = {"placement": {"kind": "pools", "pools": [
        {"name": "train", "gpus": 2, "roles": ["actor", "critic", "reference"]},
        {"name": "gen", "gpus": 1, "roles": ["rollout"]},
        {"name": "rm", "gpus": 1, "roles": ["reward"]}]}}
    d_sync = scenario_dict("gpu", over, schedule="sync")
    d_sync["placement"] = over["placement"]
    d_async = scenario_dict("gpu", over, schedule="async")
    d_async["placement"] = over["placement"]
    a = tracked(d_sync, steps=6)
    b = tracked(d_async, steps=6)
    conservation(b)
    assert sum(b.step_times) < sum(a.step_times)
    assert max(r.staleness for r in b.records) == 1


def test_oppo_inter_keeps_delta_in_flight(scenario_dict, tracked):
    run = tracked(scenario_dict("gpu", schedule="oppo-inter"), steps=5)
    assert all(r.deferred == 4 for r in run.records)  # B + delta in flight, B trained
    assert all(r.delta == 4 for r in run.records)
    assert sum(r.deferred_in for r in run.records[1:]) > 0
    assert any(r.off_policy_tokens > 0 for r in run.records[1:])
    assert run.records[0].off_policy_tokens == 0


def test_partial_respects_token_budget(scenario_dict, tracked):
    run = tracked(scenario_dict("gpu", schedule="partial"), steps=6)
    budget = run.sim.setup.scenario.schedule.token_budget
    assert all(n <= budget for r in run.taken for n in r.tokens_by_step.values())
    assert any(r.response_len > budget for r in run.taken)  # the budget binds in this scenario
    assert any(len(r.tokens_by_step) > 1 for r in run.taken)


def test_adaptive_chunk_tries_each_candidate_then_keeps_the_fastest(scenario_dict, tracked):
    run = tracked(scenario_dict("gpu", schedule="oppo-adaptive"), steps=8)
    chunks = [r.chunk_tokens for r in run.records]
    assert chunks[0:2] == [32, 64] and chunks[4:6] == [32, 64]
    best = min((run.records[0].step_time_s, 32), (run.records[1].step_time_s, 64))[1]
    assert chunks[2] == chunks[3] == best


def test_adaptive_delta_stays_within_bounds(scenario_dict, tracked):
    run = tracked(scenario_dict("gpu", schedule="oppo-adaptive"), steps=8)
    deltas = [r.delta for r in run.records]
    assert all(0 <= x <= 8 for x in deltas)
    assert all(abs(b - a) in (0, 2) for a, b in zip(deltas, deltas[1:]))
    assert deltas[:2] == [4, 4]


def test_sync_phases_tile_the_step(scenario_dict, tracked):
    # Synchronous: phases run one after another, so their spans add up to the step time.
    run = tracked(scenario_dict("gpu"), steps=3)
    for r in run.records:
        assert sum(r.phases_s.values()) == pytest.approx(r.step_time_s, rel=1e-12)
        assert set(r.phases_s) == {"generate", "reward", "reference", "critic_fwd", "actor_train",
                                   "critic_train", "weight_sync"}


# --- seeds ----------------------------------------------------------------------------------------------
def _fingerprint(run):
    return ([dataclasses.asdict(r) for r in run.records], [dataclasses.astuple(iv) for iv in run.sim.rec.intervals],
            [(r.id, r.prompt_len, r.response_len, r.generated) for r in run.taken])


@pytest.mark.parametrize("schedule", SCHEDULE_NAMES)
def test_same_seed_identical_output(schedule, scenario_dict, tracked):
    d = scenario_dict("gpu", schedule=schedule)
    assert _fingerprint(tracked(d, steps=4)) == _fingerprint(tracked(d, steps=4))


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_other_seed_other_lengths(schedule, scenario_dict, tracked):
    d = scenario_dict("gpu", schedule=schedule)
    a, b = tracked(d, steps=3, seed=0), tracked(d, steps=3, seed=1)
    assert [r.response_len for r in a.taken] != [r.response_len for r in b.taken]


def test_schedule_does_not_change_sampled_lengths(scenario_dict, tracked):
    runs = [tracked(scenario_dict("gpu", schedule=s), steps=3) for s in SCHEDULES]
    n = min(len(r.taken) for r in runs)
    lens = [[(x.prompt_len, x.response_len) for x in r.taken[:n]] for r in runs]
    assert all(lengths == lens[0] for lengths in lens)


@pytest.mark.parametrize("base,schedule,shared", [("gpu", "oppo-intra", False), ("colocated", "oppo-intra", True),
                                                  ("colocated", "sync", False), ("cpu", "oppo", True)])
def test_interference_only_where_scoring_shares_the_decode_pool(base, schedule, shared, scenario_dict, tracked):
    # Slowdowns apply when chunk prefills and decode run on the same pool at once: never under sync,
    # never with the reward model on its own GPUs.
    import copy

    from rlhfsim.costs.model import CostModel
    from rlhfsim.scenario.checks import build_setup

    sc = load_scenario(scenario_dict(base, schedule=schedule))
    loaded = CostModel.load(build_setup(sc).gpu)
    costs = []
    for slow in (1.25, 1.0):
        prof = copy.deepcopy(loaded.profile)
        prof["interference"] = {"decode_slowdown": slow, "prefill_slowdown": slow}
        costs.append(CostModel(loaded.gpu, prof))
    a = tracked(sc, steps=3, cost=costs[0])
    b = tracked(sc, steps=3, cost=costs[1])
    if shared:
        assert sum(a.step_times) > sum(b.step_times)
    else:
        assert a.step_times == b.step_times

"""The async schedule's ``groups`` generator (NeMo RL's AsyncTrajectoryCollector, ``rlhfsim.sim.feed``): prompt groups
under a semaphore of max_staleness x prompts_per_step groups, each step training exactly the groups reserved for it,
a group for step t starting only once step t - 1 - max_staleness has synced its weights, and the weight update with
and without in-flight updates."""

from __future__ import annotations

import pytest

from conftest import make_dict
from rlhfsim.errors import ScenarioError
from rlhfsim.scenario import load_scenario
from rlhfsim.scenario.checks import build_setup
from rlhfsim.costs.model import CostModel
from rlhfsim.sim import stages
from rlhfsim.sim.feed import GroupFeed
from rlhfsim.sim.run import simulate
from rlhfsim.sim.simulation import Simulation


def _dict(k: int = 1, generator: str = "groups", in_flight: bool = True, gen_gpus: int = 2, prompts: int = 8,
          median: int = 300, steps: int = 6) -> dict:
    """GRPO on 4 A100s: the actor and reference on 2, generation (2 replicas, max_batch 64) on ``gen_gpus``."""
    d = make_dict("gpu", {"generation": {"max_batch": 64}, "execution": {"weight_sync": {"kind": "nccl"}}})
    d["models"] = {"actor": {"model": "qwen2.5-0.5b"}, "reference": {"model": "qwen2.5-0.5b"}, "reward": {"kind": "rule"}}
    d["algorithm"] = {"kind": "grpo", "group_size": 4, "minibatch_size": prompts * 4}
    d["workload"]["prompts_per_step"] = prompts
    d["workload"]["response_length"] = {"kind": "lognormal", "median": median, "p99": 4 * median}
    d["cluster"] = {"gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 2 + gen_gpus}
    d["placement"] = {"kind": "pools", "pools": [{"name": "train", "gpus": 2, "roles": ["actor", "reference"]},
                                                 {"name": "gen", "gpus": gen_gpus, "roles": ["rollout"]}]}
    d["schedule"] = {"kind": "async", "max_staleness": k}
    if generator != "batch":
        d["schedule"].update(generator=generator, in_flight_weight_updates=in_flight)
    d["steps"], d["warmup_steps"] = steps, 2
    return d


def _run(d: dict) -> Simulation:
    sc = load_scenario(d)
    setup = build_setup(sc)
    sim = Simulation(setup, CostModel.load(setup.gpu))
    sim.run(sc.steps)
    return sim


def test_each_step_trains_exactly_its_own_groups():
    d = _dict(k=2)
    sim = _run(d)
    g, P = 4, d["workload"]["prompts_per_step"]
    seen = []
    for rec in sim.rec.steps:
        ids = rec.trained_ids
        assert len(ids) == P * g == len(set(ids))
        # the batch of step t is the t-th batch of prompt groups the collector started, whole groups only
        assert {i // (P * g) for i in ids} == {rec.step}
        assert 0 <= rec.staleness <= 2
        seen += ids
    assert len(seen) == len(set(seen))


def test_semaphore_and_version_window_hold_throughout(monkeypatch):
    """No more than max_staleness x prompts groups in flight; no group for step t before t - max_staleness weight
    updates; no group starts during a weight update."""
    calls = []
    orig = GroupFeed.start

    def start(self, prefer=None):
        before, paused = dict(self.left), self.paused
        orig(self, prefer)
        new = [v[1] for gid, v in self.left.items() if gid not in before]
        calls.append((sum(self.in_flight), self.cap, paused, new, self.version, self.max_age))

    monkeypatch.setattr(GroupFeed, "start", start)
    _run(_dict(k=3))
    for in_flight, cap, paused, new, version, age in calls:
        assert in_flight <= cap
        assert not (paused and new)
        assert all(t <= version + age for t in new)
    assert max(c[0] for c in calls) == 3 * 8   # the semaphore is reached: generation runs ahead


def test_more_batches_in_flight_make_a_generation_bound_step_faster():
    """Generation-bound (one GPU of generation, long responses): at max_staleness 4 the engine holds up to 4 batches
    and decodes more tokens a second than one batch at a time; the batch generator at the same staleness does not."""
    one = simulate(load_scenario(_dict(k=1, gen_gpus=1, median=600)), max_work=0).summary["step_time_s"]
    four = simulate(load_scenario(_dict(k=4, gen_gpus=1, median=600, steps=10)), max_work=0).summary["step_time_s"]
    batch4 = simulate(load_scenario(_dict(k=4, generator="batch", gen_gpus=1, median=600, steps=10)),
                      max_work=0).summary["step_time_s"]
    assert four < 0.8 * one
    assert four < 0.8 * batch4


def test_training_bound_step_is_the_trainer_loop():
    """Generation far ahead (short responses): the step is the trainer's own work, the weight update included."""
    res = simulate(load_scenario(_dict(k=2, median=20)), max_work=0)
    rec = res.steps[-1]
    trainer = sum(t for p, t in rec.phases_s.items() if p != "generate")   # reward, reference, train, weight sync
    assert rec.step_time_s == pytest.approx(trainer, rel=0.02)


def test_weight_update_without_in_flight_updates_waits_for_the_groups(monkeypatch):
    """in_flight_weight_updates false: the update starts only when no group is in flight; true: at once."""
    at_start = []
    orig = stages._record_sync

    def rec(sim, step, r, start, t, active, cross, off, swap=0.0):
        at_start.append(len(sim.schedule.feed.left))
        return orig(sim, step, r, start, t, active, cross, off, swap)

    monkeypatch.setattr(stages, "_record_sync", rec)
    slow = _run(_dict(k=1, in_flight=False, gen_gpus=1, median=600))
    assert at_start and all(n == 0 for n in at_start)
    at_start.clear()
    fast = _run(_dict(k=1, in_flight=True, gen_gpus=1, median=600))
    assert any(n > 0 for n in at_start)
    mean = lambda s: sum(r.step_time_s for r in s.rec.steps[2:]) / len(s.rec.steps[2:])  # noqa: E731
    assert mean(fast) < mean(slow)


@pytest.mark.parametrize("over, path", [
    ({"schedule": {"kind": "async", "generator": "batch", "in_flight_weight_updates": True}},
     "schedule.in_flight_weight_updates"),
    ({"schedule": {"kind": "async", "max_staleness": 0, "generator": "groups"}}, "schedule.max_staleness"),
    ({"generation": {"engine": "static"}}, "generation.engine"),
    ({"placement": {"kind": "pools", "pools": [{"name": "all", "gpus": 4, "roles": ["actor", "reference", "rollout"]}]},
      "execution": {"weight_sync": {"kind": "reshard"}}}, "placement"),
])
def test_bad_blocks_name_their_path(over, path):
    d = _dict()
    for k, v in over.items():
        d[k] = v if k != "generation" else {**d[k], **v}
    with pytest.raises(ScenarioError) as e:
        build_setup(load_scenario(d))
    assert e.value.path == path


def test_same_seed_same_steps():
    a = _run(_dict(k=2, gen_gpus=1, median=600))
    b = _run(_dict(k=2, gen_gpus=1, median=600))
    assert [(r.start_s, r.end_s, r.trained_ids, r.staleness) for r in a.rec.steps] == \
           [(r.start_s, r.end_s, r.trained_ids, r.staleness) for r in b.rec.steps]


@pytest.mark.parametrize("generator", ["batch", "groups"])
def test_last_step_waits_as_the_others_do(generator):
    """Generation-bound: the generator goes on past the last step, so the last step's weight update meets the
    generation pool as every earlier one does (the batch generator used to stop, and its last step was a fifth of
    the others)."""
    steps = _run(_dict(k=1, generator=generator, gen_gpus=1, median=600, steps=8)).rec.steps
    steady = [r.step_time_s for r in steps[2:-1]]
    assert min(steady) * 0.8 < steps[-1].step_time_s < max(steady) * 1.2

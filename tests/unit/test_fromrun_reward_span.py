"""Where a verl run's log times the reward, by release and rollout mode (``rlhfsim.fromrun.fit.reward_span``), pinned
on field run J1 (verl 0.9, async rollout: the agent loop scores each response inside ``timing_s/gen``) and on the
rules read from verl's code: the reward inside ``adv`` up to v0.3.0.post1 (before PR #1114), inside ``gen`` in
the async mode from v0.6.0 (PR #3055) while the reward is a function or a model on its own pool, its own
``timing_s/reward`` otherwise."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rlhfsim.costs.model import CostModel, with_stack_rate
from rlhfsim.costs.profile import load_profile
from rlhfsim.fromrun.fit import RunSpec, predict, prepare, reward_span, verl_spans

ROOT = Path(__file__).resolve().parents[2]
FIELD = ROOT / "scenarios" / "examples" / "field"
J1 = (FIELD / "j-qwen3lab-h20-qwen3-8b-grpo.sh", FIELD / "logs" / "j-qwen3lab-a-grpo-metrics.jsonl.gz")
MODE = "actor_rollout_ref.rollout.mode"


def scenario(reward: str = "rule", placement: str = "colocated"):
    return SimpleNamespace(models=SimpleNamespace(reward=SimpleNamespace(kind=reward)),
                           placement=SimpleNamespace(kind=placement))


@pytest.mark.parametrize("keys, version, settings, sc, holder", [
    ({"timing_s/gen", "timing_s/adv"}, "0.2", {}, scenario(), "adv"),              # no reward timer before v0.4
    ({"timing_s/gen", "timing_s/adv"}, None, {}, scenario(), "adv"),               # no release given: the log tells
    ({"timing_s/gen", "timing_s/reward", "timing_s/adv"}, "0.3", {}, scenario(), "reward"),   # main after PR #1114
    ({"timing_s/gen", "timing_s/adv"}, "0.9", {}, scenario(), "gen"),              # async by default from v0.7
    ({"timing_s/gen", "timing_s/reward"}, None, {}, scenario(), "reward"),           # no release: async only if set
    ({"timing_s/gen", "timing_s/reward"}, None, {MODE: "async"}, scenario(), "gen"),
    ({"timing_s/gen", "timing_s/reward", "timing_s/adv"}, "0.9", {}, scenario(), "gen"),
    ({"timing_s/gen", "timing_s/reward"}, "0.9", {MODE: "sync"}, scenario(), "reward"),
    ({"timing_s/gen", "timing_s/reward"}, "0.6", {}, scenario(), "reward"),         # sync was v0.6's default
    ({"timing_s/gen", "timing_s/reward"}, "0.6", {MODE: "async"}, scenario(), "gen"),
    ({"timing_s/gen", "timing_s/reward"}, "0.5", {MODE: "async"}, scenario(), "reward"),   # before PR #3055
    ({"timing_s/gen", "timing_s/reward"}, "0.9", {"reward_model.use_reward_loop": "False"}, scenario(), "reward"),
    ({"timing_s/gen", "timing_s/reward"}, "0.9", {}, scenario("model"), "reward"),          # a model on the actor's GPUs
    ({"timing_s/gen", "timing_s/reward"}, "0.9", {}, scenario("model", "dedicated_reward"), "gen"),
])
def test_the_reward_timer_by_release_and_mode(keys, version, settings, sc, holder):
    assert reward_span(keys, version, settings, sc) == holder


def test_verl_spans_puts_the_reward_and_retokenize_where_the_release_timed_them():
    phases = {"timing_s/gen": 5.0, "timing_s/reward": 0.3, "timing_s/retokenize": 0.1, "timing_s/adv": 0.01}
    assert verl_spans(phases, False, False, reward_in_gen=True) == pytest.approx(
        {"timing_s/gen": 5.4, "timing_s/adv": 0.01})
    assert verl_spans(phases, False, True) == pytest.approx({"timing_s/gen": 5.0, "timing_s/adv": 0.41})


def test_a_verl_09_async_run_is_compared_with_its_reward_inside_gen():
    """J1's log (verl 0.9, async agent loop) has timing_s/adv and no timing_s/reward: that is not the v0.3 layout
    (reward inside adv) but the agent loop's, so the simulator's reward joins gen and adv stays alone."""
    from rlhfsim.sim.run import simulate

    run = prepare(RunSpec("J1", *J1, "h20", (), "0.9"))
    assert run.reward_in_gen and not run.reward_in_adv
    base = load_profile("default")
    pred = predict(run, base)
    # priced as the fit prices a datasheet-derived profile on the run's GPU (fit.priced: with_stack_rate)
    raw = simulate(run.scenario, cost=CostModel(run.gpu, with_stack_rate(base, run.gpu)), max_work=None).summary["phases_s"]
    assert raw["reward"] > 0
    assert pred["timing_s/gen"] == pytest.approx(raw["generate"] + raw["reward"], rel=1e-9)
    assert pred["timing_s/adv"] == pytest.approx(raw["adv"], rel=1e-9)
    assert "timing_s/reward" not in pred
    old = prepare(RunSpec("J1", *J1, "h20", (), "0.2"))     # the same log claimed to be verl 0.2's
    assert old.reward_in_adv and not old.reward_in_gen

"""The shape every schedule shares: a ``NAME``, its config model ``Config`` (a frozen pydantic model with
``kind: Literal[NAME]``, in ``rlhfsim.scenario.schedules`` so that the schema needs no simulator; its
``check(sc)`` holds the block's cross-field checks and its ``VARIANTS`` the ``--compare`` names), one
entry method ``run(steps)`` (a SimPy process generator that appends a StepRecord per step), and hooks a
schedule may override:

- ``variants(sc)``: the schedule block each of its ``--compare`` names stands for;
- ``EXAMPLES``: small configurations the test matrix and the golden values run;
- ``in_flight``, ``work_per_step``: its share of the work estimate (``rlhfsim.sim.budget``), with the
  fields that scale them (``FLIGHT_FIELD``, ``WORK_FIELD``);
- ``after_generation(step, rows, streamed)``: the post-generation pipeline (reward, the actor's
  old-log-prob pass, reference, critic, advantages, training, weight sync), in verl's order by default;
- ``max_chunk_batch``: chunks a chunk-scorer replica prefills in one call (schedules that stream).
"""

from __future__ import annotations

from operator import attrgetter
from typing import ClassVar

import simpy

from rlhfsim.scenario.schedules import ScheduleConfig
from rlhfsim.sim import stages

_ROW_ID = attrgetter("id")


class Schedule:
    """Drives a Simulation's steps. Subclasses set NAME and Config and implement run()."""

    NAME: ClassVar[str]
    Config: ClassVar[type[ScheduleConfig]]
    EXAMPLES: ClassVar[dict[str, dict]] = {}
    FLIGHT_FIELD: ClassVar[str] = "workload.prompts_per_step"  # what to lower when in_flight is too large
    WORK_FIELD: ClassVar[str] = "schedule"                     # what to change when work_per_step is

    def __init__(self, sim, cfg):
        self.sim = sim
        self.cfg = cfg

    @property
    def max_chunk_batch(self) -> int:
        return 1

    @classmethod
    def variants(cls, sc) -> dict[str, dict]:
        """``--compare`` names -> the schedule block (a mapping) each stands for on scenario ``sc``:
        by default one variant, the schedule's own name, with the scenario's block when it is of this
        kind and the config's defaults otherwise."""
        cur = sc.schedule.model_dump(mode="json")
        return {cls.NAME: cur if cur["kind"] == cls.NAME else {"kind": cls.NAME}}

    @classmethod
    def variant_names(cls) -> tuple[str, ...]:
        return cls.Config.variant_names()

    @classmethod
    def work_per_step(cls, cfg, setup) -> float:
        """Work units (rlhfsim.sim.budget) one step adds beyond the default estimate."""
        return 0.0

    @classmethod
    def in_flight(cls, cfg, setup) -> int:
        """Rollouts in flight in one step (default: the batch)."""
        return setup.rollouts_per_step

    def run(self, steps: int):  # pragma: no cover - interface
        raise NotImplementedError

    def after_generation(self, step: int, rows, streamed: tuple[str, ...] = ()):
        """Process: scoring, the actor's old-log-prob pass (``execution.old_log_prob``), reference and
        critic passes, advantages (``execution.advantage``), training, weight sync (verl's order)."""
        sim = self.sim
        env, s = sim.env, sim.setup
        # The batch in prompt order, as frameworks gather it: which replica and which minibatch a row
        # lands in must not depend on the order rows happened to finish in.
        rows = sorted(rows, key=_ROW_ID)
        if "reward" in streamed:
            yield sim.scorers["reward"].wait_drained()
        elif s.rule_reward is not None:
            yield from stages.rule_reward(env, sim, step, rows)
        else:
            if s.retokenize:
                yield from stages.retokenize(env, sim, step, rows)
            yield from stages.forward_pass(env, sim, step, "reward", rows)
        ex = s.scenario.execution
        if ex.old_log_prob:
            yield from stages.forward_pass(env, sim, step, "actor", rows, phase="old_log_prob")
        for role in ("reference", "critic"):
            if role not in s.shapes:
                continue
            if role in streamed:
                yield sim.scorers[role].wait_drained()
            else:
                yield from stages.forward_pass(env, sim, step, role, rows)
        if ex.advantage.enabled:
            yield from stages.advantage(env, sim, step, rows)
        trains = [env.process(stages.train(env, sim, step, r, rows)) for r in ("actor", "critic") if r in s.shapes]
        yield simpy.AllOf(env, trains)
        yield from self.sync_weights(step)

    def sync_weights(self, step: int):
        """Process: the trained weights reach the generation engine (``stages.weight_sync``)."""
        yield from stages.weight_sync(self.sim.env, self.sim, step)

"""Asynchronous RL with bounded staleness (AReaL style): a generator process produces batch k as soon as
training has finished batch k - 1 - max_staleness, so generation runs ahead of training by at most
``max_staleness`` steps. Roles that share a pool still take turns (each phase holds its pool's lock), so
the overlap pays off when generation has GPUs of its own (placement ``pools`` with a ``rollout`` pool).

Step k's record runs from the end of step k-1's training (or the start of generation for k = 0) to the
end of its own weight sync; its staleness is k minus the policy version its batch was generated with.
With max_staleness 0 this is exactly the synchronous schedule.
"""

from __future__ import annotations

import simpy

from rlhfsim.scenario.schedules import AsyncSchedule
from rlhfsim.sim.generation import GenRequest
from rlhfsim.sim.schedules.base import Schedule


class Async(Schedule):
    """Generation ahead of training by at most ``max_staleness`` steps."""

    NAME = "async"
    Config = AsyncSchedule
    EXAMPLES = {"async": {"kind": "async", "max_staleness": 1}, "async2": {"kind": "async", "max_staleness": 2}}

    def run(self, steps: int):
        sim = self.sim
        env = sim.env
        self.store = simpy.Store(env)
        self.trained = [env.event() for _ in range(steps)]
        env.process(self._generator(steps))
        prev_end = None
        for step in range(steps):
            version, gen_start, res = yield self.store.get()
            start = gen_start if prev_end is None else prev_end
            yield env.process(sim.after_generation(step, res.finished))
            rec = sim.record_step(step, start, res.finished, res.generated_tokens, staleness=step - version)
            prev_end = rec.end_s
            self.trained[step].succeed()

    def _generator(self, steps: int):
        sim = self.sim
        env = sim.env
        B = sim.setup.rollouts_per_step
        pool = sim.setup.pool_of("rollout")
        for step in range(steps):
            wait_for = step - 1 - self.cfg.max_staleness
            if wait_for >= 0:
                yield self.trained[wait_for]
            version = sum(1 for e in self.trained if e.triggered)
            with sim.locks[pool.name].request() as req:
                yield req
                start = env.now
                res = yield env.process(sim.generate(GenRequest(step, sim.stream.take(B, step))))
            yield self.store.put((version, start, res))

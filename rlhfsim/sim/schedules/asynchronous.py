"""Asynchronous RL with bounded staleness: generation on its own pool runs ahead of training by at most
``max_staleness`` steps. Two ways of working the generation pool (``generator``):

* ``batch`` (AReaL style, the default): a generator process produces batch k as soon as training has finished
  batch k - 1 - max_staleness, one batch at a time, each generated whole (every row to its end) while it holds its
  pool's lock; the weight sync takes that lock too, so it waits for the batch in progress (the generator goes on
  past the last step, so the last sync waits as the others do). Roles that share a pool take turns, so the overlap pays off when generation has GPUs of its own (placement ``pools`` with a ``rollout``
  pool). With max_staleness 0 this is exactly the synchronous schedule.
* ``groups`` (NeMo RL's async GRPO, ``rlhfsim.sim.feed``): prompt groups start one by one under a semaphore of
  max_staleness x prompts_per_step groups in flight, a freed slot refilled at once, so the next batch fills the tail
  of the last and up to max_staleness batches generate together; training takes the groups reserved for its step.
  The weight update pauses new groups and either waits for those in flight or, with ``in_flight_weight_updates``,
  pauses their decode while the weights load.

Step k's record runs from the end of step k-1's weight sync (or the start of generation for k = 0) to the end of
its own: the trainer's loop as NeMo RL times it ("Total step time": the wait for the batch, log-probs, training and
the refit). Its staleness is k minus the oldest weight version its batch was generated with.
"""

from __future__ import annotations

import simpy

from rlhfsim.scenario.schedules import AsyncSchedule
from rlhfsim.sim import stages
from rlhfsim.sim.feed import GroupFeed
from rlhfsim.sim.generation import GenRequest
from rlhfsim.sim.schedules.base import Schedule


class Async(Schedule):
    """Generation ahead of training by at most ``max_staleness`` steps."""

    NAME = "async"
    Config = AsyncSchedule
    EXAMPLES = {"async": {"kind": "async", "max_staleness": 1}, "async2": {"kind": "async", "max_staleness": 2}}

    @classmethod
    def in_flight(cls, cfg, setup) -> int:
        """Rollouts in flight: a batch, or with generator ``groups`` up to max_staleness batches."""
        return setup.rollouts_per_step * (cfg.max_staleness if cfg.generator == "groups" else 1)

    def run(self, steps: int):
        if self.cfg.generator == "groups":
            yield from self._run_groups(steps)
            return
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
        """Process: batch after batch. It goes on past the last step (up to max_staleness batches, never trained),
        as a real run goes on past the steps it reports: the last step's weight sync then waits for the batch in
        progress as every earlier one does, instead of finding the pool free."""
        sim = self.sim
        env = sim.env
        B = sim.setup.rollouts_per_step
        pool = sim.setup.pool_of("rollout")
        for step in range(steps + self.cfg.max_staleness):
            wait_for = step - 1 - self.cfg.max_staleness
            if wait_for >= 0:
                yield self.trained[wait_for]
            version = sum(1 for e in self.trained if e.triggered)
            with sim.locks[pool.name].request() as req:
                yield req
                start = env.now
                res = yield env.process(sim.generate(GenRequest(step, sim.stream.take(B, step))))
            yield self.store.put((version, start, res))

    def _run_groups(self, steps: int):
        """The trainer's loop over a group feed (module docstring)."""
        sim = self.sim
        env = sim.env
        self.feed = feed = GroupFeed(sim, steps, self.cfg.max_staleness)
        feed.start()
        env.process(sim.generate(GenRequest(0, [], feed=feed)))
        start = env.now
        for step in range(steps):
            rows, versions = yield feed.batch(step)
            generated = sum(r.response_len for r in rows)
            yield env.process(sim.after_generation(step, rows))
            rec = sim.record_step(step, start, rows, generated, staleness=step - min(versions))
            start = rec.end_s
        feed.close()

    def sync_weights(self, step: int):
        if self.cfg.generator != "groups":
            yield from super().sync_weights(step)
            return
        yield from stages.weight_sync(self.sim.env, self.sim, step, feed=self.feed,
                                      in_flight=self.cfg.in_flight_weight_updates)

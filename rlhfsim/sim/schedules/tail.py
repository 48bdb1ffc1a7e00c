"""Length-aware tail batching (RollPacker, Gao et al. 2025, "RollPacker: Mitigating Long-Tail Rollouts
for Fast, Synchronous RL Post-Training", arXiv:2509.21009): rounds of two kinds.

- A *short round* launches B + ``extra_prompts`` x group_size rollouts (speculatively, more than the
  batch needs), stops generation on every replica once B have finished and trains on those B. The
  rollouts still running are the long tail: they stop and wait in the tail buffer with the tokens they
  have (their KV cache is dropped unless ``keep_kv``: they re-prefill prompt + generated tokens when
  they resume).
- A *long round* starts as soon as the tail buffer holds a whole batch: those B rollouts, oldest
  first, alone on the engine, run to completion, and the step trains on them.

So short rounds never wait for the longest responses, and the long ones are gathered into rounds of
their own (where they fill the engine together instead of trailing one by one at the end of every
step). Unlike OPPO's inter-step overcommitment, a deferred rollout does not resume in the next step next
to new prompts; unlike partial rollouts, a round is not cut at a token budget. The trained batch is
always B rollouts; a long round's tokens decoded in earlier rounds count as off-policy.

Step record: ``delta`` is ``extra_prompts`` in a short round and 0 in a long one; ``deferred`` is the
tail buffer after the step.
"""

from __future__ import annotations

from rlhfsim.scenario.schedules import TailSchedule
from rlhfsim.sim.generation import GenRequest
from rlhfsim.sim.schedules.base import Schedule


class TailBatching(Schedule):
    """Short rounds that stop at the first B finished; long rounds of the deferred tail, run to the end."""

    NAME = "tail"
    Config = TailSchedule
    FLIGHT_FIELD = "schedule.extra_prompts"
    EXAMPLES = {"tail": {"kind": "tail", "extra_prompts": 4}, "tail-kv": {"kind": "tail", "extra_prompts": 6, "keep_kv": True}}

    @classmethod
    def in_flight(cls, cfg, setup) -> int:
        return setup.rollouts_per_step + cfg.extra_prompts * setup.scenario.algorithm.group_size

    def run(self, steps: int):
        sim = self.sim
        env = sim.env
        B = sim.setup.rollouts_per_step
        g = sim.setup.scenario.algorithm.group_size
        tail: list = []   # deferred rollouts, oldest first
        ready: list = []  # finished beyond B in a short round: first in the next short round's batch
        for step in range(steps):
            start = env.now
            if len(tail) >= B:  # a long round
                batch, tail = tail[:B], tail[B:]
                deferred_in, extra = len(batch), 0
                res = yield env.process(sim.generate(GenRequest(step, batch)))
                trained, generated = res.finished, res.generated_tokens
                tail = res.unfinished + tail  # none: a long round runs to completion
            else:
                extra = self.cfg.extra_prompts
                deferred_in = len(ready)
                target = B - len(ready)
                new = sim.stream.take(max(B + extra * g - len(ready), 0), step)
                finished, generated, unfinished = list(ready), 0, []
                if target > 0:
                    res = yield env.process(sim.generate(GenRequest(step, new, stop_after=target)))
                    finished += res.finished
                    unfinished, generated = res.unfinished, res.generated_tokens
                else:
                    unfinished = new
                trained, ready = finished[:B], finished[B:]
                for r in unfinished:
                    if not self.cfg.keep_kv:
                        r.kv_resident = False
                tail += unfinished
            yield env.process(sim.after_generation(step, trained))
            sim.record_step(step, start, trained, generated, deferred=len(tail) + len(ready),
                            deferred_in=deferred_in, delta=extra)

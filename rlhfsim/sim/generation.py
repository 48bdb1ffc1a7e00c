"""Generation on the rollout pool: what one step asks of it (``GenRequest``), what it returns
(``GenResult``), and ``Generation``, which runs a request on the scenario's engine
(``rlhfsim.sim.engines.ENGINES[generation.engine]``: ``static``, Hugging Face generate as TRL calls it,
or ``continuous``, vLLM-like). The engines, their costs and the event clock they share are documented in
``rlhfsim.sim.engines``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import simpy

from rlhfsim.sim.engines import ENGINES
from rlhfsim.sim.rollouts import Rollout

if TYPE_CHECKING:  # for the annotation only
    from rlhfsim.sim.feed import GroupFeed


@dataclass
class GenRequest:
    """What one step asks of generation."""

    step: int
    rollouts: list[Rollout]  # carried first, then new, in admission order
    stop_after: int | None = None  # stop all replicas once this many rollouts have finished
    token_budget: int | None = None  # max tokens a rollout may decode in this step (partial rollouts)
    stream: dict = field(default_factory=dict)  # role -> chunk tokens, for chunked scoring during decode
    # an open request (rlhfsim.sim.feed.GroupFeed): rows arrive in its queues while the engine runs, until it closes
    feed: GroupFeed | None = None


@dataclass
class GenResult:
    finished: list[Rollout]
    unfinished: list[Rollout]
    generated_tokens: int
    start_s: float
    end_s: float
    preemptions: int = 0  # recompute preemptions (continuous batching) in this step


class Generation:
    """Runs one step's generation over the replicas of the rollout pool, on the scenario's engine."""

    def __init__(self, sim, req: GenRequest):
        self.env: simpy.Environment = sim.env
        self.engine = ENGINES[sim.setup.scenario.generation.engine](sim, req)

    def run(self):
        """Process: run the engine's replicas to the end of the step (or OPPO's stop); a GenResult."""
        start = self.env.now
        e = self.engine
        yield from e.run()
        return GenResult(e.finished, e.unfinished, e.generated, start, self.env.now, e.preemptions)

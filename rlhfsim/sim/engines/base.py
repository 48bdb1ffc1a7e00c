"""The shape every generation engine shares: a ``NAME``, the scenario's ``generation`` block as its
config, and one entry method ``run()`` (a SimPy process over the data-parallel replicas of the rollout
pool). What engines have in common lives here: finishing a row, the global stop, the chunk handoff
pause and the busy interval each replica records."""

from __future__ import annotations

from typing import ClassVar

import simpy

from rlhfsim.sim.engines.clock import Clock
from rlhfsim.sim.rollouts import Rollout


class Engine:
    """Runs one step's generation request (``GenRequest``) on the rollout pool. Subclasses set NAME and
    implement ``replica(idx)`` (a process per data-parallel replica) and ``leftover()`` (the rows no
    replica started). After ``run()``: ``finished`` (in finishing order), ``unfinished``, ``generated``
    (tokens decoded in this step) and ``preemptions``."""

    NAME: ClassVar[str]

    def __init__(self, sim, req):
        self.sim = sim
        self.env: simpy.Environment = sim.env
        self.req = req
        s = sim.setup
        g = s.scenario.generation
        self.cost = sim.cost
        self.rt = g.resolved_runtime
        self.max_batch = g.max_batch
        self.n_rep = s.replicas
        self.tp = s.tp["rollout"]
        self.model = s.shapes["actor"]
        self.dtype = s.dtypes["actor"]
        self.kv_cap = max(s.kv_capacity_tokens, 1)
        self.overhead = g.step_overhead_s
        self.pool = s.pool_of("rollout")
        self.finished: list[Rollout] = []
        self.unfinished: list[Rollout] = []
        self.generated = 0
        self.preemptions = 0
        self.stopped = False
        self.procs: list[simpy.Process] = []

    def run(self):
        """Process: start the replicas, wait for all of them; the results are on the engine."""
        self.procs = [self.env.process(self.replica(i)) for i in range(self.n_rep)]
        yield simpy.AllOf(self.env, self.procs)
        self.unfinished.extend(self.leftover())

    def replica(self, idx: int):  # pragma: no cover - interface
        raise NotImplementedError

    def leftover(self) -> list[Rollout]:  # pragma: no cover - interface
        raise NotImplementedError

    # -- shared steps ----------------------------------------------------------------------------------
    def stop_all(self) -> None:
        """OPPO inter-step: enough rollouts finished; interrupt every other replica with ``"stop"``."""
        if self.stopped:
            return
        self.stopped = True
        me = self.env.active_process
        for p in self.procs:
            if p is not me and p.is_alive:
                p.interrupt("stop")

    def finish(self, r: Rollout, emit: bool = True) -> None:
        """A row generated its last token now. ``emit``: its remaining tokens go to the streamed roles'
        scorers now (else the engine hands them over later)."""
        r.finished_at = self.env.now
        self.finished.append(r)
        if emit:
            for role in self.req.stream:
                self.sim.scorers[role].emit(self.req.step, r, final=True)
        if self.req.stop_after is not None and len(self.finished) >= self.req.stop_after:
            self.stop_all()

    def handoff(self, clock: Clock, rows: int):
        """Process: the actor's pause at a chunk boundary, ``cost.handoff_s(runtime, rows)`` (host time,
        not active). No event at all when it costs nothing, so a profile without handoff costs gives
        the same event sequence as no handoff. Returns False if a stop interrupted it."""
        t = self.cost.handoff_s(self.rt, rows)
        if t <= 0:
            return True
        try:
            yield from clock.busy(t, 0.0)
        except simpy.Interrupt:
            return False
        return True

    def prefill_parts(self, n_tokens: float, n_seqs: int) -> tuple[float, float]:
        """(total_s, active_s) of one prefill call of the generation runtime."""
        return self.cost.forward_parts(self.model, self.dtype, n_tokens, n_seqs, self.tp, op="prefill", head="lm",
                                       gen_runtime=self.rt)

    def record(self, clock: Clock, start: float) -> None:
        """The replica's busy interval for this step, with the kernel seconds in it."""
        end = self.env.now
        if end > start:
            self.sim.rec.busy(self.req.step, self.pool.name, clock.gpu0, self.tp, "rollout", "generate", start, end,
                              active_s=clock.active_s)

"""The shape every generation engine shares: a ``NAME``, the scenario's ``generation`` block as its
config, and one entry method ``run()`` (a SimPy process over the data-parallel replicas of the rollout
pool). What engines have in common lives here: the replica's clock (the event clock, or the deferred one
of a detached replica: ``detached``), finishing a row, the global stop, the chunk handoff pause and the
busy interval each replica records."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import simpy

from rlhfsim.costs.terms import HANDOFF, LEFT_PADDING, CostTerm
from rlhfsim.sim.engines.accounting import EngineTerms, TermsClock, TermsDeferredClock
from rlhfsim.sim.engines.clock import Clock, wait_until
from rlhfsim.sim.engines.deferred import DeferredClock
from rlhfsim.sim.rollouts import Rollout


class Engine:
    """Runs one step's generation request (``GenRequest``) on the rollout pool. Subclasses set NAME and
    implement ``replica(idx)`` (a process per data-parallel replica) and ``leftover()`` (the rows no
    replica started). After ``run()``: ``finished`` (in finishing order), ``unfinished``, ``generated``
    (tokens decoded in this step) and ``preemptions``.

    ``detached``: nothing outside a replica can see or change its generation while it runs (no streamed
    chunks, no stop target, no chunk scoring in flight), so each replica runs on a ``DeferredClock``: one
    SimPy event per replica instead of one per decode segment (``rlhfsim.sim.engines.deferred``).
    ``DETACH = False`` forces the event clock everywhere (tests compare the two)."""

    NAME: ClassVar[str]
    DETACH: ClassVar[bool] = True
    # the cost term of what a clock's ``step_extra_s`` adds to each decode step (``_Decode.price``)
    EXTRA_TERM: ClassVar[CostTerm] = LEFT_PADDING

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
        # a TP group beyond the NVLink domain: its all-reduces cross the inter-node link (cost term tp_inter_node)
        self.tp_inter_node = self.tp > s.gpu.link_domain(s.scenario.cluster.gpus_per_node)
        self.par = s.gen_parallel   # expert parallelism and data-parallel attention (genparallel; None: none)
        self.model = s.shapes["actor"]
        self.dtype = s.dtypes["actor"]
        self.kv_cap = max(s.kv_capacity_tokens, 1)
        self.overhead = g.step_overhead_s
        self.logprobs = g.sampling_logprobs   # each sampled token's log-prob recorded (genruntimes.sample_tail)
        self.pool = s.pool_of("rollout")
        self.finished: list[Rollout] = []
        self.unfinished: list[Rollout] = []
        self.generated = 0
        self.preemptions = 0
        self.stopped = False
        self.procs: list[simpy.Process] = []
        self.detached = (self.DETACH and not req.stream and req.stop_after is None and req.feed is None
                         and all(sc.outstanding == 0 for sc in sim.scorers.values()))
        self._prefill_memo: dict[tuple, tuple[float, float]] = {}
        # seconds by cost term, kept only for ``rlhfsim explain`` (``rlhfsim.sim.engines.accounting``)
        self.terms = EngineTerms(self) if sim.rec.terms is not None else None

    def clock(self, idx: int, row_stream: dict) -> Clock:
        """Replica ``idx``'s event clock (one that keeps its seconds by term when the recorder asks for them)."""
        return (Clock if self.terms is None else TermsClock)(self, idx, row_stream)

    def run(self):
        """Process: start the replicas, wait for all of them; the results are on the engine."""
        if self.detached:
            yield from self._run_detached()
        else:
            self.procs = [self.env.process(self.replica(i)) for i in range(self.n_rep)]
            yield simpy.AllOf(self.env, self.procs)
        self.unfinished.extend(self.leftover())

    def _run_detached(self):
        """Process: every replica's generation booked at once (``plan``) on a deferred clock and priced
        (``DeferredClock.resolve_all``); then each replica waits out its time in one process, and the rows'
        ends and departures are put in the order the event clock would have met them (``_merged``)."""
        env = self.env
        start = env.now
        # Local, not on the engine: a clock refers to its engine, and a cycle would keep every row of
        # the step alive until the garbage collector found it.
        kind = DeferredClock if self.terms is None else TermsDeferredClock
        clocks = [kind(self, i, {}) for i in range(self.n_rep)]
        for i, c in enumerate(clocks):
            self.plan(i, c)
        DeferredClock.resolve_all(clocks, start)
        # Replicas ending at the same time end in the order the event clock would have ended them.
        order = sorted(range(self.n_rep), key=lambda i: (clocks[i].chain(len(clocks[i].dur)), i))
        self.procs = [env.process(self._wait(clocks[i], start)) for i in order]
        yield simpy.AllOf(env, self.procs)
        self.finished.extend(_merged([(c, c.finished_at, c.finished) for c in clocks]))
        self.unfinished.extend(_merged([(c, c.left_at, c.left) for c in clocks]))

    def _wait(self, clock: DeferredClock, start: float):
        """Process: a detached replica, from its start to its booked end."""
        self.decoding(clock, +1)
        try:
            if clock.dur:
                yield from wait_until(self.env, clock.times[-1])
        finally:
            self.decoding(clock, -1)
            self.record(clock, start)

    def replica(self, idx: int):  # pragma: no cover - interface
        """Process: replica ``idx`` on the event clock."""
        raise NotImplementedError

    def plan(self, idx: int, clock: DeferredClock) -> None:  # pragma: no cover - interface
        """Replica ``idx``'s whole generation, booked on a deferred clock (a detached request)."""
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

    def decoding(self, clock: Clock, delta: int) -> None:
        """This replica's decode starts (+1) or stops (-1) on its GPUs: counted for co-running, and a chunk
        scorer running several calls on those GPUs re-prices the ones not started yet."""
        self.sim.set_active(self.pool.name, "decode", clock.gpus, delta)
        for sc in self.sim.scorers.values():
            sc.decode_changed(self.pool.name, clock.gpus)

    def finish(self, clock: Clock, r: Rollout, emit: bool = True) -> None:
        """A row generated its last token now. ``emit``: its remaining tokens go to the streamed roles'
        scorers now (else the engine hands them over later)."""
        if clock.deferred:
            clock.finished_at.append(len(clock.dur))
            clock.finished.append(r)
            return
        r.finished_at = self.env.now
        self.finished.append(r)
        if self.req.feed is not None:
            self.req.feed.finished(clock.gpu0 // self.tp, r)
        if emit:
            for role in self.req.stream:
                self.sim.scorers[role].emit(self.req.step, r, final=True)
        if self.req.stop_after is not None and len(self.finished) >= self.req.stop_after:
            self.stop_all()

    def leave(self, clock: Clock, r: Rollout) -> None:
        """A row leaves the batch unfinished now (its token budget is spent, or the replica stopped)."""
        if clock.deferred:
            clock.left_at.append(len(clock.dur))
            clock.left.append(r)
        else:
            self.unfinished.append(r)

    def handoff(self, clock: Clock, rows: int):
        """Process: the actor's pause at a chunk boundary, ``cost.handoff_s(runtime, rows)`` (host time,
        not active). No event at all when it costs nothing, so a profile without handoff costs gives
        the same event sequence as no handoff. Returns False if a stop interrupted it. With a slowdown
        measured in the hand-over pattern (window ``live``) the pause is part of the interval measured
        beside the scorer, so it is slowed as decode is (``Simulation.decode_factor`` at its start)."""
        t = self.cost.handoff_s(self.rt, rows)
        if t <= 0:
            return True
        base = t
        if self.sim.slows_decode == "live":
            t *= self.sim.decode_factor(self.pool.name, clock.gpus)
        if self.terms is not None:
            clock.charge({HANDOFF: base}, slowed=t != base)
        try:
            yield from clock.busy(t, 0.0)
        except simpy.Interrupt:
            return False
        return True

    def prefill_parts(self, n_tokens: float, n_seqs: int) -> tuple[float, float]:
        """(total_s, active_s) of one prefill call of the generation runtime (remembered per size for the
        step: rows of one prompt length cost the same)."""
        key = (n_tokens, n_seqs)
        parts = self._prefill_memo.get(key)
        if parts is None:
            parts = self._prefill_memo[key] = tuple(self.cost.forward(
                self.model, self.dtype, n_tokens, n_seqs, self.tp, op="prefill", head="lm", gen_runtime=self.rt,
                gen_logprobs=self.logprobs, tp_inter_node=self.tp_inter_node, par=self.par))
        return parts

    def row_prefills(self, rows) -> dict[int, tuple[float, float]]:
        """tokens -> (total_s, active_s) of a one-row prefill, for every row's current context, priced in
        one numpy pass (``CostModel.forward`` of an array: the same bits as ``prefill_parts``)."""
        tokens = sorted({r.prompt_len + r.generated for r in rows})
        if not tokens:
            return {}
        total, active = self.cost.forward(self.model, self.dtype, np.array(tokens, dtype=np.float64), 1, self.tp,
                                          op="prefill", head="lm", gen_runtime=self.rt, gen_logprobs=self.logprobs,
                                          tp_inter_node=self.tp_inter_node, par=self.par)
        return dict(zip(tokens, zip(total.tolist(), active.tolist())))

    def record(self, clock: Clock, start: float, step: int | None = None) -> None:
        """The replica's busy interval for this step (an open request's: for ``step``, by default the oldest step
        whose batch is still generating), with the kernel seconds in it."""
        end = self.env.now
        if step is None:
            step = self.req.step if self.req.feed is None else self.req.feed.current_step()
        if end > start:
            self.sim.rec.busy(step, self.pool.name, clock.gpu0, self.tp, "rollout", "generate", start, end,
                              active_s=clock.active_s)
            if self.terms is not None:
                self.sim.rec.add_streamed(step, "generate", clock.gpu0, end, clock.acc)


def _merged(per_replica: list[tuple[DeferredClock, list[int], list[Rollout]]]) -> list[Rollout]:
    """Rows booked by deferred clocks, (clock, booking indices, rows) per replica, in the order the event
    clock would have met them: by time; at equal times by the clocks' ``chain`` (which replica's event was
    scheduled first), then replica, then the replica's own order."""
    at, rep, rows, marks = [], [], [], []
    for i, (clock, booked_at, booked) in enumerate(per_replica):
        times = clock.times
        at.extend([times[k] for k in booked_at])
        rep.extend([i] * len(booked))
        marks.extend(booked_at)
        rows.extend(booked)
    t = np.array(at, dtype=np.float64)
    order = np.argsort(t, kind="stable").tolist()  # by time, then replica, then own order
    # Equal times in different replicas are rare: order each such run by the clocks' chains.
    ts = t[order]
    done = -1
    for j in np.flatnonzero(ts[1:] == ts[:-1]).tolist():
        if j <= done:
            continue
        k = j + 1
        while k + 1 < len(order) and ts[k + 1] == ts[j]:
            k += 1
        run = order[j:k + 1]
        if len({rep[x] for x in run}) > 1:
            run.sort(key=lambda x: (per_replica[rep[x]][0].chain(marks[x]), rep[x]))  # stable: own order kept
            order[j:k + 1] = run
        done = k
    return [rows[i] for i in order]

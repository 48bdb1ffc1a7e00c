"""A generation replica's event clock, shared by every engine.

No event per token: between two events (a completion, a chunk boundary, a per-step token budget, a
KV-capacity limit) the batch is fixed, so a replica advances in one SimPy timeout whose length is the
closed-form sum of its decode steps (``CostModel.decode_coeffs`` / ``decode_sum``):

    segment_s = f x sum_{i=0}^{n-1} [ max(c0 + cs i, u0 + us i) + o ]  -  credit x f x step_1

with f the co-running rate factor (``decode_slowdown`` while a chunk prefill runs on one of the replica's
GPUs, else 1), o the per-step overhead and ``credit`` the fraction of the first step already done in an
earlier segment cut by a rate change.

Two SimPy interrupts cut a segment:

* ``"stop"`` (OPPO's "first B finished", from ``Engine.stop_all``): the whole steps done in the elapsed
  time are recovered by inverting the same sum (``steps_done``, bisection); the step in progress is lost.
* ``"rate"`` (``Simulation.interference_changed``: chunk prefills started or stopped on the replica's
  GPUs): the whole steps are booked and the fraction of the step in progress is kept as ``credit``; the
  next segment runs at the new factor. So a slowdown applies to exactly the time both kinds of work run.

Rows advance without being touched: a replica counts its decode steps in ``T`` and a live row's
generated tokens are ``T - r.clock_offset``. Only rows with an event at the new ``T`` are popped from a
heap and brought up to date: O(log batch) per event instead of O(batch).

Kernel (active) time of a segment, for the recorder: the same expression without the per-step overhead
(``decode_parts``), times f, counted for the steps and step fractions actually done.
"""

from __future__ import annotations

import heapq

import simpy

from rlhfsim.costs.model import decode_parts, decode_sum
from rlhfsim.sim.rollouts import Rollout


def steps_done(coeffs: tuple, n: int, elapsed: float, factor: float = 1.0) -> tuple[int, float]:
    """(k, frac): the largest k <= n whose k decode steps (``factor x decode_sum(coeffs, k)``) fit in
    ``elapsed`` seconds of an interrupted segment, and the fraction of step k + 1 done in the time left
    over (0 when k = n). Bisection over k: O(log n) evaluations of the closed-form sum."""

    def t(k: int) -> float:
        return factor * decode_sum(coeffs, k)

    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if t(mid) <= elapsed + 1e-12:
            lo = mid
        else:
            hi = mid - 1
    if lo >= n:
        return lo, 0.0
    done = t(lo)
    step = t(lo + 1) - done
    return lo, min(max((elapsed - done) / step, 0.0), 1.0 - 1e-9) if step > 0 else 0.0


class Clock:
    """One replica's decode-step clock: its step count ``T``, the heap of its live rows' next events,
    the partial-step ``credit`` and the kernel seconds it has accumulated (``active_s``).

    ``row_stream`` (role -> chunk tokens) makes each row's own chunk boundaries events: the row's new
    tokens are emitted to that role's scorer when it crosses one (continuous batching streams per
    request). Empty when the engine hands chunks over per batch instead (static batching)."""

    def __init__(self, eng, idx: int, row_stream: dict):
        self.eng = eng
        self.sim = eng.sim
        self.env: simpy.Environment = eng.env
        self.step = eng.req.step
        self.row_stream = row_stream
        self.chunks = tuple(row_stream.values())
        self.T = 0
        self.heap: list = []
        self.credit = 0.0
        self.active_s = 0.0
        self.gpu0 = idx * eng.tp
        self.gpus = range(self.gpu0, self.gpu0 + eng.tp)

    # -- rows ----------------------------------------------------------------------------------------
    def sync(self, r: Rollout) -> None:
        """Bring a live row's counters up to step T."""
        g = self.T - r.clock_offset
        d = g - r.generated
        if d:
            r.generated = g
            r.step_budget_used += d
            tbs = r.tokens_by_step
            tbs[self.step] = tbs.get(self.step, 0) + d

    def push(self, r: Rollout) -> None:
        """Schedule a live row's next event after step T: its end, its next own chunk boundary, or the
        end of its token budget, whichever comes first."""
        off = r.clock_offset
        ev = off + r.response_len
        g = self.T - off
        for c in self.chunks:
            b = off + (g // c + 1) * c
            if b < ev:
                ev = b
        if r.budget_at < ev:
            ev = r.budget_at
        r.heap_version += 1
        heapq.heappush(self.heap, (ev, r.id, r.heap_version, r))

    def activate(self, r: Rollout) -> bool:
        """Start the clock of a row joining the live batch at step T. False if the row has nothing to
        decode in this step (it finished on its first token, or its budget is spent)."""
        T = self.T
        r.clock_offset = T - r.generated
        budget = self.eng.req.token_budget
        r.budget_at = T + (budget - r.step_budget_used) if budget is not None else 1 << 62
        if r.generated >= r.response_len or r.budget_at <= T:
            return False
        self.push(r)
        return True

    def first_token(self, r: Rollout) -> bool:
        """The token a fresh row gets from its prefill's logits (so a response of R tokens costs one
        prefill and R - 1 decode steps). True if it put the row on one of its own chunk boundaries
        (its tokens were emitted)."""
        step = self.step
        r.generated += 1
        r.step_budget_used += 1
        r.tokens_by_step[step] = r.tokens_by_step.get(step, 0) + 1
        self.eng.generated += 1
        hit = False
        if r.generated < r.response_len:
            for role, c in self.row_stream.items():
                if r.generated % c == 0:
                    self.sim.scorers[role].emit(step, r, final=False)
                    hit = True
        return hit

    def events(self) -> tuple[list[tuple[Rollout, str]], int]:
        """Pop every row whose event is at or before T. Rows on one of their own chunk boundaries emit
        their new tokens and stay; returns ((row, "done"|"paused") for the rows that leave the live
        batch, how many rows crossed a chunk boundary)."""
        out = []
        crossed = 0
        heap = self.heap
        T = self.T
        step = self.step
        stream = self.row_stream
        scorers = self.sim.scorers
        while heap and heap[0][0] <= T:
            _, _, ver, r = heapq.heappop(heap)
            if ver != r.heap_version:
                continue  # stale: the row left the batch (preempted) after this was pushed
            self.sync(r)
            if r.generated >= r.response_len:
                out.append((r, "done"))
            elif T >= r.budget_at:
                r.paused = True
                out.append((r, "paused"))
            else:
                hit = False
                for role, c in stream.items():
                    if r.generated % c == 0:
                        scorers[role].emit(step, r, final=False)
                        hit = True
                crossed += hit
                self.push(r)
        return out, crossed

    def release(self, rows) -> None:
        """Rows leaving the batch for good (the replica ended or stopped): counters up to T, heap
        entries made stale."""
        for r in rows:
            self.sync(r)
            r.heap_version += 1

    # -- decode segments -----------------------------------------------------------------------------
    def coeffs(self, batch: int, kv0: float) -> tuple:
        """``decode_coeffs`` of a segment of ``batch`` rows holding ``kv0`` cached tokens at its start."""
        e = self.eng
        return e.cost.decode_coeffs(e.model, e.dtype, batch, kv0, e.tp, e.overhead, runtime=e.rt)

    def factor(self) -> float:
        """How much slower decode runs now: ``decode_slowdown`` while a chunk prefill shares its GPUs."""
        sim = self.sim
        return sim.cost.decode_slowdown if sim.corun(self.eng.pool.name, "decode", self.gpus) else 1.0

    def decode(self, batch: int, kv0: float, n: int):
        """Process: run up to ``n`` decode steps of a fixed batch as one timeout (module docstring).
        Advances T by the whole steps done and returns their number: ``n``, or fewer when a "stop" or
        "rate" interrupt cut the segment."""
        env, sim = self.env, self.sim
        coeffs = self.coeffs(batch, kv0)
        factor = self.factor()
        c0 = self.credit
        head = c0 * (factor * decode_sum(coeffs, 1))  # time already spent on step 1
        total, kernel = decode_parts(coeffs, n)
        dur = factor * total - head
        self.credit = 0.0
        frac = 0.0
        t0 = env.now
        pool = self.eng.pool.name
        me = env.active_process
        sim.decoding[pool][me] = self.gpus
        try:
            yield env.timeout(dur)
        except simpy.Interrupt as why:
            n, frac = steps_done(coeffs, n, env.now - t0 + head, factor)
            kernel = decode_parts(coeffs, n)[1]
            if frac:
                kernel += frac * (decode_parts(coeffs, n + 1)[1] - kernel)
            if why.cause == "rate":
                self.credit = frac
        finally:
            sim.decoding[pool].pop(me, None)
        if c0:
            kernel -= c0 * decode_parts(coeffs, 1)[1]
        self.active_s += factor * max(kernel, 0.0)
        self.T += n
        return n

    def busy(self, total_s: float, active_s: float):
        """Process: the replica busy for ``total_s`` outside a decode segment (a prefill call, a call
        overhead, a handoff pause), ``active_s`` of it kernels. A stop interrupt is re-raised after
        counting the kernel share of the time spent."""
        t0 = self.env.now
        try:
            yield self.env.timeout(total_s)
        except simpy.Interrupt:
            if total_s > 0:
                self.active_s += active_s * (self.env.now - t0) / total_s
            raise
        self.active_s += active_s

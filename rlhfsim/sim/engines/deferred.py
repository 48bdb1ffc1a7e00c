"""A detached replica's clock: the whole generation of one replica in one SimPy event.

When nothing outside a replica can see or change its generation while it runs (no chunk streams to
scorers, no OPPO stop, so no interference from chunk prefills either), the engine's replica loop runs to
its end at once, in decode steps: the same code, the same admissions, preemptions and row ends, but each
decode segment and each busy call (prefill, call overhead) is booked instead of waited for. Afterwards
``resolve`` prices every booked segment in one numpy pass (``CostModel.decoder(...).coeffs`` and
``decode_sum`` on arrays: the same arithmetic as the event clock, elementwise, so the same bits),
accumulates the durations in booking order (``np.add.accumulate``, left to right, as SimPy's clock adds
timeouts) and gives each finished or paused row the time of the booking it followed. The replica then
waits one timeout for its total: one event instead of one per segment.

What this does not cover stays on the event clock (``clock.Clock``): streamed chunks (scorers must see
them when they happen), OPPO's "first B finished" stop (it interrupts replicas mid-segment) and the
co-running re-timing it would take. ``Engine.detached`` decides per request.
"""

from __future__ import annotations

import numpy as np

from rlhfsim.costs.model import decode_sum
from rlhfsim.sim.engines.clock import Clock
from rlhfsim.sim.rollouts import Rollout

SEGMENT = -1.0  # a booked item that is a decode segment (its duration is computed in ``resolve``)


def _with_extra(coeffs: tuple, extra: np.ndarray) -> tuple:
    """``CostModel.decoder(...).coeffs`` with each booking's ``step_extra_s`` added to its per-step overhead, as
    ``Clock.coeffs`` adds it (the same arithmetic, so the same bits)."""
    if not extra.any():
        return coeffs
    return (*coeffs[:4], coeffs[4] + extra)


class DeferredClock(Clock):
    """``Clock`` whose ``busy`` and ``decode`` book time instead of waiting for it (module docstring).
    ``finished`` and ``left``: the rows that ended / left the batch unfinished, in the order the replica
    saw them, with the booking index each followed in ``finished_at`` / ``left_at`` (parallel lists of
    ints rather than tuples: fewer objects for the garbage collector to walk at 65,536 rollouts)."""

    deferred = True

    def __init__(self, eng, idx: int, row_stream: dict):
        super().__init__(eng, idx, row_stream)
        self.dur: list[float] = []  # per booking: seconds of a busy call, or SEGMENT
        self.act: list[float] = []  # per booking: kernel seconds of a busy call
        self.book_batch: list[int] = []
        self.book_kv0: list[int] = []
        self.book_n: list[int] = []
        self.book_extra: list[float] = []   # per decode booking: the clock's step_extra_s then
        self.finished: list[Rollout] = []
        self.finished_at: list[int] = []
        self.left: list[Rollout] = []
        self.left_at: list[int] = []
        self.times: list[float] = []

    def busy(self, total_s: float, active_s: float):
        """Book ``total_s`` of busy time (``active_s`` of it kernels). A generator that never yields."""
        self.dur.append(total_s)
        self.act.append(active_s)
        return
        yield  # pragma: no cover - makes this a generator, as Clock.busy is

    def decode(self, batch: int, kv0: float, n: int):
        """Book ``n`` decode steps of a fixed batch; never cut (nothing can interrupt a detached replica)."""
        self.dur.append(SEGMENT)
        self.act.append(0.0)
        self.book_batch.append(batch)
        self.book_kv0.append(kv0)
        self.book_n.append(n)
        self.book_extra.append(self.step_extra_s)
        self.T += n
        return n
        yield  # pragma: no cover - makes this a generator, as Clock.decode is

    @staticmethod
    def resolve_all(clocks: list["DeferredClock"], start: float) -> None:
        """``resolve`` every replica's clock, their decode segments priced together: one numpy pass over
        all the replicas' bookings (elementwise, so each segment's price has the same bits as in a pass
        of its own; a small step's bookings are too few for numpy's per-call cost to be spread over
        one replica's)."""
        booked = [c for c in clocks if c.book_n]
        if booked:
            e = booked[0].eng
            batch = np.concatenate([np.array(c.book_batch) for c in booked])
            kv0 = np.concatenate([np.array(c.book_kv0) for c in booked])
            steps = np.concatenate([np.array(c.book_n) for c in booked])
            coeffs = _with_extra(e.cost.decoder(e.model, e.dtype, e.tp, runtime=e.rt, logprobs=e.logprobs,
                                                tp_inter_node=e.tp_inter_node, par=e.par).coeffs(batch, kv0, e.overhead),
                                 np.concatenate([np.array(c.book_extra) for c in booked]))
            total, kernel = decode_sum(coeffs, steps)
            o = 0
            for c in booked:
                n = len(c.book_n)
                c.resolve(start, (total[o:o + n], kernel[o:o + n]))
                o += n
        for c in clocks:
            if not c.book_n:
                c.resolve(start)

    def resolve(self, start: float, parts: tuple | None = None) -> float:
        """Price the bookings, set ``times`` (``times[k]``: the time after k bookings), ``active_s`` and the
        rows' ``finished_at``; returns the end time. ``parts``: the (total, kernel) arrays of this clock's
        decode segments, when ``resolve_all`` has priced them already."""
        dur = np.array(self.dur, dtype=np.float64)
        act = np.array(self.act, dtype=np.float64)
        if self.book_n:
            if parts is None:
                e = self.eng
                coeffs = _with_extra(e.cost.decoder(e.model, e.dtype, e.tp, runtime=e.rt, logprobs=e.logprobs,
                                                    tp_inter_node=e.tp_inter_node, par=e.par).coeffs(
                    np.array(self.book_batch), np.array(self.book_kv0), e.overhead),
                                     np.array(self.book_extra))
                parts = decode_sum(coeffs, np.array(self.book_n))
            total, kernel = parts
            seg = dur == SEGMENT
            dur[seg] = total
            act[seg] = np.maximum(kernel, 0.0)
        self.times = np.add.accumulate(np.concatenate(([start], dur))).tolist()
        self.active_s = float(np.add.accumulate(np.concatenate(([0.0], act)))[-1])
        times = self.times
        for k, r in zip(self.finished_at, self.finished):
            r.finished_at = times[k]
        return self.times[-1]

    def chain(self, k: int) -> "Chain":
        """Where booking k's end falls among events at the same time on the event clock (``Chain``)."""
        return Chain(self.times, k)


class Chain:
    """The end of booking k of a replica as the event clock orders it: by its time, then (SimPy runs
    same-time events in the order they were scheduled) by the time its timeout was scheduled at, the
    end of booking k - 1, and so on back to the start; a chain that reaches the start first was
    scheduled first. Compared lazily: times rarely tie."""

    __slots__ = ("times", "k")

    def __init__(self, times: list[float], k: int):
        self.times, self.k = times, k

    def _cmp(self, other: "Chain") -> int:
        a, b, i, j = self.times, other.times, self.k, other.k
        while i >= 0 and j >= 0:
            if a[i] != b[j]:
                return -1 if a[i] < b[j] else 1
            i -= 1
            j -= 1
        return (i > j) - (i < j)

    def __lt__(self, other: "Chain") -> bool:
        return self._cmp(other) < 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Chain) and self._cmp(other) == 0

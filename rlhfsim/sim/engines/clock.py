"""A generation replica's event clock, shared by every engine.

No event per token: between two events (a completion, a chunk boundary, a per-step token budget, a
KV-capacity limit) the batch is fixed, so a replica advances in one SimPy timeout whose length is the
closed-form sum of its decode steps (``CostModel.decoder(...).coeffs`` / ``decode_sum``):

    segment_s = f x sum_{i=0}^{n-1} [ max(c0 + cs i, u0 + us i) + o ]  -  credit x f x step_1

with f the co-running rate factor (``Simulation.decode_factor``: the decode slowdown while a chunk prefill
runs on one of the replica's GPUs, or while a scorer is live there when the profile measured the
generation runtime in the hand-over pattern; else 1), o the per-step overhead and ``credit`` the fraction of the first step already done in an
earlier segment cut by a rate change. Where the profile fitted the time the hand-over pattern adds per
decode step (``CostModel.corun_added``: ``a`` seconds a step beside a live scorer), f of the rest of a
segment of n steps and ``S`` seconds alone is ``slow + a n / S``, so that it takes ``slow S + a n``
(``Clock.factor``).

Two things cut a segment:

* a ``"stop"`` interrupt (OPPO's "first B finished", from ``Engine.stop_all``): the whole steps done in
  the elapsed time are recovered by inverting the same sum (``steps_done``); the step in progress is lost.
* a rate change (``Simulation.interference_changed``: chunk prefills started or stopped on the replica's
  GPUs): the whole steps are booked and the fraction of the step in progress is kept as ``credit``; the
  rest of the segment runs at the new factor. So a slowdown applies to exactly the time both kinds of
  work run. This happens in place (``Clock.interrupt``, registered in ``sim.decoding`` as the replica's
  stand-in): the rest is priced and the waiting process is moved onto its timeout (``retarget``), the
  same arithmetic as waking the replica to start a new segment, without a thrown interrupt and a pass
  of the engine's loop (colocated OPPO re-times decode at every chunk scoring call).

Rows advance without being touched: a replica counts its decode steps in ``T`` and a live row's
generated tokens are ``T - r.clock_offset``. Only rows with an event at the new ``T`` are popped from a
heap and brought up to date: O(log batch) per event instead of O(batch).

Kernel (active) time of a segment, for the recorder: the same expression without the per-step overhead
(``decode_sum``), times f, counted for the steps and step fractions actually done.
"""

from __future__ import annotations

import heapq
import math

import simpy

from rlhfsim.costs.model import _sum_max_linear, decode_sum
from rlhfsim.sim.rollouts import Rollout


def steps_done(coeffs: tuple, n: int, elapsed: float, factor: float = 1.0) -> tuple[int, float]:
    """(k, frac): the largest k <= n whose k decode steps (``factor x decode_sum(coeffs, k)``) fit in
    ``elapsed`` seconds of an interrupted segment, and the fraction of step k + 1 done in the time left
    over (0 when k = n). The sum is piecewise quadratic in k, so k is first estimated by inverting it
    (``_invert``), then settled by evaluating the closed-form sum at its neighbours: O(1) evaluations."""
    return _steps_done(coeffs, n, elapsed, factor)[:2]


def _steps_done(coeffs: tuple, n: int, elapsed: float, factor: float,
                s1: float | None = None) -> tuple[int, float, float, float]:
    """``steps_done``, plus the kernel sums of k and of k + 1 steps (``decode_sum(coeffs, k)[1]``, and
    the same for k + 1 when frac > 0, else 0.0) it has evaluated anyway. ``s1``: the kernel sum of one
    step when the caller has it already. Each sum is evaluated once (``t`` keeps what it computed)."""
    c0, cs, u0, us, over = coeffs
    x = elapsed + 1e-12
    if n > 0:
        if s1 is None:
            s1 = _sum_max_linear(c0, cs, u0, us, 1)
        step = factor * (s1 + 1 * over)
        if step > x:  # still in the first step: the usual case when chunk scoring re-times decode
            return 0, min(max(elapsed / step, 0.0), 1.0 - 1e-9) if step > 0 else 0.0, 0.0, s1
        sums, times = {1: s1}, {0: 0.0, 1: step}  # k -> kernel sum, factor x decode_sum(coeffs, k)
    else:
        sums, times = {}, {0: 0.0}

    def t(k: int) -> float:  # factor x decode_sum(coeffs, k), keeping the kernel sum
        v = times.get(k)
        if v is None:
            s = sums[k] = _sum_max_linear(c0, cs, u0, us, k)
            v = times[k] = factor * (s + k * over)
        return v

    k = _invert(coeffs, n, x / factor) if factor > 0 else n
    while k < n and t(k + 1) <= x:
        k += 1
    while k > 0 and t(k) > x:
        k -= 1
    kernel_k = sums[k] if k in sums else (_sum_max_linear(c0, cs, u0, us, k) if k > 0 else 0.0)
    if k >= n:
        return k, 0.0, kernel_k, 0.0
    done = t(k)
    step = t(k + 1) - done
    frac = min(max((elapsed - done) / step, 0.0), 1.0 - 1e-9) if step > 0 else 0.0
    return k, frac, kernel_k, sums[k + 1]


def _invert(coeffs: tuple, n: int, y: float) -> int:
    """An estimate (within a step or two) of the k in [0, n] with decode_sum(coeffs, k) = y: each step
    costs max(c0 + cs i, u0 + us i) + o, one line before their crossing and the other after, so the sum
    is a quadratic in k on each side of the crossing."""
    c0, cs, u0, us, over = coeffs
    if cs == us:
        return _quad_root(max(c0, u0) + over, cs, y, n)
    cross = (u0 - c0) / (cs - us)
    kx = int(min(max(math.floor(cross) + 1, 0), n))  # first step on the later line
    (a1, s1), (a2, s2) = ((u0, us), (c0, cs)) if cs > us else ((c0, cs), (u0, us))
    before = (a1 + over) * kx + s1 * kx * (kx - 1) / 2.0
    if y <= before:
        return _quad_root(a1 + over, s1, y, kx)
    return kx + _quad_root(a2 + s2 * kx + over, s2, y - before, n - kx)


def _quad_root(a: float, s: float, y: float, n: int) -> int:
    """floor of the m in [0, n] with a m + s m (m - 1) / 2 = y (steps a, a + s, a + 2 s, ...)."""
    if y <= 0:
        return 0
    b = a - s / 2.0
    if s > 0:
        m = (-b + math.sqrt(b * b + 2.0 * s * y)) / s
    elif a > 0:
        m = y / a
    else:
        return n
    return int(min(max(m, 0.0), n))


def wait_until(env: simpy.Environment, at: float):
    """Process: wait until SimPy's clock reads exactly ``at``, a time summed ahead of time step by step
    (where waiting step by step would have landed). One timeout of ``at - now`` when that lands on ``at``
    (always when now >= at / 2: the difference is then exact); otherwise, since round-half-even can make
    ``at`` unreachable in one addition, one timeout to about 0.75 ``at`` and an exact one from there."""
    d = at - env.now
    if env.now + d == at:
        yield env.timeout(d)
        return
    yield env.timeout(0.75 * at - env.now)
    yield env.timeout(at - env.now)


def retarget(proc: simpy.Process, old: simpy.Event, new: simpy.Event) -> None:
    """Make ``proc``, waiting on ``old``, wait on ``new`` instead. This is what ``simpy.Interruption``
    does before it throws into the process (SimPy 4: a waiting process is ``old.callbacks`` holding
    ``proc._resume``, and ``proc._target``); here nothing is thrown, the process just wakes later or
    earlier. Checked by the golden tests of colocated OPPO scenarios, which re-time decode constantly."""
    old.callbacks.remove(proc._resume)
    new.callbacks.append(proc._resume)
    proc._target = new


class Clock:
    """One replica's decode-step clock: its step count ``T``, the heap of its live rows' next events,
    the partial-step ``credit`` and the kernel seconds it has accumulated (``active_s``).

    ``row_stream`` (role -> chunk tokens) makes each row's own chunk boundaries events: the row's new
    tokens are emitted to that role's scorer when it crosses one (continuous batching streams per
    request). Empty when the engine hands chunks over per batch instead (static batching).

    ``deferred``: False here (time is waited for, event by event); ``DeferredClock`` books it instead."""

    deferred = False

    def __init__(self, eng, idx: int, row_stream: dict):
        self.eng = eng
        self.sim = eng.sim
        self.env: simpy.Environment = eng.env
        self.step = eng.req.step
        self.row_stream = row_stream
        self.chunks = tuple(row_stream.values())
        self.budget = eng.req.token_budget
        self.T = 0
        self.heap: list = []
        self.proc: simpy.Process | None = None  # the replica's process while it is in a decode segment
        self.credit = 0.0
        self.active_s = 0.0
        self.gpu0 = idx * eng.tp
        self.gpus = range(self.gpu0, self.gpu0 + eng.tp)
        self._decoder = eng.cost.decoder(eng.model, eng.dtype, eng.tp, eng.rt, eng.logprobs,
                                         eng.tp_inter_node, eng.par)  # the decode predictor's constants
        self.step_extra_s = 0.0   # added to every decode step of the current batch (a padded static batch)

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
        budget = self.budget
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
            d = T - r.clock_offset - r.generated  # self.sync(r), inline: this is the hot path
            if d:
                r.generated += d
                r.step_budget_used += d
                tbs = r.tokens_by_step
                tbs[step] = tbs.get(step, 0) + d
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
        """The decode coefficients (``_Decode.coeffs``) of a segment of ``batch`` rows holding ``kv0`` cached tokens at its start."""
        c = self._decoder.coeffs(batch, kv0, self.eng.overhead)
        return (*c[:4], c[4] + self.step_extra_s) if self.step_extra_s else c

    def factor(self) -> float:
        """How much slower the rest of the segment runs now (``Simulation.decode_rate``: while chunk scoring
        shares its GPUs): the factor, and where co-running adds ``a`` seconds to every decode step, as much
        again as makes the rest's ``seg_left`` steps (``_total`` seconds alone) take ``a`` longer each."""
        f, add = self.sim.decode_rate(self.eng.pool.name, self.gpus)
        if add and self.seg_left > 0 and self._total > 0:
            f += add * self.seg_left / self._total
        return f

    def decode(self, batch: int, kv0: float, n: int):
        """Process: run up to ``n`` decode steps of a fixed batch as one timeout (module docstring).
        Advances T by the whole steps done and returns their number: ``n``, or fewer when a "stop"
        interrupt cut the segment (rate changes re-time it in place: ``interrupt``)."""
        env, sim = self.env, self.sim
        self.seg_batch, self.seg_kv0, self.seg_left, self.seg_done = batch, kv0, n, 0
        self._begin()
        pool = self.eng.pool.name
        self.proc = env.active_process
        sim.decoding[pool][self] = self.gpus
        try:
            yield self.timeout
            self._book(self.seg_left, self._kernel)
        except simpy.Interrupt:  # "stop"
            self._book(*self._done_now()[::2])
        finally:
            sim.decoding[pool].pop(self, None)
            self.proc = None
        return self.seg_done

    def _begin(self, same: bool = False) -> None:
        """Price the rest of the segment from now (``seg_left`` steps from ``seg_kv0`` cached tokens, at
        the co-running factor of now, less the credit of a step begun before) and schedule its end.
        ``same``: no whole step was booked since the last call (a rate change within a step), so the
        coefficients and the sums of the rest are those already computed."""
        if same:
            coeffs, total = self._coeffs, self._total
        else:
            coeffs = self._coeffs = self.coeffs(self.seg_batch, self.seg_kv0)
            total, self._kernel = decode_sum(coeffs, self.seg_left)
            self._total = total
            self._step1 = None
        factor = self._factor = self.factor()
        c0 = self._c0 = self.credit
        if c0:  # time already spent on step 1 (decode_sum(coeffs, 1), keeping its kernel part)
            self._kernel1 = self._kernel_step1()
            head = self._head = c0 * (factor * (self._kernel1 + 1 * coeffs[4]))
        else:
            head = self._head = 0.0
        self.credit = 0.0
        self._t0 = self.env.now
        self.timeout = self.env.timeout(factor * total - head)

    def _kernel_step1(self) -> float:
        """The kernel seconds of the segment's next step (``_sum_max_linear`` of one step), computed
        once per coefficients: a segment re-timed within one step asks for it at every rate change."""
        s1 = self._step1
        if s1 is None:
            c = self._coeffs
            s1 = self._step1 = _sum_max_linear(c[0], c[1], c[2], c[3], 1)
        return s1

    def _done_now(self) -> tuple[int, float, float]:
        """(k, frac, kernel): the whole steps of the current sub-segment done by now, the fraction of the
        next, and their kernel seconds before the rate factor (``decode_sum`` of k steps, plus frac of
        step k + 1's)."""
        n = self.seg_left
        k, frac, s_k, s_k1 = _steps_done(self._coeffs, n, self.env.now - self._t0 + self._head, self._factor,
                                         self._kernel_step1() if n > 0 else None)
        return k, frac, (s_k + frac * (s_k1 - s_k)) if frac else s_k

    def _book(self, k: int, kernel: float) -> None:
        """The first ``k`` steps of the current sub-segment are done (``kernel``: their kernel seconds
        before the rate factor, the step in progress included): their active time, T, the steps done."""
        if self._c0:
            kernel -= self._c0 * self._kernel1
        self.active_s += self._factor * max(kernel, 0.0)
        self.T += k
        self.seg_done += k
        self.seg_left -= k
        self.seg_kv0 += k * self.seg_batch

    @property
    def is_alive(self) -> bool:
        """Stand-in for the replica's process in ``sim.decoding``: registered only while in a segment."""
        return self.proc is not None

    def interrupt(self, cause: str) -> None:
        """A rate change (``Simulation.interference_changed``): book the whole steps done and keep the
        step in progress as credit, then price the rest at the new rate and move the waiting process
        onto its end. The same arithmetic as an interrupted segment followed by a new one."""
        assert cause == "rate", cause
        k, frac, kernel = self._done_now()
        self._book(k, kernel)
        self.credit = frac
        old = self.timeout
        self._begin(same=not k)
        retarget(self.proc, old, self.timeout)

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

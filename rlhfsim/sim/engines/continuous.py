"""Continuous batching (vLLM/SGLang-like, as verl and OpenRLHF generate): a finished sequence's slot is
refilled at once, the KV cache's capacity is respected, recompute preemption on overflow.

Dealing: each data-parallel engine gets its share up front, ``rollouts[i::replicas]`` (verl and OpenRLHF
split the batch over their engines; one shared queue would let the first replicas take ``max_batch`` rows
each and leave the others idle whenever rollouts < replicas x max_batch).

Admission (vLLM's block manager, ``can_allocate``): with U the cached tokens of the live rows plus one
token of room per live row (the next step's), a waiting row needing ``need = prompt + generated + 1``
tokens is admitted only if

    C - (U + need) >= W,      W = floor(0.01 x C)   (vLLM's default watermark, C the cache capacity)

and fewer than ``max_batch`` rows are live. A row is always admitted into an empty batch (a row longer
than the cache still runs, alone). Without the watermark a preempted row is readmitted as soon as any row
ends and evicted again a few steps later (at 65,536 rollouts: ~1.4 recompute preemptions per rollout,
up to 20 for one rollout); the watermark leaves room for the batch to grow before the cache fills.

Preemption: when the next step would not fit (U + live rows > C), the newest live row gives up its cache
and goes back to the head of its queue (it pays a prefill of prompt + generated tokens when readmitted).

Prefill: one call per admitted row (its prompt plus any tokens generated earlier).

Streaming (OPPO intra-step, ``req.stream``): each row hands its new tokens to the scorers at its own chunk
boundaries (every ``chunk`` generated tokens) and its last tokens when it ends. Rows crossing a boundary
at the same decode step share one pause of the actor, ``cost.handoff_s(runtime, rows)`` with ``rows`` the
number of them; a row's end costs no pause.

An open request (``GenRequest.feed``, the async schedule's ``groups`` generator: ``rlhfsim.sim.feed``) deals nothing
up front: the feed puts each prompt group in one replica's queue when it starts, a decoding replica's segment is cut
(the step in progress lost, as at a stop) so that it admits new rows at once, a replica run dry waits for rows, and
decode waits while the feed holds the engine (a weight update in flight). Each replica records its busy time in
pieces: up to each idle wait, and at the end of each step's batch (under that step).

A detached replica (no streaming, no stop: ``Engine.detached``) runs ``_run_detached``: the same loop with
the clock's bookkeeping written out in place, booking on a ``DeferredClock``. It is the hot path of a
65,536-rollout step (one pass per admission); ``tests/unit/test_sim_detached.py`` holds it to the event
loop, bit for bit.

The KV capacity C enters a replica's generation at three decisions and nowhere else (``kv_cap`` and the ``limit``
derived from it, C - floor(0.01 x C), are read only there), each the comparison of a demand with C or with the limit:

1. admission (``_admit``, and ``plan``'s own first test of the head of the queue): a row is admitted into a non-empty
   batch iff ``kv + need <= limit``; the demand is ``kv + need`` (the cache after admitting it, one token of room
   per row); a refusal is a demand above the limit.
2. preemption: with more than one live row, the newest is preempted iff ``kv_live + kv_pend + n_live > C``.
3. the segment's length: ``n = min(n_next, max(room, 1))`` with ``room = (C - kv_live - kv_pend) // n_live`` and
   ``n_next`` the decode steps to the next row's end; n is ``n_next`` whenever ``C >= kv_live + kv_pend + n_live x
   n_next``, a demand that also covers decision 2 (``n_next >= 1``).

Each engine records, over its replicas, the largest demand it met under the limit (``kv_need``: decision 1) and
under C (``kv_room``: decisions 2 and 3), and a demand beyond them when the capacity decided anything (a refusal: a
demand above the limit, at least the first one refused; a preemption: its demand above C; a segment cut by room: its
demand above C). So ``kv_need <= limit(C)`` and ``kv_room <= C`` hold at the run's own capacity C exactly when no
decision went the capacity's way: no refusal, no preemption, no segment cut short. Then at any capacity C' with
``kv_need <= limit(C')`` and ``kv_room <= C'`` each decision, met in the same state, compares the same demand with a
bound at least as large and comes out the same; by induction over the loop every state is the same, and so is the
generation, bit for bit (``rlhfsim.plan.fastpath`` shares it across such capacities; the capacity's value enters
nothing else: the decode and prefill prices read the tokens cached, not the room). The record costs one comparison
per decision.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import ClassVar

import simpy

from rlhfsim.costs.terms import PREFILL_CHUNK, CostTerm
from rlhfsim.sim.engines.base import Engine
from rlhfsim.sim.engines.clock import Clock
from rlhfsim.sim.engines.deferred import SEGMENT, DeferredClock
from rlhfsim.sim.rollouts import Rollout


class ContinuousEngine(Engine):
    """vLLM-like continuous batching with a KV-cache admission watermark (module docstring)."""

    NAME: ClassVar[str] = "continuous"
    EXTRA_TERM: ClassVar[CostTerm] = PREFILL_CHUNK   # what a decode step's step_extra_s is: chunked prefill's chunks
    PREFIX_BLOCK: ClassVar[int] = 16   # vLLM's default KV block (block_size): prefix caching hits whole blocks
    WATERMARK: ClassVar[float] = 0.01  # vLLM's default ``watermark``: fraction of the KV cache kept free at admission

    def __init__(self, sim, req):
        super().__init__(sim, req)
        g = sim.setup.scenario.generation
        self.group = sim.setup.scenario.algorithm.group_size
        if req.feed is not None:   # an open request: the feed deals its groups as they start (rlhfsim.sim.feed)
            self.queues = req.feed.queues
        elif g.dispatch == "prompts":   # a prompt's samples on one replica (verl's synchronous rollout)
            self.queues = [deque(r for r in req.rollouts if (r.id // self.group) % self.n_rep == i) for i in range(self.n_rep)]
        else:
            self.queues = [deque(req.rollouts[i::self.n_rep]) for i in range(self.n_rep)]
        self.watermark = int(self.WATERMARK * self.kv_cap)
        self.share = g.prefix_caching
        self.budget_tokens = g.max_num_batched_tokens   # None: one prefill call per admitted row (the older model)
        self.chunked = g.chunked_prefill
        self._step_memo: dict[tuple[int, int], tuple[float, float]] = {}
        self.piece_at: dict[int, float | None] = {}   # replica -> start of its busy time not recorded (None: idle)
        # the largest demands compared with the limit and with the capacity, over every replica (module docstring)
        self.kv_need = self.kv_room = 0

    def run(self):
        """Process: ``Engine.run``; then this step's capacity demands (``kv_need``, ``kv_room``) go to the simulation's
        ``kv_demands`` list where it keeps one (``rlhfsim.plan.fastpath``; a plain simulation keeps none)."""
        yield from super().run()
        demands = getattr(self.sim, "kv_demands", None)
        if demands is not None:
            demands.append((self.kv_need, self.kv_room))

    def _tokens(self, r: Rollout, seen: set | None) -> int:
        """The tokens ``r``'s prefill computes: its prompt and what it generated before, less the prompt blocks a
        sibling (a sample of the same prompt, ``id // group_size``) prefilled on this replica already when ``seen``
        (prefix caching) holds its group (vLLM hits full blocks of ``PREFIX_BLOCK`` tokens and recomputes at least the
        prompt's last token); the first of its group records it in ``seen``."""
        t = r.prompt_len + r.generated
        if seen is not None:
            g = r.id // self.group
            if g in seen:
                t -= (r.prompt_len - 1) // self.PREFIX_BLOCK * self.PREFIX_BLOCK
            else:
                seen.add(g)
        return t

    def _steps(self, tokens: list[int]) -> list[tuple[int, int]]:
        """(tokens, rows) of each engine step that prefills rows of ``tokens`` tokens each, in order, within the step
        budget: with chunked prefill a row's tokens are split where the budget ends (vLLM V1, V0's
        enable_chunked_prefill); without, whole rows only, as many as fit (a longer row alone)."""
        budget, steps, tok, rows = self.budget_tokens, [], 0, 0
        for t in tokens:
            if self.chunked:
                while t > 0:
                    take = min(t, budget - tok)
                    tok, t, rows = tok + take, t - take, rows + 1
                    if tok == budget:
                        steps.append((tok, rows))
                        tok = rows = 0
            else:
                if tok and tok + t > budget:
                    steps.append((tok, rows))
                    tok = rows = 0
                tok, rows = tok + t, rows + 1
        if tok:
            steps.append((tok, rows))
        return steps

    def _steps_price(self, steps: list[tuple[int, int]]) -> tuple[float, float]:
        """(total_s, active_s) of ``steps`` (``CostModel.prefill_step`` each, remembered per shape)."""
        total = active = 0.0
        for key in steps:
            p = self._step_memo.get(key)
            if p is None:
                p = self._step_memo[key] = tuple(self.cost.prefill_step(self.model, self.dtype, key[0], key[1], self.tp,
                                                                        self.rt, self.logprobs, self.tp_inter_node,
                                                                        self.par))
            total += p[0]
            active += p[1]
        return total, active

    def leftover(self) -> list[Rollout]:
        return [r for q in self.queues for r in q]

    def _prefill(self, clock: Clock, rows: list[Rollout], seen: set | None = None):
        """Process: one prefill call per row whose KV is not resident (with a token budget: the engine steps
        their tokens take). Returns the fresh rows (nothing generated yet), which then take their first token from
        the prefill's logits. ``seen``: the prompt groups prefilled on this replica so far (prefix caching)."""
        need = [r for r in rows if not r.kv_resident]
        if not need:
            return []
        tokens = [self._tokens(r, seen) for r in need]
        if self.budget_tokens is not None:   # in engine steps of the token budget
            steps = self._steps(tokens)
            if self.terms is not None:
                clock.charge(self.terms.prefill_steps(steps))
            yield from clock.busy(*self._steps_price(steps))
            for r in need:
                r.kv_resident = True
            return [r for r in need if r.generated == 0]
        if len(need) == 1:  # the common case once the batch is full: one slot refilled
            total, active = self.prefill_parts(tokens[0], 1)
        else:
            parts = [self.prefill_parts(t, 1) for t in tokens]
            total, active = sum(p[0] for p in parts), sum(p[1] for p in parts)
        # No interference factor: that applies to chunk (scoring) prefills meeting decode on the same
        # GPUs (docs/cost-model.md); this replica's own decode flag is always up here and must not count.
        if self.terms is not None:
            clock.charge(self.terms.prefills(tokens))
        yield from clock.busy(total, active)
        for r in need:
            r.kv_resident = True
        return [r for r in need if r.generated == 0]

    def _admit(self, queue, n_live: int, kv_live: int, limit: float, max_batch: int) -> list[Rollout]:
        """Pop the rows at the head of ``queue`` that fit: at most ``max_batch`` rows in all, and (unless
        the batch is empty) the cache after admission, counting one token of room per row, within
        ``limit`` (the capacity less vLLM's watermark). Both clocks admit through this one rule. The demands it
        tests rise row by row: the last one tested (a refusal, or the cache after the last row) goes to
        ``kv_need``."""
        admitted: list[Rollout] = []
        kv = kv_live + n_live
        tested = n_live > 0
        while queue and n_live + len(admitted) < max_batch:
            r = queue[0]
            need = r.prompt_len + r.generated + 1
            if n_live or admitted:
                tested = True
                if kv + need > limit:
                    if kv + need > self.kv_need:
                        self.kv_need = kv + need
                    return admitted
            queue.popleft()
            r.paused, r.step_budget_used = False, 0
            admitted.append(r)
            kv += need
        if tested and admitted and kv > self.kv_need:
            self.kv_need = kv
        return admitted

    def replica(self, idx: int):
        clock = self.clock(idx, self.req.stream)
        start = self.env.now
        self.decoding(clock, +1)
        live: dict[int, Rollout] = {}  # admission order: preemption takes the newest
        held: list[Rollout] = []       # admitted rows in their prefill: a stop carries them
        self.piece_at[idx] = start     # an open request's replica records its busy time in pieces, between idle waits
        if self.req.feed is not None:
            self.req.feed.clocks[idx] = clock
            self.req.feed.engine = self
        try:
            yield from self._run(clock, self.queues[idx], live, held)
        finally:
            self.decoding(clock, -1)
            clock.release(live.values())
            for r in list(live.values()) + held:
                if r.generated < r.response_len:
                    self.leave(clock, r)
            if self.piece_at[idx] is not None:
                self.record(clock, self.piece_at[idx])

    def split(self, step: int) -> None:
        """An open request: step ``step``'s batch has ended; each replica's busy time since its last record is
        recorded under that step (a replica waiting idle has none)."""
        now = self.env.now
        for idx, at in self.piece_at.items():
            if at is None or now <= at:
                continue
            clock = self.req.feed.clocks[idx]
            self.record(clock, at, step)
            clock.active_s = 0.0
            if self.terms is not None:
                clock.acc = {}
            self.piece_at[idx] = now

    def _idle(self, clock: Clock, idx: int):
        """Process: an open request's replica, run dry, records its busy time so far and waits for rows (or the feed's
        end); False if the feed has closed."""
        feed = self.req.feed
        if feed.closed:
            return False
        self.decoding(clock, -1)
        self.record(clock, self.piece_at[idx])
        clock.active_s = 0.0
        if self.terms is not None:
            clock.acc = {}
        self.piece_at[idx] = None
        yield feed.idle(idx)
        self.piece_at[idx] = self.env.now
        self.decoding(clock, +1)
        return not feed.closed or bool(self.queues[idx])

    def _run(self, clock: Clock, queue, live: dict, held: list):
        """Process: replica ``idx``'s loop (module docstring) on ``clock``: the event clock (``replica``), or a deferred
        clock that books instead of waiting (``plan`` with a token budget: nothing yields then). ``live``: the decoding
        rows; ``held``: rows admitted and not yet decoding (in their prefill), both for the caller to carry at a stop."""
        cap, limit = self.kv_cap, self.kv_cap - self.watermark
        chunked = self.chunked
        seen: set | None = set() if self.share else None   # prompt groups prefilled here (prefix caching)
        pending: list = []   # chunked prefill beside live rows: [row, tokens left to prefill], FIFO
        kv_live = 0  # cached tokens of the live rows at step T
        kv_pend = 0  # tokens the rows in ``pending`` hold (counted whole, as at their admission)
        feed = self.req.feed   # an open request (rlhfsim.sim.feed): rows arrive while it runs
        idx = clock.gpu0 // self.tp
        while not self.stopped:
            # Admission. One token of room per live row is counted, as the preemption test below
            # does; otherwise a preempted row is readmitted at once and preempted again (livelock).
            admitted = self._admit(queue, len(live) + len(pending), kv_live + kv_pend, limit, self.max_batch)
            if not live and not admitted and not pending:
                if feed is not None and (yield from self._idle(clock, idx)):
                    continue
                break
            if chunked and live and admitted:
                # their prefills run in chunks inside the next decode steps; rows whose KV survived join at once
                for r in admitted:
                    if not r.kv_resident:
                        pending.append([r, self._tokens(r, seen)])
                        kv_pend += r.prompt_len + r.generated
                        held.append(r)
                admitted = [r for r in admitted if r.kv_resident]
            if pending and not live:
                # nothing left to carry the chunks: the rest of their prefills (and the new rows') in steps of their own
                rows = [r for r, _ in pending] + admitted
                tokens = [t for _, t in pending] + [self._tokens(r, seen) for r in admitted if not r.kv_resident]
                held[:] = rows
                steps = self._steps(tokens)
                if self.terms is not None:
                    clock.charge(self.terms.prefill_steps(steps))
                try:
                    yield from clock.busy(*self._steps_price(steps))
                except simpy.Interrupt:
                    break
                fresh = [r for r in rows if r.generated == 0]
                for r in rows:
                    r.kv_resident = True
                pending, kv_pend, admitted = [], 0, rows
            elif admitted:
                held[:] = admitted
                try:
                    fresh = yield from self._prefill(clock, admitted, seen)
                except simpy.Interrupt:
                    break
            if admitted:
                crossed = 0
                for r in fresh:
                    crossed += clock.first_token(r)
                freed = False  # a row that ended at its prefill leaves its slot free at once
                for r in admitted:
                    if clock.activate(r):
                        live[r.id] = r
                        kv_live += r.prompt_len + r.generated
                    elif r.generated >= r.response_len:
                        self.finish(clock, r)
                        freed = True
                    else:
                        r.paused = True
                        self.leave(clock, r)
                        freed = True
                held[:] = [r for r, _ in pending]
                if self.stopped:
                    break
                if crossed and not (yield from self.handoff(clock, crossed)):
                    break
                if freed and queue:
                    continue  # refill the freed slots before the next decode segment, as vLLM's next step does
            if not live:
                continue
            n_live = len(live)
            if kv_live + kv_pend + n_live > cap and n_live > 1:
                # Recompute preemption: the newest sequence gives up its cache and requeues.
                if kv_live + kv_pend + n_live > self.kv_room:
                    self.kv_room = kv_live + kv_pend + n_live
                victim = live.pop(next(reversed(live)))
                clock.release((victim,))
                kv_live -= victim.prompt_len + victim.generated
                victim.kv_resident = False
                queue.appendleft(victim)
                self.preemptions += 1
                continue
            if feed is not None:
                if self.env.now < feed.hold_until:   # the engine loads new weights: decode waits
                    yield self.env.timeout(feed.hold_until - self.env.now)
                if feed.take_kick(idx) and queue:
                    continue   # rows arrived during a prefill: admit them before the next segment
            room = int((cap - kv_live - kv_pend) // n_live)
            n = clock.heap[0][0] - clock.T
            demand = kv_live + kv_pend + n_live * max(n, 1)   # room >= n, and no preemption (module docstring)
            if demand > self.kv_room:
                self.kv_room = demand
            n = min(n, max(room, 1))
            chunk = 0
            if pending:   # a mixed segment: each step carries up to the budget less its decode tokens of prefill
                per = max(self.budget_tokens - n_live, 1)
                left = sum(t for _, t in pending)
                n = min(n, -(-left // per))
                chunk = min(left, n * per)
                clock.step_extra_s = self.cost.chunk_in_step_s(
                    self.model, self.dtype, chunk, _touched(pending, chunk), self.tp, self.rt, self.logprobs,
                    self.tp_inter_node, self.par) / n
            n = yield from clock.decode(n_live, kv_live, n)
            clock.step_extra_s = 0.0
            if not n and self.stopped:
                break
            self.generated += n * n_live
            kv_live += n * n_live
            leaving, crossed = clock.events()
            for r, what in leaving:
                del live[r.id]
                kv_live -= r.prompt_len + r.generated
                if what == "done":
                    # Rows that finish exactly at a stop (the interrupted segment) count as finished.
                    self.finish(clock, r)
                else:
                    self.leave(clock, r)
            if chunk:   # the rows whose last chunk ran join the batch: their first token is the last chunk's
                done = _consume(pending, min(chunk, n * per))
                for r in done:
                    kv_pend -= r.prompt_len + r.generated
                    r.kv_resident = True
                    if r.generated == 0:
                        crossed += clock.first_token(r)
                    if clock.activate(r):
                        live[r.id] = r
                        kv_live += r.prompt_len + r.generated
                    elif r.generated >= r.response_len:
                        self.finish(clock, r)
                    else:
                        r.paused = True
                        self.leave(clock, r)
                held[:] = [r for r, _ in pending]
            if crossed and not self.stopped and not (yield from self.handoff(clock, crossed)):
                break

    def plan(self, idx: int, clock: DeferredClock) -> None:
        """``replica``'s loop for a detached replica (no streams, no stop): every step of it in the same
        order, with ``Clock.activate``/``push``/``events``/``first_token``/``release`` and the prefill
        call written out on local variables, and time booked on the deferred clock."""
        queue = self.queues[idx]
        if self.budget_tokens is not None or self.share:   # the event loop's own code, booking on the deferred clock
            for _ in self._run(clock, queue, {}, []):
                raise AssertionError("a detached replica never waits")   # pragma: no cover
            return
        cap, limit, max_batch = self.kv_cap, self.kv_cap - self.watermark, self.max_batch
        step, budget, never = self.req.step, self.req.token_budget, 1 << 62
        prefill, one = self.prefill_parts, self.row_prefills(queue)  # one: a row's prefill parts, by tokens
        terms = self.terms   # seconds by cost term (rlhfsim explain only)
        dur, act = clock.dur, clock.act
        book_batch, book_kv0, book_n = clock.book_batch, clock.book_kv0, clock.book_n
        finished, finished_at, left, left_at = clock.finished, clock.finished_at, clock.left, clock.left_at
        heappush, heappop = heapq.heappush, heapq.heappop
        live: dict[int, Rollout] = {}  # admission order: preemption takes the newest
        heap: list = []
        T = kv_live = generated = 0
        need_top = room_top = 0   # the largest demands met against the limit and the capacity (module docstring)
        while True:
            n_live = len(live)
            # _admit's own first test, asked here first: under KV pressure (65,536 rollouts) two passes in
            # three find the head of the queue does not fit, and the call would admit nothing.
            if queue and n_live < max_batch and (
                    not n_live or kv_live + n_live + queue[0].prompt_len + queue[0].generated + 1 <= limit):
                if n_live and n_live + 1 == max_batch:  # one free slot (_admit admits the head only)
                    r = queue.popleft()
                    r.paused, r.step_budget_used = False, 0
                    admitted = [r]
                    if kv_live + n_live + r.prompt_len + r.generated + 1 > need_top:
                        need_top = kv_live + n_live + r.prompt_len + r.generated + 1
                else:
                    admitted = self._admit(queue, n_live, kv_live, limit, max_batch)
            else:
                admitted = ()
                if need_top <= limit and queue and n_live and n_live < max_batch:   # the first refusal: the head does not fit
                    need_top = kv_live + n_live + queue[0].prompt_len + queue[0].generated + 1
            if not n_live and not admitted:
                break
            if admitted:
                need = admitted if len(admitted) == 1 and not admitted[0].kv_resident else \
                    [r for r in admitted if not r.kv_resident]
                if need:
                    if len(need) == 1:
                        tokens = need[0].prompt_len + need[0].generated
                        parts = one.get(tokens)
                        if parts is None:
                            parts = one[tokens] = prefill(tokens, 1)
                        total, active = parts
                    else:
                        parts = []
                        for r in need:
                            tokens = r.prompt_len + r.generated
                            p = one.get(tokens)
                            if p is None:
                                p = one[tokens] = prefill(tokens, 1)
                            parts.append(p)
                        total, active = sum(p[0] for p in parts), sum(p[1] for p in parts)
                    dur.append(total)
                    act.append(active)
                    if terms is not None:
                        clock.booked(terms.prefills(r.prompt_len + r.generated for r in need), total)
                    for r in need:
                        r.kv_resident = True
                    for r in need:
                        if r.generated == 0:  # the first token, from the prefill's logits
                            r.generated = 1
                            r.step_budget_used += 1
                            tbs = r.tokens_by_step
                            tbs[step] = tbs.get(step, 0) + 1
                            generated += 1
                ended = len(finished) + len(left)
                for r in admitted:
                    r.clock_offset = off = T - r.generated
                    r.budget_at = bat = T + (budget - r.step_budget_used) if budget is not None else never
                    if r.generated >= r.response_len:
                        finished_at.append(len(dur))
                        finished.append(r)
                    elif bat <= T:
                        r.paused = True
                        left_at.append(len(dur))
                        left.append(r)
                    else:
                        ev = off + r.response_len
                        r.heap_version += 1
                        heappush(heap, (bat if bat < ev else ev, r.id, r.heap_version, r))
                        live[r.id] = r
                        kv_live += r.prompt_len + r.generated
                if not live or (queue and len(finished) + len(left) > ended):
                    continue  # (rows that ended at their prefill: their slots are refilled first, as in replica)
                n_live = len(live)
            if kv_live + n_live > cap and n_live > 1:
                # Recompute preemption: the newest sequence gives up its cache and requeues.
                if kv_live + n_live > room_top:
                    room_top = kv_live + n_live
                r = live.pop(next(reversed(live)))
                d = T - r.clock_offset - r.generated
                if d:
                    r.generated += d
                    r.step_budget_used += d
                    tbs = r.tokens_by_step
                    tbs[step] = tbs.get(step, 0) + d
                r.heap_version += 1
                kv_live -= r.prompt_len + r.generated
                r.kv_resident = False
                queue.appendleft(r)
                self.preemptions += 1
                continue
            room = (cap - kv_live) // n_live
            n = heap[0][0] - T   # >= 1: every row in the heap ends or pauses after T
            if kv_live + n * n_live > room_top:   # room >= n and no preemption (module docstring)
                room_top = kv_live + n * n_live
            if room < n:
                n = room if room > 1 else 1
            dur.append(SEGMENT)
            act.append(0.0)
            book_batch.append(n_live)
            book_kv0.append(kv_live)
            book_n.append(n)
            T += n
            generated += n * n_live
            kv_live += n * n_live
            while heap and heap[0][0] <= T:
                _, _, ver, r = heappop(heap)
                if ver != r.heap_version:
                    continue  # stale: the row was preempted after this was pushed
                d = T - r.clock_offset - r.generated
                if d:
                    r.generated += d
                    r.step_budget_used += d
                    tbs = r.tokens_by_step
                    tbs[step] = tbs.get(step, 0) + d
                del live[r.id]
                kv_live -= r.prompt_len + r.generated
                if r.generated >= r.response_len:
                    finished_at.append(len(dur))
                    finished.append(r)
                else:  # its token budget is spent
                    r.paused = True
                    left_at.append(len(dur))
                    left.append(r)
        clock.T = T
        self.generated += generated
        if need_top > self.kv_need:
            self.kv_need = need_top
        if room_top > self.kv_room:
            self.kv_room = room_top


def _touched(pending: list, tokens: int) -> int:
    """How many rows of ``pending`` ([row, tokens left], in order) the next ``tokens`` prefill tokens reach."""
    n = 0
    for _, t in pending:
        if tokens <= 0:
            break
        n += 1
        tokens -= t
    return max(n, 1)


def _consume(pending: list, tokens: int) -> list[Rollout]:
    """Take ``tokens`` prefill tokens from ``pending`` in order; the rows whose prefill they complete, removed."""
    done = []
    while pending and tokens > 0:
        take = min(tokens, pending[0][1])
        pending[0][1] -= take
        tokens -= take
        if pending[0][1] == 0:
            done.append(pending.pop(0)[0])
    return done

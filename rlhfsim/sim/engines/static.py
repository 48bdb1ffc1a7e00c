"""Static batching (Hugging Face ``generate`` as TRL calls it): a batch is formed, prefilled in one padded
call, and decoded in lockstep until its longest member ends; finished rows keep decoding as padding.

Dealing (TRL: each data-parallel rank generates its own slice of the batch): replica i takes
``rollouts[i::replicas]`` (carried rows first, so deferred stragglers spread over the replicas instead of
all landing in replica 0's first batch) and cuts its share into micro-batches of ``max_batch`` rows, run
one after another.

A batch of b rows with longest context ctx0 = max(prompt + generated) costs

    call_overhead_s(runtime)                       once, when its generate() call starts
    + prefill(b x ctx0 tokens, b sequences)        padded; skipped when every row's KV is resident
      (+ pad_prefill_s(runtime) when the rows' contexts differ)
    + sum of decode steps of b rows from b x (ctx0 + P) cached tokens
      (each + pad_step_s(runtime, b) when the rows' contexts differ: HF left-pads them and applies the
      padding mask at every step; measured, 0 for kv_decoder and for profiles without the term)

where P counts the batch's positions so far (1 after a prefill that gave fresh rows their first token).

Streaming (OPPO intra-step, ``req.stream``; TRL generates in chunked ``generate()`` calls): the batch
pauses every ``chunk`` positions counted from its start (P = chunk, 2 chunk, ...; the prefill's token is
position 1). At such a boundary every live row hands its new tokens to the scorers and the actor pauses
``cost.handoff_s(runtime, b)`` (b: the batch's rows, finished ones included: they are still in the call's
batch). A row that ends inside a chunk is finished at once (it counts towards OPPO's "first B"), but its
last tokens reach the scorers only when the call returns: at the next boundary, or at the batch's end (no
pause: the batch is done), or when a stop ends the call.

How the next call resumes (``schedule.intra.resume``): ``cached`` (default), the next ``generate()`` continues
on the cache the last one returned, and the boundary costs the handoff above (measured that way:
``calibrate.measuring.genbench`` ``handoff`` points). ``reprefill``: the next call gets the token ids only and no cache,
as a wrapper around TRL's generate gets them (TRL's ``PPOTrainer.generate`` returns sequences, never the
cache; a ``generate()`` call without ``past_key_values`` runs a prefill over all of its input ids, and it
continues every row it is given, one whose last token is EOS included: transformers' ``GenerationMixin``).
So the next call takes the b rows still generating (the finished ones leave the batch; ctx0 becomes the
longest of theirs) and the boundary costs

    handoff_s(runtime, b)                              the call ending and the next starting (measured)
    + prefill(b x (ctx0 + P) tokens, b sequences)      those rows again, left-padded to the longest
      (+ pad_prefill_s(runtime) when their contexts differ)
    - one decode step of the b rows at ctx0 + P        the prefill's logits give the next token, which the
                                                       cached call would have decoded in one step

priced by the runtime's own prefill fit (``prefill:RUNTIME``) and decode coefficients; the difference is
never below the handoff. The later chunks of the batch decode only those b rows (a synchronous call
decodes its finished rows as padding to its end). A batch's first call prefills every row, rows carried
from an earlier step (OPPO's deferred rollouts) included, whatever ``inter.keep_kv`` says. Summed over a
batch of longest response L in chunks of c, the re-prefilled tokens are at most b (L / c) (ctx0 + L / 2):
they fall as 1 / c, which is what makes small chunks slow.

When the step can stop (``schedule.intra.stop_at``): ``token`` (default), a row that ends inside a chunk counts
towards OPPO's first B at once and the stop cuts every replica at that step, as an engine with per-step
control would. ``call``: it counts when its call returns (the next boundary, or the batch's end), so the
stop too comes only between calls: a wrapper around TRL's generate sees the rows only when generate()
returns (transformers' generate runs its loop to the end of the call; TRL's ``PPOTrainer.generate`` hands
back finished sequences). Replicas are taken to reach their boundaries together (same chunk, lockstep
decode), so a stop seen at one replica's return ends the others' calls there too, and their rows that
ended inside the call count as finished. With chunks as long as the responses the step can stop only
when batches end: overcommitment (the first B) loses its grip, which is what makes large chunks slow.

A runtime whose decode loop runs one step per call in the framework's own code
(``genruntimes.ROW_HANDOVER``: ``kv_decoder``) has no call to return: each row hands its new tokens over
at its own chunk boundaries (every ``chunk`` generated tokens, as continuous batching does) and its last
tokens the moment it ends; rows crossing a boundary at the same step share one pause,
``cost.handoff_s(runtime, rows)`` with ``rows`` the number of them.
"""

from __future__ import annotations

from collections import deque
from typing import ClassVar

import simpy

from rlhfsim.costs.genruntimes import ROW_HANDOVER
from rlhfsim.costs.model import decode_sum
from rlhfsim.costs.terms import GEN_CALL_OVERHEAD, LEFT_PADDING
from rlhfsim.sim.engines.base import Engine
from rlhfsim.sim.engines.clock import Clock
from rlhfsim.sim.engines.deferred import DeferredClock
from rlhfsim.sim.rollouts import Rollout


class StaticEngine(Engine):
    """TRL-like static batches in lockstep, chunk handoff per batch (module docstring)."""

    NAME: ClassVar[str] = "static"

    def __init__(self, sim, req):
        super().__init__(sim, req)
        mb = self.max_batch
        # rows hand over at their own boundaries and ends, not when a generate() call returns
        self.per_row = self.rt in ROW_HANDOVER and bool(req.stream)
        # a chunk boundary's next generate() call re-prefills the batch (module docstring)
        intra = getattr(sim.setup.scenario.schedule, "intra", None)
        self.reprefill = (bool(req.stream) and not self.per_row
                          and getattr(intra, "resume", "cached") == "reprefill")
        # rows that end inside a chunk are seen (and can stop the step) only when the call returns
        self.stop_at_call = (bool(req.stream) and not self.per_row
                             and getattr(intra, "stop_at", "token") == "call")
        self.queues: list[deque] = []
        for i in range(self.n_rep):
            share = req.rollouts[i::self.n_rep]
            self.queues.append(deque(share[j:j + mb] for j in range(0, len(share), mb)))

    def leftover(self) -> list[Rollout]:
        return [r for q in self.queues for batch in q for r in batch]

    def _call(self, clock: Clock, rows: list[Rollout], ctx0: int, padded: bool = False):
        """Process: the batch's generate() call starts: its overhead, then one prefill padded to ``ctx0``
        tokens per row for the rows whose KV is not resident (``padded``: their contexts differ, and the
        padding adds ``pad_prefill_s``). Returns the fresh rows."""
        # reprefill: a generate() call gets token ids only, so a carried row's cache is gone too
        need = list(rows) if self.reprefill else [r for r in rows if not r.kv_resident]
        total = active = 0.0
        if need:
            total, active = self.prefill_parts(ctx0 * len(need), len(need))
            if padded:
                total += self.cost.pad_prefill_s(self.rt)
        total += self.cost.call_overhead_s(self.rt)
        if self.terms is not None and total > 0:
            clock.charge({**(self.terms.prefill(ctx0 * len(need), len(need)) if need else {}),
                          GEN_CALL_OVERHEAD: self.cost.call_overhead_s(self.rt),
                          LEFT_PADDING: self.cost.pad_prefill_s(self.rt) if need and padded else 0.0})
        if total > 0:
            yield from clock.busy(total, active)
        for r in need:
            r.kv_resident = True
        return [r for r in need if r.generated == 0]

    def _hand_over(self, P: int, live, waiting: list[Rollout], final: bool) -> None:
        """The call returns (a chunk boundary at position P, or the batch's end when ``final``): each
        streamed role whose chunk divides P (every role when final) gets the new tokens of every live
        row and the last tokens of the rows that ended inside the chunk."""
        step = self.req.step
        for role, c in self.req.stream.items():
            if not final and P % c:
                continue
            scorer = self.sim.scorers[role]
            for r in waiting:
                scorer.emit(step, r, final=True)
            if not final:
                for r in live:
                    scorer.emit(step, r, final=False)
        if final or all(P % c == 0 for c in self.req.stream.values()):
            waiting.clear()

    def replica(self, idx: int):
        env = self.env
        # per-row boundaries only for a runtime without generate() calls; else the batch hands over (_hand_over)
        clock = self.clock(idx, self.req.stream if self.per_row else {})
        st = _Batch()
        start = env.now
        self.decoding(clock, +1)
        try:
            yield from self._loop(clock, self.queues[idx], st)
        finally:
            self.decoding(clock, -1)
            self._close(clock, st)
            self.record(clock, start)

    def plan(self, idx: int, clock: DeferredClock) -> None:
        """The same loop on a deferred clock (it never waits there, so it runs to its end at once)."""
        st = _Batch()
        for _ in self._loop(clock, self.queues[idx], st):  # pragma: no cover - a deferred clock never yields
            raise RuntimeError("a detached replica waited for an event")
        self._close(clock, st)

    def _finish(self, clock: Clock, r: Rollout, st: "_Batch") -> None:
        """A row ended: its last tokens go downstream now (``per_row``), or when the call returns; under
        ``stop_at: call`` it also counts as finished only then (``_returned``)."""
        if self.per_row:
            self.finish(clock, r)
            return
        st.waiting.append(r)
        if self.stop_at_call:
            st.unseen.append(r)
        else:
            self.finish(clock, r, emit=False)

    def _returned(self, clock: Clock, st: "_Batch") -> None:
        """The generate() call returns (a chunk boundary, the batch's end, or a stop): under ``stop_at:
        call`` the rows that ended inside it are finished now, so OPPO's first-B count (and its stop)
        moves only between calls."""
        for r in st.unseen:
            self.finish(clock, r, emit=False)
        st.unseen.clear()

    def _close(self, clock: Clock, st: "_Batch") -> None:
        """The replica ends (its queue is done, or a stop ended the call): rows still in the batch leave
        unfinished, and the call's last tokens are handed over."""
        clock.release(st.live.values())
        for r in st.rows:
            if r.generated < r.response_len:
                self.leave(clock, r)
        self._returned(clock, st)
        self._hand_over(st.P, (), st.waiting, final=True)  # a stop ends the call

    def _loop(self, clock: Clock, queue: deque, st: "_Batch"):
        """Process: the replica's batches, one after another (module docstring)."""
        chunks = tuple(self.req.stream.values())
        live, waiting = st.live, st.waiting
        while not self.stopped:
            if not live:
                # The batch ends when its longest member ends.
                self._returned(clock, st)
                self._hand_over(st.P, (), waiting, final=True)
                for r in st.rows:
                    if r.paused and r.generated < r.response_len:
                        self.leave(clock, r)
                st.rows = []
                if not queue or self.stopped:
                    break
                rows = st.rows = list(queue.popleft())
                for r in rows:
                    r.paused, r.step_budget_used = False, 0
                ctx = {r.prompt_len + r.generated for r in rows}
                st.ctx0 = max(ctx)
                # rows of different contexts are left-padded to ctx0: the prefill and each decode step
                # pay for the padding mask
                clock.step_extra_s = self.cost.pad_step_s(self.rt, len(rows)) if len(ctx) > 1 else 0.0
                try:
                    fresh = yield from self._call(clock, rows, st.ctx0, len(ctx) > 1)
                except simpy.Interrupt:
                    break
                # The prefill gives fresh rows their first token: the padded batch is then one
                # position past ctx0.
                st.P = 1 if fresh else 0
                for r in fresh:
                    clock.first_token(r)
                for r in rows:
                    if clock.activate(r):
                        live[r.id] = r
                    elif r.generated >= r.response_len:
                        self._finish(clock, r, st)
                    else:
                        r.paused = True
                if self.stopped:
                    break
            else:
                batch = len(st.rows)
                n = clock.heap[0][0] - clock.T   # per row: the rows' own boundaries are heap events
                if not self.per_row:
                    for c in chunks:
                        n = min(n, (st.P // c + 1) * c - st.P)  # up to the batch's next chunk boundary
                n = yield from clock.decode(batch, batch * (st.ctx0 + st.P), n)
                if not n and self.stopped:
                    break
                st.P += n
                self.generated += n * len(live)
                done, crossed = clock.events()
                for r, what in done:
                    del live[r.id]
                    if what == "done":
                        # Rows that finish exactly at a stop (the interrupted segment) count as finished.
                        self._finish(clock, r, st)
                if self.stopped:
                    break
                if self.per_row and crossed and not (yield from self.handoff(clock, crossed)):
                    break
            P = st.P
            if not self.per_row and P and live and chunks and any(P % c == 0 for c in chunks):
                for r in live.values():
                    clock.sync(r)
                self._returned(clock, st)
                self._hand_over(P, live.values(), waiting, final=False)
                if self.stopped:   # this call's rows completed the first B (stop_at: call)
                    break
                if self.reprefill:
                    self._drop_finished(clock, st)
                if not (yield from self.handoff(clock, len(st.rows))):
                    break
                if self.reprefill and not (yield from self._reprefill(clock, st)):
                    break

    def _drop_finished(self, clock: Clock, st: "_Batch") -> None:
        """reprefill: the next generate() call takes only the rows still generating (given a finished row
        again, generate() would continue it past its EOS), left-padded to the longest of them."""
        st.rows = [r for r in st.rows if r.generated < r.response_len]
        ctx = {r.prompt_len + r.generated for r in st.rows}
        st.ctx0 = max(ctx) - st.P
        clock.step_extra_s = self.cost.pad_step_s(self.rt, len(st.rows)) if len(ctx) > 1 else 0.0

    def _reprefill(self, clock: Clock, st: "_Batch"):
        """Process: the next generate() call of a ``reprefill`` boundary prefills the batch's rows (those
        still generating: ``_drop_finished``) at its width ctx0 + P, less the decode step its token
        replaces (module docstring; the handoff was paid before). Returns False if a stop interrupted it."""
        b, width = len(st.rows), st.ctx0 + st.P
        total, active = self.prefill_parts(width * b, b)
        if clock.step_extra_s:   # the rows' contexts differ: left-padded
            total += self.cost.pad_prefill_s(self.rt)
        step_total, step_active = decode_sum(clock.coeffs(b, b * width), 1)
        total, active = max(total - step_total, 0.0), max(active - step_active, 0.0)
        if total <= 0:
            return True
        if self.terms is not None:   # the prefill's terms less those of the decode step its token replaces
            parts = {**self.terms.prefill(width * b, b), LEFT_PADDING: self.cost.pad_prefill_s(self.rt)
                     if clock.step_extra_s else 0.0}
            for k, v in clock._decoder.price(b, b * width, 1, self.overhead, clock.step_extra_s).terms().items():
                parts[k] = parts.get(k, 0.0) - v
            clock.charge(parts)
        try:
            yield from clock.busy(total, min(active, total))
        except simpy.Interrupt:
            return False
        return True


class _Batch:
    """A static replica's current batch: its rows (finished ones included: they pad), the live ones, the
    rows ended inside the current chunk (handed over when the call returns), the longest context at its
    start and the positions decoded since."""

    def __init__(self):
        self.rows: list[Rollout] = []
        self.live: dict[int, Rollout] = {}
        self.waiting: list[Rollout] = []
        self.unseen: list[Rollout] = []   # ended inside the current call, not counted yet (stop_at: call)
        self.ctx0 = 0
        self.P = 0

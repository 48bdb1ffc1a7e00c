"""A generation replica's seconds by cost term (``rlhfsim explain``), kept only when the recorder asks for terms.

The plain clocks (``Clock``, ``DeferredClock``) carry no accounting: an engine whose recorder keeps terms
(``Recorder.terms is not None``) builds its replicas' clocks from the subclasses here instead
(``Engine.clock``, ``Engine._run_detached``), so the plain simulate path runs the same code as before. Each
replica's seconds end in ``Recorder.add_streamed`` under the phase ``generate``, and ``Recorder.phase_terms``
explains the phase by the replica that ends last: its busy seconds by term and, apart from them, the rest of
the span, in which it is idle (between generation requests of one step).

What a replica's time is made of:

* a decode segment of n steps of ``batch`` rows from ``kv0`` cached tokens (``_Decode.price``'s terms, as the
  replica's clock prices it alone: the engine's per-step overhead and ``step_extra_s``): the closed-form sums of
  its steps' terms (the cache growing by ``batch`` a step),
  decode_kernels + engine_step + sampling_tail + host_launch_bound (the launch floor ``coeffs`` folds
  into the compute line, as priced: the segment's kernel sum with the floor less without it), engine_host (the
  engine's host work per step where the profile has it: its serial part, and the segment's kernel sum under the
  hidden part's floor less under the launch floor alone), on a CPU gemm_footprint and cold_overheads, and
  left_padding (a padded static batch's ``step_extra_s`` a step);
* a busy call (``charge`` names its terms before ``busy`` times it): a prefill's forward terms
  (``CostModel.forward``'s terms with ``Engine.prefill_parts``' arguments), gen_call_overhead and left_padding
  (``pad_prefill_s``) of a static batch's call, handoff at a chunk boundary; a re-prefill boundary
  (static ``reprefill``) its prefill's terms less those of the decode step its token replaces;
* interference: on the event clock, a segment or hand-over slowed by co-running work takes longer than its
  price alone (``Clock.factor``); the difference. A call or segment cut by a stop counts the share of its
  price done (the whole steps, and the fraction of the step in progress that the stop lost).

Each piece's terms are made to sum to the seconds it took exactly: what the terms leave (float rounding, the
closed forms' rounding against the clock's) goes to ``interference`` where the piece was slowed, else to its
first term (decode_kernels for a segment, the call's first term for a call). So a replica's terms sum to its
busy time, and a test holds the generate phase's terms plus its idle time to its span.
"""

from __future__ import annotations

from rlhfsim.costs.terms import DECODE_KERNELS, ENGINE_STEP, INTERFERENCE, add_terms
from rlhfsim.sim.engines.clock import Clock
from rlhfsim.sim.engines.deferred import SEGMENT, DeferredClock


class EngineTerms:
    """One engine's (one generation request's) term pricing, remembered per shape for the request."""

    def __init__(self, eng):
        self.eng = eng
        self._prefill: dict[tuple, dict[str, float]] = {}

    def prefill(self, n_tokens: float, n_seqs: int) -> dict[str, float]:
        """``Engine.prefill_parts``' total by cost term."""
        key = (n_tokens, n_seqs)
        t = self._prefill.get(key)
        if t is None:
            e = self.eng
            t = self._prefill[key] = e.cost.forward(e.model, e.dtype, n_tokens, n_seqs, e.tp, op="prefill", head="lm",
                                                    gen_runtime=e.rt, gen_logprobs=e.logprobs,
                                                    tp_inter_node=e.tp_inter_node, par=e.par).terms()
        return t

    def prefills(self, tokens) -> dict[str, float]:
        """One one-row prefill per entry of ``tokens`` (the continuous engine's admission), by term."""
        out: dict[str, float] = {}
        for n in tokens:
            add_terms(out, self.prefill(n, 1))
        return out

    def prefill_steps(self, steps) -> dict[str, float]:
        """Engine steps that prefill (tokens, rows) each (the continuous engine's token budget), by term
        (``CostModel.prefill_step``'s terms)."""
        out: dict[str, float] = {}
        e = self.eng
        for tok, rows in steps:
            key = ("step", tok, rows)
            t = self._prefill.get(key)
            if t is None:
                t = self._prefill[key] = e.cost.prefill_step(e.model, e.dtype, tok, rows, e.tp, e.rt, e.logprobs,
                                                             e.tp_inter_node, e.par).terms()
            add_terms(out, t)
        return out


class _Terms:
    """What both accounting clocks share: the replica's seconds by term (``acc``) and the terms of the busy
    call about to be timed (``charge``)."""

    def _init_terms(self) -> None:
        self.acc: dict[str, float] = {}
        self._pending: tuple[dict[str, float], str | None] | None = None

    def charge(self, terms: dict[str, float], slowed: bool = False) -> None:
        """The next ``busy`` call's price alone by term; ``slowed``: co-running stretches it (what it takes
        beyond the terms is interference)."""
        self._pending = (terms, INTERFERENCE if slowed else None)

    def booked(self, terms: dict[str, float], total_s: float) -> None:
        """A call of ``total_s`` booked without ``busy`` (the continuous engine's detached loop), by term."""
        self._pending = (terms, None)
        self._book_call(total_s, total_s)

    def _book_call(self, took_s: float, total_s: float) -> None:
        """A busy call of ``total_s`` took ``took_s`` (less where a stop cut it): its charged terms, times the
        share done, and the rest of ``took_s`` (module docstring)."""
        terms, rest = self._pending or ({}, None)
        self._pending = None
        done = min(took_s / total_s, 1.0) if total_s > 0 else 1.0
        s = add_terms(self.acc, terms, done)
        left = took_s - s
        if left:
            key = rest or next(iter(terms), ENGINE_STEP)
            self.acc[key] = self.acc.get(key, 0.0) + left


class TermsClock(_Terms, Clock):
    """The event clock, keeping the replica's seconds by term (module docstring)."""

    def __init__(self, eng, idx: int, row_stream: dict):
        super().__init__(eng, idx, row_stream)
        self._init_terms()
        self._slowed = False
        self._frac = 0.0

    def busy(self, total_s: float, active_s: float):
        t0 = self.env.now
        try:
            yield from Clock.busy(self, total_s, active_s)
        finally:
            self._book_call(self.env.now - t0, total_s)

    def _begin(self, same: bool = False) -> None:
        Clock._begin(self, same)
        if self._factor != 1.0:
            self._slowed = True

    def _done_now(self) -> tuple[int, float, float]:
        out = Clock._done_now(self)
        self._frac = out[1]
        return out

    def decode(self, batch: int, kv0: float, n: int):
        t0, extra = self.env.now, self.step_extra_s
        self._slowed, self._frac = False, 0.0
        done = yield from Clock.decode(self, batch, kv0, n)
        e = self.eng
        s = add_terms(self.acc, self._decoder.price(batch, kv0, done, e.overhead, extra, e.EXTRA_TERM).terms())
        if self.seg_left and self._frac:   # a stop cut the segment: the share of the step in progress it lost
            step = self._decoder.price(batch, kv0 + done * batch, 1, e.overhead, extra, e.EXTRA_TERM).terms()
            s += add_terms(self.acc, step, self._frac)
        left = (self.env.now - t0) - s
        if left:
            key = INTERFERENCE if self._slowed else DECODE_KERNELS
            self.acc[key] = self.acc.get(key, 0.0) + left
        return done


class TermsDeferredClock(_Terms, DeferredClock):
    """The deferred clock of a detached replica, keeping its seconds by term: the busy calls as booked, the
    decode segments once ``resolve`` has priced them (nothing slows or cuts a detached replica)."""

    def __init__(self, eng, idx: int, row_stream: dict):
        super().__init__(eng, idx, row_stream)
        self._init_terms()

    def busy(self, total_s: float, active_s: float):
        self._book_call(total_s, total_s)
        yield from DeferredClock.busy(self, total_s, active_s)

    def resolve(self, start: float, parts: tuple | None = None) -> float:
        end = DeferredClock.resolve(self, start, parts)
        e, j, extra = self.eng, 0, self.book_extra   # (empty where the plan books no step extra)
        for d in self.dur:
            if d == SEGMENT:
                add_terms(self.acc, self._decoder.price(self.book_batch[j], self.book_kv0[j], self.book_n[j], e.overhead,
                                                        extra[j] if extra else 0.0, e.EXTRA_TERM).terms())
                j += 1
        return end

"""What a simulation records: busy intervals per GPU group and one record per step."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhfsim.costs.terms import INTERFERENCE, add_terms


@dataclass(frozen=True)
class Interval:
    """GPUs ``gpu0 .. gpu0 + n_gpus - 1`` of ``pool`` were busy with ``phase`` for ``role``."""

    step: int
    pool: str
    gpu0: int
    n_gpus: int
    role: str
    phase: str
    start_s: float
    end_s: float
    active_s: float | None = None  # kernel time inside the interval (None: all of it); see docs/cost-model.md

    @property
    def active(self) -> float:
        """Seconds of the interval the device executes kernels (host overheads and pauses excluded)."""
        span = self.end_s - self.start_s
        return span if self.active_s is None else min(max(self.active_s, 0.0), span)


@dataclass
class StepRecord:
    """One training step. ``phases_s`` holds each phase's span (first start to last end)."""

    step: int
    start_s: float
    end_s: float
    generated_tokens: int = 0
    trained_rollouts: int = 0
    trained_ids: list = field(default_factory=list)
    deferred: int = 0
    deferred_in: int = 0
    off_policy_tokens: int = 0
    response_tokens: int = 0
    chunk_tokens: int = 0
    delta: int = 0
    chunks_scored: int = 0
    scored_tokens: int = 0
    staleness: int = 0
    deferral_ages: list = field(default_factory=list)
    phases_s: dict = field(default_factory=dict)
    lengths: list = field(default_factory=list)  # (rollout_id, prompt_len, response_len) trained

    @property
    def step_time_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def off_policy_token_frac(self) -> float:
        return self.off_policy_tokens / self.response_tokens if self.response_tokens else 0.0


class Recorder:
    """Collects intervals and step records. Phase spans per step are derived from the intervals."""

    def __init__(self):
        self.intervals: list[Interval] = []
        self.steps: list[StepRecord] = []
        self._spans: dict[tuple[int, str], list[float]] = {}
        # seconds by cost term per (step, phase), kept only when asked for (rlhfsim explain: ``record_terms``): of
        # the replica or rank that sets the span, and per replica for a streamed phase and for generate (``streamed``)
        self.terms: dict[tuple[int, str], dict[str, float]] | None = None
        self.streamed: dict[tuple[int, str], dict[int, list]] = {}

    def record_terms(self) -> None:
        """Keep each phase's seconds by cost term (``rlhfsim.costs.terms``)."""
        self.terms = {}

    def add_terms(self, step: int, phase: str, parts: dict[str, float]) -> None:
        """Seconds by term of the work that sets ``phase``'s span in ``step`` (terms of 0 s left out)."""
        add_terms(self.terms.setdefault((step, phase), {}), parts)

    def add_streamed(self, step: int, phase: str, replica: int, end_at: float, parts: dict[str, float],
                     interference: float = 0.0) -> None:
        """A streamed call of ``phase`` (``stages.ChunkScorer``) on ``replica``, ending at ``end_at``: its seconds
        by term and its co-running slowdown (``interference``). Also a generation replica's busy seconds in one
        request (phase ``generate``, ``rlhfsim.sim.engines.accounting``), explained the same way."""
        entry = self.streamed.setdefault((step, phase), {}).setdefault(replica, [end_at, {}])
        entry[0] = max(entry[0], end_at)
        add_terms(entry[1], parts)
        add_terms(entry[1], {INTERFERENCE: interference})

    def phase_terms(self) -> dict[tuple[int, str], tuple[dict[str, float], float | None]]:
        """Per (step, phase): the seconds by term of the work that sets the span, and for a streamed phase the
        seconds its replica waits inside the span (None for the others). A streamed phase is explained by the
        replica whose calls end last (ties: the busier), its busy seconds by term; the rest of the span it
        waits for generation to hand tokens over (``rlhfsim.costs.terms.WAITING``). ``generate`` likewise: the
        engine replica that ends last, and the rest of the span, in which it is idle."""
        out: dict = {key: (dict(parts), None) for key, parts in (self.terms or {}).items()}
        for key, reps in self.streamed.items():
            _, parts = max(reps.values(), key=lambda e: (e[0], sum(e[1].values())))
            start, end = self._spans[key]
            out[key] = (dict(parts), (end - start) - sum(parts.values()))
        return out

    def busy(self, step: int, pool: str, gpu0: int, n_gpus: int, role: str, phase: str, start: float, end: float,
             active_s: float | None = None) -> None:
        """GPUs were assigned work from ``start`` to ``end``; ``active_s`` of it executing kernels."""
        if end < start:
            raise ValueError(f"negative interval {phase} {start}..{end}")
        self.intervals.append(Interval(step, pool, gpu0, n_gpus, role, phase, start, end, active_s))
        key = (step, phase)
        span = self._spans.get(key)
        if span is None:
            self._spans[key] = [start, end]
        else:
            span[0] = min(span[0], start)
            span[1] = max(span[1], end)

    def spans(self, step: int) -> dict[str, tuple[float, float]]:
        return {ph: (s[0], s[1]) for (st, ph), s in self._spans.items() if st == step}

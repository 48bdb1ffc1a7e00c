"""A training run's own record of its steps, read as the framework wrote it, and the steady steps a fit may use.

Formats (``rlhfsim.fromrun.logformats``, one module each; ``read_log`` picks by content):

* verl's console step lines, every release (``step:N - KEY:VALUE ...``; 0.1-0.4 three decimals, 0.5 on Python and
  numpy reprs such as ``np.float64(0.01)``; 0.1's ``timing/*`` timers read as ``timing_s/*``), Ray prefixes, ANSI
  colours and tqdm carriage returns allowed;
* metrics JSONL: verl's file logger (``{"step": N, "data": {...}}``) or flat records with ``_step`` (wandb);
* TensorBoard event files (a file, or a directory of them), verl's or OpenRLHF's;
* wandb CSV exports (a run's history, or a chart's export of one run);
* OpenRLHF's console ``Global step N: {...}`` lines (0.8.5 on; per-phase timers from 0.10).

``.gz`` is read as such (a compressed file cut short is read as far as it goes, with a note).

**Bad lines are skipped and listed, never taken silently.** A record is skipped with its reason when it is
truncated, has a number cut short, a non-numeric value, bytes that are not text, a separator missing (see each
reader), or, here, when a phase time (``timing_s/*``) or a length (``response_length/*``, ``prompt_length/*``) is
NaN, infinite or negative, when it carries no ``timing_s/step``, or when its step repeats the step just before it
(a duplicate line: the later kept). ``Steady.notices()`` lists them, one line each; with ``strict`` any bad line
is an error naming it.

**Validation-only records** (every metric ``val/``, ``val-`` or ``eval/``: verl's ``val_before_train`` at step 0,
its final validation after the last step in verl 0.2, OpenRLHF's evaluation line) are not steps; they are listed.

**Resumed runs.** A run restarted from a checkpoint logs again from the checkpoint's step: a train record whose step
is not after the one before it, or the first train record after a validation-only record (a restart's
``val_before_train``; verl only: OpenRLHF evaluates between steps), begins a new segment. The later record of a step logged twice is kept (said in a note), and
the first ``warmup`` steps of every segment are warm-up (a restarted engine pays its first calls again).

Steady steps (``steady_steps``): every step kept less the warm-up steps, validation steps (a ``timing_s/testing``
key or any validation metric: verl validates inside the step and its ``timing_s/step`` includes it), checkpoint
steps (``timing_s/save_checkpoint``) and the bad ones, each skipped step listed with its reason. Fewer than
``min_steps`` steady steps is an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from rlhfsim.contracts import VERL_STEP_KEY
from rlhfsim.fromrun.logformats import READERS, read_data, read_path
from rlhfsim.fromrun.logformats.base import BadLine, LogError, LogRead, StepLine, is_validation_key, ranges
from rlhfsim.fromrun.logformats.normalize import normalize

__all__ = ["BadLine", "LogError", "LogRead", "StepLine", "Steady", "read_log", "read_log_data", "steady_steps",
           "parse_console",
           "parse_jsonl", "skipped_text"]

VALIDATION_KEYS = ("timing_s/testing",)
CHECKPOINT_KEYS = ("timing_s/save_checkpoint",)
CHECKED_PREFIXES = ("timing_s/", "response_length/", "prompt_length/")   # NaN, infinite or negative: a bad record
DEFAULT_WARMUP = 1
DEFAULT_MIN_STEPS = 3
NOTICE_LINES = 12


@dataclass
class Steady:
    """The steps a fit uses, those it skipped (step -> reason) and what the log reader found on the way: the bad
    records skipped (``bad``), notes, the validation-only records and the steps a resumed run logged again."""

    source: str
    kept: list[StepLine]
    skipped: dict[int, str] = field(default_factory=dict)
    replaced: list[int] = field(default_factory=list)   # steps logged twice (a resumed run): the later line kept
    bad: list[BadLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    validation_only: list[StepLine] = field(default_factory=list)
    logged: list[StepLine] = field(default_factory=list)   # every training step, once (the later of a repeat)
    format: str = ""
    unit: str = "line"
    framework: str = "verl"

    def phase_samples(self, prefix: str = "timing_s/") -> dict[str, list[float]]:
        """Each ``timing_s/*`` metric that every kept step logged, as its per-step values (seconds)."""
        keys = set.intersection(*(set(s.metrics) for s in self.kept)) if self.kept else set()
        skip = set(VALIDATION_KEYS + CHECKPOINT_KEYS)
        return {k: [float(s.metrics[k]) for s in self.kept] for k in sorted(keys)
                if k.startswith(prefix) and k not in skip}

    def subset(self, kept: list[StepLine]) -> "Steady":
        """These steady steps alone (a bin of them: ``rlhfsim.fromrun.bins.bins``), with the log's every training step
        (``logged``) and its format carried, so the launch/log agreement check (``rlhfsim.fromrun.agree``) still reads
        the whole log: a warm-up step or a step of another bin whose response ran past the launch's cap is named,
        not dropped silently. What the reader skipped stays with the whole log's record."""
        return Steady(self.source, list(kept), logged=list(self.logged or self.kept), format=self.format,
                      unit=self.unit, framework=self.framework)

    def mean(self, key: str) -> float | None:
        """The mean of ``key`` over the kept steps that logged it (None: none did)."""
        vals = [float(s.metrics[key]) for s in self.kept if key in s.metrics]
        return sum(vals) / len(vals) if vals else None

    def lines(self) -> str:
        """The kept steps' log lines, compactly (for tracing a fitted term to the lines that determined it)."""
        ls = [s.line for s in self.kept]
        return f"{len(ls)} step {self.unit}s, {self.unit}s {ls[0]}-{ls[-1]}" if ls else f"no {self.unit}s"

    def where(self, b: BadLine) -> str:
        return f"{b.source or self.source} {self.unit} {b.line}"

    def notices(self) -> list[str]:
        """What the user must hear about the log, one line each: every bad record skipped with its reason (the
        first ``NOTICE_LINES``, then a count by reason), the reader's notes, validation-only records."""
        out = [f"{self.where(b)}: skipped, {b.reason}" + (f": {b.excerpt}" if b.excerpt else "")
               for b in self.bad[:NOTICE_LINES]]
        if len(self.bad) > NOTICE_LINES:
            by: dict[str, int] = {}
            for b in self.bad[NOTICE_LINES:]:
                short = b.reason.split(" (")[0].split(":")[0]      # "truncated line", "NaN timing_s/gen", ...
                by[short] = by.get(short, 0) + 1
            out.append(f"{self.source}: {len(self.bad) - NOTICE_LINES} more bad {self.unit}s skipped ("
                       + "; ".join(f"{n} {why}" for why, n in by.items()) + ")")
        out += self.notes
        if self.validation_only:
            out.append(f"{self.source}: validation-only records (not training steps) at steps "
                       f"{ranges([s.step for s in self.validation_only])} ({self.unit}s "
                       f"{ranges([s.line for s in self.validation_only])})")
        return out

    def record(self) -> dict:
        """The reader's findings for a fit's JSON and overlay (``line``: the record's line, or its event in a
        TensorBoard file, as ``unit`` says)."""
        return {"format": self.format, "framework": self.framework,
                "bad_lines": [{"source": b.source or self.source, "line": b.line, "unit": self.unit, "step": b.step,
                               "reason": b.reason, "excerpt": b.excerpt} for b in self.bad],
                "notes": list(self.notes), "replaced_steps": list(self.replaced),
                "validation_only_steps": [s.step for s in self.validation_only], "notices": self.notices()}


def read_log(path: Path | str) -> LogRead:
    """Every step record of a log in any format ``rlhfsim.fromrun.logformats`` reads (module docstring), with the
    bad records skipped and listed. A log with no step record at all is an error."""
    return _with_steps(read_path(path))


def read_log_data(data: bytes, name: str) -> LogRead:
    """``read_log`` on a log's bytes as the file ``name`` would hold them (``.gz``: compressed)."""
    return _with_steps(read_data(data, name))


def _with_steps(log: LogRead) -> LogRead:
    if not log.steps:
        why = f"; {len(log.bad)} bad {log.unit}s: {log.where(log.bad[0])}: {log.bad[0].reason}" if log.bad else ""
        raise LogError(f"{log.source}: expected step records (verl `step:N - timing_s/gen:... - timing_s/step:...` "
                       f"lines, metrics JSONL, TensorBoard events, a wandb CSV or OpenRLHF `Global step N: {{...}}` "
                       f"lines), got none ({log.format}){why}")
    return log


def parse_console(text: str, source: str = "log") -> LogRead:
    """verl's console step lines of ``text`` (``logformats.verl_console``), normalized."""
    return normalize(READERS["verl-console"](text, source))


def parse_jsonl(text: str, source: str = "log") -> LogRead:
    """A metrics JSONL (``logformats.jsonl``), normalized."""
    return normalize(READERS["jsonl"](text, source))


def _value_problem(s: StepLine) -> str | None:
    if VERL_STEP_KEY not in s.metrics:
        return f"no {VERL_STEP_KEY} (not a whole step record)"
    for k, v in s.metrics.items():
        if not k.startswith(CHECKED_PREFIXES) or k.startswith("timing_s/") and "/" in k[len("timing_s/"):]:
            continue
        if math.isnan(v) or math.isinf(v):
            return f"{'NaN' if math.isnan(v) else 'infinite'} {k}"
        if v < 0:
            return f"negative {k} ({v:g})"
    return None


def steady_steps(log: LogRead | list[StepLine], source: str, warmup: int = DEFAULT_WARMUP,
                 min_steps: int = DEFAULT_MIN_STEPS, strict: bool = False) -> Steady:
    """The steady steps of a log (rules in the module docstring); ``strict``: any bad record is an error."""
    if not isinstance(log, LogRead):
        log = LogRead(source, "records", list(log))
    res = Steady(source, [], bad=list(log.bad), notes=list(log.notes), format=log.format, unit=log.unit,
                 framework=log.framework)
    latest: dict[int, StepLine] = {}
    warm: set[int] = set()          # id() of the warm-up records
    in_segment = 0
    prev: StepLine | None = None
    val_since = False
    restarts: list[tuple[StepLine, StepLine | None, list[int]]] = []
    for s in log.steps:
        if s.kind != "train":
            res.validation_only.append(s)
            # verl validates before training at every start; OpenRLHF's evaluation lines fall between steps
            val_since = prev is not None and log.framework != "openrlhf"
            continue
        dup = prev is not None and s.step == prev.step and not val_since
        if dup:
            res.bad.append(BadLine(prev.line, f"duplicate step {s.step} (logged again at {res.unit} {s.line}; the later "
                                              f"kept)", step=s.step, source=prev.source))
        elif prev is None or val_since or s.step < prev.step:
            in_segment = 0
            if prev is not None:
                restarts.append((s, prev, []))
        if s.step in latest and not dup:
            res.replaced.append(s.step)
            if restarts:
                restarts[-1][2].append(s.step)
        latest[s.step] = s
        if in_segment < warmup:
            warm.add(id(s))
        in_segment += 1
        prev, val_since = s, False
    res.replaced = sorted(set(res.replaced))
    for s, before, again in restarts:
        res.notes.append(f"{res.source}: a resumed run: {res.unit} {s.line} logs step {s.step} after step {before.step}"
                         + (f"; steps {ranges(again)} logged again, the later records kept" if again else "")
                         + f"; its first {warmup} step(s) skipped as warm-up")
    ordered = [latest[k] for k in sorted(latest)]
    res.logged = ordered
    steps = [s.step for s in ordered]
    unread = {b.step for b in res.bad}
    gaps = [k for a, b in zip(steps, steps[1:]) for k in range(a + 1, b) if k not in unread]
    if gaps:
        res.notes.append(f"{res.source}: steps {ranges(gaps)} not logged")
    for s in ordered:
        keys = s.metrics.keys()
        problem = _value_problem(s)
        if problem:
            res.bad.append(BadLine(s.line, problem, step=s.step, source=s.source))
            res.skipped[s.step] = problem
        elif id(s) in warm:
            res.skipped[s.step] = "warm-up" if s is ordered[0] or not restarts else "warm-up (resumed run)"
        elif any(k in keys for k in VALIDATION_KEYS) or any(is_validation_key(k) for k in keys):
            res.skipped[s.step] = "validation" + (" and checkpoint" if any(k in keys for k in CHECKPOINT_KEYS) else "")
        elif any(k in keys for k in CHECKPOINT_KEYS):
            res.skipped[s.step] = "checkpoint"
        else:
            res.kept.append(s)
    if strict and res.bad:
        b = res.bad[0]
        raise LogError(f"{res.where(b)}: {b.reason} (--strict refuses a log with a bad record; {len(res.bad)} in all)")
    if len(res.kept) < min_steps:
        bad = f"; {len(res.bad)} bad {res.unit}s skipped, first {res.where(res.bad[0])}: {res.bad[0].reason}" \
            if res.bad else ""
        raise LogError(f"{source}: expected at least {min_steps} steady steps, got {len(res.kept)} of {len(ordered)} "
                       f"logged (skipped: {_skipped_text(res.skipped)}{bad})")
    return res


def _skipped_text(skipped: dict[int, str]) -> str:
    by: dict[str, list[int]] = {}
    for k, why in skipped.items():
        by.setdefault(why, []).append(k)
    return "; ".join(f"{why} {_ranges(v)}" for why, v in by.items()) or "none"


def skipped_text(st: Steady) -> str:
    """The skipped steps by reason, e.g. ``warm-up 1; validation 5, 10, 15``."""
    return _skipped_text(st.skipped)


def _ranges(xs: list[int]) -> str:
    xs = sorted(xs)
    if len(xs) > 8:
        return f"{', '.join(map(str, xs[:6]))}, ... {xs[-1]} ({len(xs)} steps)"
    return ", ".join(map(str, xs))

"""A training run's own record of its steps: verl's console step lines and its metrics JSONL, read into one
``StepLine`` per logged step, and the steady steps a fit may use.

Formats (verl, ``verl/trainer/ppo/ray_trainer.py`` logging through ``verl/utils/tracking.py``):

* console (``trainer.logger`` with ``console``): one line per step, ``step:N - KEY:VALUE - KEY:VALUE ...``,
  usually behind Ray's ``(TaskRunner pid=...)`` prefix and ANSI colour codes; VALUE a number (``nan``/``inf``
  allowed). Anything else on other lines (configs, samples, warnings) is ignored.
* metrics JSONL (``trainer.logger`` with ``file``, path ``VERL_FILE_LOGGER_PATH``): one JSON object per line,
  ``{"step": N, "data": {KEY: VALUE, ...}}`` (newer releases add ``elapsed_seconds``).

A step line must carry ``timing_s/step`` (verl logs it last on the console line): a line without it, or with a
value that is not a number, is a truncated or corrupt log, reported as one line naming the file's line number.

Steady steps (``steady_steps``): every logged step less

* the first ``warmup`` steps (default 1: verl's first step carries the engine's and the reward function's
  first-call costs; in dingxianzhong/play-verl's PPO log step 1's ``timing_s/reward`` is 13.8 s against
  0.3 s afterwards),
* validation steps (a ``timing_s/testing`` key or any ``val-``/``val/`` metric: verl validates inside the step
  and its ``timing_s/step`` includes it),
* checkpoint steps (``timing_s/save_checkpoint``),

each skipped step listed with its reason. Fewer than ``min_steps`` steady steps is an error.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from rlhfsim.contracts import VERL_STEP_KEY
from rlhfsim.errors import RlhfsimError

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
STEP_LINE = re.compile(r"(?:^|[\s)\]])step:(\d+)\s+-\s+(.*)$")
VALIDATION_KEYS = ("timing_s/testing",)
CHECKPOINT_KEYS = ("timing_s/save_checkpoint",)
DEFAULT_WARMUP = 1
DEFAULT_MIN_STEPS = 3


class LogError(RlhfsimError):
    """A run log that cannot be read: one line naming the file and line."""


@dataclass(frozen=True)
class StepLine:
    """One logged step: its number, the 1-based line of the log it came from and its metrics."""

    step: int
    line: int
    metrics: dict


@dataclass
class Steady:
    """The steps a fit uses and those it skipped (step -> reason)."""

    source: str
    kept: list[StepLine]
    skipped: dict[int, str] = field(default_factory=dict)
    replaced: list[int] = field(default_factory=list)   # steps logged twice (a resumed run): the later line kept

    def phase_samples(self, prefix: str = "timing_s/") -> dict[str, list[float]]:
        """Each ``timing_s/*`` metric that every kept step logged, as its per-step values (seconds)."""
        keys = set.intersection(*(set(s.metrics) for s in self.kept)) if self.kept else set()
        skip = set(VALIDATION_KEYS + CHECKPOINT_KEYS)
        return {k: [float(s.metrics[k]) for s in self.kept] for k in sorted(keys)
                if k.startswith(prefix) and k not in skip}

    def mean(self, key: str) -> float | None:
        """The mean of ``key`` over the kept steps that logged it (None: none did)."""
        vals = [float(s.metrics[key]) for s in self.kept if key in s.metrics]
        return sum(vals) / len(vals) if vals else None

    def lines(self) -> str:
        """The kept steps' log lines, compactly (for tracing a fitted term to the lines that determined it)."""
        ls = [s.line for s in self.kept]
        return f"{len(ls)} step lines, lines {ls[0]}-{ls[-1]}" if ls else "no lines"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_console(text: str, source: str = "log") -> list[StepLine]:
    """Every ``step:N - KEY:VALUE ...`` line of a verl console log (see the module docstring)."""
    out = []
    for i, raw in enumerate(text.splitlines(), 1):
        if "step:" not in raw:
            continue
        m = STEP_LINE.search(ANSI.sub("", raw).rstrip())
        if m is None:
            continue
        metrics: dict[str, float] = {}
        for tok in m.group(2).split(" - "):
            key, colon, val = tok.strip().rpartition(":")
            num = _number(val) if colon else None
            if not key or num is None:
                raise LogError(f"{source} line {i}: expected KEY:NUMBER in step {m.group(1)}'s metrics, got "
                               f"{tok.strip()[:60]!r} (a truncated or corrupt step line?)")
            metrics[key] = num
        if VERL_STEP_KEY not in metrics:
            raise LogError(f"{source} line {i}: expected step {m.group(1)}'s metrics to end with {VERL_STEP_KEY}, got "
                           f"none (a truncated step line?)")
        out.append(StepLine(int(m.group(1)), i, metrics))
    return out


def parse_jsonl(text: str, source: str = "log") -> list[StepLine]:
    """verl's metrics JSONL (``{"step": N, "data": {...}}`` per line)."""
    out = []
    for i, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError as e:
            raise LogError(f"{source} line {i}: expected a JSON object per line, got invalid JSON ({e.msg}; a truncated "
                           f"line?)") from None
        step, data = (rec.get("step"), rec.get("data")) if isinstance(rec, dict) else (None, None)
        if not isinstance(step, int) or isinstance(step, bool) or not isinstance(data, dict):
            raise LogError(f"{source} line {i}: expected {{\"step\": N, \"data\": {{...}}}}, got {raw.strip()[:60]!r}")
        metrics = {}
        for k, v in data.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                metrics[k] = float(v)
        if VERL_STEP_KEY not in metrics:
            raise LogError(f"{source} line {i}: expected step {step}'s data to have {VERL_STEP_KEY}, got none")
        out.append(StepLine(step, i, metrics))
    return out


def read_log(path: Path | str) -> list[StepLine]:
    """The step lines of a verl log (gzip-compressed when its name ends in .gz): JSONL when its first non-empty
    line is a JSON object, else console."""
    p = Path(path)
    try:
        text = (gzip.decompress(p.read_bytes()).decode(errors="replace") if p.suffix == ".gz"
                else p.read_text(errors="replace"))
    except (OSError, EOFError) as e:
        raise LogError(f"log: expected a readable file, got {str(p)!r} ({e.strerror if isinstance(e, OSError) and e.strerror else e})") from None
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    steps = parse_jsonl(text, p.name) if first.startswith("{") else parse_console(text, p.name)
    if not steps:
        raise LogError(f"{p.name}: expected verl step lines (`step:N - timing_s/gen:... - timing_s/step:...`) or "
                       f"metrics JSONL, got none in {len(text.splitlines())} lines")
    return steps


def steady_steps(steps: list[StepLine], source: str, warmup: int = DEFAULT_WARMUP,
                 min_steps: int = DEFAULT_MIN_STEPS) -> Steady:
    """The steady steps of a log (rules in the module docstring)."""
    by_step: dict[int, StepLine] = {}
    replaced = []
    for s in steps:
        if s.step in by_step:
            replaced.append(s.step)
        by_step[s.step] = s
    ordered = [by_step[k] for k in sorted(by_step)]
    res = Steady(source, [], replaced=sorted(set(replaced)))
    for i, s in enumerate(ordered):
        keys = s.metrics.keys()
        if i < warmup:
            res.skipped[s.step] = "warm-up"
        elif any(k in keys for k in VALIDATION_KEYS) or any(k.startswith(("val-", "val/")) for k in keys):
            res.skipped[s.step] = "validation" + (" and checkpoint" if any(k in keys for k in CHECKPOINT_KEYS) else "")
        elif any(k in keys for k in CHECKPOINT_KEYS):
            res.skipped[s.step] = "checkpoint"
        elif not all(math.isfinite(v) for k, v in s.metrics.items() if k.startswith("timing_s/")):
            res.skipped[s.step] = "non-finite timing"
        else:
            res.kept.append(s)
    if len(res.kept) < min_steps:
        raise LogError(f"{source}: expected at least {min_steps} steady steps, got {len(res.kept)} of {len(ordered)} "
                       f"logged (skipped: {_skipped_text(res.skipped)})")
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

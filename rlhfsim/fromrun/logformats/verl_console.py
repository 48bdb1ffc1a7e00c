"""verl's console step lines, every release: ``step:N - KEY:VALUE - KEY:VALUE ...`` (``trainer.logger`` with
``console``; ``verl/utils/logger/aggregate_logger.py``: ``concat_dict_to_str``), usually behind Ray's
``(TaskRunner pid=...)`` prefix and ANSI colour codes.

* verl 0.1-0.4 print every value as ``f"{v:.3f}"`` (three decimals, ``nan``/``inf`` as such); verl >= 0.5 as
  ``pprint.pformat(v)``: a Python float's or int's repr, or numpy's ``np.float64(0.0123)`` for the metrics it
  averages with numpy (numpy >= 2). Only ``numbers.Number`` values are printed.
* verl 0.1 names its timers ``timing/gen``..., later releases ``timing_s/gen``... (``logformats.normalize``).

A line is read whole or not at all. It is skipped, with its reason, when

* a token is not ``KEY:NUMBER`` (a non-numeric value, a separator missing, text of another process run in),
* a metric appears twice in it (two lines run together),
* it has bytes that are not text (NUL and other control codes, bytes that were not UTF-8),
* it is cut short: it lacks the metric the log's step lines end with (the commonest last metric of its train
  lines, ``perf/throughput`` from verl 0.3 on), or, in a three-decimal log, a value has not three decimals
  (``timing_s/step:3`` where 35.387 was printed).

Other lines (configs, samples, warnings, tqdm bars) are not step lines and are ignored.
"""

from __future__ import annotations

import re
from collections import Counter

from rlhfsim.fromrun.logformats.base import (
    ANSI, BINARY, KEY, BadLine, LogRead, StepLine, excerpt, kind_of, number,
)

FORMAT = "verl console"
STEP_LINE = re.compile(r"(?:^|[\s)\]>])step:(\d+)\s+-\s+(.*)$")
STEP_CUT = re.compile(r"(?:^|[\s)\]>])step:(\d+)\s*-?\s*$")          # a step line cut before its first metric
FIXED3 = re.compile(r"^[-+]?(?:\d+\.\d{3}|nan|inf)$", re.I)
FIXED3_SHARE = 0.97     # a log whose values have three decimals this often is a verl <= 0.4 log


def _segment(raw: str) -> str:
    """The part of a line a terminal shows last (tqdm rewrites its bar with carriage returns)."""
    parts = [p for p in ANSI.sub("", raw).split("\r") if "step:" in p]
    return (parts[-1] if parts else "").rstrip()


def read(text: str, source: str) -> LogRead:
    """Every verl step line of ``text`` (module docstring)."""
    out = LogRead(source, FORMAT)
    values: dict[int, list[tuple[str, str]]] = {}
    for i, raw in enumerate(text.split("\n"), 1):
        if "step:" not in raw:
            continue
        seg = _segment(raw)
        m = STEP_LINE.search(seg)
        if m is None:
            cut = STEP_CUT.search(seg)
            if cut:
                out.bad.append(BadLine(i, "truncated line (no metrics after the step number)", excerpt(seg),
                                       int(cut.group(1))))
            continue
        step = int(m.group(1))
        if BINARY.search(seg):
            out.bad.append(BadLine(i, "binary bytes in the line (not text)", excerpt(seg), step))
            continue
        metrics: dict[str, float] = {}
        pairs: list[tuple[str, str]] = []
        why = None
        toks = m.group(2).split(" - ")
        for j, tok in enumerate(toks):
            tok = tok.strip()
            key, colon, val = tok.partition(":")
            if not tok:
                why = "truncated line (ends at a separator)" if not m.group(2).strip(" -") or \
                    m.group(2).rstrip().endswith("-") else "an empty metric between two separators"
            elif not colon and j == len(toks) - 1:
                why = f"truncated line (ends inside a metric name: {tok[:40]!r})"
            elif not colon or not KEY.match(key):
                why = f"malformed metric {tok[:40]!r} (expected KEY:NUMBER; a separator missing?)"
            elif key in metrics:
                why = f"metric {key} twice in one line (two lines run together?)"
            else:
                num = number(val)
                if num is None and re.search(r"\s\S+:", val.strip()):
                    why = f"a separator missing after {key} ({tok[:50]!r})"
                elif num is None:
                    why = f"non-numeric value {key}:{val.strip()[:24]!r}"
                else:
                    metrics[key] = num
                    pairs.append((key, val.strip()))
                    continue
            break
        if why:
            out.bad.append(BadLine(i, why, excerpt(seg), step))
            continue
        out.steps.append(StepLine(step, i, metrics, kind_of(metrics), source))
        values[i] = pairs
    _cut_short(out, values)
    return out


def _cut_short(out: LogRead, values: dict[int, list[tuple[str, str]]]) -> None:
    """Move the records cut short (module docstring) from ``out.steps`` to ``out.bad``."""
    train = [s for s in out.steps if s.kind == "train"]
    lasts = Counter(values[s.line][-1][0] for s in train)
    usual = lasts.most_common(1)[0][0] if lasts and lasts.most_common(1)[0][1] >= 2 else None
    texts = [v for pairs in values.values() for _, v in pairs]
    fixed3 = bool(texts) and sum(bool(FIXED3.match(v)) for v in texts) >= FIXED3_SHARE * len(texts)
    keep = []
    for s in out.steps:
        pairs = values[s.line]
        why = None
        if fixed3:
            wrong = next(((k, v) for k, v in pairs if not FIXED3.match(v)), None)
            if wrong:
                why = (f"number cut short: {wrong[0]}:{wrong[1]} (this log prints three decimals)"
                       if (wrong[0], wrong[1]) == pairs[-1] else
                       f"malformed number {wrong[0]}:{wrong[1]} (this log prints three decimals)")
        if why is None and s.kind == "train" and usual is not None and usual not in s.metrics:
            why = f"truncated line (ends at {pairs[-1][0]}; this log's step lines end with {usual})"
        if why:
            out.bad.append(BadLine(s.line, why, f"step:{s.step} - ... {pairs[-1][0]}:{pairs[-1][1]}", s.step))
        else:
            keep.append(s)
    out.steps = keep

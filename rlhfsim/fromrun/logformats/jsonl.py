"""Metrics as JSON, one object per line.

* verl's file logger (``trainer.logger`` with ``file``, verl >= 0.5; path ``VERL_FILE_LOGGER_PATH``):
  ``{"step": N, "data": {KEY: VALUE, ...}}`` (``json.dumps``: NaN and Infinity written bare).
* A flat record with its step beside the metrics: ``{"_step": N, KEY: VALUE, ...}`` (wandb's
  ``wandb-history.jsonl``; ``_runtime``/``_timestamp`` are not metrics) or ``{"step": N, KEY: VALUE, ...}``.

A line that is not a JSON object (a truncated last line, bytes that are not text) or has no whole-number step is
skipped with its reason. A value that is not a number is not a metric (wandb keeps tables and media as objects),
except under a timer (``timing_s/``, ``timing/``), where it makes the line bad.
"""

from __future__ import annotations

import json
import math

from rlhfsim.fromrun.logformats.base import BINARY, BadLine, LogRead, StepLine, excerpt, kind_of

FORMAT = "metrics JSONL"
STEP_KEYS = ("step", "_step", "global_step")
NOT_METRICS = {"_runtime", "_timestamp", "_step", "step", "global_step", "elapsed_seconds"}
TIMERS = ("timing_s/", "timing/")


def _step_of(rec: dict) -> int | None:
    for k in STEP_KEYS:
        v = rec.get(k)
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            return v
        if isinstance(v, float) and math.isfinite(v) and v == int(v):
            return int(v)
    return None


def read(text: str, source: str) -> LogRead:
    """Every record of a metrics JSONL (module docstring)."""
    out = LogRead(source, FORMAT)
    for i, raw in enumerate(text.split("\n"), 1):
        if not raw.strip():
            continue
        if BINARY.search(raw):
            out.bad.append(BadLine(i, "binary bytes in the line (not text)", excerpt(raw)))
            continue
        try:
            rec = json.loads(raw)
        except (json.JSONDecodeError, RecursionError) as e:
            msg = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
            out.bad.append(BadLine(i, f"not a JSON object ({msg}; a truncated line?)", excerpt(raw)))
            continue
        step = _step_of(rec) if isinstance(rec, dict) else None
        if step is None:
            out.bad.append(BadLine(i, "expected {\"step\": N, \"data\": {...}} (or a flat record with \"_step\"), got "
                                      "no whole-number step", excerpt(raw)))
            continue
        data = rec["data"] if isinstance(rec.get("data"), dict) else {k: v for k, v in rec.items() if k not in NOT_METRICS}
        metrics: dict[str, float] = {}
        why = None
        for k, v in data.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                metrics[str(k)] = float(v)
            elif str(k).startswith(TIMERS):
                why = f"non-numeric value {k}:{str(v)[:24]!r}"
                break
        if why:
            out.bad.append(BadLine(i, why, excerpt(raw), step))
            continue
        out.steps.append(StepLine(step, i, metrics, kind_of(metrics), source))
    return out

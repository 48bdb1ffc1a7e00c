"""Weights & Biases CSV exports of a run's metrics.

Two shapes, both one row per logged step:

* a run's history (``wandb.Api().run(...).history().to_csv()``, or the run page's table export): a step column
  (``_step``; ``step``/``Step``/``global_step`` are read alike) and one column per metric under its own name
  (``timing_s/gen``); ``_runtime``, ``_timestamp`` and unnamed index columns are not metrics;
* a chart panel's "Export CSV": ``Step`` and ``<run name> - <metric>`` columns, with ``__MIN``/``__MAX`` beside
  each when the panel smooths or samples (not read). One run per file: columns of several runs are an error.

A cell that is empty is a metric not logged that step. A row whose cells are fewer or more than the header's, whose
step is not a whole number, that has bytes that are not text, or a non-numeric value in a metric column is skipped
with its reason. (A column that is not numeric in most rows, such as a table of samples, is not a metric.)
"""

from __future__ import annotations

import csv
import io
import math

from rlhfsim.fromrun.logformats.base import BINARY, BadLine, LogError, LogRead, StepLine, excerpt, kind_of, number

FORMAT = "wandb CSV"
STEP_COLUMNS = ("_step", "Step", "step", "global_step", "train/global_step", "trainer/global_step")
NOT_METRICS = {"_runtime", "_timestamp", "_wandb", ""}
RUN_SEP = " - "


def looks_like(text: str) -> bool:
    first = next((ln for ln in text.split("\n") if ln.strip()), "")
    try:
        head = next(csv.reader([first]))
    except csv.Error:
        return False
    return any(h.strip().strip('"') in STEP_COLUMNS for h in head)


def _metric_names(header: list[str], source: str) -> dict[int, str]:
    """Column index -> metric name (module docstring)."""
    names, runs = {}, set()
    for j, h in enumerate(header):
        h = h.strip()
        if h in STEP_COLUMNS or h in NOT_METRICS or h.startswith(("Unnamed:", "_wandb")) or h.endswith(("__MIN", "__MAX")):
            continue
        run, sep, metric = h.partition(RUN_SEP)
        if sep and "/" in metric and "/" not in run:
            runs.add(run)
            h = metric
        names[j] = h
    if len(runs) > 1:
        raise LogError(f"{source}: expected one run's columns, got {len(runs)} runs ({', '.join(sorted(runs)[:4])}); "
                       f"export one run per file")
    return names


def read(text: str, source: str) -> LogRead:
    """Every row of a wandb CSV export (module docstring); ``line`` is the row's line in the file."""
    out = LogRead(source, FORMAT, unit="line")
    lines = text.split("\n")
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as e:
        raise LogError(f"{source}: expected CSV, got {e}") from None
    if not rows:
        return out
    header = rows[0]
    step_col = next((j for j, h in enumerate(header) if h.strip() in STEP_COLUMNS), None)
    if step_col is None:
        raise LogError(f"{source}: expected a step column ({', '.join(STEP_COLUMNS)}) in the CSV header, got "
                       f"{', '.join(h[:20] for h in header[:6])}")
    names = _metric_names(header, source)
    numeric = {j: 0 for j in names}
    for r in rows[1:]:
        for j in names:
            if j < len(r) and r[j].strip() and number(r[j]) is not None:
                numeric[j] += 1
    filled = {j: sum(1 for r in rows[1:] if j < len(r) and r[j].strip()) for j in names}
    names = {j: n for j, n in names.items() if filled[j] == 0 or numeric[j] * 2 >= filled[j]}
    line_of = _row_lines(lines, len(rows))
    for idx, r in enumerate(rows[1:], 1):
        ln = line_of[idx]
        raw = ",".join(r)
        if not any(c.strip() for c in r):
            continue
        if BINARY.search(raw):
            out.bad.append(BadLine(ln, "binary bytes in the row (not text)", excerpt(raw)))
            continue
        if len(r) != len(header):
            out.bad.append(BadLine(ln, f"expected {len(header)} cells as the header has, got {len(r)} (a truncated row?)",
                                   excerpt(raw)))
            continue
        s = number(r[step_col])
        if s is None or not math.isfinite(s) or s != int(s):
            out.bad.append(BadLine(ln, f"expected a whole-number step in {header[step_col]}, got {r[step_col][:20]!r}",
                                   excerpt(raw)))
            continue
        metrics, why = {}, None
        for j, name in names.items():
            cell = r[j].strip()
            if not cell:
                continue
            v = number(cell)
            if v is None:
                why = f"non-numeric value {name}:{cell[:24]!r}"
                break
            metrics[name] = v
        if why:
            out.bad.append(BadLine(ln, why, excerpt(raw), int(s)))
            continue
        if metrics:
            out.steps.append(StepLine(int(s), ln, metrics, kind_of(metrics), source))
    return out


def _row_lines(lines: list[str], n_rows: int) -> list[int]:
    """The 1-based file line each CSV row starts on (a quoted cell may span lines)."""
    out, row, i = [], "", 0
    starts = []
    while i < len(lines) and len(starts) < n_rows:
        if not row:
            starts.append(i + 1)
        row += lines[i] + "\n"
        i += 1
        if row.count('"') % 2 == 0:
            row = ""
    out = starts + [len(lines)] * (n_rows - len(starts))
    return out

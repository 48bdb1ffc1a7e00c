"""Turn busy intervals into drawable timeline rows, and keep what is drawn bounded.

A run can hold ~10^5 intervals; drawing each as an SVG bar makes the HTML slow and large. Three steps,
each lossless for what a reader can see, then one lossy step that says what it dropped:

1. merge: consecutive intervals of the same (pool, gpu, role, phase) whose gap is <= ``merge_gap_s``
   become one bar [first start, last end] that remembers how many intervals and which steps it covers;
2. lanes: bars that overlap on one GPU (two phases sharing it) go to separate lanes, greedily: a bar takes
   the lowest lane whose last bar ended at or before its start, so no lane holds two overlapping bars;
3. group: consecutive GPUs of a pool whose bars are identical (tensor/data-parallel replicas doing the same
   work) share one row, labelled ``pool · gpu 0–7``;
4. cap: if more than ``max_bars`` bars remain, keep only the bars of the first steps (by the first step
   a bar covers) that fit, and say so in ``note``.

No plotly here: ``trace.py`` uses the lane assignment too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlhfsim.report.load import Intervals

MERGE_GAP_FRACTION = 2e-4   # default merge gap as a fraction of the whole run's span (~1/5000: sub-pixel)


@dataclass(frozen=True, slots=True)
class Bar:
    """One drawn bar: intervals [start_s, end_s] merged over steps step_lo..step_hi."""

    pool: str
    gpu: int
    role: str
    phase: str
    step_lo: int
    step_hi: int
    start_s: float
    end_s: float
    merged: int       # how many intervals this bar stands for
    lane: int = 0


@dataclass(frozen=True)
class TimelineRows:
    """Rows top to bottom (label, bars) and a human note on what was merged or left out."""

    rows: list[tuple[str, list[Bar]]]
    bars_drawn: int
    intervals: int
    note: str


def merge_intervals(iv: Intervals, merge_gap_s: float) -> list[Bar]:
    """Step 1: merge same-(pool, gpu, role, phase) intervals whose gap is <= merge_gap_s.

    The gap is measured from the furthest end so far of the bar being built (an interval inside an
    earlier, longer one never splits it)."""
    n = len(iv)
    if n == 0:
        return []
    order = np.lexsort((iv.start_s, iv.phase, iv.role, iv.gpu, iv.pool))
    pool, gpu, role, phase = iv.pool[order], iv.gpu[order], iv.role[order], iv.phase[order]
    start, end, step = iv.start_s[order], iv.end_s[order], iv.step[order]
    new_key = np.ones(n, dtype=bool)
    new_key[1:] = (pool[1:] != pool[:-1]) | (gpu[1:] != gpu[:-1]) | (role[1:] != role[:-1]) | (phase[1:] != phase[:-1])
    running_end = np.empty(n)
    key_starts = np.flatnonzero(new_key)
    for a, b in zip(key_starts, [*key_starts[1:], n]):  # one numpy pass per (pool, gpu, role, phase)
        running_end[a:b] = np.maximum.accumulate(end[a:b])
    new_bar = new_key.copy()
    new_bar[1:] |= start[1:] - running_end[:-1] > merge_gap_s
    firsts = np.flatnonzero(new_bar)
    lasts = np.append(firsts[1:], n) - 1
    bar_end = np.maximum.reduceat(end, firsts)
    step_lo, step_hi = np.minimum.reduceat(step, firsts), np.maximum.reduceat(step, firsts)
    counts = lasts - firsts + 1
    return [Bar(str(pool[f]), int(gpu[f]), str(role[f]), str(phase[f]), int(lo), int(hi), float(start[f]),
                float(e), int(c))
            for f, lo, hi, e, c in zip(firsts, step_lo, step_hi, bar_end, counts)]


def assign_lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Step 2: lane index per interval such that intervals within one lane do not overlap.

    Greedy over intervals sorted by start (ties: longer first, so a parent precedes what it covers);
    uses the minimum number of lanes for interval graphs."""
    n = len(starts)
    lanes = np.zeros(n, dtype=np.int64)
    lane_end: list[float] = []
    for i in np.lexsort((-(ends - starts), starts)):
        for lane, end in enumerate(lane_end):
            if end <= starts[i]:
                break
        else:
            lane = len(lane_end)
            lane_end.append(0.0)
        lane_end[lane] = ends[i]
        lanes[i] = lane
    return lanes


def _gpu_label(pool: str, lo: int, hi: int) -> str:
    return f"{pool} · gpu {lo}" if lo == hi else f"{pool} · gpu {lo}–{hi}"


def timeline_rows(iv: Intervals, pools: dict, *, max_bars: int = 6000,
                  merge_gap_s: float | None = None) -> TimelineRows:
    """Steps 1-4 for every GPU of every pool (pools: summary.json "pools", in its order).

    merge_gap_s defaults to MERGE_GAP_FRACTION of the run's span (first start to last end)."""
    if merge_gap_s is None:
        span_s = float(iv.end_s.max() - iv.start_s.min()) if len(iv) else 0.0
        merge_gap_s = MERGE_GAP_FRACTION * span_s
    bars = merge_intervals(iv, merge_gap_s)
    per_gpu: dict[tuple[str, int], list[Bar]] = {}
    for bar in bars:
        per_gpu.setdefault((bar.pool, bar.gpu), []).append(bar)
    for key, gpu_bars in per_gpu.items():
        lanes = assign_lanes(np.array([b.start_s for b in gpu_bars]), np.array([b.end_s for b in gpu_bars]))
        laned = [Bar(b.pool, b.gpu, b.role, b.phase, b.step_lo, b.step_hi, b.start_s, b.end_s, b.merged, int(l))
                 for b, l in zip(gpu_bars, lanes)]
        per_gpu[key] = sorted(laned, key=lambda b: (b.lane, b.start_s))

    def signature(gpu_bars: list[Bar]) -> tuple:
        return tuple((b.lane, b.role, b.phase, b.step_lo, b.step_hi, b.start_s, b.end_s) for b in gpu_bars)

    # Step 3: group runs of identical consecutive GPUs; each group contributes one row per lane.
    groups: list[tuple[str, int, int, list[Bar]]] = []
    for pool, spec in pools.items():
        lo, sig, first = 0, None, []
        for gpu in range(spec["gpus"]):
            gpu_bars = per_gpu.get((pool, gpu), [])
            s = signature(gpu_bars)
            if gpu > 0 and s != sig:
                groups.append((pool, lo, gpu - 1, first))
                lo = gpu
            if gpu == 0 or s != sig:
                sig, first = s, gpu_bars
        groups.append((pool, lo, spec["gpus"] - 1, first))

    # Step 4: cap. Count bars per first step (each group's bars are drawn once).
    drawn = [b for _, _, _, group_bars in groups for b in group_bars]
    note_parts = []
    keep: set[Bar] | None = None
    if len(drawn) > max_bars:
        steps = np.sort(np.array([b.step_lo for b in drawn]))
        candidates = np.unique(steps)
        counts = np.searchsorted(steps, candidates, side="right")
        fitting = candidates[counts <= max_bars]   # steps s with count(step_lo <= s) <= max_bars
        if fitting.size:
            cutoff = int(fitting[-1])
            keep = {b for b in drawn if b.step_lo <= cutoff}
            note_parts.append(f"showing steps {int(candidates[0])}–{cutoff} of {int(candidates[0])}–"
                              f"{int(candidates[-1])} (at most {max_bars} bars; the Perfetto trace has every interval)")
        else:  # the first step alone needs more bars than the cap
            keep = set(sorted(drawn, key=lambda b: b.start_s)[:max_bars])
            note_parts.append(f"showing the first {max_bars} bars of step {int(candidates[0])} "
                              f"(the Perfetto trace has every interval)")
    rows: list[tuple[str, list[Bar]]] = []
    bars_drawn = 0
    for pool, lo, hi, group_bars in groups:
        if keep is not None:
            group_bars = [b for b in group_bars if b in keep]
        lanes = max((b.lane for b in group_bars), default=0) + 1
        for lane in range(lanes):
            label = _gpu_label(pool, lo, hi) + (f" lane {lane + 1}" if lane else "")
            lane_bars = [b for b in group_bars if b.lane == lane]
            rows.append((label, lane_bars))
            bars_drawn += len(lane_bars)
    merged = len(iv) - len(bars)
    if merged:
        note_parts.insert(0, f"{len(iv)} intervals merged into {len(bars)} bars (gaps ≤ {merge_gap_s * 1e3:.3g} ms)")
    if any(hi > lo for _, lo, hi, _ in groups):
        note_parts.append("identical GPUs share a row")
    return TimelineRows(rows=rows, bars_drawn=bars_drawn, intervals=len(iv), note="; ".join(note_parts))

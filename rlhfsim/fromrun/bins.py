"""A run's steady steps cut into bins by their longest response, so that a fit sees how ``timing_s/gen`` grows with
the tail batch, not only the run's mean (``rlhfsim.fromrun.pool``'s pooled fit and ``rlhfsim.fromrun.fit``'s
``prepare_units`` both cut runs so; why: ``rlhfsim.fromrun.pool``'s module docstring).

A run is binned on ``response_length/max`` when its 10-90% range is at least ``SPREAD`` of its median, else on
``response_length/clip_ratio`` when every step's longest reached the cap and the clipped share moves by ``SPREAD``
(absolute); else it stays one bin. Bins are quantiles of that key with at least ``MIN_BIN`` steps each, equal values
(steps at the cap) kept together."""

from __future__ import annotations

import numpy as np

from rlhfsim.fromrun.logs import Steady

BINS = 3
MIN_BIN = 8
SPREAD = 0.05            # a tail key is binned on when its 10-90% range is this share of its median (clip: absolute)


def tail_key(steady: Steady) -> str | None:
    """The length metric a run's steps are binned on (module docstring), or None: too little spread to bin."""
    def vals(k):
        return np.array([float(s.metrics[k]) for s in steady.kept if k in s.metrics])
    mx = vals("response_length/max")
    if len(mx) == len(steady.kept) and len(mx) and np.median(mx) > 0:
        p10, p90 = np.quantile(mx, [0.1, 0.9])
        if (p90 - p10) / np.median(mx) >= SPREAD:
            return "response_length/max"
    cl = vals("response_length/clip_ratio")
    if len(cl) == len(steady.kept) and len(cl):
        p10, p90 = np.quantile(cl, [0.1, 0.9])
        if p90 - p10 >= SPREAD:
            return "response_length/clip_ratio"
    return None


def bins(steady: Steady, n: int = BINS, min_bin: int = MIN_BIN) -> list[tuple[str, Steady]]:
    """The steady steps cut into up to ``n`` bins of at least ``min_bin`` steps by ``tail_key`` (quantiles; ties
    kept together), each a ``Steady`` of its own; one bin, all steps, when there is nothing to bin on."""
    key = tail_key(steady)
    k = min(n, len(steady.kept) // min_bin)
    if key is None or k < 2:
        return [(f"all {len(steady.kept)} steps", steady)]
    order = sorted(steady.kept, key=lambda s: (float(s.metrics[key]), s.step))
    vals = [float(s.metrics[key]) for s in order]
    cuts = [0]
    for i in range(1, k):
        c = max(round(i * len(order) / k), cuts[-1] + min_bin)
        if c >= len(order):
            break
        # equal values (steps at the cap) stay together: the cut moves to the start of their run, else past its end
        start, end = vals.index(vals[c]), len(vals) - vals[::-1].index(vals[c])
        c = start if start >= cuts[-1] + min_bin else end
        if c <= len(order) - min_bin:
            cuts.append(c)
    cuts.append(len(order))
    if len(cuts) < 3:
        return [(f"all {len(steady.kept)} steps", steady)]
    out = []
    for a, b in zip(cuts, cuts[1:]):
        part = sorted(order[a:b], key=lambda s: s.step)
        lo, hi = float(order[a].metrics[key]), float(order[b - 1].metrics[key])
        out.append((f"{key} {lo:g}-{hi:g} ({len(part)} steps)", steady.subset(part)))
    return out

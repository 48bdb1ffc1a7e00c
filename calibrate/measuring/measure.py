"""Timing discipline for every measured point.

A point is measured as: one first call, timed on its own (compilation, autotuning, allocator growth land
there: ``first_call_s``); ``warmup`` untimed calls; then ``iters`` timed calls whose durations are kept raw
(``samples_s``). The point's value, the one the fits use, is the 10%-trimmed mean of the samples
(``tmean_s``: the mean of the samples left after dropping the lowest and highest 10%): a simulated step
is a sum of many operations, whose expected time is the mean, and trimming drops one-off outliers
(page faults, garbage collection). On a shared VM the samples are bimodal (the same decode step at
4.5-5 ms and at 7.5-8.5 ms, in proportions that vary from pass to pass), and a median jumps between the
two modes (4.9 ms in one calibration, 7.3 ms in the next) where the trimmed mean moves far less. The
median and the inter-quartile range (IQR = p75 - p25) are recorded too; when IQR / median > 0.1 the
point is flagged ``warn_noisy`` (the threshold torch.utils.benchmark uses) and a warning is printed.

Clocks: on CUDA each call is bracketed by CUDA events recorded on the current stream (so concurrent
streams each time their own work), read after the end event synchronizes; on CPU ``time.perf_counter``
brackets the call. ``host_clock=True`` forces the host clock on CUDA too (with a device synchronize
before and after), for runtimes that launch work on streams torch does not know about (ONNX Runtime).

``budget_s`` bounds a point's cost: after ``min_iters`` samples, sampling stops once the samples sum past
the budget. Units: seconds.

Spread (``spread(bursts, gap_s)``, set for a whole calibration from the grid): the timed samples are
taken in ``bursts`` bursts separated by ``gap_s`` seconds of sleep (each burst re-warmed by one untimed
call, and given ``1/bursts`` of the budget and of the sample counts). On a shared machine whose speed
changes from one second to the next (a 2-vCPU cloud VM: the same decode step measured 4.2-8.2 ms in
back-to-back 0.3 s windows), samples from one contiguous window time that window, not the machine;
bursts spread over a few seconds time its usual speed, which is what long real runs see.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

NOISY_IQR_RATIO = 0.1
TRIM = 0.1   # fraction of samples dropped at each end for tmean_s
_SPREAD: contextvars.ContextVar[tuple[int, float]] = contextvars.ContextVar("rlhfsim_spread", default=(1, 0.0))


@contextlib.contextmanager
def spread(bursts: int, gap_s: float):
    """Within this block ``time_calls`` takes its samples in ``bursts`` bursts ``gap_s`` apart."""
    token = _SPREAD.set((max(int(bursts), 1), max(float(gap_s), 0.0)))
    try:
        yield
    finally:
        _SPREAD.reset(token)


@dataclass
class Measurement:
    """Raw samples of one point, its separately timed first call, and the last call's return value."""

    samples_s: list[float]
    first_call_s: float
    output: Any = None

    @property
    def median_s(self) -> float:
        return float(np.median(self.samples_s))

    @property
    def tmean_s(self) -> float:
        return trimmed_mean(self.samples_s)

    @property
    def iqr_s(self) -> float:
        q75, q25 = np.percentile(self.samples_s, [75, 25])
        return float(q75 - q25)

    @property
    def warn_noisy(self) -> bool:
        return noisy(self.samples_s)

    def summary(self) -> dict:
        return summarize(self.samples_s, self.first_call_s)


def alone_fields(alone: Measurement) -> dict:
    """The fields an interference point keeps about its side running alone (the slowdown's divisor)."""
    return {"alone_median_s": alone.median_s, "alone_tmean_s": alone.tmean_s, "alone_iqr_s": alone.iqr_s,
            "alone_samples_s": alone.samples_s}


def noisy(samples_s: list[float]) -> bool:
    med = float(np.median(samples_s))
    q75, q25 = np.percentile(samples_s, [75, 25])
    return bool(med > 0 and (q75 - q25) / med > NOISY_IQR_RATIO)


def trimmed_mean(samples_s) -> float:
    """Mean of the samples left after dropping floor(TRIM x n) from each end (the plain mean below 10)."""
    s = np.sort(np.asarray(samples_s, dtype=np.float64))
    k = int(TRIM * len(s))
    return float(s[k:len(s) - k].mean())


def summarize(samples_s: list[float], first_call_s: float) -> dict:
    """The timing fields every journal point carries."""
    s = np.asarray(samples_s, dtype=np.float64)
    q75, q25 = np.percentile(s, [75, 25])
    return {"tmean_s": trimmed_mean(s), "median_s": float(np.median(s)), "iqr_s": float(q75 - q25),
            "p95_s": float(np.percentile(s, 95)),
            "samples_s": [float(x) for x in s], "first_call_s": float(first_call_s), "warn_noisy": noisy(list(s))}


class Clock:
    """Times one call on ``device`` ("cpu", "cuda", "cuda:N")."""

    def __init__(self, device: str, host_clock: bool = False):
        self.cuda = str(device).startswith("cuda")
        self.events = self.cuda and not host_clock

    def call(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        if self.events:
            import torch

            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3, out
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn()
            torch.cuda.synchronize()
            return time.perf_counter() - t0, out
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out


def time_calls(fn: Callable[[], Any], *, device: str, warmup: int, iters: int, min_iters: int | None = None,
               budget_s: float | None = None, setup: Callable[[], Any] | None = None,
               host_clock: bool = False) -> Measurement:
    """First call, ``warmup`` untimed calls, then up to ``iters`` timed calls (``setup`` runs untimed
    before every call, e.g. to rewind a KV cache)."""
    clock = Clock(device, host_clock)
    if setup:
        setup()
    first_s, out = clock.call(fn)
    for _ in range(warmup):
        if setup:
            setup()
        out = fn()
    lo = iters if min_iters is None else min(min_iters, iters)
    bursts, gap_s = _SPREAD.get()
    bursts = min(bursts, iters)
    samples: list[float] = []
    for k in range(bursts):
        if k:
            time.sleep(gap_s)
            if setup:
                setup()
            out = fn()                      # re-warm after the pause, untimed
        b_hi, b_lo = math.ceil(iters / bursts), math.ceil(lo / bursts)
        b_budget = None if budget_s is None else budget_s / bursts
        taken: list[float] = []
        while len(taken) < b_hi and len(samples) + len(taken) < iters:
            if setup:
                setup()
            dt, out = clock.call(fn)
            taken.append(dt)
            if b_budget is not None and len(taken) >= b_lo and sum(taken) >= b_budget:
                break
        samples += taken
    return Measurement(samples, first_s, out)


def iters_for(estimate_s: float, budget_s: float, lo: int, hi: int) -> int:
    """How many timed calls fit a per-point budget given an estimate of one call."""
    if estimate_s <= 0:
        return hi
    return int(max(lo, min(hi, budget_s // estimate_s)))

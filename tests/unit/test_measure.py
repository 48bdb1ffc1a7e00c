"""The timing discipline: budgets, bursts spread over time, and the summary fields."""

from __future__ import annotations

import time

import pytest

from calibrate.measuring.measure import spread, summarize, time_calls, trimmed_mean


def _clocked():
    """A function that records when it was called."""
    calls: list[float] = []

    def fn():
        calls.append(time.perf_counter())
        return len(calls)

    return fn, calls


def test_plain_sampling_takes_iters_samples_after_first_and_warmup():
    fn, calls = _clocked()
    m = time_calls(fn, device="cpu", warmup=2, iters=7)
    assert len(m.samples_s) == 7 and len(calls) == 1 + 2 + 7
    assert m.output == 10


def test_bursts_are_spread_by_the_gap_and_rewarmed():
    fn, calls = _clocked()
    with spread(3, 0.05):
        m = time_calls(fn, device="cpu", warmup=1, iters=9)
    # 3 bursts of 3 timed calls, each later burst preceded by one untimed re-warm call.
    assert len(m.samples_s) == 9 and len(calls) == 1 + 1 + 9 + 2
    gaps = sorted(b - a for a, b in zip(calls, calls[1:]))
    assert gaps[-2] >= 0.05 and gaps[-3] < 0.05     # exactly two pauses
    with spread(3, 0.05):
        pass
    fn2, calls2 = _clocked()
    time_calls(fn2, device="cpu", warmup=0, iters=4)   # the setting does not leak out of the block
    assert max(b - a for a, b in zip(calls2, calls2[1:])) < 0.05


def test_bursts_share_the_budget_and_the_minimum():
    def slow():
        time.sleep(0.01)

    with spread(2, 0.0):
        m = time_calls(slow, device="cpu", warmup=0, iters=50, min_iters=4, budget_s=0.04)
    # each burst: at least ceil(4/2) = 2 samples and stops once its samples pass 0.02 s
    assert 4 <= len(m.samples_s) <= 8


def test_summary_fields():
    s = summarize([1.0, 2.0, 3.0, 4.0], 9.0)
    assert s["median_s"] == pytest.approx(2.5) and s["first_call_s"] == 9.0 and s["iqr_s"] == pytest.approx(1.5)
    assert s["tmean_s"] == pytest.approx(2.5) and s["warn_noisy"]


def test_trimmed_mean_follows_both_modes_and_drops_outliers():
    # Bimodal samples (a VM in a fast and a slow state): the median sits in one mode, the trimmed mean
    # between them in proportion; one huge outlier in 20 is trimmed away.
    fast, slow = [5.0] * 9, [8.0] * 10
    s = fast + slow + [500.0]
    assert trimmed_mean(s) == pytest.approx((7 * 5.0 + 9 * 8.0) / 16)
    assert summarize(s, 0.0)["median_s"] == 8.0
    assert trimmed_mean([1.0, 2.0, 30.0]) == pytest.approx(11.0)   # under 10 samples: the plain mean

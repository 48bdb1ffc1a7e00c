"""rlhfsim.fromrun.lengths: the capped lognormal's mean, and a shape matched back from its own statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlhfsim.fromrun.lengths import capped_mean, logged_shape
from rlhfsim.fromrun.logs import Steady, StepLine


def test_capped_mean_matches_sampling():
    rng = np.random.default_rng(0)
    mu, sigma, cap = math.log(150), 0.6, 256
    x = np.minimum(rng.lognormal(mu, sigma, 400_000), cap)
    assert capped_mean(mu, sigma, cap) == pytest.approx(x.mean(), rel=3e-3)


def steady_from(samples: list[np.ndarray], cap: int) -> Steady:
    steps = [StepLine(i + 2, i + 2, {"response_length/mean": float(s.mean()), "response_length/max": float(s.max()),
                                     "response_length/clip_ratio": float((s >= cap).mean()), "timing_s/step": 1.0})
             for i, s in enumerate(samples)]
    return Steady("synthetic", steps)


@pytest.mark.parametrize("sigma,cap", [(0.45, 256), (0.6, 4096)])   # clip ratio matched; longest matched
def test_shape_recovered_from_a_logs_statistics(sigma, cap):
    rng = np.random.default_rng(1)
    mu, rows = math.log(180), 512
    samples = [np.minimum(np.rint(rng.lognormal(mu, sigma, rows)), cap) for _ in range(40)]
    got = logged_shape(steady_from(samples, cap), cap, rows)
    assert ("clip_ratio" in got["matched"]) == (cap == 256)
    assert got["block"]["median"] == pytest.approx(180, rel=0.05)
    assert got["sigma"] == pytest.approx(sigma, rel=0.12)
    assert got["block"]["p99"] == pytest.approx(got["block"]["median"] * math.exp(2.3263478740408408 * got["sigma"]), rel=1e-3)


def test_no_shape_without_max_or_with_a_mean_at_the_cap():
    steps = [StepLine(2, 2, {"response_length/mean": 100.0, "timing_s/step": 1.0})]
    assert logged_shape(Steady("s", steps), 256, 64) is None
    steps = [StepLine(2, 2, {"response_length/mean": 256.0, "response_length/max": 256.0, "timing_s/step": 1.0})]
    assert logged_shape(Steady("s", steps), 256, 64) is None

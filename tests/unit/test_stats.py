"""calibrate.fitting.stats on synthetic samples with known answers, and the interleaving order."""

from __future__ import annotations

import numpy as np
import pytest

from calibrate.fitting import stats
from calibrate.measuring.interleave import Sampler, interleave, order


def _rounds(values_per_round: list[list[float]]) -> tuple[list[float], list[int]]:
    samples = [x for r in values_per_round for x in r]
    rounds_of = [i for i, r in enumerate(values_per_round) for _ in r]
    return samples, rounds_of


def test_percentiles_of_a_known_sample():
    d = stats.percentiles(np.arange(1, 101, dtype=float))
    assert d["p50"] == pytest.approx(50.5) and d["p95"] == pytest.approx(95.05) and d["p99"] == pytest.approx(99.01)
    assert d["n"] == 100


def test_median_ci_covers_the_true_median_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    hits = 0
    for k in range(60):
        groups = [rng.normal(10.0, 1.0, 3) for _ in range(15)]
        lo, hi = stats.median_ci(groups, seed=k)
        assert lo <= float(np.median(np.concatenate(groups))) <= hi
        hits += lo <= 10.0 <= hi
    assert hits >= 50   # ~95% nominal; percentile bootstrap of 15 rounds runs a little narrow


def test_same_distribution_is_a_tie_and_a_shift_is_faster_or_slower():
    rng = np.random.default_rng(1)
    base = _rounds([list(rng.normal(10, 0.5, 2)) for _ in range(12)])
    same = _rounds([list(rng.normal(10, 0.5, 2)) for _ in range(12)])
    quick = _rounds([list(rng.normal(8, 0.5, 2)) for _ in range(12)])
    slow = _rounds([list(rng.normal(12, 0.5, 2)) for _ in range(12)])
    c = stats.compare(*base, *same)
    assert c["verdict"] == "tie" and c["welch"]["p"] > 0.05
    assert c["speedup_ci95"][0] < 1.0 < c["speedup_ci95"][1]
    c = stats.compare(*base, *quick)
    assert c["verdict"] == "faster" and c["speedup"] == pytest.approx(1.25, rel=0.08)
    assert c["speedup_ci95"][0] > 1.0
    c = stats.compare(*base, *slow)
    assert c["verdict"] == "slower" and c["speedup_ci95"][1] < 1.0
    assert c["welch"]["df"] is not None and c["welch"]["df"] > 0


def test_welch_matches_scipy_on_round_means():
    from scipy.stats import ttest_ind

    a = [[1.0, 1.2], [1.1, 1.3], [0.9, 1.0], [1.2, 1.1]]
    b = [[1.5, 1.4], [1.6, 1.7], [1.3, 1.5]]
    t = stats.welch([np.array(x) for x in a], [np.array(x) for x in b])
    ref = ttest_ind([np.mean(x) for x in b], [np.mean(x) for x in a], equal_var=False)
    assert t["p"] == pytest.approx(ref.pvalue) and t["t"] == pytest.approx(ref.statistic)


def test_rounds_not_samples_are_the_unit():
    # 2 rounds of 50 samples each: 100 samples, but only 2 independent units.
    s, r = _rounds([[1.0] * 50, [2.0] * 50])
    assert stats.describe(s, r)["n_rounds"] == 2
    assert stats.describe(s)["n_rounds"] == 100 and stats.describe(s)["interleaved"] is False


def test_fewer_than_two_rounds_gives_no_verdict():
    s, r = _rounds([[1.0, 1.1, 0.9]])
    c = stats.compare(s, r, s, r)
    assert c["verdict"] is None and c["speedup_ci95"] is None and "fewer than 2 rounds" in c["verdict_reason"]
    assert stats.verdict({"p": 0.2, "mean_base": 1, "mean_other": 2}) in stats.VERDICTS


class _Log(Sampler):
    def __init__(self, name, log):
        self.name, self.log = name, log

    def first(self):
        self.log.append((self.name, "first"))
        return 0.5

    def round(self, k):
        self.log.append((self.name, k))
        return [0.1] * k


def test_interleave_alternates_and_rotates():
    log: list = []
    out = interleave({"a": _Log("a", log), "b": _Log("b", log), "c": _Log("c", log)}, rounds=3, per_round=2)
    assert [x for x in log if x[1] == "first"] == [("a", "first"), ("b", "first"), ("c", "first")]
    assert [n for n, k in log if k != "first"] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert out["a"].rounds_of == [0, 0, 1, 1, 2, 2] and len(out["b"].samples_s) == 6
    assert order(["a", "b"], 1) == ["b", "a"]

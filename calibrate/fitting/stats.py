"""Statistics of measured samples, with scipy: percentiles, 95% bootstrap confidence intervals, Welch's
t-test and a verdict per runtime against a baseline (eager).

The unit of independence is a **round** (``calibrate.measuring.interleave``): samples taken back to back within one
round share that moment's machine state, so they are not independent draws. Every resampling below
resamples rounds (a cluster bootstrap): ``scipy.stats.bootstrap`` draws round indices with replacement and
the statistic pools those rounds' samples. Points measured before interleaving (no ``rounds_of``) count
each sample as its own round, and are reported with ``interleaved: false``.

* ``p50/p95/p99``: percentiles of all samples (linear interpolation).
* ``ci95``: the 95% percentile-bootstrap interval of the median (``N_RESAMPLES`` resamples, seeded).
* ``speedup`` = median(baseline) / median(contender) (> 1: the contender is faster), with its 95%
  bootstrap interval (the two sides' rounds resampled independently).
* Welch's t-test (``scipy.stats.ttest_ind(equal_var=False)``) on the per-round means of the two sides.
  ``verdict``: ``faster`` / ``slower`` when p < 0.05 and the contender's mean is lower / higher, ``tie``
  otherwise; ``None`` (with ``verdict_reason``) when either side has fewer than 2 rounds.
Units: seconds in, seconds out (the report converts).
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy import stats as st

ALPHA = 0.05
CONFIDENCE = 0.95
N_RESAMPLES = 2000
VERDICTS = ("faster", "slower", "tie")


def rounds(samples_s, rounds_of=None) -> list[np.ndarray]:
    """The samples grouped by round (each sample its own group without ``rounds_of``)."""
    x = np.asarray(samples_s, dtype=np.float64)
    if rounds_of is None or len(rounds_of) != len(x):
        return [x[i:i + 1] for i in range(len(x))]
    keys = np.asarray(rounds_of)
    return [x[keys == k] for k in dict.fromkeys(rounds_of)]


def percentiles(samples_s) -> dict:
    x = np.asarray(samples_s, dtype=np.float64)
    p50, p95, p99 = np.percentile(x, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "mean": float(x.mean()), "n": int(len(x))}


def _median_of(groups: list[np.ndarray], idx) -> float:
    return float(np.median(np.concatenate([groups[int(i)] for i in idx])))


def _stat(groups: list[np.ndarray]):
    """(vectorized?, statistic of resampled round indices -> median of their pooled samples). Rounds of
    equal size (the usual case) are stacked so that every resample is one numpy call."""
    sizes = {len(g) for g in groups}
    if len(sizes) == 1:
        block = np.stack(groups)            # [rounds, per_round]

        def med(idx, axis=-1):
            idx = np.asarray(idx, dtype=np.int64)
            pooled = block[idx]               # [..., n, per_round]
            return np.median(pooled.reshape(*pooled.shape[:-2], -1), axis=-1)
        return True, med
    return False, lambda idx: _median_of(groups, idx)


def _interval(res_fn, point: float) -> tuple[float, float]:
    """Run a bootstrap; a degenerate one (every resample equal) is the point itself."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ci = res_fn().confidence_interval
        except ValueError:
            return point, point
    lo, hi = float(ci.low), float(ci.high)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return point, point
    return lo, hi


def median_ci(groups: list[np.ndarray], seed: int = 0) -> tuple[float, float] | None:
    """95% bootstrap interval of the median, rounds resampled; None below 2 rounds."""
    if len(groups) < 2:
        return None
    idx = np.arange(len(groups))
    vec, med = _stat(groups)
    point = float(med(idx))
    return _interval(lambda: st.bootstrap((idx,), med, vectorized=vec, n_resamples=N_RESAMPLES,
                                          confidence_level=CONFIDENCE, method="percentile",
                                          random_state=np.random.default_rng(seed)), point)


def speedup_ci(base: list[np.ndarray], other: list[np.ndarray], seed: int = 0) -> tuple[float, float] | None:
    """95% bootstrap interval of median(base) / median(other); None below 2 rounds on either side."""
    if len(base) < 2 or len(other) < 2:
        return None
    ib, io = np.arange(len(base)), np.arange(len(other))
    vb, mb = _stat(base)
    vo, mo = _stat(other)
    vec = vb and vo

    def ratio(a, b, axis=-1):
        return mb(a) / mo(b)

    point = float(ratio(ib, io))
    return _interval(lambda: st.bootstrap((ib, io), ratio if vec else (lambda a, b: ratio(a, b)), vectorized=vec,
                                          paired=False, n_resamples=N_RESAMPLES, confidence_level=CONFIDENCE,
                                          method="percentile", random_state=np.random.default_rng(seed)), point)


def welch(base: list[np.ndarray], other: list[np.ndarray]) -> dict | None:
    """Welch's t-test on per-round means: {t, p, df, mean_base, mean_other}; None below 2 rounds."""
    a = np.array([g.mean() for g in base])
    b = np.array([g.mean() for g in other])
    if len(a) < 2 or len(b) < 2:
        return None
    if np.ptp(a) == 0 and np.ptp(b) == 0:   # no spread at all: the t statistic is undefined
        p = 1.0 if a[0] == b[0] else 0.0
        return {"t": None, "p": p, "df": None, "mean_base": float(a.mean()), "mean_other": float(b.mean())}
    r = st.ttest_ind(b, a, equal_var=False)
    df = getattr(r, "df", None)
    return {"t": float(r.statistic), "p": float(r.pvalue), "df": None if df is None else float(df),
            "mean_base": float(a.mean()), "mean_other": float(b.mean())}


def verdict(test: dict | None, alpha: float = ALPHA) -> str | None:
    """faster / slower / tie at 1 - alpha (see the module docstring); None without a test."""
    if test is None:
        return None
    if test["p"] < alpha:
        return "faster" if test["mean_other"] < test["mean_base"] else "slower"
    return "tie"


def describe(samples_s, rounds_of=None, seed: int = 0) -> dict:
    """Percentiles, the median's 95% interval and the round count of one point's samples."""
    groups = rounds(samples_s, rounds_of)
    return {**percentiles(samples_s), "ci95": median_ci(groups, seed), "n_rounds": len(groups),
            "interleaved": rounds_of is not None}


def compare(base_samples, base_rounds, samples, rounds_of, seed: int = 0) -> dict:
    """A contender against the baseline: speedup with its interval, Welch's test and the verdict."""
    b, o = rounds(base_samples, base_rounds), rounds(samples, rounds_of)
    test = welch(b, o)
    out = {"speedup": float(np.median(base_samples) / np.median(samples)), "speedup_ci95": speedup_ci(b, o, seed),
           "welch": test, "verdict": verdict(test)}
    if test is None:
        out["verdict_reason"] = "fewer than 2 rounds on one side: no test"
    return out

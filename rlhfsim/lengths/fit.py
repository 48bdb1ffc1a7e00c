"""Parametric fits of observed response lengths, in the scenario's own terms (``rlhfsim.scenario.schema``).

* lognormal: ``scipy.stats.lognorm.fit`` with loc = 0 (maximum likelihood: mu = mean of ln L, sigma = std
  of ln L); reported as ``{kind: lognormal, median: e^mu, p99: e^(mu + 2.3263 sigma)}``.
* pareto: ``scipy.stats.pareto.fit`` with loc = 0 and the scale fixed at the smallest length (the MLE of
  x_m), so alpha = n / sum ln(L / x_m); reported as ``{kind: pareto, scale: x_m, alpha}``.

Each fit carries its Kolmogorov-Smirnov statistic against the data (``scipy.stats.kstest``: the largest
gap between the empirical and fitted CDFs; smaller is closer) and its log-likelihood. Lengths capped by a
maximum (truncated completions) pile up at the cap; the fits treat them as observed lengths, so a large
``capped_fraction`` says the tail is cut, not measured.
"""

from __future__ import annotations

import numpy as np

from rlhfsim.workload.lengths import Z99


def summarize(lengths) -> dict:
    """Count, mean, median, p90, p99, max and the fraction at the maximum."""
    x = np.asarray(lengths, dtype=float)
    return {"n": int(x.size), "mean": float(x.mean()), "median": float(np.median(x)),
            "p90": float(np.percentile(x, 90)), "p99": float(np.percentile(x, 99)), "max": float(x.max()),
            "capped_fraction": float(np.mean(x == x.max()))}


def fit_lengths(lengths) -> dict:
    """Lognormal and Pareto fits of ``lengths`` (module docstring), as scenario length blocks."""
    from scipy import stats

    x = np.asarray(lengths, dtype=float)
    if x.size < 2 or np.all(x == x[0]):
        raise ValueError("expected at least two different lengths to fit")
    s, _, scale = stats.lognorm.fit(x, floc=0)
    mu, sigma = float(np.log(scale)), float(s)
    xm = float(x.min())
    b, _, _ = stats.pareto.fit(x, floc=0, fscale=xm)
    out = {
        "lognormal": {"dist": {"kind": "lognormal", "median": float(np.exp(mu)), "p99": float(np.exp(mu + Z99 * sigma))},
                      "params": {"mu": mu, "sigma": sigma},
                      "ks": float(stats.kstest(x, "lognorm", args=(s, 0, scale)).statistic),
                      "loglik": float(np.sum(stats.lognorm.logpdf(x, s, 0, scale)))},
        "pareto": {"dist": {"kind": "pareto", "scale": xm, "alpha": float(b)},
                   "params": {"x_m": xm, "alpha": float(b)},
                   "ks": float(stats.kstest(x, "pareto", args=(b, 0, xm)).statistic),
                   "loglik": float(np.sum(stats.pareto.logpdf(x, b, 0, xm)))},
    }
    return out


def fitted_curves(fits: dict, grid) -> dict:
    """pdf and survival function of each fit on ``grid`` (for the figure)."""
    from scipy import stats

    g = np.asarray(grid, dtype=float)
    ln, pa = fits["lognormal"]["params"], fits["pareto"]["params"]
    return {
        "lognormal": {"pdf": stats.lognorm.pdf(g, ln["sigma"], 0, np.exp(ln["mu"])),
                      "sf": stats.lognorm.sf(g, ln["sigma"], 0, np.exp(ln["mu"]))},
        "pareto": {"pdf": stats.pareto.pdf(g, pa["alpha"], 0, pa["x_m"]),
                   "sf": stats.pareto.sf(g, pa["alpha"], 0, pa["x_m"])},
    }

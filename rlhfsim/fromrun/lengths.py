"""Response lengths as the run logged them: a lognormal, cut at the response cap, matched to the steady steps'
mean length and to how long the longest ran.

verl logs per step ``response_length/mean``, ``/max`` and ``/clip_ratio`` (the share of responses cut at
``data.max_response_length``). ``rlhfsim import verl`` with a mean alone assumes a log-sd of 0.5; a run whose
longest responses reach the cap (clip ratio 0.3 in play-verl's 0.5B PPO run) or run far past the assumed
tail (the 7B runs' longest, 870-1010 tokens against a mean of 170-190) decodes for more steps than that shape
says. With L = min(X, c), ln X ~ N(mu, sigma), c the cap:

    E[L]      = exp(mu + sigma^2 / 2) Phi((ln c - mu - sigma^2) / sigma) + c (1 - Phi((ln c - mu) / sigma))
    P(X >= c) = 1 - Phi((ln c - mu) / sigma)                         (matched when the clip ratio is >= 0.005)
    median of the largest of N = exp(mu + sigma Phi^-1(0.5^(1/N)))   (matched to the mean logged max otherwise)

N = the responses per step (prompts x group size). (mu, sigma) solve the two equations (scipy least squares
in (mu, ln sigma)); the scenario gets ``{kind: lognormal, median: e^mu, p99: e^(mu + 2.326 sigma)}``.
"""

from __future__ import annotations

import math

from scipy.optimize import least_squares
from scipy.stats import norm

from rlhfsim.fromrun.logs import Steady

CLIP_MIN = 0.005
Z99 = 2.3263478740408408


def capped_mean(mu: float, sigma: float, cap: float) -> float:
    a = (math.log(cap) - mu) / sigma
    return math.exp(mu + sigma ** 2 / 2) * norm.cdf(a - sigma) + cap * norm.sf(a)


def logged_shape(steady: Steady, cap: int, rows: int) -> dict | None:
    """The lognormal block for ``workload.response_length`` (module docstring), with what it matched; None when
    the log has no ``response_length/mean`` and ``/max`` to match."""
    mean, longest, clip = (steady.mean(f"response_length/{k}") for k in ("mean", "max", "clip_ratio"))
    if mean is None or longest is None or not 0 < mean < cap:
        return None
    use_clip = clip is not None and clip >= CLIP_MIN
    q_max = norm.ppf(0.5 ** (1.0 / max(rows, 2)))

    def res(v):
        mu, sigma = v[0], math.exp(v[1])
        second = (norm.sf((math.log(cap) - mu) / sigma) - clip) * 10 if use_clip else \
            (mu + sigma * q_max - math.log(min(longest, cap - 0.5)))
        return [math.log(capped_mean(mu, sigma, cap) / mean), second]

    # bounded (log-sd 0.01-3): unbounded steps could leave the range exp() holds (a bin of steps whose longest all
    # reached the cap, clip ratio 0.009 at mean 167 of 1024, overflowed; its solution is median 110, log-sd 0.93)
    sol = least_squares(res, [math.log(mean) - 0.125, math.log(0.5)], method="trf",
                        bounds=([-math.inf, math.log(0.01)], [math.log(cap) + 5, math.log(3.0)]))
    mu, sigma = float(sol.x[0]), float(math.exp(sol.x[1]))
    return {"block": {"kind": "lognormal", "median": round(math.exp(mu), 2), "p99": round(math.exp(mu + Z99 * sigma), 2)},
            "sigma": round(sigma, 4), "matched": {"mean": round(mean, 2), ("clip_ratio" if use_clip else "max"):
                                                  round(clip if use_clip else longest, 4)},
            "residual": [float(x) for x in sol.fun]}

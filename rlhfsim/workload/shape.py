"""Response lengths as a run logged them: a lognormal, cut at the response cap, matched to the mean length and to
how long the longest ran (the share cut at the cap, else the longest of a step).

verl logs per step ``response_length/mean``, ``/max`` and ``/clip_ratio`` (the share of responses cut at
``data.max_response_length``); OpenRLHF ``response_length`` and ``rollout/truncated_rate``. A step's generation
lasts as long as its longest responses, so their tail matters as much as the mean: a run whose longest reach the
cap (clip ratio 0.3 in dingxianzhong/play-verl's 0.5B PPO run) or run far past an assumed tail (its 7B runs'
longest, 870-1010 tokens against a mean of 170-190) decodes for more steps than a shape from the mean alone says.
With L = min(X, c), ln X ~ N(mu, sigma), c the cap:

    E[L]      = exp(mu + sigma^2 / 2) Phi((ln c - mu - sigma^2) / sigma) + c (1 - Phi((ln c - mu) / sigma))
    P(X >= c) = 1 - Phi((ln c - mu) / sigma)                         (matched when the clip ratio is >= 0.005)
    median of the largest of N = exp(mu + sigma Phi^-1(0.5^(1/N)))   (matched to the mean logged max otherwise)

N = the responses per step (prompts x group size). (mu, sigma) solve the two equations (scipy's bounded
trust-region least squares in (mu, ln sigma), sigma in [0.01, 3]: an unbounded solve can leave the range exp()
holds when every step's longest reached the cap); the scenario gets
``{kind: lognormal, median: e^mu, p99: e^(mu + 2.326 sigma)}``.

Both ``rlhfsim import`` (``--max-response-len-logged``, ``--clip-ratio``, ``--log``) and ``calibrate --from-run``
(``rlhfsim.fromrun.lengths``) use ``match_capped_lognormal``.
"""

from __future__ import annotations

import math

from scipy.optimize import least_squares
from scipy.stats import norm

CLIP_MIN = 0.005
Z99 = 2.3263478740408408
SIGMA_BOUNDS = (0.01, 3.0)


def capped_mean(mu: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for ln X ~ N(mu, sigma) (module docstring)."""
    a = (math.log(cap) - mu) / sigma
    return math.exp(mu + sigma ** 2 / 2) * norm.cdf(a - sigma) + cap * norm.sf(a)


def match_capped_lognormal(mean: float, cap: float, rows: int, longest: float | None = None,
                           clip: float | None = None) -> dict | None:
    """The lognormal block for ``workload.response_length`` whose capped mean is ``mean`` and whose share at the cap
    is ``clip`` (when >= ``CLIP_MIN``), else whose median longest of ``rows`` responses is ``longest``; with what it
    matched and the residuals. None when there is nothing to match: no ``longest`` and no usable ``clip``, or a mean
    not inside (0, cap)."""
    if mean is None or not 0 < mean < cap:
        return None
    use_clip = clip is not None and clip >= CLIP_MIN
    if not use_clip and (longest is None or longest <= 0):
        return None
    q_max = norm.ppf(0.5 ** (1.0 / max(rows, 2)))

    def res(v):
        mu, sigma = v[0], math.exp(v[1])
        second = (norm.sf((math.log(cap) - mu) / sigma) - clip) * 10 if use_clip else \
            (mu + sigma * q_max - math.log(min(longest, cap - 0.5)))
        return [math.log(capped_mean(mu, sigma, cap) / mean), second]

    lo, hi = (math.log(s) for s in SIGMA_BOUNDS)
    x0 = [math.log(mean) - 0.125, math.log(0.5)]
    sol = least_squares(res, x0, method="trf", bounds=([-math.inf, lo], [math.log(cap) + 5, hi]))
    mu, sigma = float(sol.x[0]), float(math.exp(sol.x[1]))
    return {"block": {"kind": "lognormal", "median": round(math.exp(mu), 2), "p99": round(math.exp(mu + Z99 * sigma), 2)},
            "sigma": round(sigma, 4), "matched": {"mean": round(mean, 2), ("clip_ratio" if use_clip else "max"):
                                                  round(clip if use_clip else longest, 4)},
            "residual": [float(x) for x in sol.fun]}

"""Response lengths as the run logged them, for ``calibrate --from-run``: the steady steps' mean
``response_length/mean``, ``/max`` and ``/clip_ratio`` matched by ``rlhfsim.workload.shape`` (a lognormal cut at
the response cap; the equations are there, shared with ``rlhfsim import --log``)."""

from __future__ import annotations

from rlhfsim.fromrun.logs import Steady
from rlhfsim.workload.shape import CLIP_MIN, Z99, capped_mean, match_capped_lognormal

__all__ = ["CLIP_MIN", "Z99", "capped_mean", "logged_lengths", "logged_shape"]


def logged_lengths(steady: Steady) -> dict[str, float | None]:
    """The steady steps' means of what the length shape is matched to: ``mean``, ``max``, ``clip_ratio`` (responses)
    and ``prompt_mean`` (None: not logged)."""
    out = {k: steady.mean(f"response_length/{k}") for k in ("mean", "max", "clip_ratio")}
    out["prompt_mean"] = steady.mean("prompt_length/mean")
    return out


def logged_shape(steady: Steady, cap: int, rows: int) -> dict | None:
    """The lognormal block for ``workload.response_length`` matched to the steady steps (module docstring), with
    what it matched; None when the log has no ``response_length/mean`` and ``/max`` to match."""
    got = logged_lengths(steady)
    if got["mean"] is None or got["max"] is None:
        return None
    return match_capped_lognormal(got["mean"], cap, rows, longest=got["max"], clip=got["clip_ratio"])

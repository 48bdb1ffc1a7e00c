"""Response lengths as the run logged them, for ``calibrate --from-run``: the steady steps' mean
``response_length/mean``, ``/max`` and ``/clip_ratio`` matched by ``rlhfsim.workload.shape`` (a lognormal cut at
the response cap; the equations are there, shared with ``rlhfsim import --log``)."""

from __future__ import annotations

from rlhfsim.fromrun.logs import Steady
from rlhfsim.workload.shape import CLIP_MIN, Z99, capped_mean, match_capped_lognormal

__all__ = ["CLIP_MIN", "Z99", "capped_mean", "logged_lengths", "logged_shape"]


def logged_lengths(steady: Steady, cap: int | None = None) -> dict[str, float | None]:
    """The steady steps' means of what the length shape is matched to: ``mean``, ``max``, ``clip_ratio`` (responses)
    and ``prompt_mean`` (None: not logged).

    verl's ``response_length/clip_ratio`` is the share of responses as long as the batch's response tensor is wide
    (``torch.eq(response_length, responses.shape[-1])``), and that width is the cap only where the engine pads to it
    or a response reached it: a release that pads to the batch's longest logs at least 1/N on every step, the
    longest response itself. With ``cap`` given, a step whose ``response_length/max`` stayed under the cap counts
    0 at the cap (none of its responses was cut there), a step that reached it its logged ratio."""
    out = {k: steady.mean(f"response_length/{k}") for k in ("mean", "max", "clip_ratio")}
    if cap is not None and out["clip_ratio"] is not None:
        at_cap = [float(m["response_length/clip_ratio"]) if float(m.get("response_length/max", cap)) >= cap - 0.5
                  else 0.0 for m in (s.metrics for s in steady.kept) if "response_length/clip_ratio" in m]
        out["clip_ratio"] = sum(at_cap) / len(at_cap)
    out["prompt_mean"] = steady.mean("prompt_length/mean")
    return out


def logged_shape(steady: Steady, cap: int, rows: int) -> dict | None:
    """The lognormal block for ``workload.response_length`` matched to the steady steps (module docstring), with
    what it matched; None when the log has no ``response_length/mean`` and ``/max`` to match."""
    got = logged_lengths(steady, cap)
    if got["mean"] is None or got["max"] is None:
        return None
    return match_capped_lognormal(got["mean"], cap, rows, longest=got["max"], clip=got["clip_ratio"])

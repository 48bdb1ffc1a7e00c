"""GPU kernel terms by shape, fitted from public per-operation measurements (``calibrate.fitting.fromops``).

A profile's ``kernels_by_shape`` section replaces, for the operations it names (``applies_to``: base names such
as prefill, chunk_prefill, decode, score), the constant compute and memory efficiencies of the roofline
(``rlhfsim.costs.model``) with:

    t_kernel = max( F / (tp x peak x e_c(M, S)),  (W + (B - W) x e_w / e_ew) / (tp x bw x e_w) ) + L x floor_s
    e_c(M, S) = e_max x M / (M + m_half) x S / (S + s_half)
    floor_s   = 4 x t0_gemm_s + elementwise.floor_s          (seconds per layer)

M: tokens per call (a forward's tokens, a decode step's rows), S = layer_params / tp (a layer's linear
parameters on one GPU), F and B (FLOP, bytes) the work of ``rlhfsim.costs.flops``, W its weight bytes
(streamed at the GEMMs' fitted e_w; the rest, activations, KV reads, logits, at the element-wise ops'
e_ew), L the layers. A decode step streams everything at e_w (its bytes are the weights and the KV cache;
attention kernels were not in the public data, ``calibrate/public/vidur/README.md``). Units: seconds,
FLOP, bytes, FLOP/s, bytes/s, parameters.

A profile's ``collectives`` section replaces the tensor-parallel all-reduce's constants (``LINK_EFF``,
``LINK_LATENCY_S``): per call, t = latency_s + wire_bytes / bus_bw at the TP degree's worker count
(``collectives.all_reduce.by_workers[N]``; a degree not measured takes the nearest measured count, on a log
scale, ties to the larger).

Both sections are optional; a profile without them prices exactly as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GEMMS_PER_LAYER = 4   # qkv, output projection, up (gate + up), down


@dataclass(frozen=True)
class ShapeKernels:
    """The fitted curve of one profile (``kernels_by_shape``)."""

    e_max: float
    m_half: float
    s_half: float
    weight_memory_eff: float
    t0_gemm_s: float
    elementwise_eff: float
    elementwise_floor_s: float
    applies_to: frozenset

    @classmethod
    def of(cls, profile: dict) -> "ShapeKernels | None":
        sec = profile.get("kernels_by_shape")
        if not sec:
            return None
        g, e = sec["gemm"], sec["elementwise"]
        return cls(float(g["e_max"]), float(g["m_half"]), float(g["s_half"]), float(g["weight_memory_eff"]),
                   float(g["t0_gemm_s"]), float(e["memory_eff"]), float(e["floor_s"]), frozenset(sec["applies_to"]))

    def applies(self, op: str) -> bool:
        """Does the curve price operation ``op`` (``prefill``, ``decode:vllm``, ...: its base name is looked up)?"""
        return op.split(":", 1)[0] in self.applies_to

    def compute_eff(self, tokens, shard_params: float):
        """e_c(M, S); ``tokens`` a float or a numpy array (the same arithmetic elementwise)."""
        return self.e_max * tokens / (tokens + self.m_half) * (shard_params / (shard_params + self.s_half))

    def floor_s(self, layers: int) -> float:
        """The kernels' floors of ``layers`` layers: L x (4 t0_gemm + the element-wise floors)."""
        return layers * (GEMMS_PER_LAYER * self.t0_gemm_s + self.elementwise_floor_s)

    def weight_equivalent_bytes(self, nbytes, weight_bytes: float):
        """Bytes at the GEMMs' streaming efficiency equivalent to ``weight_bytes`` of weights plus the rest of
        ``nbytes`` at the element-wise efficiency."""
        return weight_bytes + (nbytes - weight_bytes) * (self.weight_memory_eff / self.elementwise_eff)


def _nearest(profile_collectives: dict | None, n: int, collective: str) -> dict | None:
    """The ``by_workers`` entry of ``collective`` nearest ``n`` workers on a log scale (the larger at a tie)."""
    by = ((profile_collectives or {}).get(collective) or {}).get("by_workers")
    if not by:
        return None
    counts = sorted(int(k) for k in by)
    near = min(counts, key=lambda c: (abs(math.log(c) - math.log(n)), -c))
    return by[str(near)]


def allreduce_terms(profile_collectives: dict | None, n: int, collective: str = "all_reduce") -> tuple[float, float] | None:
    """(latency_s, bus_bw) of ``collective`` over ``n`` workers from a profile's ``collectives``; None without it (or
    where the entry carries only a small-message floor)."""
    p = _nearest(profile_collectives, n, collective)
    if p is None or p.get("bus_bw") is None:
        return None
    return float(p["latency_s"]), float(p["bus_bw"])


def allreduce_floor(profile_collectives: dict | None, n: int, collective: str = "all_reduce") -> float:
    """``small_message_s`` of ``collective`` over ``n`` workers: the measured time of one call of a small message
    (the median over sizes up to 1 MiB), under which no call of that collective runs; 0 without it."""
    p = _nearest(profile_collectives, n, collective)
    return float(p.get("small_message_s") or 0.0) if p is not None else 0.0

"""A mixture-of-experts model's generation engine under expert parallelism (EP) and data-parallel attention, as vLLM
(``--enable-expert-parallel`` with ``--data-parallel-size``) and SGLang (``--ep-size``, ``--enable-dp-attention``) run
it: the decode step's weight bytes, its tensor-parallel all-reduces, its KV cache per GPU and the expert all-to-all
(cost term gen_ep_alltoall). The scenario's ``generation.parallel``; equations in docs/cost-model.md, "Generation under
expert parallelism".

Notation: an engine of ep GPUs; attention at tensor parallelism t (``placement.tp.rollout``) on each of d = ep / t
data-parallel attention ranks (d = 1 without ``dp_attention``: ep = t); B a rank's rows in a decode step (the
simulator's replica is one rank); E routed experts, k per token, R redundant replicas, M MoE layers of L, h hidden,
a bytes per activation element. Every rank steps with the others (the all-to-all is collective); the simulator prices
each rank alone with the engine's batch taken as d B (the ranks evenly loaded).

    weights         each GPU holds (E + R) / ep whole routed experts (instead of 1/t of every expert) and 1/t of
                    every other weight; a step reads its experts the engine's d B rows touch:
                    W_dense / t + (E + R) / ep x P_e b x M x (1 - (1 - k/E)^(d B))      (``moe.touched_fraction``)
    FLOPs           unchanged per GPU: each of the engine's ep GPUs computes its experts for every rank's tokens,
                    d B k / ep expert rows of the engine's d B k, as many as B k / t (the expert imbalance as before)
    all-reduces     with d > 1, attention's per layer and the dense MLPs' (L - M layers) at TP t; a MoE layer's output
                    is combined by the all-to-all instead: L + (L - M) all-reduces per step instead of 2 L. With
                    d = 1 (ep = t) TP's 2 L and no all-to-all: every GPU of the group holds the step's tokens, runs
                    its own experts on them, and the MoE output is all-reduced (vLLM: all-to-all kernels only with
                    dp_size > 1, ``FusedMoEParallelConfig.use_all2all_kernels``)
    gen_ep_alltoall = 2 M x (max(n_nv / nvlink_bw, n_ib / ib_bw) + latency)          per step, d > 1
                    each GPU dispatches its B / t tokens to their k experts (uniform over the ep GPUs, no two copies
                    merged: DeepEP's low-latency kernels send one per expert) and combines them back; of the
                    B / t x k x h x a bytes of one direction, (D - 1) / ep go to other GPUs of its NVLink domain of D
                    (n_nv) and (ep - D) / ep beyond it over the inter-node link (n_ib), the two at once; D = min(ep,
                    the domain). FP8 dispatch: 1 byte per element and a 4-byte scale per 128 (a_dispatch = 1 + 4/128).
                    The busiest GPU receives u times the mean (u the model's expert_imbalance, as its FLOPs) and
                    sends as many back; every GPU waits for it: the bytes count u times
    KV cache        each rank keeps its own rows' cache; under attention TP a multi-head latent attention cache (one
                    latent per token, no heads to split) is whole on every one of the t GPUs, a grouped-query cache
                    split over min(t, kv heads)
    two-batch overlap  a step costs max(device time, all-to-alls) instead of their sum (folded into the compute
                    line as the launch floor is, ``model._Decode.coeffs``)
    prefill         every one of the GPU's own experts read (``forward_shape``), the same all-reduces, and the
                    prefill's tokens through the same all-to-all (serial; a chunk inside a decode step: in prefill_chunk)

Latency per all-to-all call: ``parallel.LATENCY_S`` (10 us, the model's other collectives); link bandwidths from the
hardware catalog at ``model.LINK_EFF``. DeepEP's published low-latency kernel times (docs/legacy.md of
deepseek-ai/DeepEP: 128 tokens per GPU, h 7168, top-8, FP8 dispatch, BF16 combine on H800 with 400 Gb/s CX7) are a
check of this term, not a constant of it (``scenarios/examples/moe-ep/check_ep_decode.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from rlhfsim.models.catalog import ACTIVATION_BYTES, ModelShape

LATENCY_S = 10e-6        # per all-to-all call, as the model's other collectives (parallel.LATENCY_S)
FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128   # an FP8 value and its share of one fp32 scale per 128 values (DeepEP, DeepGEMM)


@dataclass(frozen=True)
class GenLayout:
    """One generation engine's expert parallelism (``generation.parallel`` with ``placement.tp.rollout``)."""

    tp: int            # attention's tensor parallelism on each data-parallel rank
    ep: int            # the engine's GPUs, over which the routed experts are spread
    dp_attention: bool
    redundant: int     # redundant expert replicas (EPLB)
    fp8_dispatch: bool
    overlap: bool      # two-batch overlap
    domain: int        # GPUs of one NVLink domain (the node, or an NVL72 rack: GpuSpec.link_domain)
    spans_nodes: bool  # the rollout pool crosses NVLink domains

    @property
    def dp(self) -> int:
        """Data-parallel attention ranks of one engine: ep / tp (1 without dp_attention)."""
        return self.ep // self.tp if self.dp_attention else 1

    @property
    def nv_group(self) -> int:
        """GPUs of the engine that share one NVLink domain with a given GPU (itself included)."""
        return min(self.ep, self.domain) if self.spans_nodes else self.ep


def layout_of(setup) -> GenLayout | None:
    """The rollout engine's layout, or None where ``generation.parallel`` is left at its defaults (priced as before,
    bit for bit)."""
    par = setup.scenario.generation.parallel
    if par.ep <= 1 and not par.dp_attention:
        return None
    pool = setup.pool_of("rollout")
    return GenLayout(setup.tp["rollout"], par.ep, par.dp_attention, par.redundant_experts, par.fp8_dispatch,
                     par.two_batch_overlap, setup.gpu.link_domain(setup.scenario.cluster.gpus_per_node),
                     pool.spans_nodes)


def routed_share(m: ModelShape, lay: GenLayout) -> float:
    """One GPU's routed-expert weights over what tensor parallelism at ``lay.tp`` leaves it: (E + R) t / (E ep)."""
    return (m.num_experts + lay.redundant) * lay.tp / (m.num_experts * lay.ep)


def decode_shape(k, m: ModelShape, lay: GenLayout):
    """``flops.ShapeCoeffs`` ``k`` of ``m`` as one GPU of the engine reads it, in the roofline's units (bytes over t
    GPUs): the routed experts at ``routed_share`` and touched by the engine's d B rows."""
    if not k.n_experts:
        return k
    routed = k.routed_bytes * routed_share(m, lay)
    return replace(k, decode_weight_bytes=k.decode_weight_bytes - k.routed_bytes + routed, routed_bytes=routed,
                   touch_rows=float(lay.dp))


def forward_shape(k, m: ModelShape, lay: GenLayout):
    """``flops.ShapeCoeffs`` ``k`` of ``m`` for a prefill on one GPU of the engine: every one of its own experts read
    (a prefill's rows touch them all), at ``routed_share`` of TP's slices."""
    if not k.n_experts:
        return k
    routed = k.routed_bytes * routed_share(m, lay)
    return replace(k, weight_bytes=k.weight_bytes - k.routed_bytes + routed)


def kv_shards(m: ModelShape, tp: int) -> int:
    """Over how many of a rank's ``tp`` GPUs its KV cache is split: 1 for multi-head latent attention (the latent is
    whole on each), min(tp, kv heads) for grouped-query attention."""
    if m.attention == "mla":
        return 1
    return max(min(tp, m.kv_heads), 1)


def dispatches(lay: GenLayout) -> bool:
    """Whether the engine's MoE layers run the all-to-all: only across data-parallel attention ranks (vLLM's
    ``use_all2all_kernels``: dp_size > 1 with expert parallelism). With one rank (ep = t) every GPU of the
    tensor-parallel group holds all the step's tokens already; each runs its own experts on them and the MoE output
    is all-reduced as under TP."""
    return lay.dp > 1


def allreduces(m: ModelShape, lay: GenLayout) -> int:
    """Tensor-parallel all-reduces per decode step: TP's two per layer with one attention rank; across ranks
    attention's in every layer and the dense MLPs' (L - M), a MoE layer's output combined by the all-to-all."""
    if not dispatches(lay):
        return 2 * m.layers
    return m.layers + (m.layers - m.moe_layers)


def alltoall_s(cost, m: ModelShape, dtype: str, batch, lay: GenLayout):
    """gen_ep_alltoall of one decode step of ``batch`` rows on one rank (module docstring); 0 for ep 1 or a dense
    model. ``batch`` may be a numpy array (elementwise)."""
    if lay.ep <= 1 or not m.is_moe or m.moe_layers <= 0 or not dispatches(lay):
        return 0.0 * batch
    a = ACTIVATION_BYTES[dtype]
    # the busiest GPU receives the expert imbalance u times the mean of the tokens and sends as many back, and every
    # GPU waits for it (moe: u is the busiest expert's, or under expert parallelism the busiest rank's, over the mean)
    tokens = batch / lay.tp * m.expert_imbalance
    dispatch = call_s(cost, tokens, m.experts_per_token, m.hidden, FP8_DISPATCH_BYTES if lay.fp8_dispatch else a, lay)
    return m.moe_layers * (dispatch + call_s(cost, tokens, m.experts_per_token, m.hidden, a, lay))


def call_s(cost, tokens, top_k: int, hidden: int, elem_bytes: float, lay: GenLayout):
    """One dispatch (or combine) of ``tokens`` tokens from one GPU, each to ``top_k`` experts spread evenly over the
    engine's ep GPUs, ``hidden`` elements of ``elem_bytes`` bytes each: the share for other GPUs of its NVLink domain
    over NVLink and the share beyond it over the inter-node link, at once, plus the call's latency."""
    per_call = tokens * top_k * hidden * elem_bytes
    nv = per_call * (lay.nv_group - 1) / lay.ep / cost.link_bw(False)
    if lay.ep <= lay.nv_group:
        return nv + LATENCY_S
    ib = per_call * (lay.ep - lay.nv_group) / lay.ep / cost.link_bw(True)
    return (np.maximum(nv, ib) if isinstance(ib, np.ndarray) else max(nv, ib)) + LATENCY_S


def engine_weight_bytes(m: ModelShape, bytes_per_weight: int, lay: GenLayout) -> float:
    """The engine's weights on one GPU: 1/t of the dense weights and (E + R) / ep whole routed experts."""
    routed = m.routed_params
    return (m.params("lm") - routed) * bytes_per_weight / lay.tp + \
        routed * bytes_per_weight * ((m.num_experts + lay.redundant) / (m.num_experts * lay.ep) if routed else 0.0)

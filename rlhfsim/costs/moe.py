"""The arithmetic of mixture-of-experts models: which weights a step reads, which FLOPs it does, and the router and
the expert imbalance as cost terms. Pure Python + numpy; ``rlhfsim.costs.flops`` and ``rlhfsim.costs.model`` call it.

Notation (per model, ``ModelShape``): E routed experts, k of them per token (top-k), M MoE layers, P_e one routed
expert's weights in one layer (3 h x moe_intermediate: a SwiGLU MLP), b bytes per weight, imbalance u >= 1.

FLOPs come from the active parameters (``ModelShape.active_body_params``: attention, dense MLPs, the top-k routed and
the shared experts, the routers), 2 per weight per token, plus the routed experts' FLOPs a second time times u - 1:

    F_linear = 2 P_active + 2 M k P_e (u - 1)                      per token
    F_router = 2 M h E                                             per token (inside P_active)

The expert imbalance u is the busiest routed expert's tokens over the mean: a layer's experts finish when the busiest
does (under expert parallelism the busiest rank; on one GPU the grouped GEMM's tiles of the busiest expert), so the
routed experts' FLOPs are priced at u times their mean. It is an assumption (``catalog.ASSUMED_EXPERT_IMBALANCE``),
set per model in a scenario.

Weight bytes. A forward over many tokens reads every expert (P b, the total). A decode step of B rows reads the
shared weights and only the experts its rows chose. With each row choosing k of E experts uniformly at random, an
expert is missed by one row with probability 1 - k/E and by all B rows with (1 - k/E)^B, so the expected number of
distinct experts a step touches in a layer is

    D(B) = E (1 - (1 - k/E)^B),   D(1) = k,   D(B) -> E as B grows,

and the step streams W_dense + M D(B) P_e b bytes of weights, W_dense the decode weights less every routed expert's.
Rows do not choose uniformly (a trained router prefers some experts, more so within one prompt's rows), which makes
D(B) an upper bound on the experts touched: the decode step's bytes are the most it reads.

The router's top-k reads the E logits of each token: written in fp32 by the router GEMM, read and written by the
softmax, read by the top-k, ``flops.LOGIT_BYTES`` per logit as the LM head's (a forward's activation bytes).

The routed experts at their own shape (``expert_gemm``, a framework call's training or forward pass on a GPU). F_linear
prices every GEMM of a call at the call's efficiency, as if the experts' FLOPs ran in GEMMs of the call's n tokens.
Megatron-core runs them as a grouped GEMM (TEGroupedMLP) per layer: each GPU holds E / ep experts (ep the expert
parallelism) and, balanced, each expert gets the rows of n k ep / E tokens (n the tokens of one GPU's micro-batch after
context parallelism: the expert-parallel group's ep GPUs each send n k / E rows to each expert), in GEMMs of those rows by
h x I / t (I moe_intermediate, t the expert tensor parallelism, tp where unset): fc1 (gate and up, 2 I / t wide) and
fc2. Qwen3-30B-A3B's 4096-token micro-batch on one GPU gives 128 experts 256 rows each, where its attention GEMMs
see 4096. One such grouped GEMM, per MoE layer and pass, is priced at the roofline of its shape:

    F_e = 2 r (3 h w) E_l,   B_e = E_l (3 h w b_w + r (2 h + 3 w) b_a),   r = n k ep / E,  w = I / t,  E_l = E / ep
    t_e = max( F_e / (peak x e_shape),  B_e / (bw x e_mem) )
    e_shape = e_call x e_c(r, 3 h w) / e_c(n, S)      (the profile's kernel curve ``byshape``; e_call without it)

e_call the efficiency the call's roofline priced every FLOP at (the training op's compute_eff, a forward's curve at n
tokens and S = layer_params / tp), e_c the curve of ``kernels_by_shape`` (its rows and one expert's weights against
the call's tokens and a layer's), b_w and b_a the weight and activation bytes. The term is what the shape adds
beyond the call's charge for the same FLOPs, passes x M x max(t_e - F_e / (peak x e_call), 0) (3 passes in
training: the forward, the input gradient and the weight gradient), plus the tokens' permute and unpermute
(Megatron's ``permute`` / ``unpermute``: the GPU's n / t_s dispatched tokens, t_s = tp under sequence parallelism,
each copied into k expert-ordered rows and summed back, and under expert parallelism the received rows sorted by
local expert once more):

    B_perm = b_a h (n / t_s) (2 (1 + k) + 2 k [ep > 1])    per MoE layer and pass (2 passes in training)

at the element-wise memory efficiency (the curve's ``elementwise.memory_eff``, else the operation's memory_eff).
Balanced rows are the floor of what routing gives: the busiest expert's surplus is ``expert_imbalance``.

The terms. ``router`` and ``expert_imbalance`` are split out of an operation's kernels the way a CPU's host effects
are (``rlhfsim.costs.terms``): the price with the term less the price without it, the shape without it being
``without_imbalance`` (u = 1) and then ``without_router`` (no router weights, FLOPs or logits).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from rlhfsim.costs.terms import DECODE_KERNELS, EXPERT_IMBALANCE, ROUTER
from rlhfsim.models.catalog import ACTIVATION_BYTES, DTYPE_BYTES, ModelShape


def touched_fraction(n_experts: int, top_k: int, rows):
    """The expected fraction of E experts that ``rows`` rows choosing k each touch: 1 - (1 - k/E)^B (rows may be a
    numpy array). One row: k/E; many: 1."""
    miss = 1.0 - top_k / n_experts
    if isinstance(rows, np.ndarray):
        return 1.0 - np.power(miss, np.maximum(rows, 0.0))
    return 1.0 - miss ** max(rows, 0.0)


def expected_experts(n_experts: int, top_k: int, rows):
    """D(B) = E (1 - (1 - k/E)^B): the expected distinct experts ``rows`` rows touch in one MoE layer."""
    return n_experts * touched_fraction(n_experts, top_k, rows)


def step_weight_bytes(decode_weight_bytes: int, routed_bytes: int, n_experts: int, top_k: int, rows):
    """The weights a decode step of ``rows`` rows streams: every weight but the routed experts', plus the share of
    those the rows touch (``touched_fraction``)."""
    return decode_weight_bytes - routed_bytes + routed_bytes * touched_fraction(n_experts, top_k, rows)


def imbalance_flops(m: ModelShape) -> float:
    """FLOPs per token the expert imbalance adds: 2 M k P_e (u - 1) (0 for a dense model)."""
    if not m.is_moe or m.expert_imbalance == 1.0:
        return 0.0
    return 2.0 * m.moe_layers * m.experts_per_token * m.expert_params * (m.expert_imbalance - 1.0)


def router_logit_bytes(m: ModelShape, bytes_per_logit: int) -> int:
    """Bytes per token of the routers' logits (E per MoE layer, ``bytes_per_logit`` each); 0 without a router."""
    if not m.is_moe or not m.router_priced:
        return 0
    return m.moe_layers * m.num_experts * bytes_per_logit


def shape_fields(m: ModelShape, b: int) -> dict:
    """``flops.ShapeCoeffs``' mixture-of-experts fields ({} for a dense model)."""
    if not m.is_moe:
        return {}
    return {"n_experts": m.num_experts, "top_k": m.experts_per_token,
            "routed_bytes": m.routed_params * b,
            "f_router": 2.0 * m.router_params, "f_imbalance": imbalance_flops(m)}


def without_imbalance(m: ModelShape) -> ModelShape:
    """``m`` with its experts perfectly balanced (u = 1)."""
    return replace(m, expert_imbalance=1.0)


def without_router(m: ModelShape) -> ModelShape:
    """``m`` balanced and without its routers (their weights, FLOPs and logits): what ``router`` is priced against."""
    return replace(m, expert_imbalance=1.0, router_priced=False)


def priced(m: ModelShape) -> bool:
    """Whether ``m`` has a router or an imbalance to split out of its prices."""
    return m.is_moe and (m.router_priced or m.expert_imbalance != 1.0)


def effects(call, m: ModelShape, *args, **kwargs) -> tuple[dict, float]:
    """The router and expert_imbalance of one priced call (``call(m, *args, **kwargs)``, returning a ``Price`` or a
    ``framework.CallParts``), with their share of its active seconds: the price with the term less the price without
    it. The shape of a CPU's host effects (``terms.with_effects``, ``CallParts.effects``), taken out of kernels."""
    full, balanced, bare = (call(s, *args, **kwargs) for s in (m, without_imbalance(m), without_router(m)))
    imb, router = full.total_s - balanced.total_s, balanced.total_s - bare.total_s
    active = full.active_s - bare.active_s
    return {ROUTER: router, EXPERT_IMBALANCE: imb}, active


def call_effects(call, m: ModelShape, *args, **kwargs) -> tuple[dict, float]:
    """``effects`` of a ``framework.CallParts`` (its kernel seconds: the rest of a call, the head, FSDP and the host,
    does not depend on the router)."""
    parts = [call(s, *args, **kwargs) for s in (m, without_imbalance(m), without_router(m))]
    k = [p.kernel_s for p in parts]
    return {ROUTER: k[1] - k[2], EXPERT_IMBALANCE: k[0] - k[1]}, parts[0].kernel_active_s - parts[2].kernel_active_s


def split_decode(out: dict, kern: float, kern_of, m: ModelShape) -> None:
    """Decode steps' router and expert_imbalance, out of ``out``'s decode_kernels: ``kern`` the steps' kernel seconds,
    ``kern_of(shape)`` the same steps' kernel seconds priced with another ``ModelShape``'s constants."""
    balanced = kern_of(without_imbalance(m))
    bare = kern_of(without_router(m))
    out[EXPERT_IMBALANCE] = kern - balanced
    out[ROUTER] = balanced - bare
    out[DECODE_KERNELS] -= kern - bare


def expert_gemm_s(m: ModelShape, dtype: str, n_tokens, *, tp: int = 1, cp: int = 1, ep: int = 1, etp: int | None = None,
                  training: bool, peak: float, bw: float, call_eff: float, mem_eff: float, ew_eff: float,
                  curve=None):
    """``expert_gemm`` of one framework call on one GPU of ``n_tokens`` tokens (a float or a numpy array; before
    context parallelism's split by ``cp``), in seconds (module docstring); 0 for a dense model. ``call_eff``: the
    compute efficiency the call's roofline priced its FLOPs at; ``curve``: the profile's ``byshape.ShapeKernels``
    or None; ``mem_eff`` the GEMMs' streaming efficiency, ``ew_eff`` the element-wise kernels'."""
    if not m.is_moe or m.moe_layers <= 0:
        return 0.0
    n = n_tokens / cp
    k, experts, h = m.experts_per_token, m.num_experts, m.hidden
    w = m.moe_intermediate / (etp or tp)
    local = experts / ep
    rows = n * k * ep / experts
    shape_params = 3.0 * h * w
    flops = 2.0 * rows * shape_params * local
    nbytes = local * (shape_params * DTYPE_BYTES[dtype] + rows * (2.0 * h + 3.0 * w) * ACTIVATION_BYTES[dtype])
    eff = call_eff
    if curve is not None:
        eff = call_eff * curve.compute_eff(rows, shape_params) / curve.compute_eff(n, m.layer_params / tp)
    charged = flops / (peak * call_eff)
    at_shape = np.maximum(flops / (peak * eff), nbytes / (bw * mem_eff))
    gemm = np.maximum(at_shape - charged, 0.0)
    copies = ACTIVATION_BYTES[dtype] * h * (n / tp) * (2.0 * (1 + k) + (2.0 * k if ep > 1 else 0.0))
    out = m.moe_layers * ((3 if training else 1) * gemm + (2 if training else 1) * copies / (bw * ew_eff))
    return out if isinstance(out, np.ndarray) else float(out)

"""The decoder layers' element-wise kernels as a training framework runs them: Hugging Face transformers' modules in
PyTorch eager mode (verl's and OpenRLHF's FSDP / DeepSpeed actor, reference and critic), one kernel per operation,
after the GEMMs on one stream. Term: ``layer_elementwise`` (``rlhfsim.costs.terms``).

A forward call priced from the kernel curves by shape (``rlhfsim.costs.byshape``) takes the larger of its GEMMs'
FLOP time and its bytes' time, as if the whole pass were one kernel: a pass with many tokens is compute-bound there
and its activations' traffic costs nothing. On the device the layer is a sequence of kernels, and the element-wise ones (the norms, the
rotary embedding, the activation, the residual adds) are memory-bound and run *between* the GEMMs, not beside them:
their time adds. Vidur measures them as separate kernels for that reason (``calibrate.fitting.fromops``: norms,
rotary, activation and add, each ``t0 + bytes / (bw x e_ew)``). A framework's model is also unfused where an
inference engine's is fused: transformers' ``RMSNorm`` runs in float32 in six kernels where vLLM's runs in one.

Bytes per token and decoder layer, counted from transformers' modeling code (``modeling_llama`` / ``qwen2`` /
``qwen3``; b = the model dtype's bytes, f = 4, float32), reads plus writes of each kernel:

    RMSNorm (x 2: input and post-attention)   (4 b + 7 f) h     to(float32) b+f, pow(2) 2f, mean f, x * rsqrt 2f,
                                                                 to(dtype) f+b, weight * 2b
    residual add (x 2)                        3 b h
    rotary embedding on q and k               10 b d (n_q + n_kv)  rotate_half: neg b, cat 2b; q * cos 2b,
                                                                 rotate_half(q) * sin 2b, sum 3b (per element of d)
    Qwen3's q / k RMSNorm                     (4 b + 7 f) d (n_q + n_kv)
    SwiGLU act_fn(gate) * up                  5 b I / tp        SiLU b+b, product 2b+b  (GELU without a gate: 2 b I / tp)

plus the final norm once per token. A model without a gated MLP (GELU; LayerNorm) takes PyTorch's fused LayerNorm
(one kernel, 2 b h) and the GELU's 2 b I. Tensor parallelism divides the attention's and the MLP's shares (heads and
the intermediate are split; the norms and adds run on the whole hidden state on every rank).

Where it applies: a forward pass (log-prob, reference, values) priced from per-operation GEMM measurements
(``kernels_by_shape``: the H100 and A100 profiles, and the GPUs priced from them). Those curves are the GEMMs alone,
so nothing else in the price holds the element-wise kernels. Where a pass is priced from a whole-pass efficiency
instead (training's ``operations.train.compute_eff``, fitted to the logged training phases; the ``prefill``
efficiency of a profile without kernel terms by shape, a whole model's datasheet-derived fraction), that
efficiency already holds them, and adding them again would count them twice::

    elementwise_s = bytes_per_token x tokens / sp / (mem_bw x e_ew)

e_ew: the element-wise kernels' memory efficiency the profile measured (``kernels_by_shape.elementwise.memory_eff``:
Vidur's norm, rotary, activation and add kernels on the H100 and A100). Nothing here is fitted to a run. Not
counted: the copies flash-attention's variable-length path may make of q, k and v, the embedding's gather, and the
activation bytes the curve's roofline already holds (inside its max: they count only in a memory-bound call, a
small one, where the two overlap); a framework that fuses these kernels (verl's ``model.use_liger``, Megatron's Transformer Engine) is not told apart (the importer does not
read it).
"""

from __future__ import annotations

import numpy as np

from rlhfsim.models.catalog import ACTIVATION_BYTES, ModelShape

FP32 = 4            # transformers' RMSNorm computes in float32
QK_NORM_TYPES = ("qwen3",)   # models whose attention normalizes q and k per head (Qwen3Attention.q_norm, k_norm)


def rmsnorm_bytes(b: int) -> int:
    """Bytes per element of transformers' eager RMSNorm (module docstring): 4 b + 7 f."""
    return 4 * b + 7 * FP32


def layer_bytes_per_token(m: ModelShape, dtype: str, tp: int = 1) -> float:
    """Bytes one token moves through one decoder layer's element-wise kernels on one GPU of a TP group of ``tp``."""
    b = ACTIVATION_BYTES[dtype]
    h, d, heads = m.hidden, m.head_dim, m.heads + m.kv_heads
    if m.gated_mlp:
        norms = 2 * rmsnorm_bytes(b) * h
        mlp = 5 * b * m.intermediate
    else:
        norms = 2 * 2 * b * h            # PyTorch's fused LayerNorm: one read, one write
        mlp = 2 * b * m.intermediate     # GELU: one read, one write
    adds = 2 * 3 * b * h
    attn = 10 * b * d * heads
    if m.hf_model_type in QK_NORM_TYPES:
        attn += rmsnorm_bytes(b) * d * heads
    return norms + adds + (attn + mlp) / tp


def bytes_per_token(m: ModelShape, dtype: str, tp: int = 1) -> float:
    """Every decoder layer's element-wise bytes per token, and the final norm's."""
    b = ACTIVATION_BYTES[dtype]
    final = (rmsnorm_bytes(b) if m.gated_mlp else 2 * b) * m.hidden
    return m.layers * layer_bytes_per_token(m, dtype, tp) + final


def elementwise_s(m: ModelShape, dtype: str, n_tokens: float, mem_bw: float, memory_eff: float, *, tp: int = 1,
                  sp: int = 1) -> float:
    """Seconds of one forward call's element-wise kernels on one GPU (``n_tokens`` the call's tokens; ``sp``: one GPU
    of a Ulysses group, its share of them). 0 for an encoder (its reward-model passes are not a framework's decoder)."""
    if m.arch != "decoder" or (not isinstance(n_tokens, np.ndarray) and n_tokens <= 0):
        return 0.0
    return bytes_per_token(m, dtype, tp) * (n_tokens / sp) / (mem_bw * memory_eff)

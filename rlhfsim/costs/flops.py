"""FLOP and byte counts of each operation, from model shapes alone. Pure Python + numpy.

Notation (per model): L layers, h hidden, d_kv = kv_heads x head_dim, P_l parameters per layer,
P_body = L x P_l, V vocab, b bytes per element of the model dtype.

Forward of n tokens whose attention spans c cached + the new tokens (causal):

    F_linear = 2 x P_body x n                                  (matmuls: 2 FLOP per weight per token)
    F_attn   = 4 x L x h x sum_i n_i x (c_i + (n_i + 1) / 2)   (QK^T and AV over the visible keys)
    F_head   = 2 x h x V x n_logits                            (LM head; n_logits = 0 for scoring heads)

Bytes a forward pass moves: weights once (P x b), plus K/V cache read (2 x L x d_kv x b per visible cached
token) plus activations written/read (approx. 2 x L x h x b x 12 per token, the usual transformer
activation traffic), plus the logits of an LM head: float32 logits written, then read and written by the
log-softmax and read by the sampler or the log-prob gather (LOGIT_BYTES = 16 per logit, V logits per
position that needs them: each sequence's last token in a generation step, every token in a log-prob
pass and in training).

Training (forward + backward) is 3x the forward FLOPs (backward = 2x forward). The optimizer (AdamW,
fp32 master weights and moments) moves 16 bytes read + 16 bytes written per parameter shard.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlhfsim.models.catalog import DTYPE_BYTES, ModelShape

ACT_BYTES_PER_TOKEN_LAYER_FACTOR = 12  # elements of h moved per token per layer (norms, residuals, MLP I/O)
LOGIT_BYTES = 16                       # bytes moved per LM-head logit (fp32 write, log-softmax r/w, read)


@dataclass(frozen=True)
class Work:
    """What an operation costs before a device is chosen: FLOPs, bytes moved through device memory,
    bytes moved over the interconnect (per participating GPU) and the number of kernel launches proxy
    (layers, used by fitted per-layer overheads)."""

    flops: float
    bytes: float
    comm_bytes: float = 0.0
    layers: int = 0


def forward_work(m: ModelShape, dtype: str, n_tokens: float, n_seqs: float, cached_tokens: float = 0.0,
                 logits_tokens: float = 0.0, head: str = "value") -> Work:
    """Forward over ``n_tokens`` new tokens spread evenly over ``n_seqs`` sequences, each attending to
    ``cached_tokens / n_seqs`` cached tokens as well (0 for a one-shot prefill)."""
    b = DTYPE_BYTES[dtype]
    n_seqs = max(n_seqs, 1.0)
    per_seq = n_tokens / n_seqs
    cached_per_seq = cached_tokens / n_seqs
    body = m.layers * m.layer_params
    f_lin = 2.0 * body * n_tokens
    if m.arch == "encoder":
        f_attn = 4.0 * m.layers * m.hidden * n_seqs * per_seq * per_seq
    else:
        f_attn = 4.0 * m.layers * m.hidden * n_seqs * per_seq * (cached_per_seq + (per_seq + 1) / 2)
    f_head = 2.0 * m.hidden * m.vocab * logits_tokens if head == "lm" else 2.0 * m.hidden * n_seqs
    weight_bytes = m.params(head) * b
    kv_read = 2 * m.layers * m.kv_dim * b * cached_tokens
    act = ACT_BYTES_PER_TOKEN_LAYER_FACTOR * m.layers * m.hidden * b * n_tokens
    logit_bytes = LOGIT_BYTES * m.vocab * logits_tokens if head == "lm" else 0.0
    return Work(f_lin + f_attn + f_head, weight_bytes + kv_read + act + logit_bytes, 0.0, m.layers)


def decode_step_work(m: ModelShape, dtype: str, batch: float, kv_tokens: float, kv_passes: float = 1.0) -> Work:
    """One decode step: ``batch`` sequences each produce one token; ``kv_tokens`` is the total number of
    cached tokens over the batch (the sum of the sequences' current lengths); ``kv_passes``: passes over
    the cached K/V per step (``rlhfsim.costs.genruntimes.KV_PASSES``: 3 for HF's DynamicCache)."""
    b = DTYPE_BYTES[dtype]
    body = m.layers * m.layer_params
    flops = 2.0 * body * batch + 4.0 * m.layers * m.hidden * kv_tokens + 2.0 * m.hidden * m.vocab * batch
    weight_bytes = m.params("lm") * b
    kv_read = 2 * m.layers * m.kv_dim * b * kv_tokens * kv_passes
    return Work(flops, weight_bytes + kv_read + LOGIT_BYTES * m.vocab * batch, 0.0, m.layers)


def decode_steps_arrays(m: ModelShape, dtype: str, batch: float, kv_tokens0: float, n_steps: int):
    """FLOPs and bytes of ``n_steps`` consecutive decode steps (numpy arrays, one entry per step) of a
    batch whose membership is fixed: each step adds ``batch`` tokens to the cache."""
    b = DTYPE_BYTES[dtype]
    kv = kv_tokens0 + batch * np.arange(n_steps, dtype=np.float64)
    body = m.layers * m.layer_params
    flops = 2.0 * body * batch + 4.0 * m.layers * m.hidden * kv + 2.0 * m.hidden * m.vocab * batch
    bytes_ = m.params("lm") * b + LOGIT_BYTES * m.vocab * batch + 2 * m.layers * m.kv_dim * b * kv
    return flops, bytes_


def train_work(m: ModelShape, dtype: str, n_tokens: float, n_seqs: float, head: str = "lm") -> Work:
    """Forward + backward over a minibatch (activation recomputation off): 3x forward FLOPs, and weights
    plus gradients moved about 3x."""
    fwd = forward_work(m, dtype, n_tokens, n_seqs, 0.0, n_tokens if head == "lm" else 0.0, head)
    return Work(3.0 * fwd.flops, 3.0 * fwd.bytes, 0.0, m.layers)


def optimizer_work(m: ModelShape, shards: int = 1, head: str = "lm") -> Work:
    """AdamW step on 1/shards of the parameters: fp32 master weight, two moments and the gradient read,
    the three state tensors and the bf16 weight written: about 32 bytes per parameter, ~10 FLOP each."""
    p = m.params(head) / max(shards, 1)
    return Work(10.0 * p, 32.0 * p, 0.0, 0)


def allreduce_bytes(n_bytes: float, n: int) -> float:
    """Bytes each participant sends in a ring all-reduce of ``n_bytes`` over ``n`` participants."""
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n * n_bytes


def tp_allreduce_bytes(m: ModelShape, dtype: str, n_tokens: float, tp: int, passes: int = 1) -> float:
    """Tensor parallelism all-reduces the hidden states twice per layer per pass (Megatron)."""
    if tp <= 1:
        return 0.0
    return passes * 2 * m.layers * allreduce_bytes(n_tokens * m.hidden * DTYPE_BYTES[dtype], tp)

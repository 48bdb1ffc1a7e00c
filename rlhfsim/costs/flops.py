"""FLOP and byte counts of each operation, from model shapes alone. Pure Python + numpy.

Notation (per model): L layers, h hidden, d_kv = kv_heads x head_dim, P_l parameters per layer,
P_body = L x P_l, V vocab, b bytes per element of the model dtype (weights at ``DTYPE_BYTES``; activations, K/V and
collectives at ``ACTIVATION_BYTES``: the two differ only for float8, 1 and 2).

Forward of n tokens whose attention spans c cached + the new tokens (causal):

    F_linear = 2 x P_body x n                                  (matmuls: 2 FLOP per weight per token)
    F_attn   = 4 x L x h x sum_i n_i x (c_i + (n_i + 1) / 2)   (QK^T and AV over the visible keys)
    F_head   = 2 x h x V x n_logits                            (LM head; n_logits = 0 for scoring heads)

Bytes a forward pass moves: weights once (P x b; a decode step of two rows or more ``gemm_weight_passes``
times, a device property measured by ``calibrate.cpu.gemm``: GEMM kernels pack the weights, GEMV does not;
on a CPU, by the weights' footprint: ``rlhfsim.costs.cpuhost.footprint_passes``; a decode step streams every weight but an untied
LM's input embedding, whose rows it only gathers: ``decode_weight_bytes``), plus K/V cache read (2 x L x d_kv x b per visible cached
token) plus activations written/read (approx. 2 x L x h x b x 12 per token, the usual transformer
activation traffic), plus the logits of an LM head: float32 logits written, then read and written by the
log-softmax and read by the sampler or the log-prob gather (LOGIT_BYTES = 16 per logit, V logits per
position that needs them: each sequence's last token in a generation step, every token in a log-prob
pass and in training).

DeBERTa-v2's disentangled attention (``hf_model_type`` deberta-v2, eager: transformers has no fused path
for it) adds, per layer, from its module's code (``DisentangledSelfAttention``, relative embeddings of
2 x DEBERTA_SPAN positions, shared attention keys, c2p and p2c as ``calibrate.measuring.models`` builds it):

    F_rel    = 2 x (2 x 2S x h) x n  +  2 x (2 x 2S x h x h)      (c2p, p2c products; the relative
                                                                  embeddings' query/key projections per call)
    B_scores = (SCORE_PASSES x b + 2 x 8) x H x pairs             (score matrices materialized per head,
                                                                  int64 gather indices read per head)
             + INDEX_BYTES_PER_PAIR x pairs                      (the clamped position indices and the mask,
                                                                  per layer)
             + 2 x 2S x b x H x n + 2 x 2S x h x b x n_seqs      (c2p/p2c products written; position
                                                                  keys/queries repeated per sequence)

B_scores is counted under PyTorch eager only (``materializes_scores``): a runtime that compiles the pass
(torch.compile, AOTInductor, ONNX Runtime) fuses the elementwise chain into few kernels.

with S = DEBERTA_SPAN and pairs = sum_i n_i^2 (every token sees every token). An encoder's forward time
is dominated by these at a few hundred tokens: tiny-deberta (hidden 128) and small-deberta (256), both
with 4 heads, took the same time at 512 tokens (``lab/diagnostics/encoder_workmodel.py`` measures it).

A mixture-of-experts model (``rlhfsim.costs.moe``): F_linear counts the active parameters (attention, dense MLPs,
the top-k routed and the shared experts, the routers' hidden x E GEMMs), its routed experts' share times the
expert imbalance; a forward streams every expert's weights, a decode step the shared weights and the experts its
rows touch (E (1 - (1 - k/E)^B) of E per MoE layer for B rows); each token's router logits add LOGIT_BYTES per
expert and MoE layer. Multi-head latent attention caches kv_lora_rank + qk_rope_head_dim elements per token and
layer (``ModelShape.kv_width``), and its attention FLOPs per pair are ``ModelShape.attn_flops_per_pair``.

Training (forward + backward) is 3x the forward FLOPs (backward = 2x forward). The optimizer (AdamW,
fp32 master weights and moments) moves 16 bytes read + 16 bytes written per parameter shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from rlhfsim.costs import moe
from rlhfsim.models.catalog import ACTIVATION_BYTES, DTYPE_BYTES, ModelShape

ACT_BYTES_PER_TOKEN_LAYER_FACTOR = 12  # elements of h moved per token per layer (norms, residuals, MLP I/O)
# DeBERTa-v2's disentangled attention (see the module docstring), counted from transformers'
# DisentangledSelfAttention as calibrate.measuring.models configures it (position_buckets 256, share_att_key, c2p+p2c):
DEBERTA_TYPES = ("deberta-v2",)
DEBERTA_SPAN = 256        # position_buckets: relative embeddings of 2 x 256 positions
# passes over one head's (query, key) score matrix per layer, each a read or a write of N^2 elements:
# QK^T written 1; c2p gather read + write 2, "/ scale" 2, "0 + c2p" 2; p2c gather 2, "/ scale" (transposed) 2,
# "score +=" 3; "scores + rel_att" 3; masked_fill 2; softmax 2; the AV product reads 1
SCORE_PASSES = 22
# int64 position indices per (query, key) pair and layer: c2p "+ span", clamp (2 passes each); p2c "- r_pos",
# "+ span", clamp (2 each): 10 passes of 8 bytes; the mask's bool() and ~ about 11 bytes more
INDEX_BYTES_PER_PAIR = 91
LOGIT_BYTES = 16                       # bytes moved per LM-head logit (fp32 write, log-softmax r/w, read)
FP32_LOGIT_BYTES = 4   # log-probs are taken in float32 (logits.float()), whatever the model's dtype
# of LOGIT_BYTES, those of the log-prob tail after the head's write (the log-softmax's read and write, the gather's
# read): taken out of a pass's roofline where the tail is priced after it (a CPU's measured tail, cpuhost; a GPU
# framework's log-prob head, rlhfsim.costs.framework)
TAIL_LOGIT_BYTES = LOGIT_BYTES - FP32_LOGIT_BYTES


class Work(NamedTuple):
    """What an operation costs before a device is chosen: FLOPs, bytes moved through device memory,
    bytes moved over the interconnect (per participating GPU) and the number of kernel launches proxy
    (layers, used by fitted per-layer overheads). A named tuple: one is made per priced call, and a
    frozen dataclass's constructor costs several times as much."""

    flops: float
    bytes: float
    comm_bytes: float = 0.0
    layers: int = 0


@dataclass(frozen=True)
class ShapeCoeffs:
    """The constants of one model's FLOP and byte counts (one dtype, one head), computed once from its
    shape: every count below is these constants times token counts. ``CostModel`` keeps one per model,
    dtype and head, so a call costs a few multiplications instead of walking the shape again."""

    layers: int
    encoder: bool
    lm: bool
    f_linear: float   # 2 P_body: matmul FLOPs per token
    f_attn: float     # 4 L h: attention FLOPs per (query, visible key) pair
    f_head: float     # 2 h V per logit position (LM head), or 2 h per sequence (scalar head)
    weight_bytes: int  # P b
    decode_weight_bytes: int  # the weights a decode step streams: P b less an untied LM's input embedding
    kv_bytes: int     # 2 L d_kv b: K/V bytes per cached token
    act_bytes: int    # 12 L h b: activation bytes per token
    logit_bytes: int  # 16 V: bytes per logit position
    # DeBERTa-v2's disentangled attention (0 for any other model): see the module docstring
    f_rel_token: float = 0.0        # 2 L (2 x 2S x h): c2p and p2c products per token
    f_rel_call: float = 0.0         # 2 L (2 x 2S x h^2): the relative embeddings' projections per call
    rel_pair_bytes: float = 0.0     # L (H (SCORE_PASSES b + 16) + INDEX_BYTES_PER_PAIR) per (query, key) pair
    rel_token_bytes: float = 0.0    # 2 L 2S b H per token (c2p/p2c products written)
    rel_seq_bytes: float = 0.0      # 2 L 2S h b per sequence (position keys/queries repeated)
    # A mixture-of-experts model (0 for a dense one; rlhfsim.costs.moe): routed experts E and top-k, the bytes of
    # every routed expert of every MoE layer (inside decode_weight_bytes), and the FLOPs per token of the routers
    # and of the expert imbalance (both inside f_linear)
    n_experts: int = 0
    top_k: int = 0
    routed_bytes: int = 0
    f_router: float = 0.0
    f_imbalance: float = 0.0
    # the rows whose expert choices a decode step's weight reads follow, per row of the step: an expert-parallel
    # engine's d data-parallel attention ranks step together (rlhfsim.costs.genparallel); 1 otherwise
    touch_rows: float = 1.0

    @classmethod
    def of(cls, m: ModelShape, dtype: str, head: str = "value", scoring_runtime: str | None = None) -> "ShapeCoeffs":
        """``scoring_runtime``: the runtime a DeBERTa-v2 pass runs under: its score matrices' traffic is counted
        for PyTorch eager (``materializes_scores``) and not for a runtime that compiles the pass."""
        b, a = DTYPE_BYTES[dtype], ACTIVATION_BYTES[dtype]   # weights; activations and KV cache (float8: 1 and 2)
        lm = head == "lm"
        return cls(layers=m.layers, encoder=m.arch == "encoder", lm=lm,
                   f_linear=2.0 * m.active_body_params + moe.imbalance_flops(m),
                   f_attn=float(m.layers * m.attn_flops_per_pair),
                   f_head=2.0 * m.hidden * m.vocab if lm else 2.0 * m.hidden,
                   weight_bytes=m.params(head) * b,
                   # an untied LM's input embedding is gathered (one row per token), not streamed: a decode
                   # step of an untied actor took the same time as of the same shape tied (docs/cost-model.md)
                   decode_weight_bytes=(m.params(head) - (m.embedding_params if lm and not m.tied_embeddings else 0)) * b,
                   kv_bytes=m.layers * m.kv_width * a,
                   act_bytes=(ACT_BYTES_PER_TOKEN_LAYER_FACTOR * m.layers * m.hidden * a
                              + moe.router_logit_bytes(m, LOGIT_BYTES)),
                   logit_bytes=LOGIT_BYTES * m.vocab,
                   **moe.shape_fields(m, b),
                   **(_deberta_rel(m, a, materializes_scores(scoring_runtime))
                      if m.arch == "encoder" and m.hf_model_type in DEBERTA_TYPES else {}))

    def forward(self, n_tokens, n_seqs, cached_tokens=0.0, logits_tokens=0.0, attn_pairs=None) -> Work:
        """``forward_work`` (token counts may be numpy arrays: the same arithmetic, elementwise).
        ``attn_pairs``: the (query, key) pairs attention visits when rows of different lengths are
        packed without padding (``rlhfsim.costs.stepcosts.packed_attn_pairs``); F_attn = 4 L h x pairs
        instead of the even spread of ``n_tokens`` over ``n_seqs`` (no cached tokens)."""
        n_seqs = np.maximum(n_seqs, 1.0) if isinstance(n_seqs, np.ndarray) else max(n_seqs, 1.0)
        per_seq = n_tokens / n_seqs
        pairs = None
        if attn_pairs is not None:
            pairs = attn_pairs
            f_attn = self.f_attn * pairs
        elif self.encoder:     # every token sees every token of its sequence
            pairs = n_seqs * per_seq * per_seq
            f_attn = self.f_attn * pairs
        else:
            f_attn = self.f_attn * n_seqs * per_seq * (cached_tokens / n_seqs + (per_seq + 1) / 2)
        if self.lm:
            f_head = self.f_head * logits_tokens
            logit_bytes = self.logit_bytes * logits_tokens
        else:
            f_head = self.f_head * n_seqs
            logit_bytes = 0.0
        kv_read = self.kv_bytes * cached_tokens
        act = self.act_bytes * n_tokens
        flops = self.f_linear * n_tokens + f_attn + f_head
        nbytes = self.weight_bytes + kv_read + act + logit_bytes
        if self.f_rel_token:    # DeBERTa-v2 (an encoder: ``pairs`` set above)
            flops = flops + self.f_rel_token * n_tokens + self.f_rel_call
            nbytes = nbytes + self.rel_pair_bytes * pairs + self.rel_token_bytes * n_tokens + self.rel_seq_bytes * n_seqs
        return Work(flops, nbytes, 0.0, self.layers)

    def train(self, n_tokens, n_seqs, attn_pairs=None, body_rate: float = 1.0) -> Work:
        """``train_work``: 3x the forward (logits of every token with an LM head). ``body_rate``: the
        model width's relative training rate (``cpuhost.width_rate``): the body's matmul FLOPs count 1/body_rate
        times."""
        fwd = self.forward(n_tokens, n_seqs, 0.0, n_tokens if self.lm else 0.0, attn_pairs)
        flops = fwd.flops if body_rate == 1.0 else fwd.flops + self.f_linear * n_tokens * (1.0 / body_rate - 1.0)
        return Work(3.0 * flops, 3.0 * fwd.bytes, 0.0, self.layers)

    def decode(self, batch, kv_tokens, kv_passes: float = 1.0, weight_passes=1.0) -> Work:
        """``decode_step_work`` (an LM head: build with ``head="lm"``)."""
        flops = self.f_linear * batch + self.f_attn * kv_tokens + self.f_head * batch
        kv_read = self.kv_bytes * kv_tokens * kv_passes
        return Work(flops, self.decode_weights(batch, weight_passes) + kv_read + self.logit_bytes * batch, 0.0, self.layers)

    def decode_weights(self, batch, weight_passes=1.0):
        """Weight bytes a decode step of ``batch`` rows moves: the streamed weights ``gemm_passes`` times."""
        return self.decode_weights_at(batch) * gemm_passes(batch, weight_passes)

    def decode_weights_at(self, batch):
        """The weights a decode step of ``batch`` rows streams once: ``decode_weight_bytes``, less, for a
        mixture-of-experts model, the routed experts its rows do not touch (``moe.step_weight_bytes``)."""
        if not self.n_experts:
            return self.decode_weight_bytes
        if self.touch_rows != 1.0:
            batch = batch * self.touch_rows
        return moe.step_weight_bytes(self.decode_weight_bytes, self.routed_bytes, self.n_experts, self.top_k, batch)


def materializes_scores(scoring_runtime: str | None) -> bool:
    """Whether a DeBERTa-v2 pass under this scoring runtime writes and reads its score matrices pass by pass:
    PyTorch eager (``eager``, or None: a framework's own forward) does; a runtime that compiles the pass
    (torch.compile, AOTInductor, ONNX Runtime) fuses the elementwise chain, whose traffic is not counted."""
    return scoring_runtime in (None, "eager")


def _deberta_rel(m: ModelShape, b: int, materialized: bool = True) -> dict:
    """``ShapeCoeffs``' disentangled-attention constants of a DeBERTa-v2 model (see the module docstring):
    the c2p/p2c FLOPs always, the score matrices' traffic when ``materialized``."""
    span2, L, h, H = 2 * DEBERTA_SPAN, m.layers, m.hidden, m.heads
    out = {"f_rel_token": 2.0 * L * 2.0 * span2 * h}
    if materialized:
        out.update(f_rel_call=2.0 * L * 2.0 * span2 * h * h, rel_pair_bytes=float(L * (H * (SCORE_PASSES * b + 16) + INDEX_BYTES_PER_PAIR)),
                   rel_token_bytes=float(2 * L * span2 * b * H), rel_seq_bytes=float(2 * L * span2 * h * b))
    return out


def gemm_passes(batch, weight_passes):
    """Passes over the weights of a decode step of ``batch`` rows: 1 for one row (a matrix-vector
    product); for two or more (a matrix-matrix product whose kernel packs the weights first; measured per
    device, ``calibrate.cpu.gemm``) either ``weight_passes`` at every row count (a number) or, with a table
    ``(rows, passes)`` from ``cpuhost.footprint_passes`` (rows 1, 2, 4 ... with passes 1, p2, p4 ...), the passes
    interpolated linearly in rows and held beyond the last row measured: on a CPU a GEMM's time grows
    with its rows from two on (1.7-2.0x one row at 2 rows, 2.1-3.0x at 4, in cache), so one number for
    every row count prices a two-row step at the four-row step's passes (``lab/diagnostics/gemm_footprint.py`` and
    ``lab/diagnostics/decode_rows.py`` measure it).
    ``batch`` may be a numpy array."""
    if isinstance(weight_passes, tuple):
        rows, passes = weight_passes
        v = np.interp(batch, rows, passes)
        return v if isinstance(batch, np.ndarray) else float(v)
    if weight_passes == 1.0:
        return 1.0
    if isinstance(batch, np.ndarray):
        return np.where(batch > 1, weight_passes, 1.0)
    return weight_passes if batch > 1 else 1.0


def forward_work(m: ModelShape, dtype: str, n_tokens: float, n_seqs: float, cached_tokens: float = 0.0,
                 logits_tokens: float = 0.0, head: str = "value", scoring_runtime: str | None = None) -> Work:
    """Forward over ``n_tokens`` new tokens spread evenly over ``n_seqs`` sequences, each attending to
    ``cached_tokens / n_seqs`` cached tokens as well (0 for a one-shot prefill); ``scoring_runtime``: see
    ``ShapeCoeffs.of``."""
    return ShapeCoeffs.of(m, dtype, head, scoring_runtime).forward(n_tokens, n_seqs, cached_tokens, logits_tokens)


def decode_step_work(m: ModelShape, dtype: str, batch: float, kv_tokens: float, kv_passes: float = 1.0,
                     weight_passes: float = 1.0) -> Work:
    """One decode step: ``batch`` sequences each produce one token; ``kv_tokens`` is the total number of
    cached tokens over the batch (the sum of the sequences' current lengths); ``kv_passes``: passes over
    the cached K/V per step (``rlhfsim.costs.genruntimes.KV_PASSES``: 3 for HF's DynamicCache);
    ``weight_passes``: passes over the weights when ``batch`` > 1 (``gemm_passes``)."""
    return ShapeCoeffs.of(m, dtype, "lm").decode(batch, kv_tokens, kv_passes, weight_passes)


def decode_steps_arrays(m: ModelShape, dtype: str, batch: float, kv_tokens0: float, n_steps: int,
                        kv_passes: float = 1.0):
    """FLOPs and bytes of ``n_steps`` consecutive decode steps (numpy arrays, one entry per step) of a
    batch whose membership is fixed: each step adds ``batch`` tokens to the cache."""
    w = decode_step_work(m, dtype, batch, kv_tokens0 + batch * np.arange(n_steps, dtype=np.float64), kv_passes)
    return w.flops, w.bytes


def train_work(m: ModelShape, dtype: str, n_tokens: float, n_seqs: float, head: str = "lm",
               body_rate: float = 1.0) -> Work:
    """Forward + backward over a minibatch (activation recomputation off): 3x forward FLOPs, and weights
    plus gradients moved about 3x; ``body_rate``: the width's relative training rate (``cpuhost.width_rate``)."""
    return ShapeCoeffs.of(m, dtype, head).train(n_tokens, n_seqs, body_rate=body_rate)


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
    return passes * 2 * m.layers * allreduce_bytes(n_tokens * m.hidden * ACTIVATION_BYTES[dtype], tp)


def sequence_parallel(w: Work, weight_bytes: float, sp: int) -> Work:
    """One GPU's share of ``w`` under Ulysses sequence parallelism over ``sp`` GPUs: each holds 1/sp of
    every sequence's tokens (and, inside attention, 1/sp of the heads over the whole sequence), so FLOPs,
    activation, KV and logit bytes divide by sp; the weights (FSDP gathers them whole on every GPU) are
    read in full by each: F / sp, W_bytes + (B - W_bytes) / sp. ``weight_bytes``: the weight traffic
    inside ``w`` (P b for a forward, 3 P b for training)."""
    if sp <= 1:
        return w
    return Work(w.flops / sp, weight_bytes + (w.bytes - weight_bytes) / sp, w.comm_bytes, w.layers)


def ulysses_bytes(m: ModelShape, dtype: str, n_tokens: float, sp: int, passes: int = 1) -> float:
    """Bytes each GPU sends in Ulysses' all-to-alls: four per layer per pass (q, k, v in, the attention
    output back), each of its n / sp tokens x h elements, (sp - 1) / sp of it leaving the GPU (k and v are
    priced at h wide too: an upper bound under grouped-query attention)."""
    if sp <= 1:
        return 0.0
    return passes * 4 * m.layers * (n_tokens / sp) * m.hidden * ACTIVATION_BYTES[dtype] * (sp - 1) / sp


"""A training rank's peak memory under Megatron's parallelism, estimated before a configuration is simulated (the
parallelism search prunes what does not fit; ``rlhfsim.scenario.checks`` keeps its own, coarser check of every
scenario, which still applies).

One GPU of a trained role (actor, critic) with ``tp x pp x cp x dp`` GPUs, experts over ``ep`` (bytes)::

    weights     = b x (P_dense / (tp pp) + P_routed / (tp ep pp))              the stage's shard; b the dtype's bytes
    grads       = 2 x (the same parameters)                                    Megatron's bf16 gradient buffer, whole
                                                                               on every rank of the shard
    optimizer   = 12 x P / N                                                   fp32 master weights and Adam's m, v,
                                                                               sharded over the data-parallel group by
                                                                               the distributed optimizer (dense over
                                                                               dp x cp, experts over dp x cp / ep:
                                                                               either way P over the N = tp pp cp dp
                                                                               GPUs)
    activations = a x n / cp x L x (34 h + 6 I_tok) / tp   (no recompute)      n the tokens of one micro-batch (the
                = a x n / cp x (L x 2 h + (34 h + 6 I_tok)) / tp  (recompute)  token budget ``ppo_max_token_len_per_gpu``
                                                                               or rows x the longest sequence), a the
                                                                               activation bytes; Korthikanti et al. 2022
                                                                               (arXiv 2205.05198) with flash attention
                                                                               (no s^2 term) and sequence parallelism
                                                                               (all of it over tp): 34 h per token and
                                                                               layer with the 4h MLP's 19 h replaced by
                                                                               a SwiGLU's 2 h + 6 I_tok, I_tok = I dense,
                                                                               top-k x I_expert + I_shared in MoE layers
                                                                               (averaged over the layers); 1F1B keeps
                                                                               pp micro-batches of L / pp layers in
                                                                               flight on the first stage: L layers' worth
                                                                               at any pp (interleaving adds (pp - 1) /
                                                                               (pp vpp) of it)
    logits      = 4 x n / cp x V / tp                                          the loss's fp32 logits on the last stage
    fits when weights + grads + optimizer + activations + logits + RESERVE <= GPU memory

Other models on the pool are not counted: NeMo RL keeps the reference policy's weights in host memory and swaps them in
for its pass, and verl offloads a colocated reference's parameters where asked (``ref.megatron.param_offload``); the
simulator's own check (``rlhfsim.scenario.checks``) counts every model resident, and still applies.

RESERVE (the CUDA context, NCCL's buffers and the allocator's fragmentation) is ``RESERVE_BYTES``. What it leaves out:
the generation engine's memory on a shared pool (``rlhfsim.scenario.checks`` sizes the KV cache from what the models
leave), pipeline send/receive buffers, MoE dispatch buffers. An estimate, checked against public out-of-memory
reports (docs/planning.md), not fitted to them.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhfsim.costs.parallel import stage_layers
from rlhfsim.costs.stepcosts import GIB, OPTIMIZER_STATE_BYTES  # fp32 master weight + Adam m, v: 12 bytes
from rlhfsim.models.catalog import ACTIVATION_BYTES, DTYPE_BYTES, ModelShape

RESERVE_BYTES = 4 * GIB        # CUDA context (~0.5 GiB), NCCL buffers, allocator fragmentation
GRAD_BYTES = 2                 # bf16 gradients (Megatron's grad buffer; grad_reduce_in_fp32 off)
ACT_PER_TOKEN_LAYER_H = 34     # Korthikanti et al. 2022, table 2: 34 s b h per layer (with sequence parallelism)
MLP_4H_SHARE_H = 19            # of which the 4h MLP's (input 2, fc1 8, GeLU 8, dropout mask 1)
CKPT_INPUT_H = 2               # full recompute keeps each layer's input (2 bytes x h per token)
LOGIT_BYTES = 4                # fp32 logits for the loss


@dataclass(frozen=True)
class RankLayout:
    """One trained role's degrees on its pool (the search's candidate, before a scenario exists)."""

    tp: int
    pp: int
    vpp: int
    cp: int
    ep: int
    pool_gpus: int
    etp: int | None = None     # expert tensor parallelism (None: tp, Megatron's default)
    first: int | None = None   # an uneven pipeline's first and last stages' decoder layers (None: an even split)
    last: int | None = None


@dataclass(frozen=True)
class RankMemory:
    """Bytes on one GPU of a training rank at its peak, by part."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    logits: float
    resident: float
    reserve: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.logits + self.resident + self.reserve

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in (
            ("weights", self.weights), ("grads", self.grads), ("optimizer", self.optimizer),
            ("activations", self.activations), ("logits", self.logits), ("other models", self.resident),
            ("reserve", self.reserve)) if v)
        return f"{self.total / GIB:.1f} GiB ({parts})"


def shard_params(m: ModelShape, lay: RankLayout) -> float:
    """Parameters one GPU holds: the dense part over tp, the routed experts over etp x ep (etp None: tp), and of them
    the largest pipeline stage's share (1/pp of the layers, or an uneven pipeline's largest stage:
    ``parallel.stage_layers``)."""
    total = m.params("lm")
    routed = m.routed_params
    per_gpu = (total - routed) / lay.tp + routed / ((lay.tp if lay.etp is None else lay.etp) * lay.ep)
    if lay.pp > 1 and (lay.first is not None or lay.last is not None):
        return per_gpu * max(stage_layers(m.layers, lay.pp, lay.first, lay.last)) / m.layers
    return per_gpu / lay.pp


def tokens_per_token_mlp(m: ModelShape) -> float:
    """I_tok: the MLP width one token passes through, averaged over the layers (module docstring)."""
    if not m.is_moe:
        return float(m.intermediate)
    moe = m.experts_per_token * m.moe_intermediate + m.shared_intermediate
    return ((m.layers - m.moe_layers) * m.intermediate + m.moe_layers * moe) / m.layers


def activation_bytes(m: ModelShape, dtype: str, tokens: float, lay: RankLayout, checkpointing: bool) -> float:
    """The activations a training rank holds at its peak (module docstring)."""
    a = ACTIVATION_BYTES[dtype] / 2   # the coefficients count 2-byte elements
    per_layer = (ACT_PER_TOKEN_LAYER_H - MLP_4H_SHARE_H + 2) * m.hidden + 6 * tokens_per_token_mlp(m)
    n = tokens / lay.cp
    if checkpointing:
        body = m.layers * CKPT_INPUT_H * m.hidden + per_layer
    else:
        body = m.layers * per_layer
    if lay.pp > 1 and lay.vpp > 1:
        body *= 1 + (lay.pp - 1) / (lay.pp * lay.vpp)
    return a * n * body / lay.tp


def training_rank(m: ModelShape, dtype: str, lay: RankLayout, tokens: float, checkpointing: bool,
                  resident: float = 0.0) -> RankMemory:
    """Peak bytes on one GPU of a trained role (module docstring). ``tokens``: one micro-batch's tokens on a
    context-parallel group; ``resident``: other models' weights on the same GPU."""
    p = shard_params(m, lay)
    return RankMemory(weights=p * DTYPE_BYTES[dtype], grads=p * GRAD_BYTES,
                      optimizer=OPTIMIZER_STATE_BYTES * m.params("lm") / lay.pool_gpus,
                      activations=activation_bytes(m, dtype, tokens, lay, checkpointing),
                      logits=LOGIT_BYTES * tokens / lay.cp * m.vocab / lay.tp,
                      resident=resident, reserve=RESERVE_BYTES)

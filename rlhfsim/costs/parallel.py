"""Megatron-LM's model parallelism beside tensor parallelism, as a training step pays for it: pipeline stages (pp) with
interleaved virtual stages (vpp), context parallelism (cp) and expert parallelism (ep). Each is one cost term
(``rlhfsim.costs.terms``: pipeline_bubble, pp_p2p, cp_comm, ep_alltoall); equations in docs/cost-model.md,
"Megatron's parallelism".

A role's GPUs are tp x pp x cp x dp (dp data-parallel pipelines); Megatron orders ranks tp, cp, ep, dp, pp (tp
innermost), so a tensor-parallel group is tp consecutive GPUs, a context-parallel group tp x cp, an expert-parallel
group tp x cp x ep, and a pipeline's stages are pool GPUs / pp apart. A group is in one NVLink domain, and its messages
cross NVLink (the catalog's ``intra_node_bw``), when it spans at most ``gpus_per_node`` consecutive GPUs (an NVL72
rack's 72: ``GpuSpec.link_domain``); otherwise the
inter-node link (``inter_node_bw``) carries them, the slowest member setting the pace. b bytes per element, h the
hidden size, n the tokens of one micro-batch of one pipeline, L_s = L / pp the layers of one stage::

    stage          one GPU of a pipeline prices L / pp decoder layers and the LM head: the last stage, the slowest
                   (the first holds the embedding, a lookup). An uneven pipeline (``first_stage_layers``,
                   ``last_stage_layers``: Megatron's num_layers_in_first/last_pipeline_stage) is split as Megatron-core
                   splits it (``stage_layers``), and its slowest stage sets the pace: each micro-batch is priced on the
                   last stage (its layers and the LM head) and on the largest other stage (its layers, no head), and
                   the dearer of the two is the pipeline's call; 1F1B then takes m calls and the bubble below, the
                   slowest stage's time x (m + (p - 1) / v) in all
    pipeline_bubble  = (p - 1) / (v m) x sum of the pipeline's m micro-batch calls on one stage
                   (1F1B: Narayanan et al. 2021, section 2.2; the fraction of the step is (p - 1) / (v m + p - 1))
    pp_p2p         = 2 v x (n / cp x h x b / tp / link_bw + latency)            per micro-batch
                   (an activation forward and a gradient back across each of a rank's v chunk boundaries; Megatron's
                   scatter-gather over tensor parallelism sends 1/tp of it from each TP rank; send and receive at once)
    cp_comm        = 3 (cp - 1) L_s x (n / cp x w_kv x b / tp_kv / link_bw + latency)    per micro-batch
                   (ring attention: cp - 1 steps per layer, each passing one rank's keys and values, w_kv wide; the
                   backward passes them again with their gradients: 3 in all; tp_kv = min(tp, kv heads))
    ep_alltoall    = 4 M_s x (n / (cp tp) x k x h x b x (ep - 1) / ep / link_bw + latency)   per micro-batch
                   (dispatch and combine per MoE layer, forward and backward: each of a GPU's n / (cp tp) tokens
                   goes to its k experts, (ep - 1) / ep of them on another GPU; M_s the stage's MoE layers; the
                   group spans tp x cp x ep GPUs, or ep x etp under expert tensor parallelism, whose FLOPs per GPU
                   are the same: it moves which GPU computes an expert, not how much each computes)

A forward-only call (old log-probs, the reference, the critic's values: Megatron's schedule with forward_only) runs
through the same pipeline: its bubble is (p - 1) / (v m) of its calls too (the fill and drain of forwards alone), and
it sends half the messages above (activations only: v per micro-batch; one ring pass of cp - 1 steps per layer; 2
all-to-alls per MoE layer).

The communications are counted serial with the compute (Megatron overlaps parts of them: an upper bound on what they
expose); the bubble is idle time, not device work. Under context parallelism a GPU computes 1/cp of every sequence
(``flops.sequence_parallel``, the Ulysses split without its all-to-alls). Expert parallelism leaves the FLOPs per GPU
unchanged (each GPU computes its experts for every GPU's tokens routed there); it shards the experts' weights, which
only the memory check would feel.
"""

from __future__ import annotations

import math

import numpy as np
from dataclasses import dataclass, replace

from rlhfsim.contracts import SEQUENCE_PARALLEL
from rlhfsim.costs.terms import CP_COMM, EP_ALLTOALL, PP_P2P
from rlhfsim.models.catalog import ACTIVATION_BYTES, ModelShape

LATENCY_S = 10e-6   # per message, as the model's other collectives (model.LINK_LATENCY_S)


@dataclass(frozen=True)
class Layout:
    """One role's Megatron degrees on its pool (``execution.megatron.ROLE`` with ``placement.tp``)."""

    tp: int
    pp: int
    vpp: int
    cp: int
    ep: int
    pool_gpus: int
    gpus_per_node: int   # the NVLink domain: the node's GPUs, or an NVL72 rack's 72 (GpuSpec.link_domain)
    spans_nodes: bool
    etp: int | None = None     # expert tensor parallelism (Megatron's expert_tensor_parallel_size); None: tp
    first: int | None = None   # decoder layers of the first stage (Megatron's num_layers_in_first_pipeline_stage)
    last: int | None = None    # of the last stage (num_layers_in_last_pipeline_stage); None: an even split

    @property
    def uneven(self) -> bool:
        """Does the scenario set the first or last stage's layers (Megatron's uneven pipeline)?"""
        return self.pp > 1 and (self.first is not None or self.last is not None)

    @property
    def dp(self) -> int:
        """Data-parallel pipelines: pool GPUs / (tp x pp x cp)."""
        return max(self.pool_gpus // (self.tp * self.pp * self.cp), 1)

    def inter_node(self, group: int) -> bool:
        """Does a group of ``group`` consecutive GPUs of the pool cross a node?"""
        return self.spans_nodes and group > self.gpus_per_node


def layout_of(setup, role: str) -> Layout | None:
    """``role``'s Megatron layout, or None where the scenario sets none (pp, cp, ep all 1: the older step, priced as
    before bit for bit)."""
    if role not in SEQUENCE_PARALLEL:
        return None
    r = getattr(setup.scenario.execution.megatron, role)
    if (r.pp, r.cp, r.ep) == (1, 1, 1):
        return None
    pool = setup.pool_of(role)
    return Layout(setup.tp[role], r.pp, r.vpp, r.cp, r.ep, pool.gpus, setup.gpu.link_domain(setup.scenario.cluster.gpus_per_node),
                  pool.spans_nodes, r.etp, r.first_stage_layers, r.last_stage_layers)


def stage_layers(layers: int, pp: int, first: int | None = None, last: int | None = None) -> tuple[int, ...]:
    """Decoder layers on each of ``pp`` pipeline ranks as Megatron-core builds them (``get_num_layers_to_build`` in
    megatron/core/transformer/transformer_block.py): ``first`` on rank 0 and ``last`` on rank pp - 1 where set, the
    rest split evenly over the ranks between (each rank's layers whole over its virtual stages). Without either, L /
    pp on every rank. Raises ValueError where the split does not add up (the scenario check says which field)."""
    if pp <= 1:
        return (layers,)
    if first is None and last is None:
        if layers % pp:
            raise ValueError(f"{layers} layers do not split evenly over {pp} stages")
        return (layers // pp,) * pp
    rest, middle = layers - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
    if rest < 0 or bool(rest) != bool(middle) or (middle and rest % middle):
        raise ValueError(f"{rest} layers left for {middle} middle stages")
    each = rest // middle if middle else 0
    return (first if first is not None else each,) + (each,) * (pp - 2) + (last if last is not None else each,)


def largest_stage(m: ModelShape, lay: "Layout | None") -> int | None:
    """The decoder layers of a pipeline's largest stage, which sets a rank's weights and optimizer step, where the
    layout is uneven (None otherwise: ``stage_shape``'s even split)."""
    if lay is None or not lay.uneven:
        return None
    return max(stage_layers(m.layers, lay.pp, lay.first, lay.last))


def stage_shape(m: ModelShape, pp: int, layers: int | None = None) -> ModelShape:
    """The model one GPU of a pipeline of ``pp`` stages prices: its last stage, layers / pp decoder layers (of them
    the MoE layers' share, rounded up) and the LM head. ``layers``: a stage of that many decoder layers (an uneven
    pipeline), its MoE layers the model's share of them, rounded up (where the model's dense layers sit is not in
    its shape: a stage is priced as if it held its share of the experts, which overstates a stage of DeepSeek's
    first, dense layers)."""
    if pp <= 1:
        return m
    if layers is not None:
        return replace(m, layers=layers, moe_layers=min(math.ceil(m.moe_layers * layers / m.layers), layers))
    layers = m.layers // pp
    return replace(m, layers=layers, moe_layers=min(math.ceil(m.moe_layers / pp), layers))


def bubble_s(calls_s: float, micro_batches: int, pp: int, vpp: int = 1) -> float:
    """The pipeline bubble of one minibatch on one pipeline under (interleaved) 1F1B: ``calls_s`` (its
    ``micro_batches`` calls on one stage) x (p - 1) / (v m)."""
    if pp <= 1 or micro_batches <= 0:
        return 0.0
    return calls_s * (pp - 1) / (vpp * micro_batches)


def p2p_s(cost, m: ModelShape, dtype: str, n_tokens: float, lay: Layout, training: bool = True) -> float:
    """pp_p2p of one micro-batch of ``n_tokens`` tokens on one stage (module docstring; a forward-only call sends its
    activations only: half the messages)."""
    if lay.pp <= 1:
        return 0.0
    nbytes = n_tokens / lay.cp * m.hidden * ACTIVATION_BYTES[dtype] / lay.tp
    return (2 if training else 1) * lay.vpp * (nbytes / cost.link_bw(lay.spans_nodes) + LATENCY_S)


def kv_width(m: ModelShape) -> int:
    """Elements of one token's keys and values in one layer as attention reads them (MLA's decompressed)."""
    if m.attention == "mla":
        return m.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
    return 2 * m.kv_dim


def cp_s(cost, m: ModelShape, dtype: str, n_tokens: float, lay: Layout, training: bool = True) -> float:
    """cp_comm of one micro-batch of ``n_tokens`` tokens on one GPU of a stage of ``m`` (module docstring; a forward-only
    call passes the keys and values round once: 1 pass of 3)."""
    if lay.cp <= 1:
        return 0.0
    split = min(lay.tp, m.kv_heads) if m.attention != "mla" else lay.tp
    nbytes = n_tokens / lay.cp * kv_width(m) * ACTIVATION_BYTES[dtype] / max(split, 1)
    steps = (3 if training else 1) * (lay.cp - 1) * m.layers
    return steps * (nbytes / cost.link_bw(lay.inter_node(lay.tp * lay.cp)) + LATENCY_S)


def ep_alltoall_s(cost, m: ModelShape, dtype: str, n_tokens: float, lay: Layout, training: bool = True) -> float:
    """ep_alltoall of one micro-batch of ``n_tokens`` tokens on one GPU of a stage of ``m`` (module docstring; a
    forward-only call dispatches and combines once per MoE layer: 2 all-to-alls of 4); 0 for a dense model or ep 1."""
    if lay.ep <= 1 or not m.is_moe or m.moe_layers <= 0:
        return 0.0
    nbytes = (n_tokens / (lay.cp * lay.tp) * m.experts_per_token * m.hidden * ACTIVATION_BYTES[dtype]
              * (lay.ep - 1) / lay.ep)
    calls = (4 if training else 2) * m.moe_layers
    # the group: ep x etp consecutive GPUs under expert tensor parallelism (Megatron's expert ranks order etp, ep, edp,
    # pp), else the tp x cp x ep GPUs of the dense layers' order
    group = lay.tp * lay.cp * lay.ep if lay.etp is None else lay.etp * lay.ep
    return calls * (nbytes / cost.link_bw(lay.inter_node(group)) + LATENCY_S)


def call(cost, training: bool, m: ModelShape, dtype: str, n_tokens: float, n_seqs: float, head: str, attn_pairs,
         lay: Layout, **kwargs):
    """One micro-batch of one pipeline on one GPU (``CostModel.framework_call`` with ``layout``), a training call or a
    forward-only one: the call priced on the last stage's layers, 1/cp of every sequence (the Ulysses split without its
    all-to-alls), and its pp_p2p, cp_comm and ep_alltoall serial with it (``framework.CallParts.parallel``). An uneven
    pipeline's call is its slowest stage's: the last stage's (its layers and the head) or the largest other stage's
    (its layers; no LM head, no log-prob head), whichever costs more."""
    if lay.uneven:
        stages = stage_layers(m.layers, lay.pp, lay.first, lay.last)
        last = _stage_call(cost, training, stage_shape(m, lay.pp, stages[-1]), dtype, n_tokens, n_seqs, head,
                           attn_pairs, lay, kwargs)
        inner = dict(kwargs, logprob=False, entropy=False)
        other = _stage_call(cost, training, stage_shape(m, lay.pp, max(stages[:-1])), dtype, n_tokens, n_seqs,
                            "value", attn_pairs, lay, inner)
        return other if other.total_s > last.total_s else last
    return _stage_call(cost, training, stage_shape(m, lay.pp), dtype, n_tokens, n_seqs, head, attn_pairs, lay, kwargs)


def _stage_call(cost, training: bool, stage: ModelShape, dtype: str, n_tokens: float, n_seqs: float, head: str,
                attn_pairs, lay: Layout, kwargs: dict):
    """``call`` on one stage of ``stage``'s layers (``head`` "value" for a stage without the LM head: a scalar
    head's 2h FLOPs a sequence, nothing)."""
    parts = cost.framework_call(training, stage, dtype, n_tokens, n_seqs, lay.tp, head, attn_pairs, lay.cp,
                                ulysses=False, ep=lay.ep, etp=lay.etp, **kwargs)
    extra = tuple((t, s) for t, s in ((PP_P2P, p2p_s(cost, stage, dtype, n_tokens, lay, training)),
                                      (CP_COMM, cp_s(cost, stage, dtype, n_tokens, lay, training)),
                                      (EP_ALLTOALL, ep_alltoall_s(cost, stage, dtype, n_tokens, lay, training)))
                  if isinstance(s, np.ndarray) or s > 0)   # an array: many pieces priced at once
    return replace(parts, parallel=parts.parallel + extra) if extra else parts

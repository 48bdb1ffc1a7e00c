"""The CostModel: seconds for each operation of an RLHF step on one model replica spread over ``tp`` GPUs.

Every prediction is the roofline-with-efficiency form, with the parameters of the operation ``op``:

    t(op) = max( F / (tp x peak[dtype] x compute_eff[op]),  B / (tp x mem_bw x memory_eff[op]) )
            + overhead_s[op] + overhead_per_layer_s[op] x L
            + C / (link_bw x link_eff)                     (tensor-parallel all-reduce, if tp > 1)

F and B are the FLOPs and bytes of ``rlhfsim.costs.flops`` (from model shapes), peak and mem_bw are
the device's datasheet numbers (``rlhfsim.hardware``), and the four parameters per operation come from
a Profile: datasheet-derived defaults (the bundled ``default`` profile) or values fitted to measurements
(``rlhfsim calibrate``). Because F and B carry the model size, fitted parameters carry over to model
sizes that were never measured. Units: seconds, FLOP, bytes, FLOP/s, bytes/s.

A profile with kernel terms fitted by shape from public per-operation data (``kernels_by_shape``, ``collectives``:
``calibrate.fitting.fromops``) replaces, for the operations it names, the constant compute_eff by a curve in the tokens per
call and the shard, the memory_eff by the GEMMs' and element-wise ops' efficiencies plus per-layer kernel floors, and
the TP all-reduce's LINK_EFF / LINK_LATENCY_S by the fitted bus bandwidth and latency (``rlhfsim.costs.byshape``). A
profile's efficiencies are stated for the GPU its ``gpu`` field names (``any``: an H100 under CUDA); priced on another
GPU, its compute_eff are carried to it (``with_stack_rate``: ``catalog.carried_compute_eff``, the GEMMs at the GPU
stack's rate and the rest of a pass at its memory's speed).

A CPU's host effects (GEMM weight passes by footprint, cold fixed costs, training rate by width, page faults, the
measured log-prob tail: ``rlhfsim.costs.cpuhost``) enter only where the device is a CPU whose profile measured them:
``CostModel.cpu`` holds them (None on a GPU) and each use is one ``if self.cpu is not None`` branch.

One home per formula: the roofline is ``roofline_kernel_s`` plus ``with_overheads_s`` (the calibration
fit, ``calibrate.fitting.fit``, calls the same two functions), F and B come from ``rlhfsim.costs.flops.ShapeCoeffs``
(decode included: ``_Decode.coeffs`` is that decode work divided by the roofline's denominators). The
constants of both are computed once per (model, dtype, head or runtime, tp) and kept on the CostModel (a
CostModel is one device and one profile), so a prediction costs a few multiplications.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np

from rlhfsim.costs import flops as fl
from rlhfsim.costs.byshape import ShapeKernels, allreduce_floor, allreduce_terms
from rlhfsim.costs.cpuhost import CpuHostEffects
from rlhfsim.costs import driver, genparallel, moe, parallel
from rlhfsim.costs import framework as fw
from rlhfsim.costs import eager
from rlhfsim.costs.hostscale import HOST_STEP_SCALARS, host_factor, scaled_profile
from rlhfsim.costs.genruntimes import GEN_SCALARS, EngineHost, engine_host, kv_passes, op_key, pricing_names, sample_tail
from rlhfsim.costs.profile import AUTO_PROFILE, BUNDLED_DIR, DEFAULT_PROFILE, default_profile_for, load_profile
from rlhfsim.costs.stepcosts import GIB, STEP_DEFAULTS, STEP_SCALARS
from rlhfsim.costs.terms import (DECODE_KERNELS, ENGINE_HOST, ENGINE_STEP, EXPERT_GEMM, GEN_EP_ALLTOALL, HOST_LAUNCH_BOUND, KERNELS,
                                 LEFT_PADDING, OPTIMIZER, SAMPLING_TAIL, TP_INTER_NODE, CostTerm, Price, moved, with_effects)
from rlhfsim.errors import ProfileError
from rlhfsim.hardware.catalog import (INTER_NODE_ALLREDUCE_S, GpuSpec, balance_ratio, carried_operations, stack_factor,
                                      stated_gpu)
from rlhfsim.models.catalog import ACTIVATION_BYTES, DTYPE_BYTES, ModelShape

LINK_EFF = 0.7  # fraction of link bandwidth a ring all-reduce achieves
LINK_LATENCY_S = 10e-6  # per all-reduce call
# NeMo RL's refit buckets (nemo_rl/utils/packed_tensor.py get_target_packed_tensor_size): a share of the GPU's memory
# (NRL_REFIT_BUFFER_MEMORY_RATIO's default), at most 5 GiB.
REFIT_BUCKET_MEM_FRAC = 0.02
REFIT_BUCKET_MAX_BYTES = 5 * 1024 ** 3
# The most of a scorer call's time an actor can lose beside it (CostModel.corun_overlap): the measured
# actors lost 0.56-0.95 of it (calibrate.fitting.assemble.handover_overlap); a line taken past the smallest of them
# could reach 1, an actor that never moves while a call runs.
OVERLAP_LOST_MAX = 0.95


@dataclass(frozen=True)
class OpParams:
    """Fitted (or default) parameters of one operation."""

    compute_eff: float
    memory_eff: float
    overhead_s: float
    overhead_per_layer_s: float
    # the per-layer term is the host launching each layer's kernels while the device runs earlier ones (an
    # eager engine's decode step on a GPU): a step costs overhead_s + max(device, layers x per-layer), not the
    # sum (profile key ``host_overlap``; absent: the sum, as every fitted operation was fitted)
    host_overlap: bool = False

    @classmethod
    def from_dict(cls, d: dict) -> "OpParams":
        return cls(float(d["compute_eff"]), float(d["memory_eff"]), float(d["overhead_s"]),
                   float(d["overhead_per_layer_s"]), bool(d.get("host_overlap", False)))


def _series(a: float, s: float, i0: int, i1: int) -> float:
    """sum_{i=i0}^{i1-1} (a + s i)."""
    n = i1 - i0
    return a * n + s * (i0 + i1 - 1) * n / 2.0 if n > 0 else 0.0


def decode_sum(coeffs, n_steps) -> tuple:
    """(total_s, active_s) of ``n_steps`` decode steps in closed form from ``CostModel.decoder(...).coeffs``: the
    steps' sum and its kernel part (the per-step overhead excluded; tensor-parallel communication counts as active).
    ``n_steps`` an integer, or an integer array (every entry >= 1) with ``coeffs`` for arrays of batch sizes and
    cached tokens: many segments at once, elementwise the same arithmetic, so each the same bits."""
    c0, cs, u0, us, over = coeffs
    if isinstance(n_steps, np.ndarray):
        n = n_steps.astype(np.int64, copy=False)
        kernel = _sum_max_linear_many(c0, cs, u0, us, n)
        return kernel + n * over, kernel
    if n_steps <= 0:
        return 0.0, 0.0
    kernel = _sum_max_linear(c0, cs, u0, us, n_steps)
    return kernel + n_steps * over, kernel


def _sum_max_linear(a1: float, s1: float, a2: float, s2: float, n: int) -> float:
    """sum_{i=0}^{n-1} max(a1 + s1 i, a2 + s2 i) for two lines (they cross at most once). The two
    ``_series`` are written out: this is the simulator's innermost call."""
    if s1 == s2:
        a = a1 if a1 >= a2 else a2
        return a * n + s1 * (n - 1) * n / 2.0 if n > 0 else 0.0
    cross = (a2 - a1) / (s1 - s2)  # line 1 is above line 2 for i > cross when s1 > s2
    if math.isfinite(cross):
        k = math.floor(cross) + 1  # first index at or past the crossing, clamped to [0, n] (min(max(.)))
        if k < 0:
            k = 0
        if k > n:
            k = n
    else:
        k = int(min(max(np.floor(cross) + 1, 0), n))
    if s1 > s2:
        a, s, b, t = a2, s2, a1, s1
    else:
        a, s, b, t = a1, s1, a2, s2
    first = a * k + s * (k - 1) * k / 2.0 if k > 0 else 0.0           # _series(a, s, 0, k)
    m = n - k
    return first + (b * m + t * (k + n - 1) * m / 2.0 if m > 0 else 0.0)  # + _series(b, t, k, n)


def _series_many(a, s, i0, i1):
    """``_series`` elementwise over numpy arrays (the same arithmetic, so the same bits)."""
    n = i1 - i0
    return np.where(n > 0, a * n + s * (i0 + i1 - 1) * n / 2.0, 0.0)


def _sum_max_linear_many(a1, s1, a2, s2, n):
    """``_sum_max_linear`` elementwise over numpy arrays (the same arithmetic, so the same bits)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = (a2 - a1) / (s1 - s2)
    flat, up = s1 == s2, s1 > s2
    k = np.where(flat, 0, np.minimum(np.maximum(np.floor(cross) + 1, 0), n)).astype(np.int64)
    # Each element's two lines in the scalar's order (the lower one up to the crossing, then the other;
    # s1 == s2: no crossing, k = 0, the higher line), so only two series are evaluated, not five.
    a, s = np.where(up, a2, a1), np.where(up, s2, s1)
    b, t = np.where(flat, np.maximum(a1, a2), np.where(up, a1, a2)), np.where(up | flat, s1, s2)
    return _series_many(a, s, np.zeros_like(n), k) + _series_many(b, t, k, n)


def roofline_kernel_s(flops, nbytes, peak: float, bw: float, compute_eff, memory_eff):
    """The roofline, max(F / (peak x compute_eff), B / (bw x memory_eff)) in seconds: the kernel time.
    Floats, or numpy arrays (broadcast; the calibration fit evaluates a grid of efficiencies at once)."""
    compute = flops / (peak * compute_eff)
    memory = nbytes / (bw * memory_eff)
    if isinstance(compute, np.ndarray) or isinstance(memory, np.ndarray):
        return np.maximum(compute, memory)
    return max(compute, memory)


def with_overheads_s(kernel_s, p: OpParams, layers):
    """A prediction from its kernel time: kernel + overhead_s + overhead_per_layer_s x L (host time)."""
    return kernel_s + p.overhead_s + p.overhead_per_layer_s * layers


def roofline(work: fl.Work, p: OpParams, peak: float, bw: float, tp: int = 1) -> Price:
    """The roofline time plus the fixed overheads (``total_s``), the roofline (kernel) part alone its active share,
    by term kernels and op_overhead. Overheads are host time (Python, launches, sampling bookkeeping) during which
    the device waits; ``active_s`` is what nvidia-smi / DCGM-style utilization counts as busy."""
    kernel = roofline_kernel_s(work.flops, work.bytes, tp * peak, tp * bw, p.compute_eff, p.memory_eff)
    return Price(with_overheads_s(kernel, p, work.layers), kernel)


class _Forward:
    """``CostModel.forward`` of one (model, dtype, head, tp, operation parameters): the shape constants and the
    device numbers, looked up once."""

    __slots__ = ("cost", "m", "dtype", "tp", "shape", "p", "peak", "bw", "tail0", "tail_row", "ks", "shard", "floor",
                 "inter_node", "allreduces")

    def __init__(self, cost: "CostModel", m: ModelShape, dtype: str, head: str, tp: int, p: OpParams,
                 tail: tuple[float, float] = (0.0, 0.0), scoring_runtime: str | None = None,
                 by_shape: ShapeKernels | None = None, inter_node: bool = False,
                 par: genparallel.GenLayout | None = None):
        self.cost, self.m, self.dtype, self.tp, self.p = cost, m, dtype, tp, p
        self.inter_node = inter_node   # a TP group spanning NVLink domains (CostModel._tp_comm_s)
        # the profile's kernel terms by shape where they price this operation (rlhfsim.costs.byshape), else None
        self.ks, self.shard = by_shape, m.layer_params / tp
        self.floor = by_shape.floor_s(m.layers) if by_shape is not None else 0.0
        self.shape = fl.ShapeCoeffs.of(m, dtype, head, scoring_runtime)
        # one GPU of an expert-parallel engine (genparallel): its own experts' weights, fewer all-reduces
        self.allreduces = None
        if par is not None:
            self.shape = genparallel.forward_shape(self.shape, m, par)
            self.allreduces = genparallel.allreduces(m, par)
        self.peak, self.bw = cost.gpu.peak(dtype), cost.gpu.mem_bw
        # a generation prefill samples each row's first token: the runtime's measured sampling tail
        self.tail0, self.tail_row = tail[0], tail[1] * m.vocab

    def parts(self, n_tokens, n_seqs, cached_tokens, logits_tokens, attn_pairs=None, lp_tail: float = 0.0,
              sp: int = 1, ulysses: bool = True) -> tuple:
        """(total_s, active_s) of the forward. ``lp_tail``: seconds per logit of a log-prob pass's log-softmax and gather
        after the head (a CPU's measured tail, ``CpuHostEffects.logprob_tail``, or a GPU framework's head,
        ``framework_call``; 0: their bytes counted in the roofline, as without either). ``sp`` > 1: one GPU of a Ulysses
        group of ``sp`` (``flops.sequence_parallel``; no cached tokens), plus the group's all-to-alls
        (``CostModel._ulysses_comm_s``; ``ulysses`` False: without them, Megatron's context parallelism)."""
        w = self.shape.forward(n_tokens, n_seqs, cached_tokens if sp <= 1 else 0.0, logits_tokens, attn_pairs)
        if lp_tail:
            w = self._without_tail_bytes(w, logits_tokens)
        tokens, logits = n_tokens, logits_tokens
        if sp > 1:
            w = fl.sequence_parallel(w, self.shape.weight_bytes, sp)
            tokens, logits = n_tokens / sp, logits_tokens / sp
        total, active = self._roofline(w, tokens)
        comm = self.cost._tp_comm_s(self.m, self.dtype, tokens, self.tp, inter_node=self.inter_node, calls=self.allreduces)
        if sp > 1 and ulysses:
            comm = comm + self.cost._ulysses_comm_s(self.m, self.dtype, n_tokens, sp)
        if self.tail_row or self.tail0:   # a generation prefill's sampling of each row's first token
            total = total + self.tail0 + self.tail_row * n_seqs
        if lp_tail:
            after = lp_tail * logits * (self.m.vocab / self.tp)
            total, active = total + after, active + after
        return total + comm, active + comm

    def _roofline(self, w: fl.Work, tokens) -> tuple:
        """``roofline`` of ``w``; with kernel terms by shape, their efficiencies at ``tokens`` per call and this
        shard, the weights streamed at the GEMMs' efficiency, and the layers' kernel floors (``byshape``)."""
        ks = self.ks
        if ks is None:
            return roofline(w, self.p, self.peak, self.bw, self.tp)
        kernel = roofline_kernel_s(w.flops, ks.weight_equivalent_bytes(w.bytes, self.shape.weight_bytes), self.tp * self.peak,
                                   self.tp * self.bw, ks.compute_eff(tokens, self.shard), ks.weight_memory_eff) + self.floor
        return with_overheads_s(kernel, self.p, w.layers), kernel

    def marginal_s(self, n_tokens: float, n_seqs: float) -> float:
        """The device time ``n_tokens`` new tokens of ``n_seqs`` rows (their last tokens' logits) add to a step that
        streams the weights already (a prefill chunk inside a decode step, chunked prefill): the roofline of their
        work less the weight bytes, without the operation's overheads or the layers' kernel floors (the step pays
        those once)."""
        w = self.shape.forward(n_tokens, n_seqs, 0.0, n_seqs, None)
        rest = max(w.bytes - self.shape.weight_bytes, 0.0)
        ks = self.ks
        if ks is None:
            return roofline_kernel_s(w.flops, rest, self.tp * self.peak, self.tp * self.bw, self.p.compute_eff,
                                     self.p.memory_eff)
        return roofline_kernel_s(w.flops, ks.weight_equivalent_bytes(rest, 0.0), self.tp * self.peak, self.tp * self.bw,
                                 ks.compute_eff(n_tokens, self.shard), ks.weight_memory_eff)

    def _without_tail_bytes(self, w: fl.Work, logits_tokens) -> fl.Work:
        """``w`` less the bytes of the log-prob tail (``flops.TAIL_LOGIT_BYTES`` per logit): a measured tail is
        added after the roofline instead (the head's own write of its logits stays in it)."""
        return w._replace(bytes=w.bytes - fl.TAIL_LOGIT_BYTES * self.m.vocab * logits_tokens)


class _Decode:
    """The decode predictor (``CostModel.decoder``) of one (model, dtype, tp, runtime): the decode work's constants
    (``ShapeCoeffs.decode``) over the roofline's denominators, looked up once."""

    __slots__ = ("cost", "m", "dtype", "tp", "shape", "peak", "bw", "kv_b", "over", "tail0", "tail_row", "wp", "ws", "ks", "shard", "floor",
                 "cold", "hfloor", "cpu", "eh", "efloor", "inter_node", "par", "attn_peak")

    def __init__(self, cost: "CostModel", m: ModelShape, dtype: str, tp: int, runtime: str | None,
                 logprobs: bool = False, inter_node: bool = False, par: genparallel.GenLayout | None = None):
        p = cost.gen_params("decode", runtime)
        self.cost, self.m, self.dtype, self.tp, self.par = cost, m, dtype, tp, par
        self.inter_node = inter_node   # a TP group spanning NVLink domains (CostModel._tp_comm_s)
        self.shape = self._shape_of(m)
        self.peak = tp * cost.gpu.peak(dtype) * p.compute_eff
        self.bw = tp * cost.gpu.mem_bw * p.memory_eff
        # kernel terms by shape (rlhfsim.costs.byshape): the compute efficiency at each step's rows (in ``coeffs``), every
        # byte at the GEMMs' streaming efficiency, the layers' kernel floors added to both lines of the roofline
        ks = self.ks = cost.by_shape if cost.by_shape is not None and cost.by_shape.applies("decode") else None
        self.shard, self.floor = m.layer_params / tp, (ks.floor_s(m.layers) if ks is not None else 0.0)
        if ks is not None:
            self.peak, self.bw = tp * cost.gpu.peak(dtype), tp * cost.gpu.mem_bw * ks.weight_memory_eff
        # the attention's FLOPs under kernel terms by shape: at the GEMMs' sustained rate (e_max), not at the skinny
        # efficiency of the step's ``batch`` rows, which prices the linear layers' GEMMs (M = batch). A decode
        # attention kernel's matmuls run over the cached keys (thousands of rows a sequence), with the query heads of
        # a group packed beside them, so its rate does not fall with the batch; at GQA's arithmetic intensity (the
        # group size in FLOPs per KV byte, <= 8 in the catalog's GQA models) it is bound by reading the cache, as
        # FlashInfer's and FlashAttention's decode kernels are. Priced at the batch's rows, one sequence at 32k
        # tokens of Qwen2.5-0.5B took 0.86 ms more than at 128 tokens; vLLM with FA3 measured 0.19 ms (H100 PCIe,
        # vllm-project/vllm#53060; scenarios/examples/engine-check). None: the constant compute_eff prices both.
        self.attn_peak = tp * cost.gpu.peak(dtype) * ks.e_max if ks is not None else None
        # bytes per cached token per step: K and V read by attention, times the runtime's passes over
        # the cache (HF's DynamicCache re-concatenates it every step: rlhfsim.costs.genruntimes.KV_PASSES)
        self.kv_b = self.shape.kv_bytes * kv_passes(runtime, cost.generation)
        if par is not None and tp > 1:   # each GPU of a rank reads its share of the rank's cache (MLA's whole)
            self.kv_b = self.kv_b * tp / genparallel.kv_shards(m, tp)
        # a CPU's host effects (rlhfsim.costs.cpuhost; a GPU: none): the step's fixed work runs after the model's own
        # weights have swept the caches (the overheads and the sampling tail cost ``cold`` times their hot values at
        # its footprint), a step of >= 2 rows passes over the weights ``wp`` times at their footprint, and the weights
        # stream ``ws`` times slower than the fitted bandwidth where the footprint sweep measured them slower
        self.cpu, self.cold, self.wp, self.ws = cost.cpu, 1.0, 1.0, 1.0
        if cost.cpu is not None:
            self.cold, self.wp, self.ws = cost.cpu.decode_factors(
                self.shape.decode_weight_bytes, tp, cost.gpu.mem_bw * (p.memory_eff if ks is None else ks.weight_memory_eff))
        self.over = self.cold * (p.overhead_s + p.overhead_per_layer_s * m.layers)
        # an eager engine's launches overlap the device's work (OpParams.host_overlap): the per-layer host time
        # is a floor under the step's device time instead of an addition. It is folded into the compute line's
        # intercept (coeffs): exact at every step but for the attention FLOPs' growth cs x i, nanoseconds per
        # step; the floor then counts as the step's active time (a launch-bound step's gaps are not split out)
        self.hfloor = 0.0
        if p.host_overlap:
            self.over, self.hfloor = self.cold * p.overhead_s, self.cold * p.overhead_per_layer_s * m.layers
        # the sampling tail per step: sample_s + sample_per_logit_s x batch x vocab (measured,
        # calibrate.measuring.sampling; the fitted parameters above exclude it); ``logprobs``: the tail measured with the
        # executor's log-prob recorder where the runtime's plain tail lacks it (genruntimes.sample_tail)
        a, b = sample_tail(runtime, cost.generation, cost.own_gen_op("decode", runtime), logprobs)
        self.tail0, self.tail_row = self.cold * a, self.cold * b * m.vocab
        # the engine's host work per step (genruntimes.engine_host; None without its keys: priced as before them):
        # H(b) = step_s + per_seq_s b, ``overlap`` of it a floor under the step's device time (folded into the compute
        # line as the launch floor is), the rest serial (in the per-step overhead); a batch above the CUDA-graph limit
        # runs eagerly, its launch floor ``efloor`` the eager runtime's (overhead_per_layer_s x layers)
        eh = cost.engine_host(runtime)
        self.eh, self.efloor = (eh if eh.any else None), self.hfloor
        if eh.graph_max_batch is not None and eh.eager_runtime is not None:
            self.efloor = max(self.hfloor, self.cold * cost.gen_params("decode", eh.eager_runtime).overhead_per_layer_s * m.layers)

    def _shape_of(self, m: ModelShape) -> fl.ShapeCoeffs:
        """``m``'s decode constants, as one GPU of an expert-parallel engine reads them where ``par`` is set."""
        k = fl.ShapeCoeffs.of(m, self.dtype, "lm")
        return k if self.par is None else genparallel.decode_shape(k, m, self.par)

    def comm(self, batch):
        """A step's communication beside its kernels: the tensor-parallel all-reduces and, under expert parallelism
        without two-batch overlap, the expert all-to-alls (``genparallel``)."""
        par = self.par
        if par is None:
            return self.cost._tp_comm_s(self.m, self.dtype, batch, self.tp, inter_node=self.inter_node)
        ar = self.cost._tp_comm_s(self.m, self.dtype, batch, self.tp, inter_node=self.inter_node,
                                  calls=genparallel.allreduces(self.m, par))
        return ar if par.overlap else ar + self.alltoall(batch)

    def alltoall(self, batch):
        """The step's expert all-to-alls (gen_ep_alltoall before any overlap; 0 without expert parallelism)."""
        if self.par is None:
            return 0.0
        return genparallel.alltoall_s(self.cost, self.m, self.dtype, batch, self.par)

    def launch_floor(self, batch):
        """The launch floor under a step of ``batch`` rows (an array: elementwise): the runtime's own (an eager engine's
        per-layer launches), or the eager runtime's where ``batch`` is above the CUDA-graph limit."""
        g = self.eh.graph_max_batch if self.eh is not None else None
        if g is None:
            return self.hfloor
        if isinstance(batch, np.ndarray):
            return np.where(batch > g, self.efloor, self.hfloor)
        return self.efloor if batch > g else self.hfloor

    def host(self, batch) -> tuple:
        """(serial, hidden): the engine's host work per step of ``batch`` rows (``H(b)``, genruntimes.engine_host) less
        the share hidden behind the device, and that share; (0, 0) without the keys."""
        eh = self.eh
        if eh is None:
            return 0.0, 0.0
        h = eh.step_s + eh.per_seq_s * batch
        return (1.0 - eh.overlap) * h, eh.overlap * h

    def _lines(self, batch, kv0, plain: bool = False, shape: fl.ShapeCoeffs | None = None):
        """(c0, cs, u0, us): F_dec(kv0 + batch i) / peak and B_dec(kv0 + batch i) / bw, linear in the step i.
        ``plain``: the weights streamed once at the fitted bandwidth, as without a CPU's GEMM passes by footprint
        (``terms``); ``shape``: another shape's constants (an MoE model's without its router: ``moe.split_decode``)."""
        k, peak, bw, kv_b = self.shape if shape is None else shape, self.peak, self.bw, self.kv_b
        if self.ks is not None:   # the GEMMs at the batch's rows, the attention at its own rate (``attn_peak``)
            peak, ap = peak * self.ks.compute_eff(batch, self.shard), self.attn_peak
            c0 = (k.f_linear * batch + k.f_head * batch) / peak + k.f_attn * kv0 / ap + self.floor
            cs = k.f_attn * batch / ap
        else:
            c0 = (k.f_linear * batch + k.f_head * batch + k.f_attn * kv0) / peak + self.floor
            cs = k.f_attn * batch / peak
        weights = k.decode_weights_at(batch) if self.cpu is None or plain else \
            self.cpu.decode_weight_bytes(k, batch, self.wp, self.ws)
        u0 = (weights + k.logit_bytes * batch + kv_b * kv0) / bw + self.floor
        return c0, cs, u0, kv_b * batch / bw

    def price(self, batch: int, kv0: float, n: int, overhead_s: float | None = None, extra_s: float = 0.0,
              extra_term: CostTerm = LEFT_PADDING) -> Price:
        """``n`` decode steps of ``batch`` rows from ``kv0`` cached tokens, the cache growing by ``batch`` a step:
        ``decode_sum`` of ``coeffs`` (``overhead_s``: the engine's per-step overhead, None: the runtime's; ``extra_s``
        added to every step: a padded static batch's padding or a chunked prefill's chunk, term ``extra_term``), and the
        same seconds by cost term (``_terms``)."""
        c = self.coeffs(batch, kv0, overhead_s)
        if extra_s:
            c = (*c[:4], c[4] + extra_s)
        total, active = decode_sum(c, n)
        return Price(total, active, partial(self._terms, batch, kv0, n, overhead_s, extra_s, extra_term, c, total))

    def _terms(self, batch: int, kv0: float, n: int, overhead_s: float | None, extra_s: float, extra_term: CostTerm,
               c: tuple, total: float) -> dict[CostTerm, float]:
        """``price``'s steps by cost term, summed over the steps in closed form (``c`` the coefficients it priced,
        ``total`` its price; the terms sum to it, the rounding put in decode_kernels): decode_kernels, engine_step,
        sampling_tail, host_launch_bound (the launch floor beyond the kernels), engine_host (where the profile has
        the engine's host work per step), ``extra_term``; a CPU's host effects split out of them
        (``CpuHostEffects.decode_terms``). A floor is folded into the compute line as ``coeffs`` folds it: exact at
        every step but for the attention FLOPs' growth, and exact for one step."""
        if n <= 0:
            return {}
        c0, cs, u0, us = self._lines(batch, kv0)
        kern = _sum_max_linear(c0, cs, u0, us, n)
        comm = self.comm(batch)
        over = self.over if overhead_s is None else overhead_s
        priced = _sum_max_linear(c[0], c[1], c[2], c[3], n)   # the steps' device time under the floors folded into c0
        # the floors below are counted from the kernels, or, under two-batch overlap, from the kernels with the expert
        # all-to-alls as a floor under them (the all-to-alls' exposed part, term gen_ep_alltoall)
        base0, base = c0, kern
        a2a = 0.0
        if self.par is not None:
            if self.par.overlap:
                base0 = max(c0, self.alltoall(batch))
                base = _sum_max_linear(base0, cs, u0, us, n)
                a2a = base - kern
            else:   # out of the step's communication
                a2a = n * self.alltoall(batch)
                comm = comm - self.alltoall(batch)
        out = {DECODE_KERNELS: kern + (0.0 if self.inter_node else n * comm), ENGINE_STEP: n * over,
               SAMPLING_TAIL: n * (self.tail0 + self.tail_row * batch), HOST_LAUNCH_BOUND: priced - base}
        if extra_s:
            out[extra_term] = n * extra_s
        if self.inter_node:   # the all-reduces across nodes, a term of their own
            out[TP_INTER_NODE] = n * comm
        if self.par is not None:
            out[GEN_EP_ALLTOALL] = a2a
        lf = self.launch_floor(batch)
        if self.eh is not None:   # the engine's host work: its serial part, and its hidden part beyond device and launches
            serial, _ = self.host(batch)
            launched = _sum_max_linear(max(base0, lf), cs, u0, us, n)
            out[HOST_LAUNCH_BOUND] = launched - base
            out[ENGINE_HOST] = n * serial + (priced - launched)
        if self.cpu is not None:   # the launch floor's hot value: the floor less its cold factor, beyond the kernels
            p0, _, pu0, pus = self._lines(batch, kv0, plain=True)
            hot = _sum_max_linear(max(c0, lf / self.cold), cs, u0, us, n) - kern if lf else 0.0
            self.cpu.decode_terms(out, kern, _sum_max_linear(p0, cs, pu0, pus, n), n * comm, self.cold, hot,
                                  engine_cold=overhead_s is None)
        if moe.priced(self.m):   # a mixture-of-experts model's router and expert imbalance, out of decode_kernels
            moe.split_decode(out, kern, lambda s: _sum_max_linear(
                *self._lines(batch, kv0, shape=self._shape_of(s)), n), self.m)
        out[DECODE_KERNELS] += total - sum(out.values())   # rounding: the terms sum to the price
        return out

    def coeffs(self, batch, kv0, overhead_s: float | None = None):
        c0, cs, u0, us = self._lines(batch, kv0)
        step_over = (self.over if overhead_s is None else overhead_s) + self.tail0 + self.tail_row * batch
        if self.eh is not None:   # the launch floor (past the graph limit: the eager one) or the hidden host work
            serial, hidden = self.host(batch)
            floor = self.launch_floor(batch)
            if isinstance(c0, np.ndarray):
                c0 = np.maximum(c0, np.maximum(floor, hidden))
            else:
                c0 = max(c0, floor, hidden)
            step_over = step_over + serial
        elif self.hfloor:
            c0 = np.maximum(c0, self.hfloor) if isinstance(c0, np.ndarray) else max(c0, self.hfloor)
        if self.par is not None and self.par.overlap:   # two-batch overlap: the all-to-alls a floor under the device
            a2a = self.alltoall(batch)
            c0 = np.maximum(c0, a2a) if isinstance(c0, np.ndarray) else max(c0, a2a)
        if self.par is None:   # (the simulator's innermost path: the all-reduces without a call more)
            return c0, cs, u0, us, step_over + self.cost._tp_comm_s(self.m, self.dtype, batch, self.tp,
                                                                     inter_node=self.inter_node)
        return c0, cs, u0, us, step_over + self.comm(batch)


def with_stack_rate(doc: dict, gpu: GpuSpec) -> dict:
    """A profile priced on ``gpu``: its efficiencies are stated for the GPU its ``gpu`` field names (``any``, a
    derived profile: an H100 SXM under CUDA; ``catalog.stated_gpu``), and every operation's compute_eff is carried
    from there to ``gpu`` (``catalog.carried_compute_eff``: the GEMMs at each GPU stack's sustained rate,
    ``catalog.stack_factor``, MI300X under ROCm 6.3 0.64; the rest of a pass at the speed of the GPU's memory,
    ``catalog.balance_ratio`` of the two GPUs), the provenance saying so. One rule for every profile: the derived
    ``default``, a family's fitted profile (``h100-sxm`` priced for an H200 or a GH200), a measured one. The
    operations that kernel terms by shape price (``kernels_by_shape``) do not read compute_eff, so carrying it
    changes nothing there. A CPU device or a CPU profile, and the GPU the profile is stated for, as it is."""
    stated = doc.get("gpu", "any")
    ref = stated_gpu(stated)
    if ref is None and stated != "cpu":
        raise ProfileError(f"profile {doc.get('name')}.gpu: expected 'any', 'cpu' or a GPU of the catalog "
                           f"(rlhfsim gpus), got {stated!r}")
    if ref is None or gpu.kind == "cpu":
        return doc
    f, r = stack_factor(gpu.name) / stack_factor(ref), balance_ratio(gpu.name, ref)
    if f == 1.0 and r == 1.0:
        return doc
    ops = carried_operations(doc["operations"], ref, gpu.name)
    prov = {**doc["provenance"], "source": f"{doc['provenance'].get('source')}: compute efficiencies stated for "
            f"{ref} carried to {gpu.name} (stack x{f:.2f}, compute-to-bandwidth balance x{r:.2f} {ref}'s; "
            f"catalog.carried_compute_eff)"}
    return {**doc, "operations": ops, "provenance": prov}


class CostModel:
    """Costs of an RLHF step's operations on one device type, parameterized by a Profile.

    This is the interface the simulator calls; a profile from ``rlhfsim calibrate`` plugs in by giving
    fitted parameters. ``runtime`` selects a scoring runtime's parameters (``score:RUNTIME`` in the
    profile); without one, scoring uses the ``prefill`` parameters.
    """

    def __init__(self, gpu: GpuSpec, profile: dict):
        self.gpu = gpu
        # the profile as given (a CostModel rebuilt from it, as the interval's draws do, prices the same)
        self.profile = profile
        # every host-side term read through one factor: the GPU's server CPU against the profile's reference host
        # (rlhfsim.costs.hostscale); the sections below are read from the scaled copy
        self.host_factor = host_factor(gpu, profile)
        profile = scaled_profile(profile, self.host_factor)
        self.ops = {op: OpParams.from_dict(d) for op, d in profile["operations"].items()}
        self.generation = profile.get("generation", {})
        # the CPU host effects (rlhfsim.costs.cpuhost): None unless this device is a CPU whose profile measured any
        self.cpu = CpuHostEffects.of(profile, gpu.kind)
        # GPU kernel terms by shape and fitted collectives (calibrate.fitting.fromops, rlhfsim.costs.byshape; None and {}:
        # the constant efficiencies and LINK_EFF / LINK_LATENCY_S)
        self.by_shape = ShapeKernels.of(profile)
        self.collectives = profile.get("collectives") or {}
        # the host's dispatch per layer of a framework's forward and training calls (GPU profiles; None: CPU,
        # where the fitted operations hold the host's time already): rlhfsim.costs.framework
        self.host = fw.FrameworkHost.of(profile)
        step = profile.get("step") or {}
        # Framework step scalars (rlhfsim.costs.stepcosts): the profile's where measured, else defaults.
        self.step = {k: (float(step[k]) if step.get(k) is not None else STEP_DEFAULTS[k])
                     * (self.host_factor if k in HOST_STEP_SCALARS else 1.0) for k in STEP_SCALARS}
        self.step_sources = {k: "profile" if step.get(k) is not None else "default" for k in STEP_SCALARS}
        self.adv_costs = driver.AdvantageCosts(**{k: self.step[k] for k in driver.ADV_SCALARS})
        inter = profile.get("interference", {})
        self.decode_slowdown = float(inter.get("decode_slowdown", 1.0))
        self.prefill_slowdown = float(inter.get("prefill_slowdown", 1.0))
        # Measured in the hand-over pattern per generation runtime (calibrate.cpu.corun), where the profile has it.
        self.handover = inter.get("handover") or {}
        # Constants per (model, dtype, ...): computed on first use, then reused (the profile is fixed).
        self._forward: dict[tuple, _Forward] = {}
        self._decode: dict[tuple, _Decode] = {}
        self._shapes: dict[tuple, tuple[fl.ShapeCoeffs, float]] = {}

    @classmethod
    def load(cls, gpu: GpuSpec, profile_ref: str | None = None) -> "CostModel":
        if profile_ref is None:
            # A measured CPU profile ships with the package. A GPU gets its bundled profile fitted to the public record
            # (``--profile auto``: its kernel terms from public per-operation data and the terms fitted to the public
            # runs' logs), which held out by source predicts the field table no worse than the datasheet-derived
            # ``default`` (docs/accuracy.md, "GPU: public runs"); ``--profile default`` still chooses that.
            bundled_cpu = BUNDLED_DIR / "cpu.json"
            if gpu.kind == "cpu":
                profile_ref = str(bundled_cpu) if bundled_cpu.is_file() else DEFAULT_PROFILE
            else:
                profile_ref = AUTO_PROFILE
        if profile_ref == AUTO_PROFILE:
            # the GPU's bundled profile fitted from public per-operation data (profile.default_profile_for)
            doc = load_profile(default_profile_for(gpu.name))
            if doc["gpu"] not in ("any", gpu.name):   # another GPU's curves, as fractions of this GPU's peaks: say so
                doc["provenance"] = {**doc["provenance"], "source": f"{doc['provenance'].get('source')}: {doc['gpu']}'s "
                                     f"kernel curves on {gpu.name}'s datasheet peaks"}
            return cls(gpu, with_stack_rate(doc, gpu))
        return cls(gpu, with_stack_rate(load_profile(profile_ref), gpu))

    @property
    def name(self) -> str:
        return self.profile["name"]

    @property
    def page_faults(self) -> dict | None:
        """A CPU profile's ``kernels.page_faults`` (``rlhfsim.costs.cpuhost``); None on a GPU or without them."""
        return self.cpu.page_faults if self.cpu is not None else None

    def corun_factors(self, gen_runtime: str | None, actor: ModelShape | None = None,
                      reward: ModelShape | None = None) -> tuple[float, float, str]:
        """(decode slowdown, chunk-call slowdown, window) of intra-step scoring beside generation with
        ``gen_runtime`` on shared devices. Measured in the hand-over pattern for that runtime
        (``interference.handover``): its window is ``live``, the whole time a scorer is live beside
        generation (from the step's first hand-over to its drain), the window it was measured over.
        The configurations used: those of the measured actor nearest to ``actor`` in parameter count
        (log scale; the actor itself when measured: the smaller the model, the larger the share of
        host work and thread wake-ups the scorer disturbs), with ``reward`` as the scorer when measured
        beside it, else all of that actor's; their medians. Without model sizes in the configurations,
        the runtime's medians. Otherwise the busy-loop slowdowns, window ``overlap``: decode slows only
        while a call runs."""
        h = self.handover.get(gen_runtime)
        if h is None:
            return self.decode_slowdown, self.prefill_slowdown, "overlap"
        configs = h.get("configs", [])
        sizes = {c["model"]: c["model_params"] for c in configs if c["side"] == "decode" and c.get("model_params")}
        if actor is None or not sizes:
            return float(h["decode_slowdown"]), float(h["prefill_slowdown"]), "live"
        target = math.log(actor.params())
        near = min(sorted(sizes), key=lambda m: (m != actor.name, abs(math.log(sizes[m]) - target)))
        dec = [c for c in configs if c["side"] == "decode" and c["model"] == near]
        pre = [c for c in configs if c["side"] == "prefill" and c["partner"] == near]
        rname = reward.name if reward is not None else None
        if any(c["partner"] == rname for c in dec) and any(c["model"] == rname for c in pre):
            dec = [c for c in dec if c["partner"] == rname]
            pre = [c for c in pre if c["model"] == rname]
        if not dec or not pre:
            return float(h["decode_slowdown"]), float(h["prefill_slowdown"]), "live"
        return (float(np.median([c["slowdown"] for c in dec])), float(np.median([c["slowdown"] for c in pre])), "live")

    def corun_added(self, gen_runtime: str | None, actor: ModelShape | None,
                    reward: ModelShape | None) -> tuple[float, float, float, float] | None:
        """(decode multiplier, decode seconds added per step, chunk-call multiplier, seconds added per chunk
        call) of intra-step scoring beside generation with ``gen_runtime``, window ``live``, from the
        profile's fit of the time the hand-over pattern adds (``interference.handover.RT.added``,
        ``calibrate.fitting.assemble.handover_added_fit``): an operation of time t alone beside a live scorer
        takes ``t (1 + per_alone) + const_s + per_layer_s x L``, L the layers of the actor (a decode
        step) or of the reward model (a chunk call). None where the profile has no such fit for the
        runtime, or without the models: ``corun_factors`` then."""
        h = self.handover.get(gen_runtime)
        added = h.get("added") if isinstance(h, dict) else None
        if not added or actor is None or reward is None:
            return None
        d, p = added["decode"], added["prefill"]
        return (1.0 + float(d["per_alone"]), float(d["const_s"]) + float(d["per_layer_s"]) * actor.layers,
                1.0 + float(p["per_alone"]), float(p["const_s"]) + float(p["per_layer_s"]) * reward.layers)

    def corun_overlap(self, gen_runtime: str | None, actor: ModelShape | None,
                      reward: ModelShape | None) -> tuple[float, float] | None:
        """(idle_x, busy_x): how much slower the actor decodes beside a live scorer that waits and beside one
        that computes a call, measured in the hand-over pattern for ``gen_runtime`` with each decode step's
        overlap with the scorer's calls (``interference.handover.RT.overlap``, ``calibrate.cpu.corun.overlap_fit``).
        ``busy_x`` is ``idle_x / (1 - lost)`` with ``lost``, the share of a call's time the actor loses, at
        the actor's size on the profile's line (``lost``, ``calibrate.fitting.assemble.handover_overlap``; held
        within [0, OVERLAP_LOST_MAX]), else the configurations' median. A ``generate()`` runtime's fit is over
        the decode steps inside its calls (``calibrate.cpu.corun.call_steps``). None where the profile has no such
        fit for the runtime (a GPU; a profile whose ``generate()`` calls were stamped whole, not per decode step,
        for a ``generate()`` runtime), or without a reward model; decode then follows ``corun``."""
        h = self.handover.get(gen_runtime)
        ov = h.get("overlap") if isinstance(h, dict) else None
        if not ov or reward is None:
            return None
        idle = float(ov["idle_x"])
        line = ov.get("lost")
        if line and actor is not None:
            lost = float(line["intercept"]) + float(line["per_log_params"]) * math.log(actor.params())
            return idle, idle / (1.0 - min(max(lost, 0.0), OVERLAP_LOST_MAX))
        return idle, float(ov["busy_x"])

    def corun(self, gen_runtime: str | None, actor: ModelShape | None,
              reward: ModelShape | None) -> tuple[float, float, float, float, str]:
        """(decode factor, decode seconds added per step, chunk-call factor, seconds added per chunk call,
        window) of intra-step scoring beside generation: ``corun_added`` where the profile fitted the
        added time, else ``corun_factors`` with nothing added. The one choice the simulator
        (``Simulation``) and the validation's report (``calibrate.validation.compare.scoring_operations``) share."""
        added = self.corun_added(gen_runtime, actor, reward)
        if added is not None:
            return (*added, "live")
        dec, pre, window = self.corun_factors(gen_runtime, actor, reward)
        return dec, 0.0, pre, 0.0, window

    @property
    def runtimes(self) -> list[str]:
        return sorted(op.split(":", 1)[1] for op in self.ops if op.startswith("score:"))

    # -- generation runtimes (rlhfsim.costs.genruntimes) ---------------------------------------------
    def has_gen_runtime(self, runtime: str) -> bool:
        """Does the profile price ``runtime``'s prefill and decode with costs of its own (or of the runtime it is
        priced as, ``genruntimes.PRICED_AS``)?"""
        return self.own_gen_op("prefill", runtime) and self.own_gen_op("decode", runtime)

    def own_gen_op(self, op: str, runtime: str | None) -> bool:
        """Does ``op`` (prefill or decode) of ``runtime`` have an operation of its own in the profile (its own, or that
        of the runtime it is priced as)?"""
        return any(op_key(op, name) in self.ops for name in pricing_names(runtime))

    def gen_params(self, op: str, runtime: str | None) -> OpParams:
        """``prefill``/``decode`` parameters of a generation runtime (or of the runtime it is priced as,
        ``genruntimes.PRICED_AS``); the plain operation (our own decoder) when the profile has none for it."""
        for name in pricing_names(runtime):
            if op_key(op, name) in self.ops:
                return self.ops[op_key(op, name)]
        return self.ops[op]

    def gen_scalar(self, runtime: str | None, key: str) -> float:
        """A generation runtime's scalar (``GEN_SCALARS``: ``call_overhead_s``, ``handoff_s``,
        ``handoff_per_row_s``, ``pad_step_s``, ``pad_step_per_row_s``, ``pad_prefill_s``), its own or that of the runtime
        it is priced as (``genruntimes.PRICED_AS``); 0 when the profile has no value for the key."""
        assert key in GEN_SCALARS, key
        for name in pricing_names(runtime):
            info = self.generation.get(name)
            if isinstance(info, dict) and info.get(key) is not None:
                return float(info[key])
        return 0.0

    def engine_host(self, runtime: str | None) -> EngineHost:
        """``runtime``'s engine host work per step and CUDA-graph limit (``genruntimes.engine_host``; all zero without
        the profile's keys)."""
        return engine_host(runtime, self.generation)

    def handoff_s(self, runtime: str | None, rows: int) -> float:
        """The actor's pause at one chunk boundary (streaming ``rows`` rows' new tokens downstream)."""
        if rows <= 0:
            return 0.0
        return self.gen_scalar(runtime, "handoff_s") + rows * self.gen_scalar(runtime, "handoff_per_row_s")

    def pad_step_s(self, runtime: str | None, rows: int) -> float:
        """What left padding adds to one decode step of a static batch of ``rows`` rows whose contexts
        differ (HF ``generate`` applies the padding mask at every step; measured, ``calibrate.measuring.genbench``
        ``pad`` points); 0 for a runtime whose profile has no such term (``kv_decoder``: its steps always
        apply a mask, which its calibrated steps include)."""
        if rows <= 1:
            return 0.0
        return self.gen_scalar(runtime, "pad_step_s") + rows * self.gen_scalar(runtime, "pad_step_per_row_s")

    def pad_prefill_s(self, runtime: str | None) -> float:
        """What left padding adds to the prefill call of a static batch whose rows' contexts differ."""
        return self.gen_scalar(runtime, "pad_prefill_s")

    def call_overhead_s(self, runtime: str | None) -> float:
        """The fixed host cost of one ``generate()`` call of a static-batch runtime."""
        return self.gen_scalar(runtime, "call_overhead_s")

    def params(self, op: str, runtime: str | None = None) -> OpParams:
        if runtime is not None:
            key = f"score:{runtime}"
            if key not in self.ops:
                raise KeyError(f"profile {self.name!r} has no scoring runtime {runtime!r} (has: {', '.join(self.runtimes) or 'none'})")
            return self.ops[key]
        return self.ops[op]

    # -- communication -------------------------------------------------------------------------------
    def link_bw(self, inter_node: bool = False) -> float:
        return (self.gpu.inter_node_bw if inter_node else self.gpu.intra_node_bw) * LINK_EFF

    def allreduce_s(self, n_bytes: float, n: int, inter_node: bool = False) -> float:
        if n <= 1:
            return 0.0
        return fl.allreduce_bytes(n_bytes, n) / self.link_bw(inter_node) + LINK_LATENCY_S

    def transfer_s(self, n_bytes: float, inter_node: bool = False) -> float:
        return n_bytes / self.link_bw(inter_node) + LINK_LATENCY_S

    def _tp_comm_s(self, m: ModelShape, dtype: str, n_tokens: float, tp: int, passes: int = 1,
                   inter_node: bool = False, calls: int | None = None) -> float:
        """Tensor-parallel all-reduces of ``n_tokens`` tokens: two per layer per pass, each the fitted latency plus its
        bytes over the bus bandwidth (the link constants without a fit), and never under the measured time of a
        small message (``collectives.all_reduce.by_workers.N.small_message_s``, ``byshape.allreduce_floor``).
        ``inter_node``: a TP group spanning NVLink domains (a generation engine beyond a node; cost term
        tp_inter_node): each call an inter-node all-reduce's small-message time (``INTER_NODE_ALLREDUCE_S``) plus
        its bytes over the inter-node link (the profile's fit is of calls within a node)."""
        if tp <= 1:
            return 0.0
        nbytes = fl.tp_allreduce_bytes(m, dtype, n_tokens, tp, passes)
        if calls is not None:   # fewer all-reduces per pass than Megatron's two per layer (genparallel.allreduces)
            nbytes, calls = nbytes * calls / (2 * m.layers), calls * passes
        else:
            calls = 2 * m.layers * passes
        if inter_node:
            return nbytes / self.link_bw(True) + calls * INTER_NODE_ALLREDUCE_S
        fitted = allreduce_terms(self.collectives, tp)   # (latency_s, bus_bw) fitted per worker count, else None
        lat, bw = fitted if fitted is not None else (LINK_LATENCY_S, self.link_bw())
        floor = allreduce_floor(self.collectives, tp)
        if floor:   # (elementwise where the decode's batch is an array: the detached clock's segments at once)
            small = lat + nbytes / calls / bw < floor
            if isinstance(small, np.ndarray):
                return np.where(small, calls * floor, nbytes / bw + calls * lat)
            if small:
                return calls * floor
        return nbytes / bw + calls * lat

    def _ulysses_comm_s(self, m: ModelShape, dtype: str, n_tokens: float, sp: int, passes: int = 1) -> float:
        """Ulysses' all-to-alls within a node: ``flops.ulysses_bytes`` over the link, 10 us per call
        (4 per layer per pass)."""
        if sp <= 1:
            return 0.0
        return fl.ulysses_bytes(m, dtype, n_tokens, sp, passes) / self.link_bw() + 4 * m.layers * passes * LINK_LATENCY_S

    # -- operations: one predictor each, returning its Price (total_s, active_s, terms(): rlhfsim.costs.terms) ------
    def forward(self, m: ModelShape, dtype: str, n_tokens, n_seqs: float, tp: int = 1, cached_tokens: float = 0.0,
                op: str = "prefill", runtime: str | None = None, head: str = "value", all_logits: bool = False,
                gen_runtime: str | None = None, attn_pairs: float | None = None, sp: int = 1,
                gen_logprobs: bool = False, head_s_per_logit: float | None = None, ulysses: bool = True,
                tp_inter_node: bool = False, par: genparallel.GenLayout | None = None, a2a: bool = True) -> Price:
        """A forward pass over ``n_tokens`` new tokens in ``n_seqs`` sequences (generation prefill,
        scoring, reference/critic passes), attending also to ``cached_tokens`` cached tokens. With an LM
        head, the logits of each sequence's last token (a generation prefill) or, with ``all_logits``, of
        every token (a log-prob pass: the reference model scores every response token). ``runtime``: a
        scoring runtime (``score:RUNTIME``); ``gen_runtime``: a generation runtime's prefill costs (with
        ``gen_logprobs``: its sampled token's log-prob recorded, ``genruntimes.sample_tail``). ``attn_pairs``:
        attention's (query, key) pairs of rows packed without padding (``ShapeCoeffs.forward``); ``sp``: one GPU
        of a Ulysses sequence-parallel group of that size (``_Forward.parts``; no cached tokens);
        ``head_s_per_logit``: a log-prob pass's head priced after the roofline at this many seconds per logit
        instead of the profile's measured tail (``framework_call``); ``ulysses`` False: ``sp`` is Megatron's context
        parallelism (no all-to-alls); ``tp_inter_node``: the TP group spans NVLink domains (a generation engine's prefill
        beyond a node), its all-reduces the term tp_inter_node, out of kernels; ``par``: one GPU of an expert-parallel
        engine, its tokens' all-to-alls the term gen_ep_alltoall (``a2a`` False: the price without them, as the MoE
        effects' split of the rest prices it).

        The active share is the roofline's kernels (``roofline``); the terms are kernels and op_overhead
        and, on a CPU, the host effects priced inside them (``CpuHostEffects.forward_effects``). ``n_tokens`` may
        be a list or numpy array of counts (each > 0; no ``attn_pairs``, ``sp`` 1): each entry's price, the same
        arithmetic elementwise, so each equals the scalar call bit for bit (an engine's prefills at once)."""
        if isinstance(n_tokens, (list, tuple)):
            n_tokens = np.asarray(n_tokens, dtype=np.float64)
        if not isinstance(n_tokens, np.ndarray) and n_tokens <= 0:
            return Price(0.0, 0.0)
        logits = (n_tokens if all_logits else n_seqs) if head == "lm" else 0.0
        k = self._forward_kernel(m, dtype, tp, op, runtime, head, gen_runtime, gen_logprobs, tp_inter_node, par)
        logprob = all_logits and head == "lm"   # a log-prob pass: every position's logits
        lp = 0.0   # a log-prob head priced after the roofline, seconds per logit: a GPU framework's, a CPU's measured tail
        if logprob and head_s_per_logit is not None:
            lp = head_s_per_logit
        elif logprob and self.cpu is not None:
            lp = self.cpu.logprob_tail
        total, active = k.parts(n_tokens, n_seqs, cached_tokens, logits, attn_pairs, lp, sp, ulysses)
        if self.cpu is None:
            price = Price(total, active)
            if moe.priced(m):   # the router and expert imbalance split out of kernels (rlhfsim.costs.moe)
                # (the router and imbalance of the forward less its all-to-alls, which are a term of their own below)
                price = Price(total, active, partial(with_effects, total, active, moe.effects,
                                                     partial(self.forward, a2a=False), m, dtype,
                                                     n_tokens, n_seqs, tp, cached_tokens, op, runtime, head, all_logits,
                                                     gen_runtime, attn_pairs, sp, gen_logprobs, head_s_per_logit,
                                                     ulysses, tp_inter_node, par))
            if tp_inter_node and tp > 1:   # the all-reduces across nodes out of kernels, a term of their own
                comm = self._tp_comm_s(m, dtype, n_tokens / sp, tp, inter_node=True, calls=k.allreduces)
                price = Price(total, active, partial(moved, price, KERNELS, TP_INTER_NODE, comm))
            if par is not None and a2a:   # an expert-parallel engine's prefill: its tokens' all-to-alls (genparallel)
                sent = genparallel.alltoall_s(self, m, dtype, n_tokens, par)
                return price.add(GEN_EP_ALLTOALL, sent, sent)
            return price
        if logprob and self.cpu.page_faults:
            # a log-prob pass's logits-sized tensors, faulted in when above the allocator's threshold
            total = total + self.cpu.fault_s(n_tokens / sp, m.vocab / tp, "logprob_forward")
        return Price(total, active, partial(with_effects, total, active, self.cpu.forward_effects, self, m, dtype,
                                            n_tokens, n_seqs, tp, cached_tokens, op, runtime, head, all_logits,
                                            gen_runtime, attn_pairs, sp, gen_logprobs, head_s_per_logit))

    # -- an engine's prefill steps (the continuous engine's token budget; docs/cost-model.md "Generation runtimes") --
    def prefill_step(self, m: ModelShape, dtype: str, n_tokens: float, n_rows: int, tp: int = 1,
                     runtime: str | None = None, logprobs: bool = False, tp_inter_node: bool = False,
                     par: genparallel.GenLayout | None = None) -> Price:
        """One engine step that prefills ``n_tokens`` tokens of ``n_rows`` rows: the runtime's prefill forward
        (``forward``) and the engine's host work for the step's rows (``engine_host``: H(rows), its hidden share a
        floor under the forward's device time). Terms: the forward's and engine_host."""
        fwd = self.forward(m, dtype, n_tokens, n_rows, tp, op="prefill", head="lm", gen_runtime=runtime,
                           gen_logprobs=logprobs, tp_inter_node=tp_inter_node, par=par)
        host = self._step_host(runtime, n_rows, fwd.active_s)
        return fwd.add(ENGINE_HOST, host) if host else Price(fwd.total_s + host, fwd.active_s, fwd.why)

    def _step_host(self, runtime: str | None, rows: int, device_s: float) -> float:
        """The engine's host work a step of ``rows`` rows adds beyond ``device_s`` of device time:
        (1 - overlap) H(rows) + max(overlap H(rows) - device_s, 0) (``genruntimes.engine_host``; 0 without its keys)."""
        eh = self.engine_host(runtime)
        if not eh.any:
            return 0.0
        h = eh.step_s + eh.per_seq_s * rows
        return (1.0 - eh.overlap) * h + max(eh.overlap * h - device_s, 0.0)

    def chunk_in_step_s(self, m: ModelShape, dtype: str, n_tokens: float, n_rows: int, tp: int = 1,
                        runtime: str | None = None, logprobs: bool = False, tp_inter_node: bool = False,
                        par: genparallel.GenLayout | None = None) -> float:
        """What a prefill chunk of ``n_tokens`` tokens of ``n_rows`` rows adds to a decode step that carries it (chunked
        prefill): its work beyond the step's weight reads (``_Forward.marginal_s``), its tensor-parallel all-reduces,
        and its rows' share of the engine's host work (the serial part of ``step_host_per_seq_s`` x rows)."""
        if n_tokens <= 0:
            return 0.0
        k = self._forward_kernel(m, dtype, tp, "prefill", None, "lm", runtime, logprobs, par=par)
        eh = self.engine_host(runtime)
        a2a = genparallel.alltoall_s(self, m, dtype, n_tokens, par) if par is not None else 0.0
        # an expert-parallel engine: its all-reduces (k.allreduces) and the chunk's all-to-alls (genparallel)
        return k.marginal_s(n_tokens, n_rows) + self._tp_comm_s(m, dtype, n_tokens, tp, inter_node=tp_inter_node,
                                                                 calls=k.allreduces) + \
            a2a + (1.0 - eh.overlap) * eh.per_seq_s * n_rows

    def _forward_kernel(self, m, dtype, tp, op, runtime, head, gen_runtime, gen_logprobs: bool = False,
                        inter_node: bool = False, par: genparallel.GenLayout | None = None) -> _Forward:
        key = (m, dtype, tp, op, runtime, head, gen_runtime, gen_logprobs, inter_node, par)
        k = self._forward.get(key)
        if k is None:
            if runtime is not None and m.arch == "encoder" and op_key("encode", runtime) in self.ops:
                p = self.ops[op_key("encode", runtime)]   # an encoder's own family fit (calibrate.fitting.assemble)
            elif gen_runtime is not None and runtime is None:
                p = self.gen_params(op, gen_runtime)
            else:
                p = self.params(op, runtime)
            tail = (0.0, 0.0)
            if gen_runtime is not None and runtime is None and op == "prefill" and head == "lm":
                tail = sample_tail(gen_runtime, self.generation, self.own_gen_op("prefill", gen_runtime), gen_logprobs)
            # the runtime a scoring pass runs under (a DeBERTa-v2 pass's score-matrix traffic depends on it)
            scoring = runtime if runtime is not None else (op.split(":", 1)[1] if op.startswith("reencode:") else None)
            ks = self.by_shape if self.by_shape is not None and self.by_shape.applies(op) else None
            k = self._forward[key] = _Forward(self, m, dtype, head, tp, p, tail, scoring, ks, inter_node, par)
        return k

    def chunk_prefill(self, m: ModelShape, dtype: str, chunk_tokens: float, n_seqs: float, prefix_tokens: float,
                      tp: int = 1, head: str = "value") -> Price:
        """Incremental scoring: prefill ``chunk_tokens`` new tokens on top of ``prefix_tokens`` cached
        (``head="lm"``: a streamed reference model, log-probs of every new token); a ``forward``."""
        return self.forward(m, dtype, chunk_tokens, n_seqs, tp, prefix_tokens, op="chunk_prefill", head=head,
                            all_logits=head == "lm")

    def rescore(self, m: ModelShape, dtype: str, n_tokens: float, n_seqs: float, tp: int = 1,
                runtime: str | None = None) -> Price:
        """Scoring ``n_seqs`` whole sequences of ``n_tokens`` tokens in all from scratch, no cache (streaming
        ``reencode``: one pass over the prefix so far; ``final_only``: one pass over the finished response). An
        encoder reward model is priced with the profile's ``reencode:RUNTIME`` fit when it has one (batch-1 passes
        over a growing prefix of encoder reward models, ``calibrate.rescore``); otherwise, and for decoders, as the
        reward model's full forward pass is (``score:RUNTIME``, else the prefill costs): the same FLOPs and bytes of
        ``flops.forward_work`` with no cached tokens; a ``forward``."""
        return self.forward(m, dtype, n_tokens, n_seqs, tp, **self._rescore_op(m, runtime))

    def _rescore_op(self, m: ModelShape, runtime: str | None) -> dict:
        """The operation (and scoring runtime) ``rescore`` prices a model's pass with."""
        key = op_key("reencode", runtime) if runtime is not None else None
        if m.arch == "encoder" and key in self.ops:
            return {"op": key, "head": "value"}
        scorer = runtime if runtime is not None and op_key("score", runtime) in self.ops else None
        return {"op": "prefill", "runtime": scorer, "head": "value"}

    def retokenize_s(self, n_calls: int, n_tokens: float) -> float:
        """Host seconds to decode the actor's token ids to text and tokenize the texts for a reward model
        of another tokenizer: retokenize_s x calls + retokenize_per_token_s x tokens (step scalars,
        measured by ``calibrate.measuring.stepbench``; CPU work whatever the accelerator)."""
        if n_calls <= 0:
            return 0.0
        return self.step["retokenize_s"] * n_calls + self.step["retokenize_per_token_s"] * n_tokens

    def decode_steps(self, m: ModelShape, dtype: str, batch: int, kv_tokens0: float, n_steps: int, tp: int = 1,
                     overhead_s: float | None = None, runtime: str | None = None, logprobs: bool = False,
                     par: genparallel.GenLayout | None = None) -> Price:
        """``n_steps`` decode steps of a fixed batch, in closed form. ``kv_tokens0`` is the total cached tokens over
        the batch at the first step; each step adds ``batch`` tokens. ``runtime``: a generation runtime's decode
        parameters (``decode:RUNTIME``) when the profile has them; ``logprobs``: each step also records the sampled
        tokens' log-probs (``generation.sampling_logprobs``; ``genruntimes.sample_tail``).

        Step i's compute time c(i) = c0 + cs x i and memory time u(i) = u0 + us x i are both linear in i
        (FLOPs and KV bytes grow with the cache), so sum_i max(c(i), u(i)) is two arithmetic series split
        at the single crossing point: O(1), however many steps (``decoder(...).coeffs``, ``decode_sum``). The
        active share excludes the per-step overhead; the terms are the steps' (``_Decode.price``)."""
        if n_steps <= 0 or batch <= 0:
            return Price(0.0, 0.0, {})
        return self.decoder(m, dtype, tp, runtime, logprobs, par=par).price(batch, kv_tokens0, n_steps, overhead_s)

    def decoder(self, m: ModelShape, dtype: str, tp: int = 1, runtime: str | None = None,
                logprobs: bool = False, tp_inter_node: bool = False, par: genparallel.GenLayout | None = None) -> _Decode:
        """The decode predictor of one (model, dtype, tp, runtime, logprobs), computed on first use (a replica's
        clock holds its own): ``coeffs(batch, kv_tokens0, overhead_s)``, the (c0, cs, u0, us, per-step overhead) of
        ``decode_steps``, evaluated once, then ``decode_sum`` for any number of steps (the simulator inverts the sum
        by bisection when a segment is cut); ``batch`` and ``kv_tokens0`` may be numpy arrays, the coefficients of
        many segments at once; ``price(batch, kv0, n)``, ``n`` steps' ``Price`` with their terms. ``par``: one GPU of an
        expert-parallel engine (``genparallel.GenLayout``: its experts' bytes, all-reduces, KV split and all-to-alls)."""
        key = (m, dtype, tp, runtime, logprobs, tp_inter_node, par)
        k = self._decode.get(key)
        if k is None:
            k = self._decode[key] = _Decode(self, m, dtype, tp, runtime, logprobs, tp_inter_node, par)
        return k

    def train(self, m: ModelShape, dtype: str, n_tokens: float, n_seqs: float, tp: int = 1, head: str = "lm",
              attn_pairs: float | None = None, sp: int = 1, ulysses: bool = True) -> Price:
        """Forward + backward of one minibatch on one data-parallel replica (``attn_pairs``: rows packed without
        padding; ``sp``: one GPU of a Ulysses group, its all-to-alls in the forward and again in the backward;
        ``ulysses`` False: the same split without them, Megatron's context parallelism, whose ring exchange
        ``rlhfsim.costs.parallel`` prices).
        Terms: kernels and op_overhead and, on a CPU, the host effects inside them
        (``CpuHostEffects.train_effects``)."""
        if not isinstance(n_tokens, np.ndarray) and n_tokens <= 0:
            return Price(0.0, 0.0)
        shape, rate = self._train_shape(m, dtype, head)
        total, active = self._train_roofline(shape, rate, dtype, n_tokens, n_seqs, tp, attn_pairs, sp)
        if sp > 1 and not ulysses:
            comm = self._tp_comm_s(m, dtype, n_tokens / sp, tp, passes=3)
        elif sp > 1:
            comm = self._tp_comm_s(m, dtype, n_tokens / sp, tp, passes=3) + self._ulysses_comm_s(m, dtype, n_tokens, sp, 2)
        else:
            comm = self._tp_comm_s(m, dtype, n_tokens, tp, passes=3)
        if self.cpu is None:
            if moe.priced(m):   # the router and expert imbalance split out of kernels (rlhfsim.costs.moe)
                return Price(total + comm, active + comm, partial(with_effects, total + comm, active + comm, moe.effects,
                                                                  self.train, m, dtype, n_tokens, n_seqs, tp, head,
                                                                  attn_pairs, sp, ulysses))
            return Price(total + comm, active + comm)
        if head == "lm" and self.cpu.page_faults:
            # the log-prob loss's logits-sized tensors and their gradients (calibrate.cpu.pagefaults)
            total = total + self.cpu.fault_s(n_tokens / sp, m.vocab / tp, "logprob_train")
        return Price(total + comm, active + comm, partial(with_effects, total + comm, active + comm,
                                                          self.cpu.train_effects, self, 1.0, m, dtype, n_tokens,
                                                          n_seqs, tp, head, attn_pairs, sp))

    def _train_shape(self, m: ModelShape, dtype: str, head: str) -> tuple:
        """The shape's constants and, on a CPU, its width's training rate (cpuhost.width_rate), computed once."""
        key = (m, dtype, head)
        got = self._shapes.get(key)
        if got is None:
            got = self._shapes[key] = (fl.ShapeCoeffs.of(m, dtype, head), 1.0 if self.cpu is None else self.cpu.body_rate(m))
        return got

    def _train_roofline(self, shape: fl.ShapeCoeffs, rate: float, dtype: str, n_tokens, n_seqs, tp, attn_pairs,
                        sp) -> tuple[float, float]:
        """``roofline`` of a training call's work at body rate ``rate`` (one GPU of a Ulysses group of ``sp``)."""
        w = shape.train(n_tokens, n_seqs, attn_pairs, rate)
        if sp > 1:
            w = fl.sequence_parallel(w, 3 * shape.weight_bytes, sp)
        return roofline(w, self.ops["train"], self.gpu.peak(dtype), self.gpu.mem_bw, tp)

    def framework_call(self, training: bool, m: ModelShape, dtype: str, n_tokens: float, n_seqs: float, tp: int = 1,
                       head: str = "lm", attn_pairs: float | None = None, sp: int = 1, *, runtime: str | None = None,
                       logprob: bool = False, entropy: bool = False, checkpointing: bool = False, fsdp_n: int = 0,
                       inter_node: bool = False, ckpt_frac: float = 0.0, ulysses: bool = True,
                       layout: parallel.Layout | None = None, ep: int = 1, etp: int | None = None) -> fw.CallParts:
        """One framework call (a forward or a training micro-batch on one data-parallel rank): its price (``total_s``,
        ``active_s``, ``terms()``, ``price()``) and its parts (``rlhfsim.costs.framework.CallParts``): the roofline (``forward`` / ``train``; with
        ``checkpointing`` x (1 + ``ckpt_frac``)), a log-prob head's element-wise passes (``logprob``: every
        position's logits; ``entropy``: verl's entropy too), FSDP's collectives over ``fsdp_n`` shards and the
        host's dispatch (GPU profiles). A profile without a ``framework`` section (CPU) gets the roofline alone
        (and its own measured log-prob tail), as before. ``layout``: a call on one GPU of a pipeline stage under
        Megatron's pipeline, context and expert parallelism (``rlhfsim.costs.parallel.call``); ``ulysses`` False: ``sp``
        is Megatron's context parallelism, its split without Ulysses' all-to-alls. On a GPU an MoE model's routed
        experts add ``expert_gemm`` (``rlhfsim.costs.moe.expert_gemm_s``; ``ep``, ``etp``: the call's expert and expert
        tensor parallelism, which ``parallel.call`` passes)."""
        if layout is not None:
            return parallel.call(self, training, m, dtype, n_tokens, n_seqs, head, attn_pairs, layout, runtime=runtime,
                                 logprob=logprob, entropy=entropy, checkpointing=checkpointing, fsdp_n=fsdp_n,
                                 inter_node=inter_node, ckpt_frac=ckpt_frac)
        host = self.host
        with_head = logprob and head == "lm" and host is not None
        per_logit = (fw.head_bytes_per_logit(entropy, training) / (self.gpu.mem_bw * self.ops["prefill"].memory_eff)
                     if with_head else 0.0)
        if training:
            kernel, active = self.train(m, dtype, n_tokens, n_seqs, tp, head, attn_pairs, sp, ulysses)
            if checkpointing:
                kernel, active = kernel * (1.0 + ckpt_frac), active * (1.0 + ckpt_frac)
            head_s = per_logit * n_tokens / sp * m.vocab / tp
        else:
            kernel, active = self.forward(m, dtype, n_tokens, n_seqs, tp, op="prefill", runtime=runtime, head=head,
                                          all_logits=logprob, attn_pairs=attn_pairs, sp=sp,
                                          head_s_per_logit=per_logit if with_head else None, ulysses=ulysses)
            head_s = 0.0  # inside forward's total, after its roofline
        comm = exposed = 0.0
        if fsdp_n > 1:
            units = fw.fsdp_units(m)
            comm = fw.fsdp_bytes(m, head, fsdp_n, training) / self.link_bw(inter_node) + \
                units * (3 if training else 1) * LINK_LATENCY_S
            exposed = comm / units
        fsdp = fsdp_n >= 1  # FSDP wraps the model (its hooks run even on one GPU, where nothing is gathered)
        host_s = 0.0 if host is None else host.train_s(m, checkpointing, fsdp) if training else host.forward_s(m, fsdp)
        effects = None   # a CPU's host effects inside ``kernel``, computed only when a breakdown asks (CallParts.terms)
        if self.cpu is None and moe.priced(m):   # an MoE model's router and expert imbalance (rlhfsim.costs.moe)
            effects = partial(moe.call_effects, partial(self.framework_call, training), m, dtype=dtype, n_tokens=n_tokens,
                              n_seqs=n_seqs, tp=tp, head=head, attn_pairs=attn_pairs, sp=sp, runtime=runtime,
                              logprob=logprob, entropy=entropy, checkpointing=checkpointing, fsdp_n=fsdp_n,
                              inter_node=inter_node, ckpt_frac=ckpt_frac, ulysses=ulysses)
        if self.cpu is not None:
            if training:
                effects = partial(self.cpu.train_effects, self, 1.0 + ckpt_frac if checkpointing else 1.0, m, dtype,
                                  n_tokens, n_seqs, tp, head, attn_pairs, sp)
            else:
                effects = partial(self.cpu.forward_effects, self, m, dtype, n_tokens, n_seqs, tp, 0.0, "prefill", runtime, head,
                                  logprob, None, attn_pairs, sp, False, per_logit if with_head else None)
        ew_s = 0.0   # a forward pass priced from GEMM-only kernel curves: its layers' element-wise kernels (rlhfsim.costs.eager)
        if host is not None and not training and self.by_shape is not None and self.by_shape.applies("prefill"):
            ew_s = eager.elementwise_s(m, dtype, n_tokens, self.gpu.mem_bw, self.by_shape.elementwise_eff, tp=tp, sp=sp)
        extra = ()
        if self.cpu is None and m.is_moe:   # the routed experts at their own shape (rlhfsim.costs.moe.expert_gemm_s)
            extra = ((EXPERT_GEMM, self._expert_gemm_s(training, m, dtype, n_tokens, tp, sp, ep, etp, runtime)),)
        return fw.CallParts(kernel, active, head_s, comm, exposed, host_s, effects, elementwise_s=ew_s, parallel=extra)

    def _expert_gemm_s(self, training: bool, m: ModelShape, dtype: str, n_tokens, tp: int, sp: int, ep: int,
                       etp: int | None, runtime: str | None):
        """``moe.expert_gemm_s`` of a framework call with the efficiencies its roofline priced it at: a training call's
        ``train`` operation; a forward's ``prefill`` (its kernel curve at the call's tokens where the profile's
        kernels_by_shape prices prefill)."""
        ks = self.by_shape
        if training:
            p = self.ops["train"]
            eff, mem = p.compute_eff, p.memory_eff
        elif ks is not None and ks.applies("prefill"):
            eff, mem = ks.compute_eff(n_tokens / sp, m.layer_params / tp), ks.weight_memory_eff
        else:
            p = self.params("prefill", runtime)
            eff, mem = p.compute_eff, p.memory_eff
        return moe.expert_gemm_s(m, dtype, n_tokens, tp=tp, cp=sp, ep=ep, etp=etp, training=training,
                                 peak=self.gpu.peak(dtype), bw=self.gpu.mem_bw, call_eff=eff, mem_eff=mem,
                                 ew_eff=ks.elementwise_eff if ks is not None else mem, curve=ks)

    def optimizer(self, m: ModelShape, dtype: str, tp: int = 1, dp: int = 1, head: str = "lm",
                  inter_node: bool = False, grad_allreduce: bool = True, cp: int = 1, ep: int = 1,
                  etp: int | None = None) -> Price:
        """The gradient all-reduce over ``dp`` replicas plus an AdamW step on this GPU's shard (term: optimizer);
        ``grad_allreduce=False``: the gradients were reduced with every call already (FSDP's reduce-scatter,
        ``framework_call``), only the AdamW step is left. Megatron's ``cp``: its ranks hold the same weights, so the
        state shards and the gradients reduce over dp x cp GPUs. ``ep`` > 1 on an MoE model: a rank holds 1/(ep x etp)
        of the routed experts (``etp`` None: tp), whose gradients reduce over the expert-data-parallel group of
        tp x dp x cp / (ep x etp) GPUs, the dense weights' over dp x cp (Megatron-core's expert and dense gradient
        buffers); the distributed optimizer's state is 1/(tp x dp x cp) of the stage either way."""
        shards = tp * dp * cp  # ZeRO-style: the optimizer state is sharded over all GPUs of the role
        w = fl.optimizer_work(m, shards, head)
        act = ACTIVATION_BYTES[dtype]   # bf16 gradients under float8 too
        total, active = roofline(w, self.ops["optimizer"], self.gpu.peak("float32"), self.gpu.mem_bw)
        comm = 0.0
        if grad_allreduce and ep > 1 and m.is_moe:
            routed = m.routed_params
            ranks = ep * (tp if etp is None else etp)
            comm = (self.allreduce_s((m.params(head) - routed) / tp * act, dp * cp, inter_node)
                    + self.allreduce_s(routed / ranks * act, max(tp * dp * cp // ranks, 1), inter_node))
        elif grad_allreduce:
            comm = self.allreduce_s(m.params(head) / tp * act, dp * cp, inter_node)
        return Price(total + comm, active + comm, OPTIMIZER)

    def weight_sync_s(self, m: ModelShape, dtype: str, n_gpus: int, inter_node: bool = False,
                      same_pool: bool = False, shares_weights: bool = False) -> float:
        """The trained actor's weights reach the generation engine (``execution.weight_sync.kind: copy``),
        ``n_gpus`` = the engine's TP degree (each rank receives its shard): with ``same_pool`` (the engine
        shares the actor's GPUs) a copy through device memory, read + write at the prefill's memory
        efficiency, t = 2 x bytes / (mem_bw x memory_eff), or nothing at all when the runtime generates
        with the trained model itself (``shares_weights``: ``SHARES_TRAINING_WEIGHTS``, HF ``generate()``
        as TRL calls it), t = 0; otherwise a broadcast over the interconnect (a ring broadcast costs
        about one copy per receiver link), t = bytes / link_bw + latency."""
        nbytes = m.params("lm") * DTYPE_BYTES[dtype] / max(n_gpus, 1)
        if same_pool and shares_weights:
            return 0.0
        if same_pool:
            return 2 * nbytes / (self.gpu.mem_bw * self.ops["prefill"].memory_eff)
        return self.transfer_s(nbytes, inter_node)

    def pool_transfer_s(self, m: ModelShape, dtype: str, inter_node: bool) -> float:
        """The trained weights broadcast whole from the training pool to a separate generation pool
        (``execution.weight_sync.kind: nccl``, as verl's one_step_off and fully_async recipes run it: one NCCL group of
        every actor and rollout rank, each tensor broadcast from the actor's rank 0): a pipelined broadcast sends every
        byte once over each link of its chain, so t = W / link_bw + latency with W = parameters x dtype bytes, whatever
        the number of receivers; ``inter_node`` when the two pools' GPUs are not all in one node."""
        return self.transfer_s(m.params("lm") * DTYPE_BYTES[dtype], inter_node)

    def nccl_sync_parts(self, m: ModelShape, dtype: str, train_gpus: int, train_inter_node: bool, engine_tp: int,
                        pools_inter_node: bool) -> dict[str, float]:
        """Named parts (seconds) of verl's separate-pool weight update (``execution.weight_sync.kind: nccl``):

        * ``gather_s``: each FSDP-sharded tensor made whole on the training pool (``full_tensor()``), W (n - 1) / n
          bytes per GPU over the training pool's link;
        * ``broadcast_s``: the whole weights to every generation rank (``pool_transfer_s``, the term
          pool_weight_transfer);
        * ``load_s``: the engine's ``load_weights`` keeps its tensor-parallel slice, read + write through device
          memory: 2 W / engine_tp / (mem_bw x reshard_eff)."""
        w = m.params("lm") * DTYPE_BYTES[dtype]
        n = max(train_gpus, 1)
        gather = (w * (n - 1) / n / self.link_bw(train_inter_node) + LINK_LATENCY_S) if n > 1 else 0.0
        load = 2 * w / max(engine_tp, 1) / (self.gpu.mem_bw * self.step["reshard_eff"])
        return {"gather_s": gather, "broadcast_s": self.pool_transfer_s(m, dtype, pools_inter_node), "load_s": load}

    def packed_sync_parts(self, m: ModelShape, dtype: str, lay: "parallel.Layout | None", train_gpus: int,
                          train_inter_node: bool, engine_tp: int, pools_inter_node: bool) -> dict[str, float]:
        """Named parts (seconds) of NeMo RL's separate-pool refit (``execution.weight_sync.kind: nccl`` with
        ``packed``; nemo_rl/algorithms/grpo.py refit_policy_generation, non-colocated branch). Every training rank runs
        the Megatron-Bridge export, which makes each tensor whole on every training rank, and packs the tensors into
        buckets (nemo_rl/utils/packed_tensor.py packed_broadcast_producer) broadcast by NCCL from global rank 0 over one
        group of every training and generation rank; each vLLM rank unpacks a bucket and loads it
        (packed_broadcast_consumer). Two buffers on two CUDA streams on each side: bucket i's broadcast runs while
        bucket i + 1 is gathered and bucket i - 1 loaded, so the three stages form a pipeline of B buckets, and the
        whole takes (B - 1) x the slowest stage's bucket + one bucket of each stage. The parts are each stage's share
        of that critical path: the slowest stage whole, the other two one bucket (1 / B) of theirs.

        * ``gather_s`` (per training GPU, the hops Megatron-Bridge's mappings run for each tensor, one after the
          other): the owning pipeline stage broadcasts its shard to the other stages, (W_d / tp + W_e / (ep etp))
          (pp - 1) / pp over the pool's link; the tensor-parallel all-gather, W_d (tp - 1) / tp, and the expert
          tensor-parallel one, W_e / ep (etp - 1) / etp; the expert-parallel all-gather, W_e (ep - 1) / ep; each
          over NVLink where its group sits in one NVLink domain, else the inter-node link. W_e: the routed experts'
          bytes, W_d the rest. Without a Megatron layout, the FSDP gather of ``nccl_sync_parts``.
        * ``broadcast_s``: one sender (rank 0) and a pipelined ring, every byte once over each link of the ring
          (``pool_transfer_s``; the training ranks are in the group and receive it too, at no extra time).
        * ``load_s``: as ``nccl_sync_parts``.
        B = ceil(W / bucket), bucket = min(REFIT_BUCKET_MEM_FRAC x the GPU's memory, REFIT_BUCKET_MAX_BYTES)
        (get_target_packed_tensor_size's defaults). The gather's and the broadcast's inter-node traffic are taken
        not to slow each other (NCCL spreads the ring's channels over the node's NICs)."""
        b = DTYPE_BYTES[dtype]
        w = m.params("lm") * b
        parts = self.nccl_sync_parts(m, dtype, train_gpus, train_inter_node, engine_tp, pools_inter_node)
        if lay is not None:
            w_e = m.routed_params * b
            w_d = w - w_e
            etp = lay.etp or lay.tp
            hops = (((w_d / lay.tp + w_e / (lay.ep * etp)) * (lay.pp - 1) / lay.pp, lay.spans_nodes),
                    (w_d * (lay.tp - 1) / lay.tp, lay.inter_node(lay.tp)),
                    (w_e / lay.ep * (etp - 1) / etp, lay.inter_node(etp)),
                    (w_e * (lay.ep - 1) / lay.ep, lay.inter_node(lay.ep * etp)))
            parts["gather_s"] = sum(n / self.link_bw(inter) + LINK_LATENCY_S for n, inter in hops if n > 0)
        bucket = min(REFIT_BUCKET_MEM_FRAC * self.gpu.mem_bytes, REFIT_BUCKET_MAX_BYTES)
        buckets = max(math.ceil(w / bucket), 1)
        slowest = max(parts, key=parts.get)
        return {k: v if k == slowest else v / buckets for k, v in parts.items()}

    @staticmethod
    def rule_reward_s(n_rows: int, cpu_s_per_sample: float, workers: int) -> float:
        """A rule-based reward (a CPU checker) over ``n_rows`` responses on ``workers`` processes:
        t = ceil(n_rows / workers) x cpu_s_per_sample (the slowest worker's share; no GPU)."""
        return math.ceil(n_rows / workers) * cpu_s_per_sample

    # -- framework step mechanics (rlhfsim.costs.stepcosts; docs/cost-model.md "A step as verl runs it")
    def step_scalar(self, key: str) -> float:
        """A step scalar: the profile's value, else its documented default (``step_sources`` says which)."""
        return self.step[key]

    def step_costs(self) -> dict:
        """Every step scalar with its value and source ("profile" or "default"), for the summary."""
        return {k: {"value": self.step[k], "source": self.step_sources[k]} for k in STEP_SCALARS}

    def host_copy_s(self, n_bytes: float) -> float:
        """Host <-> device copy of ``n_bytes`` per GPU over the host link:
        n_bytes / (host_link_bw x host_copy_eff)."""
        if n_bytes <= 0:
            return 0.0
        if self.gpu.host_link_bw <= 0:
            raise ValueError(f"device {self.gpu.name!r} has no host_link_bw in the hardware catalog")
        return n_bytes / (self.gpu.host_link_bw * self.step["host_copy_eff"])

    def reshard_parts(self, m: ModelShape, dtype: str, train_gpus: int, engine_tp: int, kv_bytes: float,
                      shared: bool, inter_node: bool = False, engine_sleep: bool = False) -> dict[str, float]:
        """Named parts (seconds) of a weight update as verl's hybrid engine does it:

        * ``gather_s``: the training layout's shards (FSDP over ``train_gpus``) all-gathered into full
          tensors on every rank: W (n - 1) / n bytes received per GPU over the link, W = P x b;
        * ``load_s``: the engine copies its tensor-parallel slice into its own layout, read + write
          through device memory: 2 W / engine_tp / (mem_bw x reshard_eff);
        * ``kv_realloc_s`` (shared pool only: the engine frees its KV cache for training and takes it
          back): kv_realloc_s + kv_realloc_s_per_gib x KV GiB per GPU;
        * ``broadcast_s`` (separate pools only): the weights cross to the engine's GPUs
          (``weight_sync_s``);
        * ``sleep_wake_s`` (shared pool with ``engine_sleep``: vLLM's sleep level 1 and wake_up around training):
          the engine's shard to host memory and back, ``host_copy_s(2 W / engine_tp)``."""
        w = m.params("lm") * DTYPE_BYTES[dtype]
        n = max(train_gpus, 1)
        gather = (w * (n - 1) / n / self.link_bw(inter_node) + LINK_LATENCY_S) if n > 1 else 0.0
        load = 2 * w / max(engine_tp, 1) / (self.gpu.mem_bw * self.step["reshard_eff"])
        parts = {"gather_s": gather, "load_s": load}
        if shared:
            parts["kv_realloc_s"] = self.step["kv_realloc_s"] + self.step["kv_realloc_s_per_gib"] * kv_bytes / GIB
            if engine_sleep:
                parts["sleep_wake_s"] = self.host_copy_s(2 * w / max(engine_tp, 1))
        else:
            parts["broadcast_s"] = self.weight_sync_s(m, dtype, engine_tp, inter_node)
        return parts

    def advantage_s(self, rows: int, width: int, gae: bool, code: driver.AdvantageCode = driver.AdvantageCode()) -> float:
        """The driver's advantage step over ``rows`` rows padded to ``width`` positions (``rlhfsim.costs.driver``):
        GAE's reverse loop when a critic gives values, else GRPO's loops over rows, plus their element-wise passes."""
        return sum(driver.advantage_parts(self.adv_costs, code, rows, width, gae).values())

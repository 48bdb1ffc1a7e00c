"""CPU host effects: the corrections a CPU's caches, allocator and GEMM kernels add to the roofline, in one place.

A CPU profile measures them (``calibrate.cpu``) and keeps them under ``kernels``; a GPU profile has none of
them, and a GPU price never runs this module's code: ``CpuHostEffects.of`` returns None unless the device
priced is a CPU (catalog ``kind: cpu``) and its profile carries one of ``KEYS``, and ``CostModel`` holds that
result as ``cost.cpu``, each use site one ``if cost.cpu is not None`` branch. The calibration fit
(``calibrate.fitting.assemble.with_tails``) annotates its points through the same object, so the fit and the
simulator price each effect with one formula. Units: seconds, bytes, bytes/s.

The effects (equations and measurements in docs/cost-model.md, "CPU host effects"):

* GEMM weight passes (``kernels.gemm_weight_passes``, ``gemm_passes_by_footprint``; ``calibrate.cpu.gemm``):
  a decode step of two rows or more streams its weights ``w`` times, ``w`` at the weights' footprint
  (``footprint_passes``; by rows: ``flops.gemm_passes``), and no faster than the footprint's one-row
  streaming rate: ``B_weights x w x max(1, bw_fit / rate(F))`` (``footprint_rate``, ``stream_factor``).
* Cold fixed costs (``kernels.cold_overheads``; ``calibrate.cpu.coldfixed``): a decode step's overheads and
  sampling tail times ``cold_factor(F)``, F the decode weights per device, after they swept the caches.
* Training rate by width (``kernels.width_efficiency``; ``calibrate.cpu.widths``): a training pass's body
  FLOPs count ``1 / r(h)`` times (``width_rate``).
* Page faults (``kernels.page_faults``; ``calibrate.cpu.pagefaults``): logits-sized float32 tensors above
  glibc's mmap threshold are faulted in afresh at every call: ``tensors[pattern] x bytes x fault_s_per_byte``
  (``page_fault_s``).
* The log-prob tail (``kernels.page_faults.logprob_tail.s_per_logit``): a log-prob pass's log-softmax and
  gather, measured, priced after the roofline instead of as ``flops.TAIL_LOGIT_BYTES`` per logit inside it
  (``CostModel.forward`` takes it as the pass's seconds per logit after its head).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlhfsim.costs.flops import FP32_LOGIT_BYTES, ShapeCoeffs, gemm_passes
from rlhfsim.costs.terms import COLD_OVERHEADS, DECODE_KERNELS, ENGINE_STEP, GEMM_FOOTPRINT, HOST_LAUNCH_BOUND, LOGPROB_TAIL_CPU, PAGE_FAULTS, SAMPLING_TAIL, WIDTH_RATE
from rlhfsim.hardware.catalog import GPUS
from rlhfsim.models.catalog import ModelShape

# the call patterns whose logits-sized tensors ``kernels.page_faults.tensors`` counts (``page_fault_s``'s ``pattern``)
FAULT_PATTERNS = ("logprob_forward", "logprob_train", "labels_train")
# the profile keys (under ``kernels``) that hold a CPU host effect
KEYS = ("gemm_weight_passes", "gemm_passes_by_footprint", "width_efficiency", "page_faults", "cold_overheads")


def device_kind(profile: dict) -> str | None:
    """The catalog kind (``cpu``, ``cuda``) of the device a profile was measured on; None where its ``gpu`` is
    not a catalog entry (``any``: a derived profile)."""
    spec = GPUS.get(profile.get("gpu"))
    return spec.kind if spec is not None else None


@dataclass(frozen=True)
class CpuHostEffects:
    """The CPU host effects one CPU profile measured (see the module docstring): built by ``of``, held by
    ``CostModel`` as ``cost.cpu`` and used by the calibration fit's point annotations."""

    weight_passes: float | None = None  # kernels.gemm_weight_passes (None: not measured, one pass)
    by_footprint: dict | None = None    # kernels.gemm_passes_by_footprint
    width_eff: dict | None = None       # kernels.width_efficiency
    page_faults: dict | None = None     # kernels.page_faults
    logprob_tail: float = 0.0           # kernels.page_faults.logprob_tail.s_per_logit (0: inside the roofline)
    cold_overheads: dict | None = None  # kernels.cold_overheads

    @classmethod
    def of(cls, profile: dict, kind: str | None = None) -> "CpuHostEffects | None":
        """The effects of ``profile`` where the device priced is a CPU (``kind``: the priced device's catalog kind;
        None: the kind of the profile's own ``gpu``) and the profile carries any of ``KEYS``; None otherwise."""
        if (kind if kind is not None else device_kind(profile)) != "cpu":
            return None
        kernels = profile.get("kernels") or {}
        if not any(kernels.get(k) is not None for k in KEYS):
            return None
        faults = kernels.get("page_faults")
        passes = kernels.get("gemm_weight_passes")
        return cls(weight_passes=float(passes) if passes is not None else None,
                   by_footprint=kernels.get("gemm_passes_by_footprint"), width_eff=kernels.get("width_efficiency"),
                   page_faults=faults,
                   logprob_tail=float(((faults or {}).get("logprob_tail") or {}).get("s_per_logit") or 0.0),
                   cold_overheads=kernels.get("cold_overheads"))

    # -- decode ----------------------------------------------------------------------------------------
    def decode_factors(self, decode_weight_bytes: float, tp: int, bandwidth: float):
        """(cold, passes, stream) of a decode step whose streamed weights take ``decode_weight_bytes``, over ``tp``
        devices, against the fitted weight bandwidth ``bandwidth`` (bytes/s, one device): the fixed costs'
        ``cold_factor``, the weight passes of ``footprint_passes`` (a number or a ``(rows, passes)`` table for
        ``flops.gemm_passes``) and the ``stream_factor`` of the footprint's one-row rate."""
        cold = cold_factor(self.cold_overheads, decode_weight_bytes / tp)
        passes = footprint_passes(self.by_footprint, self.weight_passes or 1.0, decode_weight_bytes)
        stream = stream_factor(footprint_rate(self.by_footprint, decode_weight_bytes / tp), bandwidth)
        return cold, passes, stream

    @staticmethod
    def decode_weight_bytes(shape, batch, passes, stream):
        """The weight bytes a decode step of ``batch`` rows (a number or a numpy array) moves: ``shape``'s streamed
        weights (``flops.ShapeCoeffs``) ``gemm_passes`` times, ``stream`` times slower (``decode_factors``)."""
        return shape.decode_weights(batch, passes) * stream

    # -- training and log-prob passes ---------------------------------------------------------------------
    def body_rate(self, m) -> float:
        """r(h) of a model shape ``m`` (``width_rate`` at its width and MLP ratio)."""
        return width_rate(self.width_eff, m.hidden, m.intermediate / m.hidden)

    def fault_s(self, logits_tokens, vocab, pattern: str):
        """``page_fault_s`` of a call with this profile's page faults."""
        return page_fault_s(self.page_faults, logits_tokens, vocab, pattern)

    # -- the breakdown by cost term (rlhfsim.costs.terms; asked only by rlhfsim explain and its tests) --------
    def forward_effects(self, cost, m, dtype, n_tokens, n_seqs, tp, cached_tokens, op, runtime, head, all_logits,
                        gen_runtime, attn_pairs, sp, gen_logprobs, head_s_per_logit) -> tuple[dict[str, float], float]:
        """The effects inside ``cost.forward``'s price with these arguments, each the price with it less
        the price without it: a log-prob pass's measured tail (``logprob_tail_cpu``: after the roofline instead
        of as bytes inside it; device time) and its page faults (``page_faults``: host time); and the seconds
        of them inside the price's active share."""
        if n_tokens <= 0 or not (all_logits and head == "lm"):
            return {}, 0.0
        out, active = {}, 0.0
        if head_s_per_logit is None and self.logprob_tail:
            k = cost._forward_kernel(m, dtype, tp, op, runtime, head, gen_runtime, gen_logprobs)
            (t1, a1), (t0, a0) = (k.parts(n_tokens, n_seqs, cached_tokens, n_tokens, attn_pairs, lp, sp)
                                  for lp in (self.logprob_tail, 0.0))
            out[LOGPROB_TAIL_CPU], active = t1 - t0, a1 - a0
        f = self.fault_s(n_tokens / sp, m.vocab / tp, "logprob_forward") if self.page_faults else 0.0
        if f:
            out[PAGE_FAULTS] = f
        return out, active

    def train_effects(self, cost, scale: float, m, dtype, n_tokens, n_seqs, tp, head, attn_pairs,
                      sp) -> tuple[dict[str, float], float]:
        """The effects inside ``cost.train``'s price (x ``scale``: gradient checkpointing's repeat), each
        the price with it less the price without it: the width's training rate (``width_rate``, device time)
        and the loss's page faults (``page_faults``, host time); and the seconds of them inside the price's
        active share."""
        if n_tokens <= 0:
            return {}, 0.0
        out, active = {}, 0.0
        shape, rate = cost._train_shape(m, dtype, head)
        if rate != 1.0:
            t1, a1 = cost._train_roofline(shape, rate, dtype, n_tokens, n_seqs, tp, attn_pairs, sp)
            t0, a0 = cost._train_roofline(shape, 1.0, dtype, n_tokens, n_seqs, tp, attn_pairs, sp)
            out[WIDTH_RATE], active = (t1 - t0) * scale, (a1 - a0) * scale
        f = self.fault_s(n_tokens / sp, m.vocab / tp, "logprob_train") if head == "lm" and self.page_faults else 0.0
        if f:
            out[PAGE_FAULTS] = f * scale
        return out, active

    @staticmethod
    def decode_terms(out: dict, kern: float, plain: float, comm: float, cold: float, hot_floor: float,
                     engine_cold: bool = True) -> None:
        """Split decode terms (``out``: ``_Decode.price``'s terms of its steps, as priced) in place, each effect added
        in turn to the work without them: ``gemm_footprint``, the kernels ``kern`` less ``plain`` (the weights streamed
        once at the fitted bandwidth; ``comm`` the TP all-reduces beside them), and ``cold_overheads``, the fixed costs (sampling tail, launch floor, and the engine step
        unless the engine set its own, ``engine_cold``) less their hot values (/ ``cold``; the launch floor's hot
        value given as ``hot_floor``)."""
        if plain != kern:
            out.update({DECODE_KERNELS: plain + comm, GEMM_FOOTPRINT: kern - plain})
        if cold != 1.0:
            names = (SAMPLING_TAIL, HOST_LAUNCH_BOUND, ENGINE_STEP)[:3 if engine_cold else 2]
            fixed = sum(out[k] for k in names)
            out[SAMPLING_TAIL] /= cold
            out[HOST_LAUNCH_BOUND] = hot_floor
            if engine_cold:
                out[ENGINE_STEP] /= cold
            out[COLD_OVERHEADS] = fixed - sum(out[k] for k in names)

    # -- the calibration fit's points --------------------------------------------------------------------
    def point_fields(self, p: dict) -> dict:
        """The fields of a measured point (``calibrate.fitting.fit``) that these effects set: a generation decode point
        (LM head) ``gemm_weight_passes`` at its rows and footprint and ``stream_gb_s`` (the fastest its weights
        stream) where measured, and ``cold_x``; a training point ``width_rate`` and, with an LM head,
        ``fault_s`` (its loss's logits-sized tensors, pattern ``labels_train``) where above the threshold."""
        out: dict = {}
        if p["op"] == "decode" and p.get("head") == "lm" and (self.weight_passes is not None or self.cold_overheads):
            wbytes = ShapeCoeffs.of(ModelShape(**p["shape"]), p["dtype"], "lm").decode_weight_bytes
            if self.weight_passes is not None:   # at the model's footprint where measured by it
                out["gemm_weight_passes"] = passes_at(footprint_passes(self.by_footprint, self.weight_passes, wbytes),
                                                      p["batch"])
                rate = footprint_rate(self.by_footprint, wbytes)
                if rate:   # the fastest its weights stream (calibrate.fitting.assemble.fitted)
                    out["stream_gb_s"] = rate / 1e9
            if self.cold_overheads:   # its fixed costs and tail after its weights streamed
                out["cold_x"] = cold_factor(self.cold_overheads, wbytes)
        if p["op"] == "train":
            s = p["shape"]
            if self.width_eff is not None:
                out["width_rate"] = width_rate(self.width_eff, s["hidden"], s["intermediate"] / s["hidden"])
            if self.page_faults and p.get("head") == "lm":
                f = page_fault_s(self.page_faults, p["batch"] * p["seq_len"], s["vocab"], "labels_train")
                if f:
                    out["fault_s"] = f
        return out


def width_rate(width_eff: dict | None, hidden: int, mlp_ratio: float | None = None) -> float:
    """r(h), a model width's relative training rate (``kernels.width_efficiency``, measured by
    ``calibrate.cpu.widths``: widths and their rates relative to the fastest), interpolated in log width and
    held at the ends; with ``mlp_ratio`` (intermediate / hidden) and rates measured at several MLP ratios
    (``by_ratio``), each ratio's r(h) interpolated linearly in the ratio and held at the ends; 1 without a
    measurement."""
    if not width_eff or not width_eff.get("widths"):
        return 1.0
    by = width_eff.get("by_ratio")
    if mlp_ratio is None or not by or len(by) < 2:
        ws, rs = width_eff["widths"], width_eff["relative_rate"]
        return float(np.interp(np.log(hidden), np.log(np.asarray(ws, dtype=np.float64)), rs))
    ratios = sorted(by, key=float)
    at = [float(np.interp(np.log(hidden), np.log(np.asarray(by[r]["widths"], dtype=np.float64)), by[r]["relative_rate"]))
          for r in ratios]
    return float(np.interp(mlp_ratio, [float(r) for r in ratios], at))


def page_fault_s(page_faults: dict | None, logits_tokens, vocab: int, pattern: str):
    """Seconds a call spends faulting in fresh pages for its logits-sized tensors (CPU: glibc serves
    allocations above its threshold with fresh pages every time; ``kernels.page_faults``, measured by
    ``calibrate.cpu.pagefaults``): ``tensors[pattern] x bytes x fault_s_per_byte`` when one float32 logits
    tensor of ``logits_tokens`` x ``vocab`` is larger than ``threshold_bytes``, else 0. ``pattern``:
    ``logprob_forward``, ``logprob_train`` or ``labels_train``; ``logits_tokens`` may be a numpy array.
    0 without a measurement."""
    if not page_faults:
        return 0.0
    nbytes = logits_tokens * (vocab * FP32_LOGIT_BYTES)
    k = page_faults["tensors"][pattern] * page_faults["fault_s_per_byte"]
    if isinstance(nbytes, np.ndarray):
        return np.where(nbytes > page_faults["threshold_bytes"], k * nbytes, 0.0)
    return k * nbytes if nbytes > page_faults["threshold_bytes"] else 0.0


def footprint_passes(by_footprint: dict | None, weight_passes: float, weight_bytes: float):
    """The weight passes of a decode step of two rows or more for a model whose weights take
    ``weight_bytes``: from ``kernels.gemm_passes_by_footprint`` (``calibrate.cpu.gemm``: the passes measured
    with the weights cycled through distinct copies adding up to each footprint, as a decode step cycles
    through its layers; a CPU's GEMM packs a matrix that sits in cache at about its GEMV's time, one
    streamed from memory at a fraction of it) interpolated in log footprint and held at the ends;
    without that table, the scalar ``weight_passes``. Where the table has the passes by row count too
    (``by_rows``: ``rows`` and, per row count, the passes per footprint), the table ``(rows, passes)`` of
    ``flops.gemm_passes`` at this footprint: rows ``(1, *by_rows.rows)``, passes ``(1, p(rows) ...)``."""
    if not by_footprint:
        return weight_passes
    mib = np.log2(np.asarray(by_footprint["footprint_mib"], dtype=np.float64))
    at = np.log2(max(weight_bytes, 1.0) / 2**20)
    by_rows = by_footprint.get("by_rows")
    if by_rows:
        passes = [max(1.0, float(np.interp(at, mib, per_foot))) for per_foot in by_rows["passes"]]
        return (1.0, *(float(r) for r in by_rows["rows"])), (1.0, *passes)
    return float(np.interp(at, mib, by_footprint["passes"]))


def footprint_rate(by_footprint: dict | None, weight_bytes: float) -> float | None:
    """Bytes per second at which a one-row decode step's weights of ``weight_bytes`` can stream on this
    device: the footprint sweep's one-row rate (``kernels.gemm_passes_by_footprint.gb_s_1row``, the median
    per footprint over its matrices; for a table without it, the same medians of its ``ratios``),
    interpolated in log footprint and held at the ends; None without a sweep. On the 2-vCPU VM, 45-75 GB/s
    while the weights sit in cache (4-8 MiB), 10-20 GB/s from 32 MiB on (``calibrate.cpu.gemm``)."""
    rates = footprint_rates(by_footprint)
    if not rates:
        return None
    at = np.log2(max(weight_bytes, 1.0) / 2**20)
    return 1e9 * float(np.interp(at, np.log2(np.asarray(by_footprint["footprint_mib"], dtype=np.float64)), rates))


def footprint_rates(by_footprint: dict | None) -> list[float] | None:
    """The one-row rates (GB/s) of a footprint table, one per ``footprint_mib``: its ``gb_s_1row``, or for a
    table from before they were kept, the same medians of its ``ratios`` (``rates_from_ratios``); None
    without them."""
    if not by_footprint:
        return None
    return by_footprint.get("gb_s_1row") or rates_from_ratios(by_footprint.get("ratios") or [], by_footprint["footprint_mib"])


def rates_from_ratios(ratios: list[dict], feet) -> list[float] | None:
    """Per footprint, the median over its matrices of the one-row rate (GB/s) in the footprint sweep's
    ``ratios`` (one entry per matrix and row count, each with its matrix's ``gb_s_1row``); None where a
    footprint has none."""
    per = [list({(r.get("out"), r.get("in"), r.get("copies")): r["gb_s_1row"] for r in ratios
                 if r.get("footprint_mib") == f and r.get("gb_s_1row")}.values()) for f in feet]
    return [float(np.median(x)) for x in per] if all(per) else None


def stream_factor(rate: float | None, bandwidth: float) -> float:
    """How many times longer a decode step's weights take than the fitted ``bandwidth`` (bytes/s: the device's
    memory bandwidth times the decode fit's memory efficiency) says, where the footprint's measured streaming
    ``rate`` (``footprint_rate``) is below it: ``max(1, bandwidth / rate)``; 1 without a rate. The decode fit's
    one bandwidth is a compromise over the calibration's models, mostly in cache; a model too large for the
    cache cannot stream faster than the sweep measured at its footprint (docs/cost-model.md)."""
    return max(1.0, bandwidth / rate) if rate else 1.0


def cold_factor(table: dict | None, weight_bytes: float) -> float:
    """How many times its hot cost a decode step's fixed work (the overheads and the sampling tail) takes at a
    decode-weight footprint of ``weight_bytes`` per device: ``kernels.cold_overheads`` (``calibrate.cpu.coldfixed``:
    a small model's step timed right after F MiB of other weights streamed, over the same with none),
    interpolated linearly in MiB and held at the ends; 1 without a table. In a real step each layer's fixed
    work follows the rest of the model's weights through the caches (docs/cost-model.md)."""
    if not table:
        return 1.0
    return max(1.0, float(np.interp(max(weight_bytes, 0.0) / 2**20, np.asarray(table["footprint_mib"], dtype=np.float64),
                                    np.asarray(table["factor"], dtype=np.float64))))


def passes_at(weight_passes, batch: float) -> float:
    """The passes of ``flops.gemm_passes`` at one row count, as one number (a decode point's field in the fit)."""
    return float(gemm_passes(float(batch), weight_passes)) if isinstance(weight_passes, tuple) else float(weight_passes)

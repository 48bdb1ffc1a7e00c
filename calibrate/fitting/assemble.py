"""Turn journaled points into a Profile (layout: ``rlhfsim/costs/profile.py``).

One pipeline: the points are prepared once (``prepare``: their sampling tails, the host effects they measured,
each point with the terms its fit counts: ``FitPoints``), then fitted: ``build_profile`` into a new profile,
``refit`` into a measured one, stage by stage (``REFIT_STAGES``: generation, train, encoders; the extension
commands of ``calibrate.running.extend`` each name theirs).

* ``operations``: ``prefill``, ``decode``, ``chunk_prefill``, ``train``, ``optimizer`` fitted to their
  points (``calibrate.fitting.fit``); ``score:RUNTIME`` for every runtime valid on every model it ran on, fitted
  to its padded uniform-length points (the one strategy every runtime runs) of the decoder reward models,
  or of the encoder ones when no decoder was measured (``source_points`` says which). Both families' fits
  are kept under ``runtimes.RUNTIME.fits``. An operation with no points keeps the bundled ``default``
  profile's values with ``"source": "default"`` so the simulator still finds it.
* ``interference``: median decode and prefill slowdowns over the measured co-running configurations, and
  per generation runtime those measured in the hand-over pattern (``handover``, ``calibrate.cpu.corun``).
* ``runtimes``: per runtime, validity, max abs difference to eager, setup and first-call costs per model.
* ``batching``: padded / bucketed / packed medians per (model, batch, max length); ``chunked_scoring``:
  chunk-on-prefix against one-shot prefill of the same total length.
* ``encode:RUNTIME``: the runtime's fit to encoder reward models (``runtimes.RUNTIME.fits.encoder``) as an
  operation of its own, which prices every encoder forward pass (``encoder_score_ops``).
* ``reencode:RUNTIME``: fitted to the runtime's re-encode points (``calibrate.measuring.reencode``: batch-1 passes
  over a growing prefix of encoder reward models; ``prefill``'s default as the prior); ``reencode``:
  those points per runtime, and the lengths skipped with why.
* Generation runtimes (contract: ``rlhfsim.costs.genruntimes``; points: ``calibrate.measuring.genbench``):
  ``prefill:RT`` and ``decode:RT`` fitted like ``prefill``/``decode`` to the points of runtime RT (the
  plain operations fit only points without a runtime, or of ``kv_decoder``), for a runtime valid on every
  model it ran on; ``prefill:kv_decoder``/``decode:kv_decoder`` are the plain fits. ``generation[RT]``:
  validity and the eager check per model, ``call_overhead_s`` (median over the prefill points of the
  in-call overhead, clipped at 0), ``handoff_s`` + ``handoff_per_row_s`` x batch (non-negative least
  squares over the handoff points of every model, weighted by the inverse variance of each point's
  mean; ``handoff_per_row_s`` is 0 when one batch size was measured), ``ms_per_step`` (every measured
  decode point: model, batch, mean context, ms); ``pad_step_s`` + ``pad_step_per_row_s`` x batch, what
  left padding adds to one decode step, fitted the same way to the ``pad`` points (``pad_points``), and
  ``pad_prefill_s``, what it adds to the batch's prefill call (median over those points, clipped at 0).
  ``kv_decoder``: zero call overhead, handoff and padding cost by construction (source "derived"); an
  unavailable runtime has source "skipped".
  A runtime that was skipped (not available) or is invalid has null scalars and no operations.
* Sampling tails (``calibrate.measuring.sampling``): ``sample_s`` + ``sample_per_logit_s`` x rows x vocab fitted per
  runtime to its ``sample`` points (``sampling_summary``) and kept in ``generation[RT]`` with their points
  and held-out error (``sampling``); each generation prefill/decode point is fitted less its runtime's tail
  (``with_tails``: field ``sampling_tail_s``, ``calibrate.fitting.fit.fitted_value``). The same tail measured with the
  executor's log-prob recorder (``sample`` points with ``logprobs``) is fitted alike and kept as
  ``generation[RT].sampling_logprobs``; it prices a scenario with ``generation.sampling_logprobs`` and is
  subtracted from no point (the generation points run ``generate()`` as TRL does, without the recorder).
* ``kernels`` (``kernels_summary``): ``gemm_weight_passes`` (``calibrate.cpu.gemm``), passes over the weights
  of a matrix product of two rows or more against one row, and ``gemm_passes_by_footprint`` where the
  grid measured them by working-set footprint, which each decode point's work counts at its model's
  weight footprint (``with_tails``: field ``gemm_weight_passes``, ``calibrate.fitting.fit.point_work``), no faster than
  the footprint's measured one-row streaming rate (field ``stream_gb_s``, ``fitted``); ``width_efficiency``
  (``calibrate.cpu.widths``), the training rate by model width relative to the fastest, by which each
  training point's body FLOPs are divided (field ``width_rate``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np

import rlhfsim
from calibrate import MEASUREMENT_VERSION
from calibrate.cpu.coldfixed import cold_summary
from calibrate.fitting.fit import fit_operation, point_value
from calibrate.cpu.gemm import gemm_summary
from calibrate.cpu.widths import width_summary
from calibrate.measuring.sampling import fit_tail
from rlhfsim.costs.genruntimes import GEN_RUNTIMES, SAMPLING_AS, op_key
from rlhfsim.costs.cpuhost import CpuHostEffects, stream_factor
from rlhfsim.costs.model import OpParams
from rlhfsim.costs.profile import ADDED_TERMS, OPERATIONS, SCHEMA_VERSION, load_profile, validate_profile
from rlhfsim.hardware.catalog import GpuSpec
from rlhfsim.models.catalog import ModelShape

PLAIN_RUNTIMES = (None, "", "kv_decoder")   # the runtime field of points the plain prefill/decode fit


def _source(fit: dict) -> str:
    """``measured`` only for a fit with enough points to determine its parameters (``calibrate.fitting.fit``)."""
    return "measured" if fit["status"] == "ok" else "underdetermined"


STREAM_ROUNDS = 6   # at most this many fits of a decode operation whose points stream slower than its bandwidth


def fitted(pts: list[dict], gpu: GpuSpec, prior: OpParams) -> dict:
    """An operation fitted to its points, with ``source`` measured or underdetermined. Decode points with
    ``stream_gb_s`` (their footprint's measured streaming rate, ``with_tails``) count their weights
    ``stream_x = cpuhost.stream_factor(rate, mem_bw x memory_eff)`` times, as the simulator does
    (``rlhfsim.costs.model._Decode``); since the factor depends on the fitted ``memory_eff``, the fit is
    repeated with the factors of the last one until they stop moving (``STREAM_ROUNDS`` fits at most). No
    point below the crossover changes: a fit without such a point is the plain fit."""
    fit = fit_operation(pts, gpu, prior)
    if any(p.get("stream_gb_s") for p in pts):
        xs = [1.0] * len(pts)
        for _ in range(STREAM_ROUNDS - 1):
            bw = gpu.mem_bw * float(fit["memory_eff"])
            new = [stream_factor(1e9 * p["stream_gb_s"], bw) if p.get("stream_gb_s") else 1.0 for p in pts]
            if max(abs(a / b - 1.0) for a, b in zip(new, xs)) < 1e-3:
                break
            xs = new
            fit = fit_operation([{**p, "stream_x": x} if x > 1.0 else p for p, x in zip(pts, xs)], gpu, prior)
        fit = {**fit, "streamed_points": sum(x > 1.0 for x in xs)}
    return {**fit, "source": _source(fit)}


def _measured(points: list[dict], **match) -> list[dict]:
    return [p for p in points if "skipped" not in p and all(p.get(k) == v for k, v in match.items())]


def _plain(points: list[dict], op: str) -> list[dict]:
    """An operation's own points: for prefill/decode those of our decoder, not of a generation runtime."""
    pts = _measured(points, op=op)
    return [p for p in pts if p.get("runtime") in PLAIN_RUNTIMES] if op in ("prefill", "decode") else pts


def _handoff_fit(pts: list[dict]) -> tuple[float, float] | None:
    """(handoff_s, handoff_per_row_s) >= 0: least squares of t = a + c x batch over the points' boundary
    costs, each weighted by the inverse variance of its mean (var(samples) / n: a boundary cost is a
    difference of two calls, near zero and noisy on long calls, so relative weights would let the
    noisiest points decide); equal weights when a point has fewer than two samples. The per-row term is
    dropped when one batch size was measured or it fits < 0."""
    if not pts:
        return None
    b = np.array([p["batch"] for p in pts], dtype=np.float64)
    t = np.array([point_value(p) for p in pts], dtype=np.float64)
    se2 = [np.var(p["samples_s"], ddof=1) / len(p["samples_s"]) if len(p.get("samples_s") or []) >= 2 else None
           for p in pts]
    w = np.ones_like(t) if any(v is None or v <= 0 for v in se2) else 1.0 / np.array(se2)
    w = w / w.sum()
    a_only = max(float((w * t).sum()), 0.0)
    if np.ptp(b) == 0:
        return a_only, 0.0
    x = np.stack([np.ones_like(b), b], 1) * np.sqrt(w)[:, None]
    a, c = np.linalg.lstsq(x, t * np.sqrt(w), rcond=None)[0]
    if c < 0:
        return a_only, 0.0
    if a < 0:
        return 0.0, max(float((w * b * t).sum() / (w * b * b).sum()), 0.0)
    return float(a), float(c)


def _gen_models(records: list[dict], rt: str) -> dict:
    out = {}
    for r in records:
        if r["runtime"] == rt:
            out[r["model"]] = {k: r.get(k) for k in ("valid", "available", "reason", "tokens_match_eager",
                                                      "chunked_match", "first_divergence", "max_abs_diff",
                                                      "tolerance", "check_batch", "check_tokens")}
    return out


def sampling_summary(points: list[dict]) -> dict[str, dict]:
    """{runtime: the fit of its sampling tail (``calibrate.measuring.sampling.fit_tail``)} for each runtime with
    ``sample`` points; where the runtime's tail was also measured with the executor's log-prob recorder
    (points with ``logprobs``), that fit under the key ``logprobs``."""
    out = {}
    for rt in sorted({p.get("runtime") for p in points if p["op"] == "sample" and not p.get("logprobs")}):
        fit = fit_tail(_measured(points, op="sample", runtime=rt, logprobs=None), point_value)
        if fit is not None:
            out[rt] = fit
            recorded = fit_tail(_measured(points, op="sample", runtime=rt, logprobs=True), point_value)
            if recorded is not None:
                fit["logprobs"] = recorded
    return out


def _tail_of(point: dict, tails: dict[str, dict]) -> dict | None:
    rt = point.get("runtime")
    rt = "kv_decoder" if rt in PLAIN_RUNTIMES else rt
    return tails.get(rt) or tails.get(SAMPLING_AS.get(rt, ""))


def _put_tail(info: dict, rt: str, tails: dict[str, dict]) -> bool:
    """``generation[rt]`` given its measured sampling tail (True), or told whose it shares (False)."""
    tail = tails.get(rt)
    if tail is not None:
        info.update(sample_s=tail["sample_s"], sample_per_logit_s=tail["sample_per_logit_s"],
                    sampling={k: v for k, v in tail.items() if k != "logprobs"})
        if tail.get("logprobs") is not None:   # the tail with the executor's recorder (genruntimes.sample_tail)
            info["sampling_logprobs"] = tail["logprobs"]
        return True
    if rt in SAMPLING_AS and SAMPLING_AS[rt] in tails:
        info["sampling"] = {"shared_with": SAMPLING_AS[rt]}
    return False


def _plain_copy(ops: dict, op: str) -> str:
    """``op:kv_decoder``: the plain ``op`` fit (our decoder's points) under the runtime's key; returns the key."""
    key = op_key(op, "kv_decoder")
    ops[key] = {**ops[op], "source_points": f"the plain {op} points (calibrate.measuring.bench)"}
    return key


def kernels_summary(points: list[dict]) -> dict | None:
    """``kernels``: the GEMM weight passes (``calibrate.cpu.gemm``) and the training rate by width
    (``calibrate.cpu.widths``) where their points were measured; None when neither was."""
    gemm, widths = gemm_summary(points, point_value), width_summary(points, point_value)
    cold = cold_summary(points, point_value)
    out: dict = {}
    if gemm is not None:
        out.update(gemm_weight_passes=gemm["gemm_weight_passes"], gemm=gemm)
        if gemm.get("by_footprint"):
            out["gemm_passes_by_footprint"] = gemm["by_footprint"]
    if cold is not None:
        out["cold_overheads"] = cold
    if widths is not None:
        out["width_efficiency"] = widths
    return out or None


def with_tails(points: list[dict], tails: dict[str, dict], kernels: dict | None = None, kind: str = "cpu") -> list[dict]:
    """The points, with the measured terms their fits count (``calibrate.fitting.fit``): each generation
    prefill/decode point (LM head) ``sampling_tail_s``, its runtime's tail at its rows (batch) and
    vocabulary, which the fit takes off (``fitted_value``); on a CPU (``kind``: the device's catalog kind), the
    fields of the host effects ``kernels`` holds (``rlhfsim.costs.cpuhost.CpuHostEffects.point_fields``, the
    formulas the simulator prices them with): each decode point ``gemm_weight_passes`` (and ``stream_gb_s``,
    ``cold_x``) and each training point ``width_rate`` (its model width's relative training rate), which its work
    counts (``point_work``), and each training point of an LM head ``fault_s``, the page faults of its loss's
    logits-sized tensors (``calibrate.cpu.pagefaults``, pattern ``labels_train``), which the fit takes off. On a
    GPU, none of those. Without any, the points as they are."""
    cpu = CpuHostEffects.of({"kernels": kernels}, kind)
    if not tails and cpu is None:
        return points
    out = []
    for p in points:
        gen = p["op"] in ("prefill", "decode") and p.get("head") == "lm"
        tail = _tail_of(p, tails) if gen else None
        if tail is not None:
            p = {**p, "sampling_tail_s": tail["sample_s"] + tail["sample_per_logit_s"] * p["batch"] * p["shape"]["vocab"]}
        if cpu is not None:
            p = {**p, **cpu.point_fields(p)}
        out.append(p)
    return out


@dataclass(frozen=True)
class FitPoints:
    """A calibration's points on their way to a profile, prepared once for every fit that reads them (``prepare``):
    ``raw``, as journaled less their ``kind`` (what the profile keeps); ``tails``, the sampling tails their ``sample``
    points measure (``sampling_summary``); ``kernels``, the host effects their fits count (``kernels_summary`` of
    them, or a profile's own); ``fit``, the points with those terms set (``with_tails``); ``priors``, the bundled
    ``default`` profile's operations (each fit's starting point and an unmeasured operation's values)."""

    raw: list[dict]
    tails: dict[str, dict]
    kernels: dict | None
    fit: list[dict]
    default: dict

    @property
    def priors(self) -> dict[str, OpParams]:
        return {op: OpParams.from_dict(v) for op, v in self.default["operations"].items()}


MEASURED = object()   # ``prepare``'s kernels: summarised from the points themselves


def prepare(points: list[dict], kind: str, kernels=MEASURED, page_faults: dict | None = None) -> FitPoints:
    """``points`` prepared for the fits (``FitPoints``) on a device of catalog kind ``kind``: their ``kernels`` those
    they measured (``MEASURED``, with ``page_faults`` added where given: measured, not journaled) or the profile's
    given here (a refit that measured none)."""
    raw = [{k: v for k, v in p.items() if k != "kind"} for p in points]
    tails = sampling_summary(raw)
    if kernels is MEASURED:
        kernels = kernels_summary(raw)
        if page_faults:
            kernels = {**(kernels or {}), "page_faults": page_faults}
    return FitPoints(raw, tails, kernels, with_tails(raw, tails, kernels, kind), load_profile("default"))


# -- the refit pipeline: a measured profile's operations fitted again from prepared points, stage by stage --------
def _refit_generation(doc: dict, fp: FitPoints, gpu: GpuSpec) -> list[str]:
    """The plain ``prefill``/``decode`` (and their ``:kv_decoder`` copies) and each ``prefill:RT``/``decode:RT`` the
    profile measured, and the sampling tails into ``generation[RT]`` as ``generation_summary`` puts them."""
    priors, ops, gen, changed = fp.priors, doc["operations"], doc.setdefault("generation", {}), []
    for op in ("prefill", "decode"):
        plain = _plain(fp.fit, op)
        if plain and ops.get(op, {}).get("source") in ("measured", "underdetermined"):
            ops[op] = fitted(plain, gpu, priors[op])
            changed.append(op)
            if op_key(op, "kv_decoder") in ops:
                changed.append(_plain_copy(ops, op))
        for rt in GEN_RUNTIMES:
            own = [p for p in _measured(fp.fit, op=op, runtime=rt) if point_value(p) > 0]
            if rt != "kv_decoder" and own and op_key(op, rt) in ops:
                ops[op_key(op, rt)] = fitted(own, gpu, priors[op])
                changed.append(op_key(op, rt))
    return changed + [f"generation.{rt}.sample_s" for rt, info in gen.items() if _put_tail(info, rt, fp.tails)]


def _refit_train(doc: dict, fp: FitPoints, gpu: GpuSpec) -> list[str]:
    """``train``, where the profile measured it, with the cost terms ``fp.kernels`` hold (the width rate, the page
    faults: ``with_tails``)."""
    train = _plain(fp.fit, "train")
    if not train or doc["operations"].get("train", {}).get("source") not in ("measured", "underdetermined"):
        return []
    doc["operations"]["train"] = fitted(train, gpu, fp.priors["train"])
    return ["train"]


def _refit_encoders(doc: dict, fp: FitPoints, gpu: GpuSpec) -> list[str]:
    """Each runtime's fit to encoder reward models' padded batches (``runtimes.RUNTIME.fits.encoder``, and
    ``score:RUNTIME`` where that fit is the encoders'), ``encode:RUNTIME`` and ``reencode:RUNTIME``."""
    prior = fp.priors["prefill"]
    ops, runtimes, changed = doc["operations"], doc.get("runtimes") or {}, []
    for rt, info in sorted(runtimes.items()):
        if "encoder" not in (info.get("fits") or {}):
            continue
        pts = padded_score_points(fp.raw, rt, "encoder")
        if not pts:
            continue
        info["fits"]["encoder"] = fit_operation(pts, gpu, prior)
        changed.append(f"runtimes.{rt}.fits.encoder")
        key = f"score:{rt}"
        if info.get("op") == key and "decoder" not in info["fits"]:   # score:RT is the encoders' fit (build_profile)
            ops[key] = {**info["fits"]["encoder"], "source": _source(info["fits"]["encoder"]),
                        "source_points": ops[key]["source_points"]}
            changed.append(key)
    changed += encoder_score_ops(runtimes, ops)
    if any(p["op"] == "reencode" for p in fp.raw):
        doc["reencode"] = reencode_summary(fp.raw, ops, gpu, prior)
        changed += [r["op"] for r in doc["reencode"].values() if r.get("op")]
    return changed


REFIT_STAGES = {"generation": _refit_generation, "train": _refit_train, "encoders": _refit_encoders}


def refit(doc: dict, fp: FitPoints, gpu: GpuSpec, stages: tuple[str, ...]) -> list[str]:
    """A measured profile's operations fitted again from the prepared points ``fp``, one stage of ``REFIT_STAGES``
    after another, in the order given; nothing outside the stages changes. Returns the keys changed."""
    changed: list[str] = []
    for stage in stages:
        changed += REFIT_STAGES[stage](doc, fp, gpu)
    return changed


def refit_cost_terms(doc: dict, points: list[dict], gpu: GpuSpec, page_faults: dict | None = None) -> list[str]:
    """A measured profile's operations fitted again with the measured cost terms of ``points``
    (``calibrate.running.extend --cost-terms``): the sampling tails of its ``sample`` points, the GEMM weight passes
    of its ``gemm`` points and the training rate by width of its ``width_train`` points. Refitted from the
    profile's own points: the generation stage (``_refit_generation``), and ``train`` where the kernels hold a term
    of its (the width rate, the page faults); the tails go to ``generation[RT]``, the rest to ``kernels``. Returns
    the keys changed."""
    fp = prepare(points, gpu.kind, page_faults=page_faults or (doc.get("kernels") or {}).get("page_faults"))
    kernels = fp.kernels
    if kernels is not None:
        doc["kernels"] = kernels
    trains = kernels is not None and ("width_efficiency" in kernels or "page_faults" in kernels)
    changed = refit(doc, fp, gpu, ("generation",))
    tails = [k for k in changed if k.startswith("generation.")]   # reported after train, as before
    changed = [k for k in changed if not k.startswith("generation.")] + \
        (refit(doc, fp, gpu, ("train",)) if trains else []) + tails
    return changed + [f"kernels.{k}" for k in ("gemm_weight_passes", "gemm_passes_by_footprint", "cold_overheads",
                                               "width_efficiency", "page_faults") if k in (kernels or {})]


def refit_train(doc: dict, gpu: GpuSpec, points: list[dict] | None = None) -> bool:
    """A measured profile's ``train`` fitted again from ``points`` (default: its own) with the cost terms
    its ``kernels`` hold (the width rate, the page faults: ``with_tails``); nothing else changes. False
    when there are no training points or the profile's ``train`` was not measured."""
    fp = prepare(doc.get("points", []) if points is None else points, gpu.kind, kernels=doc.get("kernels"))
    return bool(refit(doc, fp, gpu, ("train",)))


def generation_summary(points: list[dict], records: list[dict], ops: dict, gpu: GpuSpec, priors: dict,
                       runtimes: tuple[str, ...], tails: dict[str, dict] | None = None) -> dict:
    """``generation[RT]`` for every runtime of the grid or with a journal record, adding the
    ``prefill:RT`` and ``decode:RT`` operations to ``ops`` (see the module docstring)."""
    out: dict[str, dict] = {}
    for rt in GEN_RUNTIMES:
        models = _gen_models(records, rt)
        if rt not in runtimes and not models:
            continue
        own = rt == "kv_decoder"     # our decoder: its points are the plain ones
        pre = _plain(points, "prefill") if own else _measured(points, op="prefill", runtime=rt)
        dec = _plain(points, "decode") if own else _measured(points, op="decode", runtime=rt)
        hand = [] if own else _measured(points, op="handoff", runtime=rt)
        pads = [] if own else _measured(points, op="pad", runtime=rt)
        checked = [m for m in models.values() if m["available"]]
        valid = all(m["valid"] for m in models.values()) and (bool(checked) or (own and bool(dec)))
        matches = [m["tokens_match_eager"] for m in models.values() if m["tokens_match_eager"] is not None]
        reason = next((f"{name}: {m['reason']}" for name, m in models.items() if m["reason"]), "")
        info = {"valid": valid, "available": all(m["available"] for m in models.values()) if models else own,
                "reason": reason or ("" if valid else "not measured"), "semantics": GEN_RUNTIMES[rt],
                "call_overhead_s": None, "handoff_s": None, "handoff_per_row_s": None,
                "pad_step_s": None, "pad_step_per_row_s": None, "pad_prefill_s": None,
                "tokens_match_eager": all(matches) if matches else None,
                "source": "derived" if own else ("measured" if checked else "skipped"),
                "n_points": len(pre) + len(dec) + len(hand) + len(pads), "ops": [], "models": models,
                "ms_per_step": [{"model": p["model"], "batch": p["batch"], "context": p["prefix_len"],
                                 "ms": 1e3 * point_value(p)} for p in dec] if valid else []}
        out[rt] = info
        _put_tail(info, rt, tails or {})
        if not valid:
            continue
        if own:
            # tokens reach the host every step (sample_next): no call boundary, nothing beyond the steps
            # and its decode steps always apply a mask (StaticKVDecoder.extend): padding adds nothing
            info.update(call_overhead_s=0.0, handoff_s=0.0, handoff_per_row_s=0.0, pad_step_s=0.0, pad_step_per_row_s=0.0,
                        pad_prefill_s=0.0)
            for op in ("prefill", "decode"):
                if ops[op].get("source") == "measured":
                    info["ops"].append(_plain_copy(ops, op))
            continue
        for op, pts in (("prefill", pre), ("decode", [p for p in dec if point_value(p) > 0])):
            if pts:
                ops[op_key(op, rt)] = fitted(pts, gpu, priors[op])
                info["ops"].append(op_key(op, rt))
        over = [p["call_overhead_s"] for p in pre if p.get("call_overhead_s") is not None]
        if over:
            info["call_overhead_s"] = max(float(np.median(over)), 0.0)
            info["call_overhead_points"] = [{"model": p["model"], "batch": p["batch"], "prompt": p["seq_len"],
                                             "call_overhead_s": p["call_overhead_s"]} for p in pre]
        fit = _handoff_fit(hand)
        if fit is not None:
            info["handoff_s"], info["handoff_per_row_s"] = fit
            info["handoff_points"] = [{"model": p["model"], "batch": p["batch"], "chunk": p["chunk"],
                                       "new_tokens": p["new_tokens"], "boundary_s": point_value(p)} for p in hand]
        fit = _handoff_fit(pads)   # the same form: a + c x batch over differences of two calls
        if fit is not None:
            info["pad_step_s"], info["pad_step_per_row_s"] = fit
            info["pad_prefill_s"] = max(float(np.median([p["prefill_pad_s"] for p in pads])), 0.0)
            info["pad_points"] = [{"model": p["model"], "batch": p["batch"], "prompt": p["prompt_len"],
                                   "step_s": point_value(p), "prefill_pad_s": p.get("prefill_pad_s")} for p in pads]
    return out


def runtime_summary(points: list[dict], records: list[dict]) -> dict:
    """{runtime: {valid, available, reason, max_abs_diff, tolerance, models: {...}}}."""
    out: dict[str, dict] = {}
    for rec in records:
        r = out.setdefault(rec["runtime"], {"valid": True, "available": True, "reason": "", "models": {}})
        m = r["models"].setdefault(rec["model"], {})
        m.update(valid=rec["valid"], available=rec["available"], reason=rec["reason"])
        if not rec["valid"]:
            r["valid"] = False
            r["reason"] = r["reason"] or f"{rec['model']}: {rec['reason']}"
        if not rec["available"]:
            r["available"] = False
    for p in points:
        if p["op"] != "score" or p.get("varlen"):
            continue
        if "skipped" in p:   # an invalid runtime's checked point keeps its difference to eager
            if "max_abs_diff" in p:
                m = out.setdefault(p["runtime"], {"valid": True, "available": True, "reason": "", "models": {}})
                mm = m["models"].setdefault(p["model"], {"valid": False, "available": True, "reason": ""})
                mm["max_abs_diff"] = max(mm.get("max_abs_diff", 0.0), p["max_abs_diff"])
            continue
        r = out.setdefault(p["runtime"], {"valid": True, "available": True, "reason": "", "models": {}})
        m = r["models"].setdefault(p["model"], {"valid": True, "available": True, "reason": ""})
        m["max_abs_diff"] = max(m.get("max_abs_diff", 0.0), p["max_abs_diff"])
        m["tolerance"] = p["tolerance"]
        m["setup_s"] = m.get("setup_s", 0.0) + p["setup_s"]
        m.setdefault("first_point", {"batch": p["batch"], "seq_len": p["seq_len"], "first_call_s": p["first_call_s"],
                                     "median_s": p["median_s"],
                                     "first_call_extra_s": max(0.0, p["first_call_s"] - p["median_s"])})
        m["n_points"] = m.get("n_points", 0) + 1
    for r in out.values():
        diffs = [m["max_abs_diff"] for m in r["models"].values() if "max_abs_diff" in m]
        r["max_abs_diff"] = max(diffs) if diffs else None
        r["n_points"] = sum(m.get("n_points", 0) for m in r["models"].values())
        if r["n_points"] == 0:
            r["valid"] = False
            r["reason"] = r["reason"] or "no points measured"
    return out


def interference_summary(points: list[dict], default: dict) -> dict:
    """Median decode and prefill slowdowns of the busy-loop points (``decode_slowdown``,
    ``prefill_slowdown``), and per generation runtime those of the hand-over points (``handover``:
    ``calibrate.cpu.corun``), each with the configurations it pools."""
    pts = _measured(points, op="interference")
    busy = [p for p in pts if p.get("corun_pattern") != "handover"]
    med = _slowdowns(busy)
    out = {**default, "source": "default"} if med is None else {
        **med, "source": "measured", "configs": [_corun_config(p) for p in busy]}
    handover: dict[str, dict] = {}
    for rt in sorted({p["runtime"] for p in pts if p.get("corun_pattern") == "handover"}):
        mine = [p for p in pts if p.get("corun_pattern") == "handover" and p["runtime"] == rt]
        med = _slowdowns(mine)
        if med is not None:
            configs = [{**_corun_config(p), "chunk": p["chunk"], **_size(p)} for p in mine]
            threads = {p.get("scorer_threads") for p in mine}
            handover[rt] = {**med, "configs": configs,
                            "scorer_threads": threads.pop() if len(threads) == 1 else None}   # calibrate.cpu.threadpool
            added = {side: fit for side in ("decode", "prefill") if (fit := handover_added_fit(configs, side))}
            if len(added) == 2:
                handover[rt]["added"] = added
            overlap = handover_overlap(mine)
            if overlap is not None:
                handover[rt]["overlap"] = overlap
    if handover:
        out["handover"] = handover
    return out


def handover_overlap(points: list[dict]) -> dict | None:
    """The actor's speed beside an idle and beside a computing scorer (``calibrate.cpu.corun.overlap_fit``) over
    a runtime's hand-over decode points that have it: the medians of ``idle_x`` and ``busy_x``, each
    configuration's fit, and ``lost``: the share of a scorer call's time the actor loses,
    ``1 - idle_x / busy_x``, as a line in the log of the actor's parameters (least squares over the
    configurations, with two actor sizes or more). On the 2-core VM that share followed the actor, not the
    scorer: 0.75-0.89 for tiny-qwen2 beside scorers of 0.6-4.8M parameters, 0.61-0.62 for small-qwen2-l2
    beside tiny-qwen2 and itself, 0.56 for small-qwen2 (``lab/diagnostics/handover_overlap.py`` measures it):
    the smaller the actor, the more of its step is the host's, which a call on the other core holds up.
    None where no point has a fit (a GPU, a journal older than the overlap fit, or for a ``generate()`` runtime
    a journal whose calls were stamped whole, so that the scorer's calls never covered one by half)."""
    fits = [{"model": p["model"], "partner": p["partner"], **_size(p), **p["overlap"]}
            for p in points if p["side"] == "decode" and isinstance(p.get("overlap"), dict)]
    if not fits:
        return None
    out = {"idle_x": float(np.median([f["idle_x"] for f in fits])),
           "busy_x": float(np.median([f["busy_x"] for f in fits])), "n_configs": len(fits), "configs": fits}
    sized = [f for f in fits if f.get("model_params")]
    if len({f["model_params"] for f in sized}) >= 2:
        x = np.log([f["model_params"] for f in sized])
        lost = np.array([1.0 - f["idle_x"] / f["busy_x"] for f in sized])
        slope, intercept = np.polyfit(x, lost, 1)
        out["lost"] = {"intercept": float(intercept), "per_log_params": float(slope),
                       "rms_resid": float(np.sqrt(np.mean((lost - (intercept + slope * x)) ** 2)))}
    return out


def _slowdowns(pts: list[dict]) -> dict | None:
    """Median ``decode_slowdown`` and ``prefill_slowdown`` of these points' two sides (None unless both
    sides were measured)."""
    d = [p["slowdown"] for p in pts if p["side"] == "decode"]
    pf = [p["slowdown"] for p in pts if p["side"] == "prefill"]
    if not d or not pf:
        return None
    return {"decode_slowdown": float(np.median(d)), "prefill_slowdown": float(np.median(pf))}


def _size(p: dict) -> dict:
    """``model_params`` (with the head it ran) and ``layers`` of a point's own model (its ``shape``); None
    both without one."""
    try:
        m = ModelShape(**p["shape"])
    except (KeyError, TypeError):
        return {"model_params": None, "layers": None}
    return {"model_params": m.params("lm" if p["side"] == "decode" else "value"), "layers": m.layers}


def handover_added_fit(configs: list[dict], side: str) -> dict | None:
    """The time the hand-over pattern adds to one ``side`` operation (``decode``: one decode step, the
    interval over its ``seq_len`` steps; ``prefill``: one scorer call), as ``const_s + per_layer_s x L +
    per_alone x t_alone`` with L the operation's model's layers and t_alone its time alone: non-negative
    least squares over the configurations of that side (``_nnls``), with their rms residual. On the
    2-core VM the added decode time followed the actor's layer count, not its size (``kv_decoder``:
    1.5-2.5 ms per step beside 2-layer actors of 0.6-2.9M parameters, 2.5-4.1 ms beside 4-layer ones of 1.1-4.8M),
    which a slowdown factor, a multiple of the time alone, cannot say. None without three configurations
    with layers and two layer counts among them."""
    rows = [c for c in configs if c["side"] == side and c.get("layers") and c.get("alone_median_s")]
    if len(rows) < 3 or len({c["layers"] for c in rows}) < 2:
        return None
    per = [c["seq_len"] if side == "decode" else 1 for c in rows]
    alone = np.array([c["alone_median_s"] / n for c, n in zip(rows, per)])
    added = np.array([c["corun_median_s"] / n for c, n in zip(rows, per)]) - alone
    x = np.stack([np.ones_like(alone), np.array([c["layers"] for c in rows], dtype=np.float64), alone], 1)
    coef = _nnls(x, added)
    resid = added - x @ coef
    return {**{k: float(v) for k, v in zip(ADDED_TERMS, coef)}, "n_configs": len(rows),
            "rms_resid_s": float(np.sqrt(np.mean(resid ** 2)))}


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a few columns: the best of the unconstrained fits on every subset
    of the columns whose coefficients are all >= 0 (the NNLS optimum is one of them: the plain fit on
    its own support); columns left out are 0."""
    import itertools

    k = x.shape[1]
    best, best_r = np.zeros(k), float(np.sum(y ** 2))
    for n in range(1, k + 1):
        for cols in itertools.combinations(range(k), n):
            c = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
            if np.any(c < 0):
                continue
            r = float(np.sum((y - x[:, cols] @ c) ** 2))
            if r < best_r:
                best = np.zeros(k)
                best[list(cols)] = c
                best_r = r
    return best


def _corun_config(p: dict) -> dict:
    return {"side": p["side"], "model": p["model"], "partner": p["partner"], "batch": p["batch"],
            "seq_len": p["seq_len"], "prefix_len": p["prefix_len"], "alone_median_s": p["alone_median_s"],
            "corun_median_s": p["median_s"], "alone_tmean_s": p.get("alone_tmean_s"),
            "corun_tmean_s": p.get("tmean_s"), "slowdown": p["slowdown"]}


def batching_summary(points: list[dict]) -> list[dict]:
    rows: dict[tuple, dict] = {}
    for p in _measured(points, op="score", varlen=True):
        row = rows.setdefault((p["model"], p["batch"], p["seq_len"]), {
            "model": p["model"], "batch": p["batch"], "max_len": p["seq_len"], "tokens": p["tokens"], "strategies": {}})
        row["strategies"][p["strategy"]] = {"median_s": p["median_s"], "iqr_s": p["iqr_s"],
                                            "padded_tokens": p["padded_tokens"], "max_abs_diff": p["max_abs_diff"],
                                            "peak_mem_mb": p.get("peak_mem_mb"), "samples_s": p["samples_s"],
                                            "rounds_of": p.get("rounds_of")}
    for row in rows.values():
        row["best"] = min(row["strategies"], key=lambda k: row["strategies"][k]["median_s"])
    return list(rows.values())


def chunk_summary(points: list[dict]) -> list[dict]:
    pts = _measured(points, op="chunk_prefill")
    oneshot = {(p["model"], p["batch"], p["seq_len"]): p for p in pts if p["prefix_len"] == 0}
    rows = []
    for p in pts:
        if p["prefix_len"] == 0:
            continue
        o = oneshot.get((p["model"], p["batch"], p["prefix_len"] + p["seq_len"]))
        rows.append({"model": p["model"], "batch": p["batch"], "prefix_len": p["prefix_len"], "chunk": p["seq_len"],
                     "chunk_median_s": p["median_s"], "oneshot_median_s": o["median_s"] if o else None,
                     "max_abs_diff_vs_oneshot": p["max_abs_diff_vs_oneshot"]})
    return rows


def encoder_score_ops(runtimes: dict, ops: dict) -> list[str]:
    """``encode:RUNTIME`` for every valid runtime with a fit to encoder reward models' padded batches
    (``runtimes.RUNTIME.fits.encoder``): ``score:RUNTIME`` is the decoders' fit whenever decoders were
    measured, and DeBERTa's disentangled attention costs more than that fit says, so an encoder's forward
    pass is priced with its own family's fit (``CostModel._forward_kernel``). Returns the keys added."""
    added = []
    for rt, info in sorted(runtimes.items()):
        fit = (info.get("fits") or {}).get("encoder")
        if info.get("valid") and fit:
            ops[op_key("encode", rt)] = {**fit, "source": _source(fit) if "status" in fit else "measured",
                                         "source_points": "padded uniform-length batches of encoder reward models"}
            added.append(op_key("encode", rt))
    return added


def reencode_summary(points: list[dict], ops: dict, gpu: GpuSpec, prior: OpParams) -> dict:
    """``reencode:RUNTIME`` fitted to each runtime's re-encode points (``calibrate.measuring.reencode``: batch-1
    passes over a growing prefix of encoder reward models) added to ``ops``; returns per runtime its
    points (model, length, ms, max abs difference to eager) and what was skipped, with why."""
    out: dict[str, dict] = {}
    for p in points:
        if p["op"] != "reencode":
            continue
        row = out.setdefault(p["runtime"], {"op": None, "points": [], "skipped": []})
        if "skipped" in p:
            row["skipped"].append({"model": p["model"], "length": p["seq_len"], "why": p["skipped"]})
        else:
            row["points"].append({"model": p["model"], "length": p["seq_len"], "ms": 1e3 * point_value(p),
                                  "max_abs_diff": p.get("max_abs_diff")})
    for rt, row in sorted(out.items()):
        pts = _measured(points, op="reencode", runtime=rt)
        if pts:
            ops[op_key("reencode", rt)] = {**fitted(pts, gpu, prior),
                                           "source_points": "batch-1 re-encodes of a growing prefix of encoder reward models"}
            row["op"] = op_key("reencode", rt)
    return out


def padded_score_points(points: list[dict], rt: str, arch: str | None = None) -> list[dict]:
    """A runtime's measured padded uniform-length scoring points (the ones its ``score``/``encode`` fits are made
    of), of one architecture (``decoder``, ``encoder``) or all."""
    return [p for p in _measured(points, op="score", runtime=rt, strategy="padded")
            if not p.get("varlen") and (arch is None or p["shape"]["arch"] == arch)]


def refit_encoder_ops(doc: dict, gpu: GpuSpec) -> list[str]:
    """A measured profile's encoder operations fitted again from its own points under the current work model
    (``rlhfsim.costs.flops``: DeBERTa-v2's disentangled attention): the refit's ``encoders`` stage. Nothing is
    measured; returns the keys changed (``calibrate.running.extend --refit-encoders``)."""
    return refit(doc, prepare(doc.get("points", []), gpu.kind, kernels=doc.get("kernels")), gpu, ("encoders",))


def build_profile(*, name: str, gpu: GpuSpec, dtype: str, device: dict, command: str, quick: bool,
                  points: list[dict], records: list[dict], grid: dict, page_faults: dict | None = None) -> dict:
    """The Profile dict of a calibration (validated with ``rlhfsim.costs.profile.validate_profile``);
    ``page_faults``: ``calibrate.cpu.pagefaults.measure_page_faults`` where it was measured (not journaled)."""
    fp = prepare(points, gpu.kind, page_faults=page_faults)
    default, priors, tails, kernels, raw, points = fp.default, fp.priors, fp.tails, fp.kernels, fp.raw, fp.fit
    ops: dict[str, dict] = {}
    for op in OPERATIONS:
        pts = _plain(points, op)
        if pts:
            ops[op] = fitted(pts, gpu, priors[op])
        else:
            ops[op] = {**default["operations"][op], "source": "default"}
    gen_records = [r for r in records if r.get("family") == "generation"]
    records = [r for r in records if r.get("family") != "generation"]
    runtimes = runtime_summary(points, records)
    for rt, info in sorted(runtimes.items()):
        fams = {arch: padded_score_points(points, rt, arch) for arch in ("decoder", "encoder")}
        info["fits"] = {arch: fit_operation(v, gpu, priors["prefill"]) for arch, v in fams.items() if v}
        info["op"] = None
        if info["valid"] and info["fits"]:
            # Decoder reward models (the OPPO setting) when measured, else the encoder ones: one FLOP
            # model does not describe both (DeBERTa's relative attention costs more than flops.py counts).
            fam = "decoder" if "decoder" in info["fits"] else "encoder"
            ops[f"score:{rt}"] = {**info["fits"][fam], "source": _source(info["fits"][fam]),
                                  "source_points": f"padded uniform-length batches of {fam} reward models"}
            info["op"] = f"score:{rt}"
    encoder_score_ops(runtimes, ops)
    reencode = reencode_summary(points, ops, gpu, priors["prefill"])
    generation = generation_summary(points, gen_records, ops, gpu, priors, tuple(grid.get("gen_runtimes", ())), tails)
    profile = {
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "gpu": gpu.name,
        "dtype": dtype,
        "device": device,
        "provenance": {"source": "measured", "measurement_version": MEASUREMENT_VERSION, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                       "command": command, "rlhfsim_version": rlhfsim.__version__, "quick": quick},
        "operations": ops,
        "interference": interference_summary(points, default["interference"]),
        "runtimes": runtimes,
        "generation": generation,
        "batching": batching_summary(points),
        "chunked_scoring": chunk_summary(points),
        "reencode": reencode,
        **({"kernels": kernels} if kernels is not None else {}),
        "grid": grid,
        "points": raw,
    }
    return validate_profile(profile, f"profile {name}")

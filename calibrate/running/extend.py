"""Extend a measured profile with the operations of issue 15 (or, ``--handover``, the co-running of issue 16;
``--cost-terms``, the sampling tails, GEMM weight passes and training rate by width of issue 16),
measured on this device with the calibration's own machinery, without measuring the rest again:

* ``reencode:RUNTIME`` (``calibrate.measuring.reencode``): re-encode scoring of the encoder reward models given
  (default tiny-deberta) over a growing prefix, every scoring runtime interleaved (eager, compile,
  onnxruntime, aoti_python, aoti_cpp: the C++ harness), fitted by ``calibrate.fitting.assemble.reencode_summary``;
* ``step.retokenize_s``, ``step.retokenize_per_token_s`` (``calibrate.measuring.stepbench._retokenize``);
* ``encode:RUNTIME`` from the profile's own encoder fits (``calibrate.fitting.assemble.encoder_score_ops``: no
  new measurement).

The points are appended to the profile's ``points`` and the journal kept beside the output; the
profile's ``provenance.extensions`` records the command, date, load and thread count. Nothing the profile
already had is changed::

    python -m calibrate.running.extend rlhfsim/profiles/cpu.json [--models tiny-deberta] [--runtimes eager,...]

``--handover``: co-running in the hand-over pattern (``calibrate.cpu.corun``), ``kv_decoder`` and
``hf_generate``, each decoder model given (default tiny-qwen2 and small-qwen2) as actor and as its own
scorer, batch 4, 64-token prompts, 32-token chunks; sets ``interference.handover``::

    python -m calibrate.running.extend rlhfsim/profiles/cpu.json --handover

``--cost-terms``: the sampling tails of the generation runtimes (``calibrate.measuring.sampling``), the GEMM
weight passes (``calibrate.cpu.gemm``), the training rate by width (``calibrate.cpu.widths``) and, on a CPU, the
page faults of large tensors (``calibrate.cpu.pagefaults``), then the profile's generation prefill/decode and
training operations fitted again with them (``calibrate.fitting.assemble.refit_cost_terms``)::

    python -m calibrate.running.extend rlhfsim/profiles/cpu.json --cost-terms

``--refit-encoders``: nothing measured; the encoder operations (``encode:RUNTIME``, ``reencode:RUNTIME``, the
runtimes' encoder fits) fitted again from the profile's own points under the current work model
(``calibrate.fitting.assemble.refit_encoder_ops``; DeBERTa-v2's disentangled attention, ``rlhfsim.costs.flops``)::

    python -m calibrate.running.extend rlhfsim/profiles/cpu.json --refit-encoders

``--page-faults``: only the page faults of large tensors, and ``train`` fitted again with them
(``calibrate.fitting.assemble.refit_train``); nothing else changes::

    python -m calibrate.running.extend rlhfsim/profiles/cpu.json --page-faults
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
from pathlib import Path

import torch

from calibrate.fitting.assemble import encoder_score_ops, reencode_summary
from calibrate.measuring.device_info import load_avg, usable_cores
from calibrate.running.grid import default_grid, with_overrides
from calibrate.running.journal import Journal, journal_path, with_points, write_profile
from calibrate.running.progress import Progress
from calibrate.measuring.reencode import measure_reencode, plan_size
from calibrate.runtimes import RUNTIMES
from calibrate.runtimes.aoti_cpp import default_cache_dir
from calibrate.running.session import Session
from calibrate.measuring.stepbench import _retokenize
from rlhfsim.costs.model import OpParams
from rlhfsim.costs.profile import load_profile, validate_profile
from rlhfsim.errors import RlhfsimError
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import CATALOG


def extension_journal(path: Path, what: str) -> Path:
    """The journal of extension ``what`` of the profile at ``path``: ``STEM.WHAT.journal.jsonl`` beside it."""
    return journal_path(Path(path).with_name(f"{Path(path).stem}.{what}.json"))


def _begin(path: Path, what: str, threads: int, models: list[str], runtimes: list[str], quick: bool) -> tuple:
    """An extension's start: the profile, its device kind and dtype, the journal beside it
    (``STEM.WHAT.journal.jsonl``) and its meta, the start time and load, and the thread count to restore
    once the caller has set ``threads`` for its measurements."""
    doc = with_points(json.loads(Path(path).read_text()), path)
    device, dtype = doc["device"].get("kind", "cpu"), doc.get("dtype", "float32")
    device = "cuda" if device == "cuda" else "cpu"
    old_threads = torch.get_num_threads()
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    jpath = extension_journal(path, what)
    meta = {"device_kind": device, "device_name": doc["device"].get("name"), "dtype": dtype, "threads": threads,
            "models": models, "runtimes": runtimes, "quick": quick}
    return doc, device, dtype, jpath, meta, started, load_avg(), old_threads


def extend(path: Path, models: list[str], runtimes: list[str], actor: str, threads: int, quick: bool = True,
           grid: dict | None = None, iters: int = 7, resume: bool = False) -> dict:
    doc, device, dtype, jpath, meta, started, load_start, old_threads = _begin(path, "reencode", threads, models,
                                                                             runtimes, quick)
    spec = get_gpu(doc["gpu"], "profile.gpu")
    g = with_overrides(default_grid(device, quick), grid)
    shapes = [CATALOG[m] for m in models]
    rts = {r: RUNTIMES[r]() for r in runtimes}
    torch.set_num_threads(threads)
    try:
        with Journal.open(jpath, meta, resume) as journal, \
                Progress(sum(plan_size(g, m, rts) for m in shapes), enabled=True) as prog:
            s = Session(device, dtype, g, journal, prog, default_cache_dir(), {}, threads)
            with torch.inference_mode(False):
                for m in shapes:
                    model = s.hf_model(m, "value")
                    measure_reencode(s, rts, model, m)
                    del model
                    s.free()
            points = journal.points()
        retok = _retokenize(CATALOG[actor], iters)
    finally:
        torch.set_num_threads(old_threads)
    prior = OpParams.from_dict(load_profile("default")["operations"]["prefill"])
    ops = dict(doc["operations"])
    doc["reencode"] = reencode_summary(points, ops, spec, prior)
    encoder_score_ops(doc["runtimes"], ops)
    doc["operations"] = ops
    doc["points"] = [p for p in doc.get("points", []) if p.get("op") != "reencode"] + \
        [{k: v for k, v in p.items() if k != "kind"} for p in points]
    step = dict(doc.get("step") or {})
    step.update(retokenize_s=retok["retokenize_s"], retokenize_per_token_s=retok["retokenize_per_token_s"])
    samples = dict(step.get("samples") or {})
    samples["retokenize"] = retok
    step["samples"] = samples
    step.setdefault("source", "measured")
    doc["step"] = step
    return _finish(path, doc, 15, started, load_start, threads, models, runtimes, jpath,
                   sorted(k for k in ops if k.startswith(("reencode:", "encode:"))) + ["step.retokenize_s", "step.retokenize_per_token_s"],
                   {"reencode_lengths": list(g.reencode_lengths), "reencode_static_lengths": list(g.reencode_static_lengths),
                    "rounds": g.rounds, "per_round": g.per_round})


def _finish(path: Path, doc: dict, issue: int, started: str, load_start, threads: int, models: list[str],
            runtimes: list[str], jpath: Path | None, added: list[str], grid: dict, what: str | None = None) -> dict:
    """Record the extension in ``provenance.extensions`` (one per issue and ``what``: a rerun replaces it),
    check the profile and write it atomically."""
    ext = {"issue": issue, "date": started, "command": shlex.join(["python", "-m", "calibrate.running.extend", *sys.argv[1:]]),
           "added": added, "threads": threads, "load_avg_1m_at_start": load_start, "load_avg_1m_at_end": load_avg(),
           "models": models, "runtimes": runtimes, "journal": jpath.name if jpath else None, "grid": grid}
    if what is not None:
        ext["what"] = what
    prov = dict(doc["provenance"])
    prov["extensions"] = [e for e in prov.get("extensions", [])
                          if (e.get("issue"), e.get("what")) != (issue, what)] + [ext]
    doc["provenance"] = prov
    validate_profile(doc, str(path))
    write_profile(Path(path), doc)
    return doc


def extend_handover(path: Path, models: list[str], threads: int, batch: int = 4, prompt: int = 64, chunk: int = 32,
                    runtimes: tuple[str, ...] = ("kv_decoder", "hf_generate"), resume: bool = False) -> dict:
    """Add co-running in the hand-over pattern (``calibrate.cpu.corun``) to a measured profile: for each
    generation runtime and decoder model, the model as actor and as its own scorer at (batch, prompt,
    chunk). A runtime other than ``kv_decoder`` is measured where the profile's own correctness check
    found it valid on that model (copied into the journal as such). Sets ``interference.handover`` and
    appends the points; nothing else the profile had is changed."""
    from calibrate.fitting.assemble import interference_summary
    from calibrate.cpu.corun import measure_handover
    from calibrate.measuring.genbench import runtime_key

    doc, device, dtype, jpath, meta, started, load_start, old_threads = _begin(path, "handover", threads, models,
                                                                             list(runtimes), True)
    shapes = [CATALOG[m] for m in models]
    entries = [(rt, m.name, m.name, batch, prompt, chunk) for rt in runtimes for m in shapes]
    g = with_overrides(default_grid(device, True), {"handover": entries})
    torch.set_num_threads(threads)
    try:
        with Journal.open(jpath, meta, resume) as journal, Progress(2 * len(entries), enabled=True) as prog:
            s = Session(device, dtype, g, journal, prog, default_cache_dir(), {}, threads)
            for rt, m in {(rt, m) for rt, m, *_ in entries if rt != "kv_decoder"}:
                info = (doc.get("generation", {}).get(rt, {}).get("models") or {}).get(m)
                key = runtime_key(rt, m)
                if info is not None and journal.get(key) is None:
                    journal.append({"kind": "runtime", "family": "generation", "key": key, "runtime": rt, "model": m,
                                    "valid": bool(info.get("valid")), "reason": info.get("reason", ""),
                                    "source": "the profile's own check (generation.RUNTIME.models)"})
            with torch.inference_mode(False):
                for rt, a, r, b, p, c in entries:
                    measure_handover(s, rt, CATALOG[a], CATALOG[r], b, p, c)
            points = journal.points()
    finally:
        torch.set_num_threads(old_threads)
    inter = dict(doc["interference"])
    inter["handover"] = interference_summary(points, inter).get("handover", {})
    doc["interference"] = inter
    doc["points"] = [p for p in doc.get("points", []) if p.get("corun_pattern") != "handover"] + \
        [{k: v for k, v in p.items() if k != "kind"} for p in points if p.get("op") == "interference"]
    return _finish(path, doc, 16, started, load_start, threads, models, list(runtimes), jpath,
                   ["interference.handover"], {"handover": [list(e) for e in entries]})


def extend_cost_terms(path: Path, threads: int, resume: bool = False, sampling: list | None = None,
                      gemm: list | None = None, widths: list | None = None, gemm_footprints: list | None = None) -> dict:
    """Add the cost terms the roofline cannot carry to a measured profile: the sampling tails
    (``calibrate.measuring.sampling``: the ``sample`` points of each generation runtime the profile prices with a
    sampler of its own, ``kv_decoder`` and ``hf_generate``, at the default grid's ``sampling``), the GEMM
    weight passes (``calibrate.cpu.gemm``, the grid's ``gemm`` and ``gemm_footprints_mib``), the decode step's fixed
    costs by footprint (``calibrate.cpu.coldfixed``, on the profile's smallest decoder) and the training rate by width
    (``calibrate.cpu.widths``, the grid's ``widths``); then its generation and training operations fitted
    again, from its own points, with them (``calibrate.fitting.assemble.refit_cost_terms``). Nothing else the
    profile had is changed."""
    from calibrate.fitting.assemble import refit_cost_terms
    from calibrate.cpu.coldfixed import measure_cold, plan_size as cold_plan_size
    from calibrate.cpu.gemm import measure_gemm, plan_size as gemm_plan_size
    from calibrate.cpu.widths import measure_widths, plan_size as widths_plan_size
    from calibrate.measuring.sampling import measure_sampling, plan_size as sampling_plan_size, sampled_runtimes

    doc, device, dtype, jpath, meta, started, load_start, old_threads = _begin(path, "cost_terms", threads, [],
                                                                             [], True)
    gen = doc.get("generation", {})
    runtimes = meta["runtimes"] = [rt for rt in sampled_runtimes(list(gen)) if gen[rt].get("valid")]
    g = with_overrides(default_grid(device, True), {k: v for k, v in (("sampling", sampling), ("gemm", gemm),
                                                                      ("widths", widths),
                                                                      ("gemm_footprints_mib", gemm_footprints))
                                                               if v is not None})
    actors = _profile_decoders(doc)
    torch.set_num_threads(threads)
    try:
        with Journal.open(jpath, meta, resume) as journal, \
                Progress(sampling_plan_size(g, runtimes) + gemm_plan_size(g) + cold_plan_size(g, actors)
                         + widths_plan_size(g), enabled=True) as prog:
            s = Session(device, dtype, g, journal, prog, default_cache_dir(), {}, threads)
            measure_gemm(s)
            measure_cold(s, actors)
            measure_sampling(s, runtimes)
            measure_widths(s)
            new = [{k: v for k, v in p.items() if k != "kind"} for p in journal.points()]
    finally:
        torch.set_num_threads(old_threads)
    points = [p for p in doc.get("points", []) if p.get("op") not in ("sample", "gemm", "cold_step", "width_train")] + new
    faults = _page_faults(doc, device, threads)
    changed = refit_cost_terms(doc, points, get_gpu(doc["gpu"], "profile.gpu"), faults)
    doc["points"] = points
    return _finish(path, doc, 16, started, load_start, threads, [], runtimes, jpath, changed,
                   {"sampling": [list(x) for x in g.sampling], "gemm": [list(x) for x in g.gemm],
                    "gemm_footprints_mib": list(g.gemm_footprints_mib),
                    "widths": list(g.widths), "width_mlp_ratio": g.width_mlp_ratio,
                    "width_mlp_ratios": list(g.width_mlp_ratios), "width_tokens": g.width_tokens},
                   what="cost_terms")


def _profile_decoders(doc: dict) -> list:
    """The decoder shapes a profile measured (its plain decode points), in the order first seen."""
    from rlhfsim.models.catalog import ModelShape

    seen: dict[str, ModelShape] = {}
    for p in doc.get("points", []):
        if p.get("op") == "decode" and p.get("shape") and p["model"] not in seen:
            seen[p["model"]] = ModelShape(**p["shape"])
    return list(seen.values())


def _page_faults(doc: dict, device: str, threads: int) -> dict | None:
    """``calibrate.cpu.pagefaults`` on a CPU profile with decoders (counted on a one-layer model of the first
    one's family, ``count_shape``); None elsewhere."""
    from calibrate.cpu.pagefaults import count_shape, measure_page_faults

    decoders = _profile_decoders(doc)
    if device != "cpu" or not decoders:
        return None
    print("page faults of large tensors (calibrate.cpu.pagefaults)", flush=True)
    return measure_page_faults(count_shape(decoders), threads)


def extend_page_faults(path: Path, threads: int) -> dict:
    """Add the page faults of large tensors (``calibrate.cpu.pagefaults``) to a measured CPU profile and fit
    its ``train`` operation again with them (``calibrate.fitting.assemble.refit_train``, the profile's own
    points); nothing else changes."""
    from calibrate.fitting.assemble import refit_train

    doc, device, dtype, jpath, meta, started, load_start, old_threads = _begin(path, "page_faults", threads, [], [], True)
    if device != "cpu":
        raise RlhfsimError(f"--page-faults: expected a CPU profile (glibc's allocator), got a {device} one")
    faults = _page_faults(doc, device, threads)
    if faults is None:
        raise RlhfsimError("--page-faults: expected a profile with decoder points to count the tensors on, found none")
    doc["kernels"] = {**(doc.get("kernels") or {}), "page_faults": faults}
    changed = ["kernels.page_faults"] + (["train"] if refit_train(doc, get_gpu(doc["gpu"], "profile.gpu")) else [])
    return _finish(path, doc, 16, started, load_start, threads, [], [], jpath, changed, {}, what="page_faults")


def extend_refit_encoders(path: Path) -> dict:
    """The profile's encoder operations fitted again from its own points under the current work model
    (``calibrate.fitting.assemble.refit_encoder_ops``); nothing is measured and nothing else changes."""
    from calibrate.fitting.assemble import refit_encoder_ops

    doc = with_points(json.loads(Path(path).read_text()), path)
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    changed = refit_encoder_ops(doc, get_gpu(doc["gpu"], "profile.gpu"))
    if not changed:
        raise RlhfsimError(f"--refit-encoders: {path}: expected encoder scoring points to fit, found none")
    return _finish(path, doc, 16, started, load_avg(), torch.get_num_threads(), [], [], None, changed, {},
                   what="refit_encoders")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m calibrate.running.extend", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", type=Path)
    ap.add_argument("--models", default="tiny-deberta", help="encoder reward models (comma-separated catalog names)")
    ap.add_argument("--runtimes", default="eager,compile,onnxruntime,aoti_python,aoti_cpp")
    ap.add_argument("--actor", default="small-qwen2", help="the actor whose tokenizer re-tokenizing starts from")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--handover", action="store_true",
                    help="add only co-running in the hand-over pattern (calibrate.cpu.corun) for --models (decoders; "
                         "default tiny-qwen2,small-qwen2) as actor and scorer")
    ap.add_argument("--page-faults", action="store_true",
                    help="add only the page faults of large tensors (calibrate.cpu.pagefaults; CPU) and refit training")
    ap.add_argument("--cost-terms", action="store_true",
                    help="add only the sampling tails (calibrate.measuring.sampling), the GEMM weight passes "
                         "(calibrate.cpu.gemm), the training rate by width (calibrate.cpu.widths) and, on a CPU, "
                         "the page faults of large tensors "
                         "(calibrate.cpu.pagefaults), and refit the generation and training operations")
    ap.add_argument("--refit-encoders", action="store_true",
                    help="measure nothing: fit the encoder operations (encode:RT, reencode:RT, the runtimes' encoder "
                         "fits) again from the profile's own points under the current work model")
    args = ap.parse_args(argv)
    if args.refit_encoders:
        doc = extend_refit_encoders(args.profile)
        print(json.dumps({k: {f: round(v[f], 4) for f in ("compute_eff", "memory_eff", "overhead_s", "heldout_mape")
                              if isinstance(v.get(f), float)}
                          for k, v in doc["operations"].items() if k.startswith(("encode:", "reencode:"))}, indent=1))
        return
    if args.page_faults:
        doc = extend_page_faults(args.profile, args.threads or usable_cores())
        pf = doc["kernels"]["page_faults"]
        print(json.dumps({k: pf[k] for k in ("fault_s_per_byte", "threshold_bytes", "tensors")}))
        print(json.dumps({k: v for k, v in doc["provenance"]["extensions"][-1].items() if k in ("added",)}))
        return
    if args.cost_terms:
        doc = extend_cost_terms(args.profile, args.threads or usable_cores(), resume=args.resume)
        k = doc.get("kernels") or {}
        print(json.dumps({"gemm_weight_passes": k.get("gemm_weight_passes"),
                          "width_efficiency": {w: round(r, 3) for w, r in zip((k.get("width_efficiency") or {}).get("widths", []),
                                                                              (k.get("width_efficiency") or {}).get("relative_rate", []))}}))
        print(json.dumps({rt: {k: info.get(k) for k in ("sample_s", "sample_per_logit_s")}
                          for rt, info in doc["generation"].items() if "sample_s" in info}, indent=1))
        print(json.dumps({op: doc["operations"][op].get("heldout_mape_by_model")
                          for op in ("prefill", "decode", "prefill:hf_generate", "decode:hf_generate", "train")
                          if op in doc["operations"]}, indent=1))
        return
    if args.handover:
        models = args.models.split(",") if args.models != "tiny-deberta" else ["tiny-qwen2", "small-qwen2"]
        doc = extend_handover(args.profile, models, args.threads or usable_cores(), resume=args.resume)
        print(json.dumps({rt: {k: v for k, v in h.items() if k != "configs"}
                          for rt, h in doc["interference"]["handover"].items()}, indent=1))
        return
    doc = extend(args.profile, args.models.split(","), args.runtimes.split(","), args.actor,
                 args.threads or usable_cores(), resume=args.resume)
    print(json.dumps({k: v for k, v in doc["operations"].items() if k.startswith("reencode:")}, indent=1))
    print(json.dumps({k: doc["step"][k] for k in ("retokenize_s", "retokenize_per_token_s")}))


def cli(argv: list[str] | None = None) -> int:
    """``main`` with a one-line error and exit status 2 for bad input (a profile without the points an
    extension needs, an unreadable profile), instead of a traceback."""
    try:
        main(argv)
    except (RlhfsimError, OSError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())

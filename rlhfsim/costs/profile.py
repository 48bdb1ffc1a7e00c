"""The Profile: a versioned JSON document, the only thing that crosses from ``calibrate/`` to ``rlhfsim/``.

Pure Python (json, os): ``calibrate/`` imports this module to write profiles on machines that have torch
but not pydantic or simpy.

Layout (``schema_version`` 1)::

    {
      "schema_version": 1,
      "name": "cpu",                     # what --profile NAME finds
      "gpu": "cpu",                      # hardware catalog entry whose datasheet peaks the fit is relative to
      "dtype": "float32",                # dtype the measurements ran in
      "device": {"kind": "cpu"|"cuda", "name": ..., "memory_bytes": ..., "driver": ..., "cuda": ...,
                 "torch": ..., "cpu_model": ..., "threads": ...,
                 "state_probe_at_start": {...}, "state_probe_at_end": {...}},   # CPU: calibrate.measuring.devstate
      "provenance": {"source": "measured"|"derived", "date": ISO-8601, "command": ..., "rlhfsim_version": ...},
      "operations": {                    # fitted parameters per operation (see docs/cost-model.md)
        OP: {"compute_eff": f, "memory_eff": f, "overhead_s": f, "overhead_per_layer_s": f,
             "heldout_mape": f|null, "n_points": int}
      },                                 # OP in prefill, decode, chunk_prefill, train, optimizer, score:RUNTIME,
                                         # prefill:RUNTIME, decode:RUNTIME (generation runtimes)
      "interference": {"decode_slowdown": f, "prefill_slowdown": f, "source": "measured"|"default",
                       "handover": {RUNTIME: {"decode_slowdown": f, "prefill_slowdown": f, "configs": [...],
                                              "added": {"decode"|"prefill": {"const_s": f, "per_layer_s": f,
                                                                             "per_alone": f, ...}},
                                              "overlap": {"idle_x": f, "busy_x": f, "lost": {"intercept": f,
                                                          "per_log_params": f}, ...}}}},   # optional
      "generation": {RUNTIME: {...}},    # generation runtimes (rlhfsim.costs.genruntimes), optional
      "step": {SCALAR: f, ...},          # framework step scalars (rlhfsim.costs.stepcosts), optional
      "kernels_by_shape": {"applies_to": [OP base names], "gemm": {"e_max", "m_half", "s_half", "weight_memory_eff",
                           "t0_gemm_s", ...}, "elementwise": {"memory_eff", "floor_s", ...}, "source": {...}},
                                         # GPU kernel terms by shape (calibrate.fitting.fromops, rlhfsim.costs.byshape), optional
      "collectives": {"all_reduce"|"send_recv": {"by_workers": {"N": {"latency_s": f, "bus_bw": f, ...}},
                      "source": {...}}},  # fitted NCCL terms (calibrate.fitting.fromops), optional
      "runtimes": {RUNTIME: {"valid": bool, "max_abs_diff": f, "reason": str, ...}},
      "points": [ {...one measured point...} ]
    }
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

from rlhfsim.costs.cpuhost import FAULT_PATTERNS
from rlhfsim.costs.genruntimes import GEN_RUNTIMES, GEN_SCALARS
from rlhfsim.costs.framework import check_framework
from rlhfsim.costs.stepcosts import check_step
from rlhfsim.errors import ProfileError
from rlhfsim.hardware.catalog import carried_operations, stated_gpu

SCHEMA_VERSION = 1
OPERATIONS = ("prefill", "decode", "chunk_prefill", "train", "optimizer")
EFF_KEYS = ("compute_eff", "memory_eff", "overhead_s", "overhead_per_layer_s")
BUNDLED_DIR = Path(__file__).resolve().parent.parent / "profiles"
DEFAULT_PROFILE = "default"
# ``--profile auto``: the bundled profile of the scenario's GPU (``default_profile_for``; ``CostModel.load``)
AUTO_PROFILE = "auto"
# The bundled profile a GPU scenario gets with ``--profile auto`` (``default_profile_for``): the kernel terms fitted from
# public per-operation data (calibrate.fitting.fromops; calibrate/public/vidur) for the GPUs measured there, and for GPUs of
# the same architecture and NVLink generation without data of their own, that GPU's curves, which are fractions of
# each GPU's own datasheet peaks (H200 and GH200: H100's Hopper tensor cores and NVLink 4; A100 40GB: the A100 80GB's
# SXM4 board). H100 PCIe is not mapped: its GPUs talk over PCIe, not the NVSwitch of Vidur's collectives.
GPU_PROFILES = {"h100-sxm": "h100-sxm", "h200": "h100-sxm", "gh200": "h100-sxm",
                "a100-80gb": "a100-80gb", "a100-40gb": "a100-80gb"}
# The host and software terms fitted to every public log (rlhfsim.fromrun.bundle): the layer the GPU profiles extend,
# and the profile of a GPU with none of its own
PUBLIC_PROFILE = "public"


def default_profile_for(gpu_name: str) -> str:
    """The profile ``--profile auto`` prices a scenario on ``gpu_name`` with: its bundled profile (``GPU_PROFILES``, else
    one named after the GPU, written when its own public logs identified a device term) where that file ships, else
    ``public`` where it ships, else ``default``."""
    ref = GPU_PROFILES.get(gpu_name, gpu_name)
    if gpu_name != "cpu" and (BUNDLED_DIR / f"{ref}.json").is_file():
        return ref
    return PUBLIC_PROFILE if (BUNDLED_DIR / f"{PUBLIC_PROFILE}.json").is_file() else DEFAULT_PROFILE


def user_profile_dir() -> Path:
    """Where ``rlhfsim calibrate`` writes profiles without ``--out``: $RLHFSIM_PROFILE_DIR, else
    $XDG_DATA_HOME/rlhfsim/profiles, else ~/.local/share/rlhfsim/profiles."""
    env = os.environ.get("RLHFSIM_PROFILE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "rlhfsim" / "profiles"


def bundled_names() -> set[str]:
    """Names of the profiles shipped with rlhfsim (``cpu``, ``default``)."""
    return {q.stem for q in BUNDLED_DIR.glob("*.json")}


class ProfileShadowWarning(UserWarning):
    """A user profile carries a bundled profile's name and is used in its place."""


def resolve_profile_path(ref: str) -> Path:
    """A path to a JSON file, or a name looked up in the user profile directory, then the bundled ones.
    A user profile with a bundled profile's name (written by an older ``calibrate``, which named every CPU
    profile ``cpu``) is still used, but never silently: a ``ProfileShadowWarning`` names both files."""
    p = Path(ref)
    if p.suffix == ".json" or os.sep in ref:
        if not p.is_file():
            raise ProfileError(f"profile: expected a profile JSON file, got {ref!r} (no such file)")
        return p
    for d in (user_profile_dir(), BUNDLED_DIR):
        cand = d / f"{ref}.json"
        if cand.is_file():
            if d != BUNDLED_DIR and (BUNDLED_DIR / cand.name).is_file():
                warnings.warn(f"profile {ref!r}: using {cand}, which shadows the bundled profile of that name "
                              f"({BUNDLED_DIR / cand.name}); pass a path to choose, or rename the user profile",
                              ProfileShadowWarning, stacklevel=2)
            return cand
    names = sorted({q.stem for d in (user_profile_dir(), BUNDLED_DIR) if d.is_dir() for q in d.glob("*.json")})
    raise ProfileError(f"profile: expected a profile name ({', '.join(names) or 'none found'}) or a path, got {ref!r}")


def validate_profile(doc: dict, where: str = "profile") -> dict:
    if not isinstance(doc, dict):
        raise ProfileError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    ver = doc.get("schema_version")
    if ver != SCHEMA_VERSION:
        raise ProfileError(f"{where}.schema_version: expected {SCHEMA_VERSION}, got {ver!r} "
                           f"(re-run `rlhfsim calibrate` with this version of rlhfsim)")
    for key in ("name", "gpu", "operations", "provenance"):
        if key not in doc:
            raise ProfileError(f"{where}.{key}: expected a value, got nothing")
    ops = doc["operations"]
    if not isinstance(ops, dict):
        raise ProfileError(f"{where}.operations: expected an object, got {type(ops).__name__}")
    for op, params in ops.items():
        for k in EFF_KEYS:
            v = params.get(k) if isinstance(params, dict) else None
            if not isinstance(v, (int, float)) or v < 0 or (k.endswith("_eff") and not 0 < v <= 1.5):
                raise ProfileError(f"{where}.operations.{op}.{k}: expected a non-negative number "
                                   f"(efficiencies in (0, 1.5]), got {v!r}")
    gen = doc.get("generation", {})
    if not isinstance(gen, dict):
        raise ProfileError(f"{where}.generation: expected an object keyed by runtime, got {type(gen).__name__}")
    for rt, info in gen.items():
        if not isinstance(info, dict):
            raise ProfileError(f"{where}.generation.{rt}: expected an object, got {type(info).__name__}")
        lp = info.get("sampling_logprobs")
        if lp is not None and not isinstance(lp, dict):
            raise ProfileError(f"{where}.generation.{rt}.sampling_logprobs: expected an object (sample_s, "
                               f"sample_per_logit_s) or null, got {type(lp).__name__}")
        for k, v in ([(k, info.get(k)) for k in (*GEN_SCALARS, "sample_s", "sample_per_logit_s")]
                     + [(f"sampling_logprobs.{k}", (lp or {}).get(k)) for k in ("sample_s", "sample_per_logit_s")]):
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < float("inf")):
                raise ProfileError(f"{where}.generation.{rt}.{k}: expected a finite number of seconds >= 0 or null, got {v!r}")
        _check_engine_host(info, f"{where}.generation.{rt}")
    kernels = doc.get("kernels")
    if kernels is not None:
        v = kernels.get("gemm_weight_passes") if isinstance(kernels, dict) else None
        if not isinstance(kernels, dict) or (v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)
                                                               or not 1.0 <= v < float("inf"))):
            raise ProfileError(f"{where}.kernels.gemm_weight_passes: expected a finite number >= 1, got {v!r}")
        fp = kernels.get("gemm_passes_by_footprint")
        if fp is not None and not _footprint_table(fp):
            raise ProfileError(f"{where}.kernels.gemm_passes_by_footprint: expected increasing footprint_mib > 0 and as "
                               f"many passes, each a finite number >= 1 (gb_s_1row: as many rates > 0; by_rows: "
                               f"increasing rows >= 2, per row count as many passes), got {fp!r}"[:300])
        co = kernels.get("cold_overheads")
        if co is not None and not _cold_table(co):
            raise ProfileError(f"{where}.kernels.cold_overheads: expected increasing footprint_mib >= 0 and as many "
                               f"factors, each a finite number >= 1, got {co!r}"[:300])
        we = kernels.get("width_efficiency")
        if we is not None:
            curves = {"": we, **{f".by_ratio.{r}": sub for r, sub in ((we.get("by_ratio") or {}).items()
                                                                     if isinstance(we, dict) else ())}}
            for path, curve in curves.items():
                if not _width_curve(curve):
                    raise ProfileError(f"{where}.kernels.width_efficiency{path}: expected increasing widths and their "
                                       f"relative rates in (0, 1], got {curve!r}"[:300])
        _check_page_faults(kernels.get("page_faults"), f"{where}.kernels.page_faults")
    _check_interference(doc.get("interference", {}), f"{where}.interference")
    _check_by_shape(doc.get("kernels_by_shape"), f"{where}.kernels_by_shape")
    _check_collectives(doc.get("collectives"), f"{where}.collectives")
    if "step" in doc:
        problem = check_step(doc["step"], f"{where}.step")
        if problem:
            raise ProfileError(problem)
    if doc.get("framework") is not None:
        problem = check_framework(doc["framework"], f"{where}.framework")
        if problem:
            raise ProfileError(problem)
    return doc


def _footprint_column(t, column: str, foot_ok) -> list | None:
    """The ``footprint_mib`` of a table (a dict) whose footprints each pass ``foot_ok`` and increase, beside as many
    finite numbers >= 1 under ``column``; None for anything else."""
    if not isinstance(t, dict):
        return None
    f = t.get("footprint_mib")
    if not isinstance(f, list) or not f or not all(foot_ok(x) for x in f) or any(b <= a for a, b in zip(f, f[1:])):
        return None
    return f if _at_least_one(t.get(column), len(f)) else None


def _at_least_one(xs, n: int) -> bool:
    """A list of ``n`` finite numbers >= 1 (not bools)."""
    return isinstance(xs, list) and len(xs) == n and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and 1.0 <= x < float("inf") for x in xs)


def _cold_table(t) -> bool:
    """``kernels.cold_overheads`` (``calibrate.cpu.coldfixed``): increasing footprints >= 0, a factor >= 1 each."""
    return _footprint_column(t, "factor", _non_negative) is not None


def _check_page_faults(pf, where: str) -> None:
    """``kernels.page_faults`` (``calibrate.cpu.pagefaults``; priced by ``cpuhost.page_fault_s``): a mapping with a
    ``fault_s_per_byte`` and a ``threshold_bytes`` (finite numbers >= 0), ``tensors`` giving each priced pattern's
    count (finite >= 0) and, where measured, ``logprob_tail.s_per_logit`` (seconds per logit, >= 0 and below 1e-6);
    None or absent prices no faults."""
    if pf is None:
        return
    if not isinstance(pf, dict):
        raise ProfileError(f"{where}: expected an object (fault_s_per_byte, threshold_bytes, tensors) or null, got {type(pf).__name__}")
    for k in ("fault_s_per_byte", "threshold_bytes"):
        if not _non_negative(pf.get(k)):
            raise ProfileError(f"{where}.{k}: expected a finite number >= 0, got {pf.get(k)!r}")
    tensors = pf.get("tensors")
    for pattern in FAULT_PATTERNS:
        v = tensors.get(pattern) if isinstance(tensors, dict) else None
        if not _non_negative(v):
            raise ProfileError(f"{where}.tensors.{pattern}: expected a finite count >= 0 of logits-sized tensors, got {v!r}")
    tail = pf.get("logprob_tail")
    v = tail.get("s_per_logit") if isinstance(tail, dict) else tail
    if tail is not None and not (_non_negative(v) and v < 1e-6):
        raise ProfileError(f"{where}.logprob_tail.s_per_logit: expected a finite number of seconds per logit >= 0 and "
                           f"below 1e-6, got {v!r}"[:300])


def _footprint_table(t) -> bool:
    f = _footprint_column(t, "passes", _positive)
    if f is None:
        return False
    rates = t.get("gb_s_1row")
    if rates is not None and not (isinstance(rates, list) and len(rates) == len(f) and all(_positive(x) for x in rates)):
        return False
    by_rows = t.get("by_rows")
    if by_rows is None:
        return True
    rows, per = (by_rows.get("rows"), by_rows.get("passes")) if isinstance(by_rows, dict) else (None, None)
    return (isinstance(rows, list) and isinstance(per, list) and len(rows) == len(per) >= 1
            and all(isinstance(r, int) and not isinstance(r, bool) and r >= 2 for r in rows) and rows == sorted(set(rows))
            and all(_at_least_one(xs, len(f)) for xs in per))


def _width_curve(curve) -> bool:
    """``{"widths": increasing ints > 0, "relative_rate": as many numbers in (0, 1]}``, at least two."""
    ws, rs = (curve.get("widths"), curve.get("relative_rate")) if isinstance(curve, dict) else (None, None)
    return (isinstance(ws, list) and isinstance(rs, list) and len(ws) == len(rs) >= 2
            and all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in ws) and ws == sorted(set(ws))
            and all(isinstance(r, (int, float)) and not isinstance(r, bool) and 0 < r <= 1 for r in rs))


def _check_by_shape(sec, where: str) -> None:
    """``kernels_by_shape`` (``calibrate.fitting.fromops``; priced by ``rlhfsim.costs.byshape``): efficiencies in (0, 1.5],
    half-points and floors finite >= 0, ``applies_to`` a list of operation names; None or absent: constants."""
    if sec is None:
        return
    if not isinstance(sec, dict):
        raise ProfileError(f"{where}: expected an object (applies_to, gemm, elementwise) or null, got {type(sec).__name__}")
    ops = sec.get("applies_to")
    if not (isinstance(ops, list) and ops and all(isinstance(o, str) and o for o in ops)):
        raise ProfileError(f"{where}.applies_to: expected a non-empty list of operation names, got {ops!r}"[:300])
    checks = [("gemm", k, _eff) for k in ("e_max", "weight_memory_eff")] + \
             [("gemm", k, _non_negative) for k in ("m_half", "s_half", "t0_gemm_s")] + \
             [("elementwise", "memory_eff", _eff), ("elementwise", "floor_s", _non_negative)]
    for part, key, ok in checks:
        sub = sec.get(part)
        v = sub.get(key) if isinstance(sub, dict) else None
        if not ok(v):
            what = "an efficiency in (0, 1.5]" if ok is _eff else "a finite number >= 0"
            raise ProfileError(f"{where}.{part}.{key}: expected {what}, got {v!r}"[:300])


def _check_engine_host(info: dict, where: str) -> None:
    """A runtime's engine host keys (``rlhfsim.costs.genruntimes.engine_host``), each optional: ``step_host_s`` and
    ``step_host_per_seq_s`` seconds >= 0, ``step_host_overlap`` a share in [0, 1], ``graph_max_batch`` rows >= 1 with
    ``eager_runtime`` a generation runtime."""
    for k in ("step_host_s", "step_host_per_seq_s"):
        v = info.get(k)
        if v is not None and not _non_negative(v):
            raise ProfileError(f"{where}.{k}: expected a finite number of seconds >= 0 or null, got {v!r}")
    v = info.get("step_host_overlap")
    if v is not None and not (_non_negative(v) and v <= 1):
        raise ProfileError(f"{where}.step_host_overlap: expected a share in [0, 1] or null, got {v!r}")
    g = info.get("graph_max_batch")
    if g is not None:
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise ProfileError(f"{where}.graph_max_batch: expected a whole number of rows >= 1 or null, got {g!r}")
        if info.get("eager_runtime") not in GEN_RUNTIMES:
            raise ProfileError(f"{where}.eager_runtime: expected the runtime whose launches a step past graph_max_batch "
                               f"pays ({', '.join(GEN_RUNTIMES)}), got {info.get('eager_runtime')!r}")


def _check_collectives(sec, where: str) -> None:
    """``collectives`` (``calibrate.fitting.fromops``): per collective, ``by_workers`` keyed by a worker count >= 2, each with
    ``latency_s`` finite >= 0 and ``bus_bw`` (bytes/s) finite > 0, and optionally ``small_message_s`` (seconds >= 0:
    the measured time of a small call, a floor); an entry may carry the floor alone (beside the link constants);
    None or absent: the link constants."""
    if sec is None:
        return
    if not isinstance(sec, dict):
        raise ProfileError(f"{where}: expected an object keyed by collective (all_reduce, send_recv) or null, got {type(sec).__name__}")
    for coll, body in sec.items():
        by = body.get("by_workers") if isinstance(body, dict) else None
        if not isinstance(by, dict) or not by:
            raise ProfileError(f"{where}.{coll}.by_workers: expected an object keyed by worker count, got {by!r}"[:300])
        for n, p in by.items():
            if not (isinstance(n, str) and n.isdigit() and int(n) >= 2):
                raise ProfileError(f"{where}.{coll}.by_workers: expected worker counts >= 2 as keys, got {n!r}")
            only_floor = isinstance(p, dict) and p.get("latency_s") is None and p.get("bus_bw") is None \
                and p.get("small_message_s") is not None   # a measured floor beside the link constants
            for key, ok in () if only_floor else (("latency_s", _non_negative), ("bus_bw", _positive)):
                v = p.get(key) if isinstance(p, dict) else None
                if not ok(v):
                    raise ProfileError(f"{where}.{coll}.by_workers.{n}.{key}: expected a finite number "
                                       f"{'>= 0 (seconds)' if key == 'latency_s' else '> 0 (bytes/s)'}, got {v!r}")
            v = p.get("small_message_s") if isinstance(p, dict) else None
            if v is not None and not _non_negative(v):
                raise ProfileError(f"{where}.{coll}.by_workers.{n}.small_message_s: expected a finite number >= 0 "
                                   f"(seconds) or null, got {v!r}")


def _eff(v) -> bool:
    """An efficiency: a finite number in (0, 1.5] (not a bool)."""
    return _positive(v) and v <= 1.5


def _positive(v) -> bool:
    """A finite number > 0 (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")


def _non_negative(v) -> bool:
    """A finite number >= 0 (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < float("inf")


ADDED_TERMS = ("const_s", "per_layer_s", "per_alone")   # interference.handover.RT.added.SIDE (calibrate.fitting.assemble)
OVERLAP_TERMS = ("idle_x", "busy_x")   # interference.handover.RT.overlap (calibrate.cpu.corun.overlap_fit)


def _check_interference(inter, where: str) -> None:
    if not isinstance(inter, dict):
        raise ProfileError(f"{where}: expected an object, got {type(inter).__name__}")
    slow = ("decode_slowdown", "prefill_slowdown")
    sections = [(where, inter, False)]
    handover = inter.get("handover", {})
    if not isinstance(handover, dict):
        raise ProfileError(f"{where}.handover: expected an object keyed by generation runtime, got {type(handover).__name__}")
    sections += [(f"{where}.handover.{rt}", v, True) for rt, v in handover.items()]
    for path, sec, required in sections:
        if not isinstance(sec, dict):
            raise ProfileError(f"{path}: expected an object, got {type(sec).__name__}")
        for k in slow:
            if k not in sec and not required:
                continue
            v = sec.get(k)
            if not _positive(v):
                raise ProfileError(f"{path}.{k}: expected a finite number > 0, got {v!r}")
        if not required:
            continue
        configs = sec.get("configs", [])
        if not isinstance(configs, list):
            raise ProfileError(f"{path}.configs: expected a list, got {type(configs).__name__}")
        added = sec.get("added")
        if added is not None:
            if not isinstance(added, dict) or set(added) != {"decode", "prefill"}:
                raise ProfileError(f"{path}.added: expected an object with decode and prefill, got {added!r}")
            for side, fit in added.items():
                ok = isinstance(fit, dict) and all(
                    isinstance(fit.get(k), (int, float)) and not isinstance(fit.get(k), bool) and 0 <= fit[k] < float("inf")
                    for k in ADDED_TERMS)
                if not ok:
                    raise ProfileError(f"{path}.added.{side}: expected {', '.join(ADDED_TERMS)} as finite numbers >= 0, "
                                       f"got {fit!r}")
        overlap = sec.get("overlap")
        if overlap is not None:
            ok = (isinstance(overlap, dict) and all(_positive(overlap.get(k)) and overlap[k] >= 1 for k in OVERLAP_TERMS)
                  and overlap["busy_x"] >= overlap["idle_x"])
            if not ok:
                raise ProfileError(f"{path}.overlap: expected idle_x and busy_x as finite numbers >= 1 with busy_x >= "
                                   f"idle_x, got {overlap!r}")
            line = overlap.get("lost")
            if line is not None and not (isinstance(line, dict) and all(
                    isinstance(line.get(k), (int, float)) and not isinstance(line.get(k), bool)
                    and abs(line[k]) < float("inf") for k in ("intercept", "per_log_params"))):
                raise ProfileError(f"{path}.overlap.lost: expected intercept and per_log_params as finite numbers, "
                                   f"got {line!r}")
        for i, c in enumerate(configs):
            ok = (isinstance(c, dict) and c.get("side") in ("decode", "prefill") and isinstance(c.get("model"), str)
                  and isinstance(c.get("partner"), str) and _positive(c.get("slowdown"))
                  and (c.get("model_params") is None or _positive(c["model_params"])))
            if not ok:
                raise ProfileError(f"{path}.configs[{i}]: expected an object with side decode|prefill, model, partner, "
                                   f"a finite slowdown > 0 and model_params > 0 or none, got {c!r}")


def load_profile(ref: str) -> dict:
    path = resolve_profile_path(ref)
    doc = _with_extends(_read_json(path), path, [str(path.resolve())])
    doc = validate_profile(doc, f"profile {path.name}")
    doc.setdefault("_path", str(path))
    return doc


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ProfileError(f"profile: expected valid JSON in {str(path)!r}, got {e}") from None


def _with_extends(doc, path: Path, chain: list[str]) -> dict:
    """A profile that extends another (``"extends": NAME-or-PATH``, a relative path read from the extending
    file's directory; ``rlhfsim calibrate --from-run`` writes such overlays): the base loaded the same way, then
    the overlay merged over it key by key (objects merged, anything else replaced). The result lists the chain
    under ``extends_chain``; a profile without ``extends`` is returned as it is."""
    if not isinstance(doc, dict) or "extends" not in doc:
        return doc
    ref = doc["extends"]
    if not isinstance(ref, str) or not ref:
        raise ProfileError(f"profile {path.name}.extends: expected a profile name or path, got {ref!r}")
    near = path.parent / ref
    base_path = resolve_profile_path(str(near) if near.suffix == ".json" and near.is_file() else ref)
    key = str(base_path.resolve())
    if key in chain:
        raise ProfileError(f"profile {path.name}.extends: expected a chain that ends, got a cycle back to {base_path.name}")
    base = _with_extends(_read_json(base_path), base_path, [*chain, key])
    merged = extend(base, {k: v for k, v in doc.items() if k != "extends"})
    merged["extends_chain"] = [str(base_path), *base.get("extends_chain", [])]
    return merged


def extend(base: dict, over: dict) -> dict:
    """``over`` merged over ``base`` key by key (objects merged, anything else replaced). A profile's efficiencies are
    stated for the GPU its ``gpu`` field names (``rlhfsim.hardware.catalog.stated_gpu``; ``any``: an H100 SXM): where
    ``over`` names another GPU than ``base``, the compute efficiencies it inherits are first carried from base's GPU to
    its own (``catalog.carried_operations``), so every efficiency of the merged profile is stated for its ``gpu``
    (an A100 profile that extends the datasheet-derived layer inherits that layer's H100 fractions as A100 ones)."""
    src, dst = stated_gpu(base.get("gpu", "any")), stated_gpu(over.get("gpu", base.get("gpu", "any")))
    if src is not None and dst is not None and isinstance(base.get("operations"), dict):
        base = {**base, "operations": carried_operations(base["operations"], src, dst)}
    return _merge(base, over)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out

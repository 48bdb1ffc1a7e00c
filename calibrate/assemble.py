"""Turn journaled points into a Profile (layout: ``rlhfsim/costs/profile.py``).

* ``operations``: ``prefill``, ``decode``, ``chunk_prefill``, ``train``, ``optimizer`` fitted to their
  points (``calibrate.fit``); ``score:RUNTIME`` for every runtime valid on every model it ran on, fitted
  to its padded uniform-length points (the one strategy every runtime runs) of the decoder reward models,
  or of the encoder ones when no decoder was measured (``source_points`` says which). Both families' fits
  are kept under ``runtimes.RUNTIME.fits``. An operation with no points keeps the bundled ``default``
  profile's values with ``"source": "default"`` so the simulator still finds it.
* ``interference``: median decode and prefill slowdowns over the measured co-running configurations.
* ``runtimes``: per runtime, validity, max abs difference to eager, setup and first-call costs per model.
* ``batching``: padded / bucketed / packed medians per (model, batch, max length); ``chunked_scoring``:
  chunk-on-prefix against one-shot prefill of the same total length.
"""

from __future__ import annotations

import datetime as dt

import numpy as np

import rlhfsim
from calibrate import MEASUREMENT_VERSION
from calibrate.fit import fit_operation
from rlhfsim.costs.model import OpParams
from rlhfsim.costs.profile import OPERATIONS, SCHEMA_VERSION, load_profile, validate_profile
from rlhfsim.hardware.catalog import GpuSpec


def _measured(points: list[dict], **match) -> list[dict]:
    return [p for p in points if "skipped" not in p and all(p.get(k) == v for k, v in match.items())]


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
        if p["op"] != "score" or p.get("varlen") or "skipped" in p:
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
    pts = _measured(points, op="interference")
    d = [p["slowdown"] for p in pts if p["side"] == "decode"]
    pf = [p["slowdown"] for p in pts if p["side"] == "prefill"]
    if not d or not pf:
        return {**default, "source": "default"}
    return {"decode_slowdown": float(np.median(d)), "prefill_slowdown": float(np.median(pf)), "source": "measured",
            "configs": [{"side": p["side"], "model": p["model"], "partner": p["partner"], "batch": p["batch"],
                         "seq_len": p["seq_len"], "prefix_len": p["prefix_len"], "alone_median_s": p["alone_median_s"],
                         "corun_median_s": p["median_s"], "alone_tmean_s": p.get("alone_tmean_s"),
                         "corun_tmean_s": p.get("tmean_s"), "slowdown": p["slowdown"]} for p in pts]}


def batching_summary(points: list[dict]) -> list[dict]:
    rows: dict[tuple, dict] = {}
    for p in _measured(points, op="score", varlen=True):
        row = rows.setdefault((p["model"], p["batch"], p["seq_len"]), {
            "model": p["model"], "batch": p["batch"], "max_len": p["seq_len"], "tokens": p["tokens"], "strategies": {}})
        row["strategies"][p["strategy"]] = {"median_s": p["median_s"], "iqr_s": p["iqr_s"],
                                            "padded_tokens": p["padded_tokens"], "max_abs_diff": p["max_abs_diff"]}
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


def build_profile(*, name: str, gpu: GpuSpec, dtype: str, device: dict, command: str, quick: bool,
                  points: list[dict], records: list[dict], grid: dict) -> dict:
    """The Profile dict of a calibration (validated with ``rlhfsim.costs.profile.validate_profile``)."""
    default = load_profile("default")
    priors = {op: OpParams.from_dict(v) for op, v in default["operations"].items()}
    points = [{k: v for k, v in p.items() if k != "kind"} for p in points]
    ops: dict[str, dict] = {}
    for op in OPERATIONS:
        pts = _measured(points, op=op)
        if pts:
            ops[op] = {**fit_operation(pts, gpu, priors[op]), "source": "measured"}
        else:
            ops[op] = {**default["operations"][op], "source": "default"}
    runtimes = runtime_summary(points, records)
    for rt, info in sorted(runtimes.items()):
        pts = [p for p in _measured(points, op="score", runtime=rt, strategy="padded") if not p.get("varlen")]
        fams = {arch: [p for p in pts if p["shape"]["arch"] == arch] for arch in ("decoder", "encoder")}
        info["fits"] = {arch: fit_operation(v, gpu, priors["prefill"]) for arch, v in fams.items() if v}
        info["op"] = None
        if info["valid"] and info["fits"]:
            # Decoder reward models (the OPPO setting) when measured, else the encoder ones: one FLOP
            # model does not describe both (DeBERTa's relative attention costs more than flops.py counts).
            fam = "decoder" if "decoder" in info["fits"] else "encoder"
            ops[f"score:{rt}"] = {**info["fits"][fam], "source": "measured",
                                  "source_points": f"padded uniform-length batches of {fam} reward models"}
            info["op"] = f"score:{rt}"
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
        "batching": batching_summary(points),
        "chunked_scoring": chunk_summary(points),
        "grid": grid,
        "points": points,
    }
    return validate_profile(profile, f"profile {name}")

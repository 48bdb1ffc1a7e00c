"""From the per-step records of ``calibrate.enginehost.engine`` to the fitted host work per engine step.

Pure numpy: runs without vLLM (and without torch), so its tests run in the fast loop.

Host time of one engine step (thread CPU time, seconds), from each step's record::

    host_s = step - forward - logits - sampler - wrapper_cost x (wrapped calls - 1)

(``engine.py`` says which function each name wraps; the last term takes off what the timing wrappers
themselves add.) A **decode step** is a step after the first two of its run (the prefill and the first
decode step of a new batch shape, kept apart as first calls) and before its last (where the requests
finish), in which all the run's requests were running and each was scheduled one token (the steps where a batch
fills up or drains, with requests admitted or finishing, are left out).

Fitted equation (per engine step, on this CPU)::

    host_step_s = a + b x running_seqs

by least squares on the relative residuals (each point its median over its decode steps; a relative
objective, so the fixed term is set by the small batches and not drowned by the large ones), with the
held-out error of each point predicted by the fit without it (leave one point out) and of each layer
count predicted by the fit without that layer count (the host work must not depend on the model).

Prefill steps: the same fit's residual against the step's prompt tokens and new requests,
``host_s - (a + b x running) = c x prefill_tokens + d x new_requests`` (non-negative least squares), the
per-token term a chunked-prefill step adds.

Layer extrapolation, the cross-check that needs no function list: for each batch size the median wall
time of a decode step at 1, 2, 4, 8 layers, a line over the layer count, and its value at 0 layers:
what a step costs with no model at all (host work plus the embedding, the logits and the sampler).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

DEVICE_PARTS = ("forward", "logits", "sampler")
# Parts of the host work, each a sum of wrapped functions' thread CPU time (engine.py's names). ``other``
# is what the step does outside them (LLMEngine.step's own code, the engine core's step, the executor).
PARTS = {
    "schedule": ("schedule",),
    "update": ("update",),
    "input_prep": ("execute", "-forward", "-logits"),
    "bookkeeping": ("bookkeeping",),
    "sample_other": ("sample_tokens", "-sampler", "-bookkeeping"),
    "output": ("output",),
}
# V0 (engine_v0): the sampler runs inside execute_model, and ``bookkeeping`` is the sampler's Python.
PARTS_V0 = {
    "schedule": ("schedule",),
    "input_prep": ("prepare_inputs",),
    "sampler_host": ("bookkeeping",),
    "output": ("output",),
}


def parts_of(r: dict) -> dict:
    return PARTS_V0 if r.get("engine") == "v0" else PARTS


def load_rows(paths) -> list[dict]:
    """Every step record of the given JSONL files (gzipped where the name ends in .gz)."""
    rows = []
    for p in paths:
        p = Path(p)
        with (gzip.open(p, "rt") if p.suffix == ".gz" else p.open()) as f:
            rows.extend(json.loads(line) for line in f if line.strip())
    return rows


def host_s(r: dict) -> float:
    """Host thread CPU time of one step record (seconds)."""
    wrapped = max(0, int(r.get("wrapped_calls", 0)) - 1)
    return (r["step_cpu_s"] - sum(r[f"{p}_cpu_s"] for p in DEVICE_PARTS)
            - float(r.get("wrapper_cost_s", 0.0)) * wrapped)


def part_s(r: dict, part: str) -> float:
    total = 0.0
    for name in parts_of(r)[part]:
        sign, key = (-1.0, name[1:]) if name.startswith("-") else (1.0, name)
        total += sign * r[f"{key}_cpu_s"]
    return total


def _last_step(rows: list[dict]) -> dict:
    last = {}
    for r in rows:
        key = (r["arch"], r["layers"], r["run"])
        last[key] = max(last.get(key, -1), r["step"])
    return last


def is_decode(r: dict, last: dict) -> bool:
    return (r["kind"] == "decode" and 2 <= r["step"] < last[(r["arch"], r["layers"], r["run"])]
            and r["prefill_tokens"] == 0 and r["tokens"] == r["reqs"] == r["running"] == r["n"])


def summarize(x) -> dict:
    """Median, quartiles and IQR/median of samples (seconds), with their count."""
    x = np.asarray(x, dtype=float)
    q1, med, q3 = np.percentile(x, [25, 50, 75])
    return {"median_s": float(med), "q1_s": float(q1), "q3_s": float(q3), "n": int(len(x)),
            "iqr_rel": float((q3 - q1) / med) if med > 0 else None}


def quiet_reference_s(rows: list[dict]) -> float | None:
    """The reference workload's time on a quiet core: the least ``ref_min_s`` of all runs."""
    refs = [r["ref_min_s"] for r in rows if r.get("ref_min_s")]
    return min(refs) if refs else None


def decode_points(rows: list[dict], value=host_s,
                  key=("arch", "layers", "running", "prompt_len", "logprobs", "detokenize"),
                  ref_quiet: float | None = None) -> list[dict]:
    """One point per ``key`` over the decode steps: the summary of ``value``, its 20th percentile, the load
    beside it and, where the runs carry the reference workload (``engine.reference_s``), ``norm_median_s``:
    the median of each step's value x ref_quiet / its run's ``ref_med_s``, the step as a quiet core would
    have run it (``ref_quiet`` defaults to ``quiet_reference_s(rows)``)."""
    last = _last_step(rows)
    ref_quiet = quiet_reference_s(rows) if ref_quiet is None else ref_quiet
    groups = defaultdict(list)
    for r in rows:
        if is_decode(r, last):
            groups[tuple(r.get(k, False if k == "detokenize" else None) for k in key)].append(r)
    points = []
    for k, rs in sorted(groups.items(), key=lambda kv: tuple(-1 if v is None else v for v in kv[0])):
        loads = [r["loadavg"][0] for r in rs if r.get("loadavg")]
        vals = np.array([value(r) for r in rs])
        p = {**dict(zip(key, k)), **summarize(vals), "p20_s": float(np.percentile(vals, 20)),
             "loadavg_1m": float(np.median(loads)) if loads else None}
        if ref_quiet and all(r.get("ref_med_s") for r in rs):
            slow = np.array([r["ref_med_s"] / ref_quiet for r in rs])
            p["slowdown"] = float(np.median(slow))
            p["norm_median_s"] = float(np.median(vals / slow))
        points.append(p)
    return points


def fit_linear(x, y, rel: bool = True) -> tuple[float, float]:
    """(a, b) of y = a + b x by least squares, on relative residuals when ``rel``."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    w = 1.0 / y if rel else np.ones_like(y)
    A = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(A, y * w, rcond=None)
    return float(a), float(b)


def heldout(x, y, groups=None, rel: bool = True) -> dict:
    """Held-out relative errors of y = a + b x: each group (default: each point) predicted by the fit to
    the others. Returns the errors' median/mean/max of |error| and the signed errors."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    g = np.arange(len(x)) if groups is None else np.asarray(groups)
    errs = np.full(len(x), np.nan)
    for v in dict.fromkeys(g.tolist()):
        out = g == v
        if (~out).sum() < 2 or len(set(x[~out].tolist())) < 2:
            continue
        a, b = fit_linear(x[~out], y[~out], rel)
        errs[out] = (a + b * x[out] - y[out]) / y[out]
    ok = ~np.isnan(errs)
    if not ok.any():
        return {"n": 0}
    e = np.abs(errs[ok])
    return {"n": int(ok.sum()), "median_abs": float(np.median(e)), "mean_abs": float(np.mean(e)),
            "max_abs": float(np.max(e)), "errors": [float(v) for v in errs]}


def fit_host(points: list[dict], value: str = "median_s") -> dict:
    """``a + b x running`` over decode points (their ``value``), with leave-one-point-out and
    leave-one-layer-count-out held-out errors."""
    if len(points) < 3:
        raise ValueError(f"fit_host: expected at least 3 decode points, got {len(points)}")
    x = [p["running"] for p in points]
    y = [p[value] for p in points]
    a, b = fit_linear(x, y)
    pred = a + b * np.asarray(x, float)
    out = {"equation": "host_step_s = a + b x running_seqs", "value": value, "a_s": a, "b_s": b,
           "n_points": len(points),
           "fit_mape": float(np.mean(np.abs(pred - np.asarray(y)) / np.asarray(y))),
           "heldout_point": heldout(x, y)}
    layers = [p.get("layers") for p in points]
    if len(set(layers)) > 1:
        out["heldout_layers"] = heldout(x, y, layers)
    return out


def fit_prefill(rows: list[dict], a: float, b: float) -> dict | None:
    """Per prompt token (c) and per new request (d) host time of prefill steps beyond ``a + b x running``
    (non-negative least squares on absolute residuals of the quiet-normalised host time, as ``decode_points``
    normalises; first steps of each engine left out)."""
    pts = [r for r in rows if r["prefill_tokens"] > 0 and r["kind"] != "warmup" and r["engine_step"] > 2]
    if len(pts) < 4:
        return None
    ref_quiet = quiet_reference_s(rows)
    norm = [ref_quiet / r["ref_med_s"] if ref_quiet and r.get("ref_med_s") else 1.0 for r in pts]
    resid = np.array([host_s(r) * k - (a + b * r["running"]) for r, k in zip(pts, norm)])
    tok = np.array([r["prefill_tokens"] for r in pts], float)
    new = np.array([r.get("new_reqs", 0) for r in pts], float)
    A = np.stack([tok, new], axis=1)
    coef = _nnls(A, resid)
    pred = A @ coef
    return {"equation": "host_s - (a + b x running) = c x prefill_tokens + d x new_requests",
            "c_per_token_s": float(coef[0]), "d_per_new_request_s": float(coef[1]), "n_steps": len(pts),
            "rms_resid_s": float(np.sqrt(np.mean((pred - resid) ** 2))),
            "median_resid_s": float(np.median(resid))}


def _nnls(A, y):
    """Non-negative least squares for a few columns by trying every active set (exact, small)."""
    n = A.shape[1]
    best, best_cost = np.zeros(n), float(np.sum(y ** 2))
    for mask in range(1, 2 ** n):
        cols = [i for i in range(n) if mask >> i & 1]
        sol, *_ = np.linalg.lstsq(A[:, cols], y, rcond=None)
        if (sol < 0).any():
            continue
        coef = np.zeros(n)
        coef[cols] = sol
        cost = float(np.sum((A @ coef - y) ** 2))
        if cost < best_cost:
            best, best_cost = coef, cost
    return best


def layer_extrapolation(rows: list[dict], value: str = "step_wall_s") -> list[dict]:
    """Per batch size (``running``): the median ``value`` of a decode step at each layer count, the line
    over layers and its value at 0 layers. Only models with the same arch and prompt length pooled."""
    last = _last_step(rows)
    groups = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if is_decode(r, last) and r.get("logprobs", 0) == 0:
            groups[(r["arch"], r["prompt_len"], r["running"])][r["layers"]].append(r[value])
    out = []
    for (arch, plen, n), by_layers in sorted(groups.items()):
        if len(by_layers) < 2:
            continue
        L = np.array(sorted(by_layers), float)
        med = np.array([np.median(by_layers[int(v)]) for v in L])
        A = np.stack([np.ones_like(L), L], axis=1)
        (c0, c1), *_ = np.linalg.lstsq(A, med, rcond=None)
        out.append({"arch": arch, "prompt_len": plen, "running": n, "layers": L.astype(int).tolist(),
                    "median_s": med.tolist(), "zero_layer_s": float(c0), "per_layer_s": float(c1)})
    return out


def parts_fit(rows: list[dict]) -> dict:
    """``a_i + b_i x running`` of each host part (``PARTS``, or ``PARTS_V0`` for V0 records) and of the
    rest of the host time (``other``) over the decode points (quiet-normalised medians where the runs carry
    the reference; absolute residuals), so overlap fractions can be read part by part."""
    if not rows:
        return {}
    parts = dict(parts_of(rows[0]))
    values = {part: (lambda r, p=part: part_s(r, p)) for part in parts}
    values["other"] = lambda r: host_s(r) - sum(part_s(r, p) for p in parts)
    out = {}
    for part, value in values.items():
        pts = decode_points(rows, value=value, key=("arch", "layers", "running"))
        y_key = "norm_median_s" if all("norm_median_s" in p for p in pts) else "median_s"
        pts = [p for p in pts if p[y_key] > 0]
        if len(pts) < 3:
            continue
        a, b = fit_linear([p["running"] for p in pts], [p[y_key] for p in pts], rel=False)
        out[part] = {"a_s": a, "b_s": b, "n_points": len(pts), "value": y_key}
    return out


def first_calls(rows: list[dict]) -> list[dict]:
    """The steps kept apart from the fit: each run's prefill and first decode step, and each engine's first
    steps (where its first-call costs go)."""
    keep = []
    for r in rows:
        if r["step"] <= 1 or r["engine_step"] <= 2:
            keep.append({k: r[k] for k in ("arch", "layers", "run", "kind", "step", "engine_step", "running",
                                            "tokens", "prefill_tokens", "step_wall_s", "step_cpu_s")}
                        | {"host_s": host_s(r)})
    return keep

"""GPU kernel costs from published per-operation measurements (Vidur's ``data/profiling`` format).

Importable with numpy and the standard library only (no torch, simpy, pydantic, scipy): it runs where a
GPU image lacks them. ``rlhfsim calibrate --from-ops DIR --gpu h100-sxm -o OUT`` calls ``build_profile``.

Input (Vidur's layout; ``calibrate/public/vidur`` keeps a compact copy, README there):
``DIR/compute/<gpu>/<org>/<model>/mlp.csv`` (``time_stats.<op>.median`` kernel milliseconds of one
layer's operations, by ``num_tokens`` and ``num_tensor_parallel_workers``; fp16; shape columns n_head,
n_kv_head, n_embd, n_expanded_embd, use_gated_mlp) and ``DIR/network/<gpu>_<topology>/{all_reduce,send_recv}.csv``
(``time_stats.<c>.median`` ms by ``size`` in bytes and ``num_workers``; NCCL kernel time per call).

Fitted forms (M tokens per call, S = linear-layer parameters per layer per GPU = layer_params / tp,
b = 2 bytes, peak and bw the datasheet fp16 tensor peak and memory bandwidth of the catalog GPU):

* GEMMs of one layer (attn_pre_proj + attn_post_proj + mlp_up_proj + mlp_down_proj):
      t_gemm = max( 2 M S / (peak x e_c(M, S)),  (S b + A M) / (bw x e_w) ) + 4 x t0_gemm
      e_c(M, S) = e_max x M / (M + m_half) x S / (S + s_half)
  A = 2 b x (sum of the four GEMMs' K + N) activation bytes per token. e_c rises with the tokens per call
  (the corner near the roofline's ridge point is where M / (M + m_half) bends the compute line up above
  the memory line) and falls for small shards (s_half); e_w is the weight-streaming efficiency, t0_gemm a
  per-kernel floor (launch latency, tail wave). e_w and t0_gemm: linear least squares in relative error on
  the points with M <= 16 (memory-bound); e_max, m_half, s_half: grid search minimising the mean squared
  log ratio over all points.
* Element-wise operations (input/post-attention norms, rotary embedding, activation, residual add):
      t_ew = t0_ew + bytes / (bw x e_ew)
  bytes per call: norm 4 M h, add 6 M h, gated activation 6 M I / tp (GELU 4 M I / tp), rope
  4 M (n_head + n_kv_head) d / tp (read + write, 2-byte elements); linear least squares in relative error, one
  (e_ew, t0_ew) per operation; the profile's ``memory_eff`` is their bytes-weighted harmonic mean and ``floor_s``
  the sum of the five floors (one kernel of each per layer).
* Collectives, per collective and worker count n (a topology directory, e.g. ``h100_dgx``):
      t = latency_s + wire_bytes / bus_bw,  wire_bytes = 2 (n - 1) / n x size (all-reduce, a ring), size (send/recv)
  linear least squares in relative error over message sizes; each size's time is the slowest rank's median.

Held-out error (fractions, mean |t_hat - t| / t, as ``calibrate.fitting.fit``'s ``heldout_mape``): the GEMM and
element-wise fits leave one model out at a time (refit on the others, predict the one left out;
``heldout_mape`` is the mean over all its points, ``heldout_mape_by_model`` per model); collectives are
5-fold over message sizes (seeded). ``ratios`` reports predicted/measured medians by operation group and
token range for this fit and for the profile the fit replaces (``before``).

The cost model's use (``rlhfsim.costs.model``; ``kernels_by_shape`` and ``collectives`` in the profile):
a forward pass's compute efficiency becomes e_c(tokens per call, layer_params / tp), its weights stream at
e_w and its other bytes at e_ew, and L x (4 t0_gemm + floor_s) of kernel floors is added (Vidur's Llama
layer: four GEMMs and five element-wise kernels); the tensor-parallel all-reduce takes latency_s and bus_bw
of the fitted worker count. The bundled profiles h100-sxm and a100-80gb are this fit's output; they extend
``default`` (every other term is inherited).
"""

from __future__ import annotations

import csv
import datetime
import json
import math
from pathlib import Path

import numpy as np

from rlhfsim.errors import RlhfsimError

GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
EW_PER_LAYER = 5          # element-wise kernels per layer (Vidur's Llama layer: the five above)
BYTES = 2                 # fp16, as Vidur profiled
SHAPE_COLS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp", "num_tokens",
              "num_tensor_parallel_workers")
NET_COLS = ("num_workers", "size", "devices_per_node")
# Vidur's directory names per catalog GPU (compute dir, network dir): an SXM board's GPUs sit on NVSwitch (DGX)
VIDUR_DIRS = {"h100-sxm": ("h100", "h100_dgx"), "a100-80gb": ("a100", "a100_dgx")}
MEMORY_BOUND_TOKENS = 16  # points with M <= this fit e_w and t0_gemm
# grids of the compute-side search
E_MAX = np.round(np.arange(0.50, 1.0001, 0.01), 2)
M_HALF = np.unique(np.round(np.geomspace(1, 1024, 41), 1))
S_HALF = np.concatenate([[0.0], np.geomspace(1e4, 3e7, 36)])
TOKEN_RANGES = ((1, 32), (33, 256), (257, 1024), (1025, 10 ** 9))
VIDUR_REPO = "microsoft/vidur"


class OpsError(RlhfsimError):
    """A per-operation measurement file that cannot be read: one line naming the file, row and field."""


# -- reading ---------------------------------------------------------------------------------------------
def _num(row: dict, col: str, path: Path, line: int, kind=float):
    v = row.get(col)
    try:
        x = kind(float(v)) if kind is int else float(v)
        if not math.isfinite(x) or x < 0:
            raise ValueError
        return x
    except (TypeError, ValueError):
        raise OpsError(f"{path}: line {line}: {col}: expected a finite number >= 0, got {v!r}") from None


def _rows(path: Path, need: tuple[str, ...]) -> list[tuple[int, dict]]:
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            cols = reader.fieldnames or []
            missing = [c for c in need if c not in cols]
            if missing:
                raise OpsError(f"{path}: expected columns {', '.join(missing)} in the header, got {', '.join(cols) or 'no header'}"[:300])
            rows = [(i + 2, r) for i, r in enumerate(reader)]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise OpsError(f"{path}: expected a readable CSV file, got {e}") from None
    if not rows:
        raise OpsError(f"{path}: expected at least one data row, got none")
    return rows


def read_compute(path: Path, model: str | None = None) -> list[dict]:
    """One row per (tokens, tp) of an ``mlp.csv``: shape, ``tokens``, ``tp`` and ``t_s`` {op: seconds} (the
    median kernel time; operations the file lacks are absent). Repeated (tokens, tp) pairs: the first."""
    path = Path(path)
    rows = _rows(path, SHAPE_COLS + tuple(f"time_stats.{g}.median" for g in GEMMS))
    out, seen = [], set()
    for line, r in rows:
        tokens = _num(r, "num_tokens", path, line, int)
        tp = _num(r, "num_tensor_parallel_workers", path, line, int)
        if tokens < 1 or tp < 1:
            raise OpsError(f"{path}: line {line}: num_tokens and num_tensor_parallel_workers: expected integers >= 1, "
                           f"got {r.get('num_tokens')!r} and {r.get('num_tensor_parallel_workers')!r}")
        if (tokens, tp) in seen:
            continue
        seen.add((tokens, tp))
        gated = str(r.get("use_gated_mlp")).strip().lower()
        if gated not in ("true", "false"):
            raise OpsError(f"{path}: line {line}: use_gated_mlp: expected True or False, got {r.get('use_gated_mlp')!r}")
        shape = {k: _num(r, k, path, line, int) for k in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd")}
        if min(shape.values()) < 1 or shape["n_embd"] % shape["n_head"]:
            raise OpsError(f"{path}: line {line}: n_head, n_kv_head, n_embd, n_expanded_embd: expected positive integers "
                           f"with n_embd a multiple of n_head, got {shape}")
        t = {}
        for op in GEMMS + ELEMENTWISE:
            col = f"time_stats.{op}.median"
            if col in r and r[col] not in (None, ""):
                t[op] = _num(r, col, path, line) * 1e-3
        out.append({"model": model or path.parent.name, **shape, "gated": gated == "true",
                    "tokens": tokens, "tp": tp, "t_s": t})
    return out


def read_network(path: Path) -> list[dict]:
    """Rows of an ``all_reduce.csv`` / ``send_recv.csv``: ``workers``, ``size`` (bytes), ``devices_per_node`` and
    ``t_s``, the slowest rank's median (seconds) per (workers, devices_per_node, size)."""
    path = Path(path)
    col = f"time_stats.{path.stem}.median"
    rows = _rows(path, NET_COLS + (col,))
    slowest: dict[tuple, float] = {}
    for line, r in rows:
        key = tuple(_num(r, c, path, line, int) for c in NET_COLS)
        if key[0] < 1 or key[1] < 1:
            raise OpsError(f"{path}: line {line}: num_workers and size: expected integers >= 1, got {key[0]} and {key[1]}")
        t = _num(r, col, path, line) * 1e-3
        slowest[key] = max(slowest.get(key, 0.0), t)
    return [{"workers": w, "size": s, "devices_per_node": d, "t_s": t} for (w, s, d), t in sorted(slowest.items())]


def read_dir(root: Path, gpu: str) -> tuple[list[dict], dict[str, list[dict]], list[str]]:
    """(compute rows, {collective: rows}, files used) for a catalog GPU under a Vidur ``data/profiling``
    directory (or a copy with its layout)."""
    root = Path(root)
    if gpu not in VIDUR_DIRS:
        raise OpsError(f"--gpu: expected a GPU that Vidur profiled ({', '.join(VIDUR_DIRS)}), got {gpu!r}")
    cdir, ndir = VIDUR_DIRS[gpu]
    files = sorted((root / "compute" / cdir).glob("*/*/mlp.csv"))
    if not files:
        raise OpsError(f"{root / 'compute' / cdir}: expected <org>/<model>/mlp.csv files, got none")
    compute = [row for f in files for row in read_compute(f, f"{f.parent.parent.name}/{f.parent.name}")]
    net, used = {}, [str(f.relative_to(root)) for f in files]
    for coll in ("all_reduce", "send_recv"):
        f = root / "network" / ndir / f"{coll}.csv"
        if f.is_file():
            net[coll] = read_network(f)
            used.append(str(f.relative_to(root)))
    return compute, net, used


# -- work per operation ----------------------------------------------------------------------------------
def layer_gemms(r: dict) -> list[tuple[int, int]]:
    """(K, N) per GPU of the four linear layers of one layer, as Vidur's ColumnParallel/RowParallel split them."""
    h, nh, nkv, inter, tp = r["n_embd"], r["n_head"], r["n_kv_head"], r["n_expanded_embd"], r["tp"]
    d = h // nh
    return [(h, (nh + 2 * nkv) * d // tp), (nh * d // tp, h), (h, (2 if r["gated"] else 1) * inter // tp), (inter // tp, h)]


def gemm_work(rows: list[dict]) -> dict[str, np.ndarray]:
    """Arrays over rows: M, S (params per layer per GPU), flops, weight bytes, activation bytes, t (s; the
    four GEMMs' sum; rows lacking one are dropped), model index."""
    keep = [r for r in rows if all(g in r["t_s"] for g in GEMMS)]
    m = np.array([r["tokens"] for r in keep], float)
    s = np.array([sum(k * n for k, n in layer_gemms(r)) for r in keep], float)
    act = np.array([BYTES * sum(k + n for k, n in layer_gemms(r)) for r in keep], float)
    t = np.array([sum(r["t_s"][g] for g in GEMMS) for r in keep], float)
    return {"m": m, "s": s, "flops": 2 * m * s, "wbytes": BYTES * s, "abytes": act * m, "t": t,
            "tp": np.array([r["tp"] for r in keep], float), "model": np.array([r["model"] for r in keep])}


def ew_bytes(r: dict, op: str) -> float:
    h, tp, m = r["n_embd"], r["tp"], r["tokens"]
    if op in ("input_layernorm", "post_attention_layernorm"):
        return 2 * BYTES * m * h
    if op == "add":
        return 3 * BYTES * m * h
    if op == "mlp_act":
        return (3 if r["gated"] else 2) * BYTES * m * r["n_expanded_embd"] / tp
    d = h // r["n_head"]
    return 2 * BYTES * m * (r["n_head"] + r["n_kv_head"]) * d / tp     # attn_rope: q and k read and written


def ew_work(rows: list[dict]) -> dict[str, np.ndarray]:
    pts = [(ew_bytes(r, op), r["t_s"][op], r["tokens"], r["model"], op) for r in rows for op in ELEMENTWISE if op in r["t_s"]]
    b, t, m, model, op = zip(*pts)
    return {"bytes": np.array(b, float), "t": np.array(t, float), "m": np.array(m, float), "model": np.array(model),
            "op": np.array(op), "tp": np.zeros(len(t))}


# -- fits -------------------------------------------------------------------------------------------------
def _linear_relative(x: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(a, c) minimising sum ((a x_i + c - t_i) / t_i)^2 with a > 0, c >= 0 (c = 0 refit when negative)."""
    w = 1.0 / t
    a, c = np.linalg.lstsq(np.column_stack([x * w, w]), np.ones_like(t), rcond=None)[0]
    if c < 0:
        a, c = float(np.sum(x * w * w) / np.sum((x * w) ** 2)), 0.0
    if a <= 0:
        raise OpsError(f"fit: expected times that grow with bytes, got a slope of {a:.3g} s/byte")
    return float(a), float(c)


def eff_curve(m, s, e_max: float, m_half: float, s_half: float):
    """e_c(M, S) = e_max x M / (M + m_half) x S / (S + s_half) (floats or numpy arrays)."""
    return e_max * m / (m + m_half) * s / (s + s_half)


def predict_gemm(w: dict, p: dict, peak: float, bw: float) -> np.ndarray:
    compute = w["flops"] / (peak * eff_curve(w["m"], w["s"], p["e_max"], p["m_half"], p["s_half"]))
    memory = (w["wbytes"] + w["abytes"]) / (bw * p["weight_memory_eff"])
    return np.maximum(compute, memory) + len(GEMMS) * p["t0_gemm_s"]


def fit_gemm(w: dict, peak: float, bw: float) -> dict:
    small = w["m"] <= MEMORY_BOUND_TOKENS
    if small.sum() < 2 or (~small).sum() < 3:
        raise OpsError(f"fit: expected GEMM points at <= {MEMORY_BOUND_TOKENS} tokens (2+) and above (3+), got "
                       f"{int(small.sum())} and {int((~small).sum())}")
    a, c = _linear_relative(w["wbytes"][small] + w["abytes"][small], w["t"][small])
    e_w, t0 = 1.0 / (a * bw), c / len(GEMMS)
    memory = (w["wbytes"] + w["abytes"]) / (bw * e_w)
    base = w["flops"] / peak
    logt = np.log(w["t"] - 0.0)
    best = (np.inf, None)
    for s_half in S_HALF:
        shard = w["s"] / (w["s"] + s_half)
        # compute time per point for every (e_max, m_half) at once: base (M + m_half) / (M e_max shard)
        ratio = (w["m"][None, :] + M_HALF[:, None]) / w["m"][None, :]              # (n_m, n)
        comp = base[None, None, :] * ratio[None, :, :] / (E_MAX[:, None, None] * shard[None, None, :])
        pred = np.maximum(comp, memory[None, None, :]) + len(GEMMS) * t0
        loss = np.mean((np.log(pred) - logt[None, None, :]) ** 2, axis=2)
        i, j = np.unravel_index(np.argmin(loss), loss.shape)
        if loss[i, j] < best[0]:
            best = (loss[i, j], (float(E_MAX[i]), float(M_HALF[j]), float(s_half)))
    e_max, m_half, s_half = best[1]
    return {"e_max": e_max, "m_half": m_half, "s_half": s_half, "weight_memory_eff": e_w, "t0_gemm_s": t0}


def fit_elementwise(w: dict, bw: float) -> dict:
    """Per operation {memory_eff, t0_s}; ``memory_eff`` overall is the bytes-weighted harmonic mean (the rate of
    all the points' bytes together) and ``floor_s`` the sum of the operations' floors (one kernel each per layer)."""
    ops = {}
    for op in ELEMENTWISE:
        sel = w["op"] == op
        if sel.sum() >= 2:
            a, c = _linear_relative(w["bytes"][sel], w["t"][sel])
            ops[op] = {"memory_eff": 1.0 / (a * bw), "t0_s": c}
    if not ops:
        raise OpsError("fit: expected element-wise points (norms, rope, activation, add), got none")
    eff = {op: p["memory_eff"] for op, p in ops.items()}
    total = sum(float(w["bytes"][w["op"] == op].sum()) for op in ops)
    harmonic = total / sum(float(w["bytes"][w["op"] == op].sum()) / eff[op] for op in ops)
    return {"memory_eff": harmonic, "floor_s": sum(p["t0_s"] for p in ops.values()), "ops": ops}


def predict_ew(w: dict, p: dict, bw: float) -> np.ndarray:
    ops = p["ops"]
    t0 = np.array([ops[o]["t0_s"] if o in ops else 0.0 for o in w["op"]])
    eff = np.array([ops[o]["memory_eff"] if o in ops else p["memory_eff"] for o in w["op"]])
    return t0 + w["bytes"] / (bw * eff)


# A collective's small-message floor (``small_message_s``): the median time of the calls of at most this many bytes.
# NCCL's small messages take about the same time whatever their size (18-60 us per all-reduce on H100 and A100 in
# Vidur's data, where the fitted latency + bytes / bus bandwidth line says 10-37 us), so the median of those sizes is a
# floor the line misses.
SMALL_MESSAGE_BYTES = 1 << 20


def wire_bytes(collective: str, size, workers):
    return 2.0 * (workers - 1) / workers * size if collective == "all_reduce" else size * 1.0


def fit_collective(rows: list[dict], collective: str, seed: int = 0) -> dict:
    """{workers: {latency_s, bus_bw, heldout_mape, n_points, sizes}} over the rows within one node."""
    out = {}
    for n in sorted({r["workers"] for r in rows}):
        pts = [r for r in rows if r["workers"] == n and r["devices_per_node"] == n] or \
              [r for r in rows if r["workers"] == n]
        if len(pts) < 3:
            continue
        x = np.array([wire_bytes(collective, r["size"], n) for r in pts])
        t = np.array([r["t_s"] for r in pts])
        a, c = _linear_relative(x, t)
        folds = np.random.default_rng(seed).permutation(len(t)) % min(5, len(t))
        err = np.empty(len(t))
        for k in range(folds.max() + 1):
            tr = folds != k
            ak, ck = _linear_relative(x[tr], t[tr])
            err[~tr] = np.abs(ak * x[~tr] + ck - t[~tr]) / t[~tr]
        small = [r["t_s"] for r in pts if r["size"] <= SMALL_MESSAGE_BYTES]
        out[str(n)] = {"latency_s": c, "bus_bw": 1.0 / a, "heldout_mape": float(err.mean()), "n_points": len(t),
                       "nodes": max(1, n // max(r["devices_per_node"] for r in pts)),
                       "size_bytes": [int(min(r["size"] for r in pts)), int(max(r["size"] for r in pts))],
                       **({"small_message_s": float(np.median(small)), "small_message_points": len(small)} if small else {})}
    return out


def _mape(pred, t) -> float:
    return float(np.mean(np.abs(pred - t) / t))


def heldout(fit_fn, predict_fn, w: dict) -> tuple[float | None, dict]:
    """Leave one model out: (mean over all points, {model: mean over its points})."""
    models = sorted(set(w["model"]))
    if len(models) < 2:
        return None, {}
    err, by = np.empty(len(w["t"])), {}
    for mdl in models:
        out = w["model"] == mdl
        train = {k: v[~out] for k, v in w.items()}
        test = {k: v[out] for k, v in w.items()}
        e = np.abs(predict_fn(test, fit_fn(train)) - test["t"]) / test["t"]
        err[out] = e
        by[mdl] = float(e.mean())
    return float(err.mean()), by


# -- the profile that the fit replaces ("before"), for the ratios ------------------------------------------
def before_gemm(w: dict, ops: dict, peak: float, bw: float) -> np.ndarray:
    p = ops["prefill"]
    return np.maximum(w["flops"] / (peak * p["compute_eff"]), (w["wbytes"] + w["abytes"]) / (bw * p["memory_eff"]))


def ratio_table(w: dict, pred: np.ndarray, before: np.ndarray | None) -> list[dict]:
    rows = []
    for lo, hi in TOKEN_RANGES:
        tps = sorted(set(w["tp"].tolist()))
        for tp in (tps if len(tps) > 1 else []) + [None]:
            sel = (w["m"] >= lo) & (w["m"] <= hi) & ((w["tp"] == tp) if tp is not None else True)
            if not sel.any():
                continue
            row = {"tokens": f"{lo}-{hi}" if hi < 10 ** 9 else f">{lo - 1}", "tp": int(tp) if tp is not None else "all",
                   "n": int(sel.sum()), "after": float(np.median(pred[sel] / w["t"][sel]))}
            if before is not None:
                row["before"] = float(np.median(before[sel] / w["t"][sel]))
            rows.append(row)
    return rows


# -- the profile ------------------------------------------------------------------------------------------
def fit_all(root: Path, gpu: str) -> dict:
    from rlhfsim.hardware.catalog import get_gpu

    spec = get_gpu(gpu, "--gpu")
    peak, bw = spec.peak("float16"), spec.mem_bw
    compute, net, used = read_dir(root, gpu)
    gw = gemm_work(compute)
    gemm = fit_gemm(gw, peak, bw)
    g_ho, g_by = heldout(lambda d: fit_gemm(d, peak, bw), lambda d, p: predict_gemm(d, p, peak, bw), gw)
    ew = ew_work(compute)
    elem = fit_elementwise(ew, bw)
    e_ho, e_by = heldout(lambda d: fit_elementwise(d, bw), lambda d, p: predict_ew(d, p, bw), ew)
    colls = {c: fit_collective(rows, c) for c, rows in net.items()}
    return {"gpu": gpu, "peak": peak, "bw": bw, "files": used, "gemm": gemm, "gemm_work": gw, "ew_work": ew,
            "gemm_heldout": (g_ho, g_by), "gemm_fit_mape": _mape(predict_gemm(gw, gemm, peak, bw), gw["t"]),
            "elementwise": elem, "ew_heldout": (e_ho, e_by), "ew_fit_mape": _mape(predict_ew(ew, elem, bw), ew["t"]),
            "collectives": colls, "models": sorted(set(gw["model"]))}


def _source(root: Path, commit: str | None, files: list[str]) -> dict:
    return {"repository": VIDUR_REPO, "commit": commit, "license": "MIT", "dir": str(root),
            "files": files[:3] + ([f"... {len(files) - 3} more"] if len(files) > 3 else [])}


def build_profile(root: Path, gpu: str, base: dict, commit: str | None = None, name: str | None = None,
                  command: str = "") -> tuple[dict, dict]:
    """(profile, fit): an overlay that ``extends`` ``base`` (the default profile: every term it gives is inherited,
    never copied, so it cannot go stale) with ``kernels_by_shape`` and ``collectives`` fitted from ``root`` for ``gpu``."""
    fit = fit_all(root, gpu)
    src = _source(root, commit, fit["files"])
    g, e = fit["gemm"], fit["elementwise"]
    section = {
        "applies_to": ["prefill", "chunk_prefill", "decode", "score", "reencode", "encode"],
        "gemm": {**{k: round(v, 6) if k != "t0_gemm_s" else v for k, v in g.items()},
                 "heldout_mape": fit["gemm_heldout"][0], "heldout_mape_by_model": fit["gemm_heldout"][1],
                 "fit_mape": fit["gemm_fit_mape"], "n_points": int(len(fit["gemm_work"]["t"]))},
        "elementwise": {**e, "per_layer": EW_PER_LAYER, "heldout_mape": fit["ew_heldout"][0],
                        "heldout_mape_by_model": fit["ew_heldout"][1], "fit_mape": fit["ew_fit_mape"],
                        "n_points": int(len(fit["ew_work"]["t"]))},
        "source": src,
        "basis": "fp16 kernel times of one layer's linear and element-wise operations (Vidur's mlp.csv), "
                 "against the catalog GPU's datasheet fp16 peak and memory bandwidth (calibrate.fitting.fromops)",
    }
    colls = {c: {"by_workers": v, "source": {**src, "files": [f for f in fit["files"] if f.endswith(f"{c}.csv")]}}
             for c, v in fit["collectives"].items() if v}
    base_name = base.get("name", "default")
    prof = {
        "schema_version": base.get("schema_version", 1), "extends": base_name,
        "name": name or gpu, "gpu": gpu, "dtype": "float16",
        "device": {"kind": "cuda", "name": f"{gpu}: kernel terms from Vidur's {VIDUR_DIRS[gpu][0]} profiling"},
        "provenance": {"source": "public", "date": datetime.date.today().isoformat(), "command": command,
                       "fitted": f"kernels_by_shape, collectives (calibrate.fitting.fromops, from {VIDUR_REPO}@{commit or '?'})",
                       "inherited": f"every other term from the bundled {base_name} profile (extends), with its own "
                                    f"provenance; the operations in kernels_by_shape.applies_to keep its overheads, "
                                    f"their compute_eff and memory_eff are not used"},
        "kernels_by_shape": section, "collectives": colls,
    }
    return prof, fit


def ratios(fit: dict, base_ops: dict) -> dict:
    """Predicted/measured medians by token range and TP degree: the fitted terms (``after``) and the base
    profile's constant efficiencies (``before``)."""
    peak, bw = fit["peak"], fit["bw"]
    gw, ew = fit["gemm_work"], fit["ew_work"]
    gemm = ratio_table(gw, predict_gemm(gw, fit["gemm"], peak, bw), before_gemm(gw, base_ops, peak, bw))
    ew_before = ew["bytes"] / (bw * base_ops["prefill"]["memory_eff"])
    elem = ratio_table(ew, predict_ew(ew, fit["elementwise"], bw), ew_before)
    return {"gemm_layer": gemm, "elementwise": elem}


def collective_ratios(fit: dict, intra_bw: float, link_eff: float, latency_s: float, root: Path) -> list[dict]:
    """All-reduce predicted/measured medians by worker count and size range, fitted and before (the constant
    link efficiency and latency)."""
    _, net, _ = read_dir(root, fit["gpu"])
    out = []
    for n, p in fit["collectives"].get("all_reduce", {}).items():
        rows = [r for r in net["all_reduce"] if r["workers"] == int(n) and r["devices_per_node"] == int(n)]
        for lo, hi in ((0, 2 ** 20), (2 ** 20, 2 ** 40)):
            sel = [r for r in rows if lo <= r["size"] < hi]
            if not sel:
                continue
            x = np.array([wire_bytes("all_reduce", r["size"], int(n)) for r in sel])
            t = np.array([r["t_s"] for r in sel])
            out.append({"workers": int(n), "size": "< 1 MiB" if lo == 0 else ">= 1 MiB", "n": len(sel),
                        "after": float(np.median((p["latency_s"] + x / p["bus_bw"]) / t)),
                        "before": float(np.median((latency_s + x / (intra_bw * link_eff)) / t))})
    return out


def term_lines(prof: dict) -> list[str]:
    """The fitted terms of a profile with their provenance (``rlhfsim runtimes --profile NAME``)."""
    out = []
    sec = prof.get("kernels_by_shape")
    if sec:
        g, e, src = sec["gemm"], sec["elementwise"], sec.get("source") or {}
        where = f"{src.get('repository', '?')}@{(src.get('commit') or '?')[:12]} ({src.get('license', '?')}), {src.get('dir', '?')}"
        out += [f"  applies to: {', '.join(sec['applies_to'])} (their compute_eff and memory_eff are not used)",
                f"  GEMM compute efficiency e_c = {g['e_max']:.2f} x M/(M + {g['m_half']:g}) x S/(S + {g['s_half']:.3g}) "
                f"(M tokens per call, S layer params per GPU); weights stream at {g['weight_memory_eff']:.3f} of the "
                f"bandwidth; {g['t0_gemm_s'] * 1e6:.2f} us floor per GEMM; leave-one-model-out MAPE "
                f"{_pct(g.get('heldout_mape'))} ({g.get('n_points', '?')} points)  [source: {where}]",
                f"  element-wise ops: {e['memory_eff']:.3f} of the bandwidth, {e['floor_s'] * 1e6:.2f} us of floors per "
                f"layer; leave-one-model-out MAPE {_pct(e.get('heldout_mape'))}  [source: {where}]"]
    for coll, body in (prof.get("collectives") or {}).items():
        src = body.get("source") or {}
        for n, p in body["by_workers"].items():
            # a profile may carry only the small-message floor of a worker count (the default's, with the link constants)
            fit = (f"{p['latency_s'] * 1e6:.1f} us + wire bytes / {p['bus_bw'] / 1e9:.1f} GB/s; 5-fold MAPE "
                   f"{_pct(p.get('heldout_mape'))}" if "latency_s" in p else "the link constants")
            floor = f"; small-message floor {p['small_message_s'] * 1e6:.1f} us" if p.get("small_message_s") is not None else ""
            out.append(f"  {coll} over {n} GPUs: {fit}{floor}  [source: {src.get('repository', '?')}@"
                       f"{(src.get('commit') or '?')[:12]}, {', '.join(src.get('files') or [])}]")
    prov = prof.get("provenance") or {}
    out.append(f"  {prov.get('inherited') or prov.get('copied') or 'every other term: the profile own'}")
    return out


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def commit_of(root: Path) -> str | None:
    """The source commit a copy's README.md names (the first 40-hex word), else None."""
    import re

    readme = Path(root) / "README.md"
    m = re.search(r"\b[0-9a-f]{40}\b", readme.read_text()) if readme.is_file() else None
    return m.group(0) if m else None


def summary_lines(prof: dict, fit: dict, rat: dict) -> list[str]:
    g, e = prof["kernels_by_shape"]["gemm"], prof["kernels_by_shape"]["elementwise"]
    lines = [f"{prof['name']}: {len(fit['models'])} models ({', '.join(m.split('/')[-1] for m in fit['models'])})",
             f"GEMM: e_c = {g['e_max']:.2f} x M/(M+{g['m_half']:g}) x S/(S+{g['s_half']:.3g}); weights at "
             f"e_w {g['weight_memory_eff']:.3f}; floor {g['t0_gemm_s'] * 1e6:.2f} us/kernel; fit MAPE {g['fit_mape']:.1%}, "
             f"leave-one-model-out {g['heldout_mape']:.1%}",
             f"element-wise: e_ew {e['memory_eff']:.3f} (bytes-weighted), floors {e['floor_s'] * 1e6:.2f} us per layer; "
             f"fit MAPE {e['fit_mape']:.1%}, leave-one-model-out {e['heldout_mape']:.1%}; by operation: "
             + ", ".join(f"{op} {p['memory_eff']:.2f} + {p['t0_s'] * 1e6:.1f} us" for op, p in e["ops"].items())]
    for c, sec in prof["collectives"].items():
        for n, p in sec["by_workers"].items():
            lines.append(f"{c} x{n}: latency {p['latency_s'] * 1e6:.1f} us + bytes / {p['bus_bw'] / 1e9:.1f} GB/s; "
                         f"5-fold MAPE {p['heldout_mape']:.1%} ({p['n_points']} sizes)")
    lines.append("predicted/measured medians (before: the base profile's constant efficiencies):")
    for group, rows in rat.items():
        for r in rows:
            lines.append(f"  {group:11s} tokens {r['tokens']:>9s} tp {str(r['tp']):>3s} n {r['n']:4d}: "
                         f"before {r.get('before', float('nan')):.2f} after {r['after']:.2f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    """python -m calibrate.fitting.fromops DIR --gpu GPU [-o OUT] [--commit SHA]: fit and print (and write)."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m calibrate.fitting.fromops")
    ap.add_argument("dir")
    ap.add_argument("--gpu", required=True)
    ap.add_argument("-o", "--out")
    ap.add_argument("--commit")
    a = ap.parse_args(argv)
    try:
        prof, fit, lines = run(Path(a.dir), a.gpu, a.out, a.commit, " ".join(["python -m calibrate.fitting.fromops", *sys.argv[1:]]))
    except RlhfsimError as e:
        sys.exit(f"error: {e}")
    print("\n".join(lines))


def run(root: Path, gpu: str, out: str | None, commit: str | None = None, command: str = "") -> tuple[dict, dict, list[str]]:
    """Fit, write ``out`` (when given; then read back and checked as any profile is) and the summary lines."""
    from rlhfsim.costs.profile import BUNDLED_DIR, load_profile

    base = json.loads((BUNDLED_DIR / "default.json").read_text())
    prof, fit = build_profile(Path(root), gpu, base, commit or commit_of(root), command=command)
    lines = summary_lines(prof, fit, ratios(fit, base["operations"]))
    if out:
        Path(out).write_text(json.dumps(prof, indent=1) + "\n")
        load_profile(str(Path(out).resolve()))
        lines.append(f"wrote {out}")
    return prof, fit, lines


if __name__ == "__main__":
    main()

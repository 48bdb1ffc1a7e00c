"""Fit the CostModel's per-operation parameters to measured points; report held-out error.

The fitted form is exactly ``rlhfsim.costs.model`` (tp = 1), evaluated by the same two functions
(``roofline_kernel_s``, ``with_overheads_s``) on the same work (``rlhfsim.costs.flops``):

    t_hat = max( F / (peak x compute_eff),  B / (mem_bw x memory_eff) ) + overhead_s + overhead_per_layer_s x L

with F (FLOP), B (bytes) and L (layers) from ``rlhfsim.costs.flops`` for each point's model shape and
sizes (``point_work``, the same calls CostModel makes), and peak (FLOP/s; float32 for the optimizer, the
point's dtype otherwise) and mem_bw (bytes/s) the datasheet numbers of the profile's ``gpu`` entry.
Because F and B carry the model size, the parameters carry over to model sizes that were not measured.

Objective: squared relative error, sum_i ((t_hat_i - t_i) / t_i)^2, plus a weak pull of log efficiencies
towards prior values (1e-4 x n per squared log-ratio) that only decides directions the data leave free
(e.g. memory_eff when every point is compute-bound). Method (numpy only, no scipy): for every cell of a
log-spaced grid of (compute_eff, memory_eff) in [1e-4, 1.5], the overheads are the non-negative weighted
least-squares solution (weights 1/t_i^2) of overhead_s + overhead_per_layer_s x L_i = t_i - roof_i; the
best cell is refined on a finer grid around it. With a single layer count the two overheads cannot be
told apart and overhead_per_layer_s is 0.

Held-out error: ``heldout_mape`` is the mean |t_hat - t| / t (a fraction: 0.05 = 5%) of each point when
predicted by a fit without it, k-fold (k = min(5, n), seeded shuffle); ``heldout_mape_by_model`` leaves
out one model shape at a time (how well the fit carries to an unmeasured size), when >= 2 shapes were
measured. ``fit_mape`` is the in-sample error.
"""

from __future__ import annotations

import numpy as np

from rlhfsim.costs import flops as fl
from rlhfsim.costs.genruntimes import kv_passes
from rlhfsim.costs.model import OpParams, roofline_kernel_s, with_overheads_s
from rlhfsim.hardware.catalog import GpuSpec
from rlhfsim.models.catalog import ModelShape

EFF_MIN, EFF_MAX = 1e-4, 1.5
PRIOR_WEIGHT = 1e-4
COARSE, FINE = 64, 33


def point_work(p: dict) -> fl.Work:
    """FLOPs, bytes and layers of a measured point, computed exactly as CostModel computes them (a
    ``prefill``/``decode`` point with a ``runtime`` field is that generation runtime's, priced the same way)."""
    m = ModelShape(**p["shape"])
    dtype, op, b = p["dtype"], p["op"], p["batch"]
    if op == "prefill":
        return fl.forward_work(m, dtype, p["tokens"], b, 0.0, b, "lm")
    if op == "decode":   # a generation runtime's decode point moves its own K/V passes (KV_PASSES)
        return fl.decode_step_work(m, dtype, b, b * p["prefix_len"], kv_passes(p.get("runtime")))
    if op == "chunk_prefill":
        return fl.forward_work(m, dtype, b * p["seq_len"], b, b * p["prefix_len"], 0.0, "value")
    if op == "train":
        return fl.train_work(m, dtype, p["tokens"], b, p["head"])
    if op == "optimizer":
        return fl.optimizer_work(m, 1, p["head"])
    if op == "score":
        return fl.forward_work(m, dtype, p["tokens"], b, 0.0, 0.0, "value")
    raise ValueError(f"no work model for op {op!r}")


def point_value(p: dict) -> float:
    """The measured time a fit uses: the trimmed mean (``calibrate.measure``); the median for points
    journaled before it was recorded."""
    return p.get("tmean_s", p["median_s"])


def point_peak(p: dict, gpu: GpuSpec) -> float:
    return gpu.peak("float32") if p["op"] == "optimizer" else gpu.peak(p["dtype"])


def arrays(points: list[dict], gpu: GpuSpec):
    """(F / peak, B / mem_bw, L, t) as float arrays: seconds at 100% efficiency, layers, measured s."""
    w = [point_work(p) for p in points]
    fc = np.array([x.flops / point_peak(p, gpu) for x, p in zip(w, points)], dtype=np.float64)
    fm = np.array([x.bytes / gpu.mem_bw for x in w], dtype=np.float64)
    lay = np.array([x.layers for x in w], dtype=np.float64)
    t = np.array([point_value(p) for p in points], dtype=np.float64)
    return fc, fm, lay, t


def _overheads(r: np.ndarray, wt: np.ndarray, lay: np.ndarray, use_layers: bool):
    """Non-negative weighted least squares of o + ol x L = r per grid cell. r: [..., n]; returns o, ol."""
    sw, swl, swll = wt.sum(), (wt * lay).sum(), (wt * lay * lay).sum()
    swr, swlr = (wt * r).sum(-1), (wt * lay * r).sum(-1)
    o_only = np.maximum(swr / sw, 0.0)
    cands = [(o_only, np.zeros_like(o_only))]
    if use_layers:
        det = sw * swll - swl * swl
        o2 = (swll * swr - swl * swlr) / det
        ol2 = (sw * swlr - swl * swr) / det
        ok = (o2 >= 0) & (ol2 >= 0)
        cands.append((np.where(ok, o2, o_only), np.where(ok, ol2, 0.0)))
        cands.append((np.zeros_like(o_only), np.maximum(swlr / swll, 0.0)))
    best_o, best_ol, best_loss = None, None, None
    for o, ol in cands:
        loss = (wt * (r - o[..., None] - ol[..., None] * lay) ** 2).sum(-1)
        if best_loss is None:
            best_o, best_ol, best_loss = o, ol, loss
        else:
            better = loss < best_loss
            best_o, best_ol = np.where(better, o, best_o), np.where(better, ol, best_ol)
            best_loss = np.minimum(loss, best_loss)
    return best_o, best_ol, best_loss


def _search(fc, fm, lay, t, ce_grid, me_grid, prior: OpParams):
    wt = 1.0 / (t * t)
    use_layers = np.ptp(lay) > 0
    # fc, fm are seconds at 100% efficiency (peak and bandwidth already divided out): denominators 1.0
    roof = roofline_kernel_s(fc[None, None, :], fm[None, None, :], 1.0, 1.0, ce_grid[:, None, None],
                             me_grid[None, :, None])
    o, ol, loss = _overheads(t - roof, wt, lay, use_layers)
    pen = PRIOR_WEIGHT * len(t) * ((np.log(ce_grid / prior.compute_eff) ** 2)[:, None]
                                   + (np.log(me_grid / prior.memory_eff) ** 2)[None, :])
    total = loss + pen
    i, j = np.unravel_index(np.argmin(total), total.shape)
    return OpParams(float(ce_grid[i]), float(me_grid[j]), float(o[i, j]), float(ol[i, j]))


def fit_arrays(fc, fm, lay, t, prior: OpParams) -> OpParams:
    """Best parameters for one operation's points (arrays as from ``arrays``)."""
    lo, hi = np.log(EFF_MIN), np.log(EFF_MAX)
    grid = np.exp(np.linspace(lo, hi, COARSE))
    p = _search(fc, fm, lay, t, grid, grid, prior)
    step = (hi - lo) / (COARSE - 1)

    def fine(v):
        c = np.log(v)
        return np.exp(np.clip(np.linspace(c - step, c + step, FINE), lo, hi))

    return _search(fc, fm, lay, t, fine(p.compute_eff), fine(p.memory_eff), prior)


def predict(fc, fm, lay, p: OpParams) -> np.ndarray:
    return with_overheads_s(roofline_kernel_s(fc, fm, 1.0, 1.0, p.compute_eff, p.memory_eff), p, lay)


def mape(pred: np.ndarray, t: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - t) / t))


def _heldout(fc, fm, lay, t, prior, folds: list[np.ndarray]) -> float | None:
    errs = np.full(len(t), np.nan)
    for test in folds:
        train = np.setdiff1d(np.arange(len(t)), test)
        if len(train) == 0:
            return None
        p = fit_arrays(fc[train], fm[train], lay[train], t[train], prior)
        errs[test] = np.abs(predict(fc[test], fm[test], lay[test], p) - t[test]) / t[test]
    return float(np.nanmean(errs))


def fit_operation(points: list[dict], gpu: GpuSpec, prior: OpParams, seed: int = 0) -> dict:
    """Fitted parameters of one operation with in-sample and held-out MAPE (see the module docstring)."""
    fc, fm, lay, t = arrays(points, gpu)
    p = fit_arrays(fc, fm, lay, t, prior)
    n = len(t)
    heldout = None
    if n >= 3:
        perm = np.random.default_rng(seed).permutation(n)
        heldout = _heldout(fc, fm, lay, t, prior, [f for f in np.array_split(perm, min(5, n)) if len(f)])
    models = sorted({q["model"] for q in points})
    by_model = None
    if len(models) >= 2:
        names = np.array([q["model"] for q in points])
        by_model = _heldout(fc, fm, lay, t, prior, [np.flatnonzero(names == m) for m in models])
    return {"compute_eff": p.compute_eff, "memory_eff": p.memory_eff, "overhead_s": p.overhead_s,
            "overhead_per_layer_s": p.overhead_per_layer_s, "heldout_mape": heldout,
            "heldout_mape_by_model": by_model, "fit_mape": mape(predict(fc, fm, lay, p), t), "n_points": n,
            "models": models}

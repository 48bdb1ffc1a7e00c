"""Fit the CostModel's per-operation parameters to measured points with scipy; report held-out error and
the parameters' uncertainty.

The fitted form is exactly ``rlhfsim.costs.model`` (tp = 1), evaluated by the same two functions
(``roofline_kernel_s``, ``with_overheads_s``) on the same work (``rlhfsim.costs.flops``):

    t_hat = max( F / (peak x compute_eff),  B / (mem_bw x memory_eff) ) + overhead_s + overhead_per_layer_s x L

with t a point's trimmed mean less its runtime's measured sampling tail (``fitted_value``; generation
prefill/decode points only, ``calibrate.measuring.sampling``) and F (FLOP), B (bytes) and L (layers) from ``rlhfsim.costs.flops`` for each point's model shape and
sizes (``point_work``, the same calls CostModel makes), and peak (FLOP/s; float32 for the optimizer, the
point's dtype otherwise) and mem_bw (bytes/s) the datasheet numbers of the profile's ``gpu`` entry.
Because F and B carry the model size, the parameters carry over to model sizes that were not measured.

Objective: squared relative error, sum_i ((t_hat_i - t_i) / t_i)^2, plus a weak pull of log efficiencies
towards prior values (1e-4 x n per squared log-ratio) that only decides directions the data leave free
(e.g. memory_eff when every point is compute-bound). Method: ``scipy.optimize.least_squares`` (trust
region reflective, bounds log efficiency in [log 1e-4, log 1.5], overheads >= 0) over x = (log
compute_eff, log memory_eff, overhead_s, overhead_per_layer_s), started from a few points (the prior,
balanced, compute-bound, memory-bound) and the lowest cost kept. With a single layer count the two
overheads cannot be told apart and overhead_per_layer_s is fixed at 0 (one parameter fewer).

Identifiability: a fit has ``n_params`` = 4 (3 with one layer count) parameters; with fewer than
``n_params + 2`` points it is ``status: "underdetermined"`` (the values are kept so the simulator can run,
but ``assemble`` marks the operation ``source: "underdetermined"``, never ``measured``, and no held-out
error is claimed). Otherwise ``status: "ok"``.

Uncertainty (kept in the profile, propagated by ``rlhfsim simulate --uncertainty``):
``covariance`` is the linearised covariance of x (order ``COV_PARAMS``), s^2 (J^T J)^+ with J the
analytic Jacobian (the max()'s active branch) of the relative residuals at the solution and
s^2 = RSS / (n - n_params); ``param_std`` its square roots. ``samples`` are ``BOOTSTRAP`` parameter sets [compute_eff, memory_eff, overhead_s,
overhead_per_layer_s] refitted on case-resampled points (seeded): unlike the linearisation they respect
the bounds and the max() in the form. Null for underdetermined fits.

Held-out error: ``heldout_mape`` is the mean |t_hat - t| / t (a fraction: 0.05 = 5%; t the whole measured
time, sampling tail included) of each point when
predicted by a fit without it, k-fold (k = min(5, n), seeded shuffle); ``heldout_mape_by_model`` leaves
out one model shape at a time (how well the fit carries to an unmeasured size), when >= 2 shapes were
measured. ``fit_mape`` is the in-sample error.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import least_squares

from rlhfsim.costs import flops as fl
from rlhfsim.costs.genruntimes import kv_passes
from rlhfsim.costs.model import OpParams, roofline_kernel_s, with_overheads_s
from rlhfsim.hardware.catalog import GpuSpec
from rlhfsim.models.catalog import ModelShape

EFF_MIN, EFF_MAX = 1e-4, 1.5
PRIOR_WEIGHT = 1e-4
BOOTSTRAP = 40
COV_PARAMS = ("log_compute_eff", "log_memory_eff", "overhead_s", "overhead_per_layer_s")


def point_work(p: dict) -> fl.Work:
    """FLOPs, bytes and layers of a measured point, computed exactly as CostModel computes them (a
    ``prefill``/``decode`` point with a ``runtime`` field is that generation runtime's, priced the same way). A CPU
    point's host-effect fields (``gemm_weight_passes``, ``stream_x``, ``width_rate``; ``fault_s`` and ``cold_x`` in
    ``fitted_value``) are set by ``calibrate.fitting.assemble.with_tails`` with ``rlhfsim.costs.cpuhost``'s formulas."""
    m = ModelShape(**p["shape"])
    dtype, op, b = p["dtype"], p["op"], p["batch"]
    if op == "prefill":
        return fl.forward_work(m, dtype, p["tokens"], b, 0.0, b, "lm")
    if op == "decode":   # a generation runtime's decode point moves its own K/V passes (KV_PASSES), and
        # the weights gemm_weight_passes times at two rows or more (calibrate.cpu.gemm; set by calibrate.fitting.assemble),
        # stream_x times where its footprint streams slower than the fitted bandwidth (calibrate.fitting.assemble.fitted)
        return fl.decode_step_work(m, dtype, b, b * p["prefix_len"], kv_passes(p.get("runtime")),
                                   float(p.get("gemm_weight_passes") or 1.0) * float(p.get("stream_x") or 1.0))
    if op == "chunk_prefill":
        return fl.forward_work(m, dtype, b * p["seq_len"], b, b * p["prefix_len"], 0.0, "value")
    if op == "train":   # the width's relative training rate (calibrate.cpu.widths; set by calibrate.fitting.assemble)
        return fl.train_work(m, dtype, p["tokens"], b, p["head"], float(p.get("width_rate") or 1.0))
    if op == "optimizer":
        return fl.optimizer_work(m, 1, p["head"])
    if op in ("score", "reencode"):   # reencode: one sequence of seq_len tokens from scratch (calibrate.measuring.reencode);
        # a DeBERTa-v2 point's score-matrix traffic counts under its own runtime (flops.materializes_scores)
        return fl.forward_work(m, dtype, p["tokens"], b, 0.0, 0.0, "value", p.get("runtime"))
    raise ValueError(f"no work model for op {op!r}")


def point_value(p: dict) -> float:
    """The measured time a fit uses: the trimmed mean (``calibrate.measuring.measure``); the median for points
    journaled before it was recorded."""
    return p.get("tmean_s", p["median_s"])


TAIL_FLOOR = 0.1   # a point keeps at least this fraction of its time after its sampling tail is taken off


def fitted_value(p: dict) -> float:
    """The time the roofline is fitted to: ``point_value`` less the point's sampling tail
    (``sampling_tail_s``, set by ``calibrate.fitting.assemble.with_tails`` on generation prefill/decode points:
    the simulator adds the measured tail back, ``calibrate.measuring.sampling``) and its page faults (``fault_s``,
    on training points whose logits exceed the allocator's threshold: ``calibrate.cpu.pagefaults``), never
    below ``TAIL_FLOOR`` of it."""
    t = point_value(p)
    tail = float(p.get("sampling_tail_s") or 0.0) * cold_x(p)
    return max(t - tail - float(p.get("fault_s") or 0.0), TAIL_FLOOR * t)


def cold_x(p: dict) -> float:
    """The factor on a point's fixed costs and sampling tail (field ``cold_x``, set on decode points by
    ``calibrate.fitting.assemble.with_tails`` from ``kernels.cold_overheads``: ``calibrate.cpu.coldfixed``); 1 without it."""
    return float(p.get("cold_x") or 1.0)


def overhead_x(points: list[dict]) -> np.ndarray:
    """``cold_x`` of each point, the multiplier of its fitted overheads (``predict``, ``_solve``)."""
    return np.array([cold_x(p) for p in points], dtype=np.float64)


def point_peak(p: dict, gpu: GpuSpec) -> float:
    return gpu.peak("float32") if p["op"] == "optimizer" else gpu.peak(p["dtype"])


def arrays(points: list[dict], gpu: GpuSpec):
    """(F / peak, B / mem_bw, L, t) as float arrays: seconds at 100% efficiency, layers, measured s
    (less any sampling tail: ``fitted_value``)."""
    w = [point_work(p) for p in points]
    fc = np.array([x.flops / point_peak(p, gpu) for x, p in zip(w, points)], dtype=np.float64)
    fm = np.array([x.bytes / gpu.mem_bw for x in w], dtype=np.float64)
    lay = np.array([x.layers for x in w], dtype=np.float64)
    t = np.array([fitted_value(p) for p in points], dtype=np.float64)
    return fc, fm, lay, t


def n_params(lay: np.ndarray) -> int:
    """Free parameters of a fit to points with these layer counts (overhead_per_layer_s only with >= 2)."""
    return 4 if np.ptp(lay) > 0 else 3


def predict(fc, fm, lay, p: OpParams, ox=None) -> np.ndarray:
    """The fitted time of points (arrays as from ``arrays``); ``ox``: each point's overhead multiplier
    (``overhead_x``; 1 without it)."""
    kernel = roofline_kernel_s(fc, fm, 1.0, 1.0, p.compute_eff, p.memory_eff)
    if ox is None:
        return with_overheads_s(kernel, p, lay)
    # with_overheads_s's sum with each overhead times ox: at ox = 1 the same numbers to the last digit
    return kernel + ox * p.overhead_s + p.overhead_per_layer_s * (ox * lay)


def mape(pred: np.ndarray, t: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - t) / t))


def _params(x: np.ndarray) -> OpParams:
    return OpParams(float(np.exp(x[0])), float(np.exp(x[1])), float(x[2]), float(x[3]))


def _solve(fc, fm, lay, t, prior: OpParams, starts: list[np.ndarray] | None = None, ox=None):
    """(x, least_squares result of the best start); x = (log ce, log me, o, oL); ``ox``: the points'
    overhead multipliers (``overhead_x``)."""
    ox = np.ones_like(t) if ox is None else ox
    use_layers = np.ptp(lay) > 0
    lo, hi = np.log(EFF_MIN), np.log(EFF_MAX)
    pw = np.sqrt(PRIOR_WEIGHT * len(t))
    lp = np.log([prior.compute_eff, prior.memory_eff])

    def full(z):
        return np.array([z[0], z[1], z[2], z[3] if use_layers else 0.0])

    def resid(z):
        x = full(z)
        kernel = np.maximum(fc / np.exp(x[0]), fm / np.exp(x[1]))
        r = (kernel + ox * x[2] + x[3] * (ox * lay) - t) / t   # at ox = 1 the plain fit's numbers to the last digit
        return np.concatenate([r, pw * (x[:2] - lp)])

    def jac(z):   # analytic (the active branch of the max): finite differences across the max's kink made
        # the covariance and the bootstrap differ from one CPU's rounding to another's
        x = full(z)
        c, m = fc / np.exp(x[0]), fm / np.exp(x[1])
        compute = c >= m
        j = np.zeros((len(t) + 2, n_z))
        j[:len(t), 0] = np.where(compute, -c, 0.0) / t
        j[:len(t), 1] = np.where(compute, 0.0, -m) / t
        j[:len(t), 2] = ox / t
        if use_layers:
            j[:len(t), 3] = ox * lay / t
        j[len(t), 0] = j[len(t) + 1, 1] = pw
        return j

    n_z = 4 if use_layers else 3
    lb = [lo, lo, 0.0, 0.0][:n_z]
    ub = [hi, hi, np.inf, np.inf][:n_z]
    o0 = 0.25 * float(np.min(t))
    if starts is None:
        effs = [(prior.compute_eff, prior.memory_eff), (0.5, 0.5), (0.5, 0.01), (0.01, 0.5), (0.02, 0.02)]
        starts = [np.array([np.log(a), np.log(b), o0, 0.0]) for a, b in effs]
    best = None
    for s in starts:
        z0 = np.clip(np.asarray(s, dtype=np.float64)[:n_z], lb, [h if np.isfinite(h) else 1e9 for h in ub])
        z0[2] = max(z0[2], 0.0)
        res = least_squares(resid, z0, jac=jac, bounds=(lb, ub), x_scale="jac", method="trf", xtol=1e-10, ftol=1e-12,
                            gtol=1e-12, max_nfev=400)
        if best is None or res.cost < best.cost:
            best = res
    return full(best.x), best, len(t)


def fit_arrays(fc, fm, lay, t, prior: OpParams, ox=None) -> OpParams:
    """Best parameters for one operation's points (arrays as from ``arrays``; ``ox``: ``overhead_x``)."""
    return _params(_solve(fc, fm, lay, t, prior, ox=ox)[0])


def _covariance(res, n: int, k: int) -> np.ndarray | None:
    """s^2 (J^T J)^+ over the data residuals (the prior's rows dropped), in x coordinates (4 x 4)."""
    if n <= k:
        return None
    jac = res.jac[:n]
    r = res.fun[:n]
    s2 = float(r @ r) / (n - k)
    cov_z = s2 * np.linalg.pinv(jac.T @ jac)
    cov = np.zeros((4, 4))
    cov[:k, :k] = cov_z
    return cov


def _bootstrap(fc, fm, lay, t, prior: OpParams, x0: np.ndarray, seed: int, n_boot: int, ox) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    n = len(t)
    out = []
    starts = [x0, np.array([np.log(prior.compute_eff), np.log(prior.memory_eff), x0[2], x0[3]])]
    for _ in range(n_boot):
        idx = rng.integers(0, n, n)
        if len(np.unique(idx)) < 2:
            continue
        x, _, _ = _solve(fc[idx], fm[idx], lay[idx], t[idx], prior, starts, ox[idx])
        p = _params(x)
        out.append([p.compute_eff, p.memory_eff, p.overhead_s, p.overhead_per_layer_s])
    return out


def _heldout(fc, fm, lay, t, prior, folds: list[np.ndarray], tail: np.ndarray, ox) -> float | None:
    """Mean |error| / time of each point predicted by a fit without its fold; errors are relative to the
    whole measured time (the fitted time plus the point's sampling ``tail``, which is measured, not fitted)."""
    errs = np.full(len(t), np.nan)
    for test in folds:
        train = np.setdiff1d(np.arange(len(t)), test)
        if len(train) == 0:
            return None
        p = fit_arrays(fc[train], fm[train], lay[train], t[train], prior, ox[train])
        errs[test] = np.abs(predict(fc[test], fm[test], lay[test], p, ox[test]) - t[test]) / (t[test] + tail[test])
    return float(np.nanmean(errs))


def fit_operation(points: list[dict], gpu: GpuSpec, prior: OpParams, seed: int = 0, bootstrap: int = BOOTSTRAP) -> dict:
    """Fitted parameters of one operation with in-sample and held-out MAPE, identifiability status and
    parameter uncertainty (see the module docstring)."""
    fc, fm, lay, t = arrays(points, gpu)
    ox = overhead_x(points)
    tail = np.array([point_value(q) for q in points], dtype=np.float64) - t
    x, res, n = _solve(fc, fm, lay, t, prior, ox=ox)
    p = _params(x)
    k = n_params(lay)
    ok = n >= k + 2
    heldout = None
    if ok:
        perm = np.random.default_rng(seed).permutation(n)
        heldout = _heldout(fc, fm, lay, t, prior, [f for f in np.array_split(perm, min(5, n)) if len(f)], tail, ox)
    models = sorted({q["model"] for q in points})
    by_model = None
    if ok and len(models) >= 2:
        names = np.array([q["model"] for q in points])
        by_model = _heldout(fc, fm, lay, t, prior, [np.flatnonzero(names == m) for m in models], tail, ox)
    cov = _covariance(res, n, k) if ok else None
    return {"compute_eff": p.compute_eff, "memory_eff": p.memory_eff, "overhead_s": p.overhead_s,
            "overhead_per_layer_s": p.overhead_per_layer_s, "heldout_mape": heldout,
            "heldout_mape_by_model": by_model, "fit_mape": mape(predict(fc, fm, lay, p, ox) + tail, t + tail), "n_points": n,
            "n_params": k, "status": "ok" if ok else "underdetermined", "models": models,
            "method": "scipy.optimize.least_squares (trf, relative residuals, bounded)",
            "covariance_params": list(COV_PARAMS),
            "covariance": None if cov is None else cov.tolist(),
            "param_std": None if cov is None else dict(zip(COV_PARAMS, np.sqrt(np.clip(np.diag(cov), 0, None)).tolist())),
            "samples": _bootstrap(fc, fm, lay, t, prior, x, seed, bootstrap, ox) if ok and bootstrap else None}

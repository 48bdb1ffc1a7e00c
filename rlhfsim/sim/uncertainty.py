"""Prediction intervals: the model's own error and the fitted parameters' uncertainty carried into a step.

**On a GPU** (the scenario's device is no CPU and the profile is not a CPU's) the interval is the model's own
error measured on real runs (``rlhfsim.sim.modelerror``: per phase a bias and a spread, the step from its phases
where they run one after another), which is analytic: no re-simulation.

* A bundled or calibrated GPU profile: the field table's record (``rlhfsim/profiles/model-error/``, the first of
  ``MODEL_ERROR_NAMES`` present: the leave-one-source-out file, else the dev half's). Each leave-one-source-out
  prediction priced its run with terms fitted without that run's source, so the record already holds those
  terms' own uncertainty: operations without a measured uncertainty are held at their values, not drawn again.
* A from-run overlay (``rlhfsim calibrate --from-run``; its ``from_run`` section): the phases its runs logged take
  the fit's misfit, s^2 = RSS / (N - k) over its N logged timers' residuals ln(fitted / measured) (a verl timer is
  one phase, an OpenRLHF timer several: ``rlhfsim.fromrun.frameworks.OPENRLHF_TIMERS``) and k fitted terms
  (bias 0: least squares leaves none; k_p = t(0.95, N - k) / 1.645), and so does the step where its phases
  overlap; the phases they did not log keep the field record's (its step's where it has none of the phase).
  Where N <= k the misfit is unmeasured and the field record widens every phase. Its fitted terms
  are drawn from their intervals (below) and each draw re-simulated: the prediction interval of a fit,
  parameters' spread and residual spread together.

**Parameter draws** (``draw_profiles``). A calibrated profile keeps, per fitted operation, ``samples`` (parameter
sets refitted on bootstrap resamples of its points) and ``covariance`` (linearised, over x = (log compute_eff,
log memory_eff, overhead_s, overhead_per_layer_s); ``calibrate.fitting.fit``): an operation takes a bootstrap sample where
it has them (``bootstrap``), else a normal draw of its covariance (``covariance``; efficiencies through exp,
clipped to (0, 1.5]; overheads clipped at 0). Operations with neither get a stated **prior** (each parameter
within x/ ``PRIOR_FACTOR`` (2) at 90%, log-normal), only where no model error covers them (a CPU profile);
otherwise they are ``held``. An overlay's fitted terms (``from_run.terms``) are drawn in the fit's own coordinates
(x = ln e for an efficiency, s / scale for a time; ``rlhfsim.fromrun.terms``) from a split normal whose 90% half
widths below and above are the bootstrap interval's and the misfit interval's added in quadrature, clipped to the
term's bounds; terms independently (the overlay keeps their intervals, not their joint draws). Every draw is a
whole profile, so the same draw prices every call of that operation in a step.

``interval(run, profile, gpu, n, seed, point)`` re-simulates once per draw only when something is drawn (``run(cost)``
returns a ``SimResult``; same scenario, seed and rollouts as the point prediction) and reports the 5th and 95th
percentiles of the steady-state mean step time and of each phase: a 90% interval. On a CPU (checked by ``rlhfsim
validate`` on real steps) the interval is the parameter draws' alone. The result names what it rests on
(``source``, ``note``, ``model_error``, ``ops_by_source``, ``terms_drawn``), so an interval resting on a prior
is never mistaken for a measured one.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np

from rlhfsim.contracts import PHASES, VERL_PHASE_KEYS
from rlhfsim.costs.model import CostModel
from rlhfsim.costs.profile import BUNDLED_DIR, EFF_KEYS
from rlhfsim.sim import modelerror as me

LEVEL = me.LEVEL
DEFAULT_DRAWS = 24
EFF_MAX = 1.5
PRIOR_FACTOR = 2.0
PRIOR_SIGMA = float(np.log(PRIOR_FACTOR) / me.Z90)
MODEL_ERROR_DIR = BUNDLED_DIR / "model-error"  # beside the profiles, not one of them
MODEL_ERROR_NAMES = ("field-loso.json", "field-dev.json")
_SIM_OF_VERL = {v: k for k, v in VERL_PHASE_KEYS.items()}


def model_error_file():
    """The bundled model-error file in use (the first of ``MODEL_ERROR_NAMES`` present), or None."""
    return next((MODEL_ERROR_DIR / n for n in MODEL_ERROR_NAMES if (MODEL_ERROR_DIR / n).is_file()), None)


def is_gpu(profile: dict, gpu=None) -> bool:
    """Whether a prediction is a GPU's: neither the profile nor the device is a CPU."""
    return (profile.get("device") or {}).get("kind") != "cpu" and (gpu is None or gpu.kind != "cpu")


def model_error(profile: dict, gpu=None) -> me.ModelError | None:
    """The model error that widens a prediction under ``profile`` (module docstring), or None (a CPU, or no record)."""
    if not is_gpu(profile, gpu):
        return None
    path = model_error_file()
    field = me.from_doc(json.loads(path.read_text())) if path else None
    if profile.get("from_run"):
        return overlay_error(profile["from_run"], field)
    return field


def _timer_phases(run: dict) -> dict[str, tuple[str, ...]]:
    """A fitted run's logged timers -> the simulator phases each spans: verl's ``timing_s/*`` one phase each, with the
    folds its release made (``rlhfsim.fromrun.fit.verl_spans``: the weight update, the old log-probs or the reward
    inside gen, the reward inside adv), OpenRLHF's several."""
    if run.get("framework") == "openrlhf":
        from rlhfsim.fromrun.frameworks import OPENRLHF_TIMERS

        return OPENRLHF_TIMERS
    out = {k: (p,) for k, p in _SIM_OF_VERL.items()}
    gen, adv = VERL_PHASE_KEYS["generate"], VERL_PHASE_KEYS["adv"]
    if run.get("weight_sync_in_gen"):
        out[gen] += ("weight_sync",)
    if run.get("old_log_prob_in_gen"):
        out[gen] += ("old_log_prob",)
    if run.get("reward_in_gen"):
        out[gen] += ("reward", "retokenize")
    if run.get("reward_in_adv"):
        out[adv] += ("reward", "retokenize")
    return out


def overlay_error(fit: dict, field: me.ModelError | None) -> me.ModelError | None:
    """An overlay's record: its fit's misfit for the phases its runs logged, the field record's for the rest."""
    residuals: list[float] = []
    covered: set[str] = set()
    for run in fit.get("runs", []):
        timers = _timer_phases(run)
        for key, m in run["measured_s"].items():
            f = run["fitted_s"].get(key)
            if key in timers and m > 0 and f is not None and f > 0:
                residuals.append(math.log(f / m))
                covered.update(timers[key])
    n = len(residuals)
    k = sum(not t.get("at_bound") for t in fit.get("terms", []))
    if n - k <= 0:
        if field is None:
            return None
        return me.ModelError(field.step, field.phases, field.rho, field.source + "; the fit's own misfit unmeasured "
                             f"({n} logged timers for {k} fitted terms)", field.runs, field.sources, field.date,
                             field.method)
    s = math.sqrt(sum(x * x for x in residuals) / (n - k))
    rec = me.PhaseError(0.0, s, n, me.t95(n - k) / me.Z90)
    runs = tuple(r["id"] for r in fit.get("runs", []))
    source = (f"the fit's misfit ({', '.join(runs)}: {n} logged timers, {k} fitted terms, s = {s:.3f} in log) for "
              f"the phases it logged")
    if field is None:
        return me.ModelError(rec, {p: rec for p in covered}, 1.0, source, runs, len(runs), method="from-run fit")
    # a phase the fit's runs did not log keeps the field's record of it (the field's step where it has none)
    other = {p: field.record(p)[1] for p in PHASES if p not in covered}
    return me.ModelError(rec, {**other, **{p: rec for p in covered}}, field.rho,
                         f"{source}; other phases: {field.source}", runs, len(runs), field.date, "from-run fit")


def _from_x(x: np.ndarray) -> list[float]:
    ce, me_ = np.exp(x[0]), np.exp(x[1])
    return [float(min(max(ce, 1e-6), EFF_MAX)), float(min(max(me_, 1e-6), EFF_MAX)), float(max(x[2], 0.0)),
            float(max(x[3], 0.0))]


def op_draws(params: dict, n: int, rng: np.random.Generator) -> tuple[str, list[list[float]]]:
    """(source, ``n`` parameter sets [compute_eff, memory_eff, overhead_s, overhead_per_layer_s]) for one
    operation; source is bootstrap, covariance or prior (see the module docstring)."""
    samples = params.get("samples")
    if samples:
        idx = rng.integers(0, len(samples), n)
        return "bootstrap", [list(map(float, samples[i])) for i in idx]
    cov = params.get("covariance")
    if cov is not None:
        mean = np.array([np.log(params["compute_eff"]), np.log(params["memory_eff"]), params["overhead_s"],
                         params["overhead_per_layer_s"]])
        xs = rng.multivariate_normal(mean, np.asarray(cov, dtype=np.float64), size=n, check_valid="ignore")
        return "covariance", [_from_x(x) for x in xs]
    base = np.array([float(params[k]) for k in EFF_KEYS])
    f = np.exp(PRIOR_SIGMA * rng.standard_normal((n, 4)))
    vals = base * f
    vals[:, :2] = np.minimum(vals[:, :2], EFF_MAX)
    return "prior", vals.tolist()


def term_draws(fit: dict, n: int, rng: np.random.Generator) -> dict[str, list[float]]:
    """An overlay's fitted terms drawn ``n`` times each (module docstring): profile path -> values."""
    spread = fit.get("spread")
    if spread and spread.get("paths"):
        return _spread_draws(spread, n, rng)
    from rlhfsim.fromrun import terms as T

    kinds = {t.name: t for t in T.TERMS}
    out = {}
    for t in fit.get("terms", []):
        term = kinds.get(t["term"])
        if term is None or t.get("at_bound"):
            continue   # a term held at a bound has no interval of its own
        f = float(t.get("frame", 1.0))
        x0 = T.to_x(term, t["fitted"] / f)
        lo_b, hi_b = T.x_bounds(term)
        sides = []
        for side in (0, 1):
            w2 = 0.0
            for iv in (t.get("interval"), t.get("interval_misfit")):
                if iv and iv[side] > 0:
                    w2 += (T.to_x(term, iv[side] / f) - x0) ** 2
            sides.append(math.sqrt(w2) / me.Z90)
        if not any(sides):
            continue
        z = rng.standard_normal(n)
        x = np.clip(x0 + np.where(z < 0, sides[0], sides[1]) * z, lo_b, hi_b)
        out[t["path"]] = [f * T.from_x(term, float(v)) for v in x]
    return out


def _spread_draws(spread: dict, n: int, rng: np.random.Generator) -> dict[str, list[float]]:
    """The fit's joint spread (``from_run.spread``: its coordinates x, the bootstrap's and the misfit's covariance
    of them, bounds, each path's kind, scale and frame): x ~ N(x*, cov_bootstrap + cov_misfit), clipped to the
    bounds, each value frame x (exp(x) for an efficiency, x x scale for a time)."""
    x0 = np.asarray(spread["x"], dtype=np.float64)
    cov = np.asarray(spread["cov_bootstrap"], dtype=np.float64) + np.asarray(spread["cov_misfit"], dtype=np.float64)
    lo = np.array([-np.inf if v is None else v for v in spread["lower"]], dtype=np.float64)
    hi = np.array([np.inf if v is None else v for v in spread["upper"]], dtype=np.float64)
    xs = np.clip(rng.multivariate_normal(x0, cov.reshape(len(x0), len(x0)), size=n, check_valid="ignore"), lo, hi)
    out = {}
    for j, path in enumerate(spread["paths"]):
        if not cov[j, j] > 0:
            continue   # a term held at a bound: no spread of its own
        f, scale, eff = float(spread["frames"][j]), float(spread["scales"][j]), spread["kinds"][j] == "eff"
        out[path] = [f * (math.exp(v) if eff else v * scale) for v in xs[:, j]]
    return out


def draw_profiles(profile: dict, n: int, seed: int = 0, hold_prior: bool = False) -> tuple[list[dict], dict[str, list[str]]]:
    """(n perturbed profiles, {source: operations or terms drawn that way}); see the module docstring. ``hold_prior``:
    operations that would take the prior keep their values (listed under ``held``): the model error covers them,
    and drawing both would count their error twice. Fitted terms of an overlay are listed under ``fit``. No
    profiles where nothing is drawn."""
    rng = np.random.default_rng(seed)
    by_source: dict[str, list[str]] = {"bootstrap": [], "covariance": [], "prior": [], "held": [], "fit": []}
    per_op = {}
    fitted = {op for op, v in profile["operations"].items() if v.get("source") == "fitted-from-run"} \
        if profile.get("from_run") else set()
    for op in sorted(profile["operations"]):
        src, d = op_draws(profile["operations"][op], n, rng)
        if src == "prior" and (hold_prior or op in fitted):
            by_source["held"].append(op)
            continue
        by_source[src].append(op)
        per_op[op] = d
    terms = term_draws(profile["from_run"], n, rng) if profile.get("from_run") else {}
    by_source["fit"] = sorted(terms)
    if not per_op and not terms:
        return [], by_source
    from rlhfsim.fromrun.terms import with_values

    out = []
    for k in range(n):
        prof = {**profile, "operations": {op: dict(v) for op, v in profile["operations"].items()}}
        for op, d in per_op.items():
            prof["operations"][op].update(dict(zip(EFF_KEYS, d[k])))
        if terms:
            prof = with_values(prof, {path: v[k] for path, v in terms.items()})
        out.append(prof)
    return out, by_source


def _pct(values, level: float = LEVEL) -> list[float]:
    lo = 100 * (1 - level) / 2
    a, b = np.percentile(np.asarray(values, dtype=np.float64), [lo, 100 - lo])
    return [float(a), float(b)]


def _source(by_source: dict, err: me.ModelError | None) -> str:
    """What the interval rests on, in a word or three: the model error's kind, then the parameters'."""
    parts = []
    if err is not None:
        parts.append("fit misfit" if err.method == "from-run fit" else "field error")
    if by_source["fit"]:
        parts.append("fitted terms")
    if by_source["bootstrap"] or by_source["covariance"]:
        parts.append("measured")
    if by_source["prior"]:
        parts.append("prior")
    return "+".join(parts) or "none"


def _note(by_source: dict, err: me.ModelError | None) -> str:
    out = []
    if by_source["prior"]:
        out.append(f"operations {', '.join(by_source['prior'])} carry no measured uncertainty: drawn from a stated "
                   f"prior (each parameter within x/ {PRIOR_FACTOR:g} at 90%)")
    if err is not None:
        out.append(f"the model's own error: {err.source}")
        if by_source["held"]:
            out.append(f"{len(by_source['held'])} operations without a measured uncertainty held at their values "
                       "(the model error covers them)")
    if by_source["fit"]:
        out.append(f"fitted terms drawn from their bootstrap and misfit intervals: {', '.join(by_source['fit'])}")
    return "; ".join(out)


def interval(run, profile: dict, gpu, n: int = DEFAULT_DRAWS, seed: int = 0, point: dict | None = None) -> dict:
    """The 90% interval of the step time and of each phase (module docstring). ``run(cost)`` simulates with a
    ``CostModel`` and returns a ``SimResult``; ``point``: the point prediction's summary when already simulated."""
    err = model_error(profile, gpu)
    profiles, by_source = draw_profiles(copy.deepcopy(profile), n, seed, hold_prior=err is not None)
    draws = [run(CostModel(gpu, prof)).summary for prof in profiles]
    if err is None and not draws:
        raise ValueError("interval: nothing to draw and no model error (a CPU profile is always drawn)")
    steps = [s["step_time_s"] for s in draws]
    if err is not None:
        if not draws and point is None:
            point = run(CostModel(gpu, profile)).summary
        w = me.widen(err, [(s["step_time_s"], s["phases_s"]) for s in (draws or [point])])
        step_iv, phase_iv = w["step_time_s_interval"], w["phases_s_interval"]
        carried = {**err.summary(), "step_from": w["step_from"], "phase_records": w["phase_records"]}
    else:
        phases: dict[str, list[float]] = {}
        for s in draws:
            for ph, v in s["phases_s"].items():
                phases.setdefault(ph, []).append(v)
        step_iv, phase_iv, carried = _pct(steps), {ph: _pct(v) for ph, v in phases.items()}, None
    return {"level": LEVEL, "draws": len(draws), "step_time_s_interval": step_iv, "phases_s_interval": phase_iv,
            "parameter_step_time_s_interval": _pct(steps) if steps else None,
            "model_error": carried, "ops_by_source": by_source, "source": _source(by_source, err),
            "note": _note(by_source, err), "step_time_s_draws": [float(x) for x in steps]}


def point_interval(summary: dict, err: me.ModelError) -> dict:
    """The analytic interval of one simulated summary's step (no parameter draws, no phases): what a plan's row
    carries."""
    return me.widen(err, [(summary["step_time_s"], summary["phases_s"])], phases=False)


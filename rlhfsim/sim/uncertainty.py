"""Prediction intervals: the fitted parameters' uncertainty carried into a simulated step.

A calibrated profile keeps, per fitted operation, ``samples`` (parameter sets refitted on bootstrap
resamples of its points) and ``covariance`` (linearised, over x = (log compute_eff, log memory_eff,
overhead_s, overhead_per_layer_s); ``calibrate.fit``). ``draw_profiles(profile, n, seed)`` makes ``n``
copies of the profile whose operations take one draw each: a bootstrap sample where the operation has
them (``bootstrap``), else a draw from the normal distribution of its covariance (``covariance``;
efficiencies through exp, clipped to (0, 1.5]; overheads clipped at 0). Operations that carry neither
(the hand-set ``default`` profile, underdetermined fits, profiles measured before fits kept their
uncertainty) get a stated **prior**, not a measurement: each of the four parameters within a factor of
``PRIOR_FACTOR`` (2) of its value at 90% (log-normal, sigma = ln 2 / 1.645), efficiencies capped at 1.5.
The result says which operations were drawn which way (``ops_by_source``), so an interval that rests
on the prior is never mistaken for a measured one.
Operations are drawn independently of each other (they are fitted to disjoint points). Every draw is a
whole profile, so the same draw prices every call of that operation in a step.

``interval(run, profile, gpu, n, seed)`` re-simulates the scenario once per draw (``run(cost)`` returns a
``SimResult``; same scenario, seed and rollouts as the point prediction) and reports the 5th and 95th
percentiles of the steady-state mean step time and of each phase: a 90% interval.

The parameters' spread does not cover what the cost model's form leaves out, so on a GPU profile the interval
also carries **the model's own error as measured on the public field table's dev half**
(``rlhfsim/profiles/model-error/field-dev.json``, written by ``python scenarios/examples/field/field_table.py
--write-model-error``): per phase, sigma_p = the root mean square of ln(predicted / measured) over the dev half's
runs that logged the phase (the bias counts into the spread: the interval stays centred on the prediction), and
sigma_step for the step and for phases no dev run logged. Operations without a measured uncertainty are then
held at their values instead of drawn from the prior (the dev half's error already holds theirs). Each parameter draw is combined with
``MODEL_ERROR_DRAWS`` draws z ~ N(0, 1), one per phase and one for the step: value x exp(sigma x z). The result
names the file, its date and the sigmas used (``model_error``). CPU profiles (``device.kind: cpu``) are checked by
``rlhfsim validate`` on real steps instead and carry no model error here.
"""

from __future__ import annotations

import copy
import json

import numpy as np

from rlhfsim.costs.model import CostModel
from rlhfsim.costs.profile import BUNDLED_DIR, EFF_KEYS

LEVEL = 0.90
DEFAULT_DRAWS = 24
EFF_MAX = 1.5
PRIOR_FACTOR = 2.0
PRIOR_SIGMA = float(np.log(PRIOR_FACTOR) / 1.6448536269514722)
MODEL_ERROR_FILE = BUNDLED_DIR / "model-error" / "field-dev.json"  # beside the profiles, not one of them
MODEL_ERROR_DRAWS = 64  # model-error draws per parameter draw (no re-simulation: a multiplication each)


def model_error(profile: dict) -> dict | None:
    """The bundled model error (module docstring) for a GPU profile, or None (a CPU profile, or no file)."""
    if (profile.get("device") or {}).get("kind") == "cpu" or not MODEL_ERROR_FILE.is_file():
        return None
    return json.loads(MODEL_ERROR_FILE.read_text())


def _with_model_error(values: list[float], sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Every value times exp(sigma x z) for ``MODEL_ERROR_DRAWS`` draws of z each, pooled."""
    v = np.asarray(values, dtype=np.float64)[:, None]
    return (v * np.exp(sigma * rng.standard_normal((len(values), MODEL_ERROR_DRAWS)))).ravel()


def _from_x(x: np.ndarray) -> list[float]:
    ce, me = np.exp(x[0]), np.exp(x[1])
    return [float(min(max(ce, 1e-6), EFF_MAX)), float(min(max(me, 1e-6), EFF_MAX)), float(max(x[2], 0.0)),
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


def draw_profiles(profile: dict, n: int, seed: int = 0, hold_prior: bool = False) -> tuple[list[dict], dict[str, list[str]]]:
    """(n perturbed profiles, {source: operations drawn that way}); see the module docstring. ``hold_prior``:
    operations that would take the prior keep their values (listed under ``held``): the model error measured on
    the field table covers them, and drawing both would count their error twice."""
    rng = np.random.default_rng(seed)
    by_source: dict[str, list[str]] = {"bootstrap": [], "covariance": [], "prior": [], "held": []}
    per_op = {}
    for op in sorted(profile["operations"]):
        src, d = op_draws(profile["operations"][op], n, rng)
        if src == "prior" and hold_prior:
            by_source["held"].append(op)
            continue
        by_source[src].append(op)
        per_op[op] = d
    out = []
    for k in range(n):
        prof = {**profile, "operations": {op: dict(v) for op, v in profile["operations"].items()}}
        for op, d in per_op.items():
            prof["operations"][op].update(dict(zip(EFF_KEYS, d[k])))
        out.append(prof)
    return out, by_source


def _pct(values, level: float = LEVEL) -> list[float]:
    lo = 100 * (1 - level) / 2
    a, b = np.percentile(np.asarray(values, dtype=np.float64), [lo, 100 - lo])
    return [float(a), float(b)]


def interval(run, profile: dict, gpu, n: int = DEFAULT_DRAWS, seed: int = 0) -> dict:
    """The 90% interval of the step time and of each phase (see the module docstring). ``run(cost)``
    simulates with a ``CostModel`` and returns a ``SimResult``."""
    err = model_error(profile)
    profiles, by_source = draw_profiles(copy.deepcopy(profile), n, seed, hold_prior=err is not None)
    steps, phases = [], {}
    for prof in profiles:
        s = run(CostModel(gpu, prof)).summary
        steps.append(s["step_time_s"])
        for ph, v in s["phases_s"].items():
            phases.setdefault(ph, []).append(v)
    measured = not by_source["prior"]
    out_steps, out_phases, carried = steps, phases, None
    if err is not None:
        rng = np.random.default_rng(seed + 1)
        step_sigma = float(err["step_sigma"])
        out_steps = _with_model_error(steps, step_sigma, rng)
        used = {ph: float(err["phase_sigma"].get(ph, step_sigma)) for ph in phases}
        out_phases = {ph: _with_model_error(v, used[ph], rng) for ph, v in phases.items()}
        carried = {"source": err["source"], "date": err["date"], "runs": err["runs"], "step_sigma": step_sigma,
                   "phase_sigma": used}
    return {"level": LEVEL, "draws": n, "step_time_s_interval": _pct(out_steps),
            "phases_s_interval": {ph: _pct(v) for ph, v in out_phases.items()},
            "parameter_step_time_s_interval": _pct(steps),
            "model_error": carried,
            "ops_by_source": by_source,
            "source": "measured" if measured else ("prior" if not (by_source["bootstrap"] or by_source["covariance"])
                                                   else "measured+prior"),
            "note": ("" if measured else (f"operations {', '.join(by_source['prior'])} carry no measured uncertainty: "
                                          f"drawn from a stated prior (each parameter within x/ {PRIOR_FACTOR:g} at 90%)"))
                    + (f"with the model's own error on the field table's dev half ({err['date']}, runs "
                       f"{', '.join(err['runs'])}): step x/ {np.exp(1.6448536269514722 * err['step_sigma']):.2f} at 90%; "
                       f"operations without measured uncertainty held ({len(by_source['held'])})" if err else ""),
            "step_time_s_draws": [float(x) for x in steps]}

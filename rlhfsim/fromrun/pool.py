"""Profile terms fitted jointly to many public runs' logs (issue 53 item 2): the bundled GPU profiles' fit, and the
leave-one-source-out check of it (``scenarios/examples/field/field_table.py --loso``).

**Runs.** A run is a launch and its log (``PoolRun``), prepared as ``rlhfsim calibrate --from-run`` prepares one
(``rlhfsim.fromrun.fit.prepare_steady``: the launch imported with its GPU, verl release and ``set`` list and the mean
lengths and logged length shape of its own steady steps).

**Steps, not only means.** Within one log the longest response changes from step to step, and a step's generation
is bound by it. So a run's steady steps are cut into up to ``BINS`` bins by their ``response_length/max`` (by
``response_length/clip_ratio`` where every step's longest reached the cap and the clipped share moves instead),
each of at least ``MIN_BIN`` steps, and each bin is a *unit* of its own: imported with its own mean lengths and
logged shape (``rlhfsim.fromrun.lengths``) and compared with its own mean phases. The fit then has to reproduce how
``timing_s/gen`` grows with the longest response (the decode time per step at the tail batch: the slope of gen
against the max) and what gen costs besides (prefill, the weight sync, a generate call's fixed cost: the intercept),
run by run. A unit's residuals weigh 1/sqrt(its run's bins), so every run weighs the same however it is cut.

**Pooling.** A parameter is a term of ``rlhfsim.fromrun.terms.TERMS`` at a profile path, over a *scope* set by the
term's ``pooled``:

* ``host``: one value for every run whatever its GPU: the engine's host work per step and its eager launches per
  layer (one per engine runtime: the path names it), the framework's dispatch per layer and per micro-batch, FSDP's
  per unit, the advantage on the driver. These are time on the host CPU in the software, not on the accelerator, and
  are stated for the profile's reference host (Xeon 8480C): the CostModel multiplies them by each run's server
  host factor (``rlhfsim.costs.hostscale``), so the fit moves the reference host's value.
* ``device``: efficiencies of the accelerator and its links, pooled by ``pooling`` (``POOLINGS``): ``family``, one value
  per GPU family (``family``: the bundled profile ``--profile auto`` gives the GPU, ``rlhfsim.costs.profile
  .GPU_PROFILES``: H100 SXM, H200 and GH200 share H100's; A100 80GB and 40GB share A100's; any other GPU is a family
  of its own), stated for the family's GPU; or ``reference``, one value for every run, stated for the reference GPU
  (an H100 SXM). Either way the value reaches a run on another GPU as ``simulate`` carries it
  (``rlhfsim.costs.model.with_stack_rate``: a compute efficiency by the two GPUs' compute-to-bandwidth balance,
  ``catalog.carried_compute_eff``; a fraction of the memory's or a link's bandwidth as it is).

Terms with a better source than a fit through whole phases are not candidates (``NOT_POOLED``: the GEMM ceiling of
``kernels_by_shape``, measured per operation by ``calibrate.fitting.fromops``).

**Base.** A family's runs are priced from ``base_for`` the family: its bundled profile's files with every term a
public log fitted taken back (``taken_back_chain``), stated for the family's GPU (a family without a profile of its
own: the public layer's terms carried to it), so no fit starts from an earlier fit of the same logs.

**Fit.** With x as in ``rlhfsim.fromrun.terms`` (ln e for an efficiency, s / scale for a time), the residual of
unit u's logged phase p is w_u ln(predicted_up(x) / measured_up) (``rlhfsim.fromrun.fit``'s residual, the step
excluded), plus, with ``prior`` > 0, prior (x_j - x_base_j) / unit_j for every fitted term. The identified terms
(relevant: moving the term by one unit moves some unit's phase by 2%; not confounded: its Jacobian column keeps
30% of its length after the columns of the terms before it, in ``TERMS`` order, host before device; with
``keep_confounded`` every relevant term, the prior sharing what the logs cannot tell apart) are fitted by bounded
Levenberg-Marquardt with Broyden updates (``solve``) from a forward-difference Jacobian computed on the units each
term moves only. Every simulation is cached by (unit, the values of the parameters that move it), so the folds of a
leave-one-source-out check share the base point and its Jacobian.

**Provenance.** Each fitted term lists the runs and logs that determined it, with their shares (|row j| of the
pseudo-inverse of the Jacobian at the solution, summed over a run's units and phases, like ``fit._trace``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlhfsim.contracts import VERL_STEP_KEY
from rlhfsim.costs.model import CostModel, with_stack_rate
from rlhfsim.costs.profile import BUNDLED_DIR, DEFAULT_PROFILE, GPU_PROFILES, PUBLIC_PROFILE, extend, validate_profile
from rlhfsim.hardware.catalog import REFERENCE_STACK_GPU, carried_compute_eff, stated_gpu
from rlhfsim.fromrun import terms as T
from rlhfsim.fromrun.bins import BINS, bins
from rlhfsim.fromrun.fit import FitError, Run, RunSpec, predict, prepare_steady, residual_keys
from rlhfsim.fromrun.logs import read_log, steady_steps

RELEVANT = 0.02
MIN_SIN = 0.3
FD_STEP = 0.25           # identification Jacobian step, x units
JAC_STEP = 0.02          # the fit's forward-difference step, x units (times max(1, |x|))
PRED_FLOOR_S = 1e-6
GEN_KEY = "timing_s/gen"
LN2 = math.log(2.0)
RELEASE_ROUNDS = 2       # refits after letting in the terms confounded with one held at its bound
NOT_POOLED = {"gemm_e_max": "the GEMM ceiling of kernels_by_shape is measured per operation (calibrate.fitting.fromops, "
                            "Vidur's public profiling): a fit through whole phases would fold the framework into it"}


def family(gpu: str) -> str:
    """A GPU's family: the bundled profile ``--profile auto`` prices it with, else the GPU itself."""
    return GPU_PROFILES.get(gpu, gpu)


def family_profile_name(fam: str) -> str:
    """The bundled profile a family's device terms are written to and priced from (``public``, else ``default``, when
    the family has none of its own: what ``--profile auto`` gives its GPU then)."""
    if (BUNDLED_DIR / f"{fam}.json").is_file():
        return fam
    return PUBLIC_PROFILE if (BUNDLED_DIR / f"{PUBLIC_PROFILE}.json").is_file() else DEFAULT_PROFILE


def _delete(doc: dict, path: str) -> None:
    """Remove ``path``'s key from ``doc`` and every object on the way it leaves empty."""
    *parents, key = path.split(".")
    chain = [doc]
    for k in parents:
        nxt = chain[-1].get(k)
        if not isinstance(nxt, dict):
            return
        chain.append(nxt)
    chain[-1].pop(key, None)
    for k, node in zip(reversed(parents), reversed(chain[:-1])):
        if node.get(k) == {}:
            node.pop(k)


def take_back(doc: dict) -> dict:
    """The file as it was before any fit wrote into it: each ``from_logs`` term back to its prior (or removed where
    the file had no value of its own)."""
    out = json.loads(json.dumps(doc))
    for path, rec in (out.pop("from_logs", None) or {}).items():
        if rec.get("prior_in_file"):
            out = T.with_values(out, {path: rec["prior"]})
        else:
            _delete(out, path)
    (out.get("provenance") or {}).pop("from_logs", None)
    (out.get("provenance") or {}).pop("extends_public", None)
    return out


def taken_back_chain(name: str) -> dict:
    """Bundled profile ``name`` as it would load (``extends`` followed, each layer merged by
    ``rlhfsim.costs.profile.extend``) with every layer's log-fitted terms taken back (``take_back``): what
    its files say before any fit of the public logs, inherited values carried to each layer's GPU as they are now."""
    layers, n = [], name
    while n is not None:
        doc = take_back(json.loads((BUNDLED_DIR / f"{n}.json").read_text()))
        layers.append(doc)
        n = doc.get("extends")
    merged = {k: v for k, v in layers[-1].items() if k != "extends"}
    for layer in reversed(layers[:-1]):
        merged = extend(merged, {k: v for k, v in layer.items() if k != "extends"})
    return merged


def base_for(fam: str) -> dict:
    """A family's base: its bundled profile with every log-fitted term taken back (``taken_back_chain``), stated for
    the family's GPU (a family without a profile of its own: ``default``'s layer carried to it, as ``bundle`` writes
    a family's new profile over ``public``), so a device term fitted here is stated for the GPU whose profile it goes
    to (``rlhfsim.costs.model.with_stack_rate`` carries it to the family's other members)."""
    doc = taken_back_chain(family_profile_name(fam))
    if stated_gpu(fam) is not None and stated_gpu(doc.get("gpu", "any")) != stated_gpu(fam):
        doc = extend(doc, {"gpu": fam, "name": fam})
    return validate_profile(doc, f"profile {fam} (taken back)")


def reference_base() -> dict:
    """The public layer with its fitted terms taken back: every efficiency stated for the reference GPU
    (``REFERENCE_STACK_GPU``), the frame of a device term pooled over every GPU (``pooling="reference"``)."""
    return taken_back_chain(PUBLIC_PROFILE if (BUNDLED_DIR / f"{PUBLIC_PROFILE}.json").is_file() else DEFAULT_PROFILE)


# How a device term (an efficiency of the accelerator and its links) is pooled (``Pool``'s ``pooling``):
# ``family``: one value per GPU family, stated for the family's GPU and carried to its other members;
# ``reference``: one value over every run, stated for the reference GPU and carried to each run's GPU (a compute
# efficiency by ``catalog.carried_compute_eff``; a fraction of the memory's or a link's bandwidth as it is).
POOLINGS = ("family", "reference")


def carried(p: "Param", value: float, base: dict) -> float:
    """Parameter ``p``'s value as the profile ``base`` states it: a compute efficiency pooled at the reference GPU
    (scope ``all``, a device term) carried to base's GPU; anything else as it is."""
    if p.scope == "all" and p.term.pooled == "device" and p.path.endswith(".compute_eff"):
        return carried_compute_eff(value, stated_gpu(base.get("gpu", "any")), REFERENCE_STACK_GPU)
    return value


@dataclass(frozen=True)
class PoolRun:
    """A public run with a log: where it came from (its source, for holding out) and how to import it."""

    id: str
    source_group: str
    spec: RunSpec


@dataclass
class Unit:
    """One bin of a run's steady steps, prepared as a run of its own."""

    run: PoolRun
    label: str               # e.g. "response_length/max 363-512 (37 steps)"
    prepared: Run
    weight: float
    family: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.run.id, self.label)


def prepare_units(runs: list[PoolRun], n_bins: int = BINS) -> list[Unit]:
    """Every run's steady steps in bins, each prepared (``fit.prepare_steady``)."""
    units = []
    for r in runs:
        s = r.spec
        steady = steady_steps(read_log(s.log), s.log.name, s.warmup, s.min_steps)
        parts = bins(steady, n_bins)
        for label, st in parts:
            units.append(Unit(r, label, prepare_steady(s, st), 1 / math.sqrt(len(parts)), family(s.gpu)))
    return units


@dataclass(frozen=True)
class Param:
    """A fitted coordinate: a term at a profile path over a scope (``all`` or a GPU family)."""

    term: T.Term
    path: str
    scope: str

    @property
    def label(self) -> str:
        return f"{self.term.name} ({self.path}; {'every GPU' if self.scope == 'all' else self.scope})"


class SimCache:
    """Simulated phases by (unit, the values of the parameters that move it): shared by the folds of a check."""

    def __init__(self):
        self.store: dict = {}
        self.simulations = 0

    def get(self, unit: Unit, profile: dict, key: tuple) -> dict[str, float]:
        k = (unit.key, key)
        if k not in self.store:
            self.store[k] = predict(unit.prepared, profile)
            self.simulations += 1
        return self.store[k]


class Pool:
    """The pooled fit's residuals over ``units``: each family's base (``bases``), the candidate parameters, which
    units each one moves, and cached simulations."""

    def __init__(self, units: list[Unit], bases: dict[str, dict], cache: SimCache | None = None,
                 weighting: str = "equal", pooling: str = "family"):
        if not units:
            raise FitError("pool: expected at least one run with a log, got none")
        if pooling not in POOLINGS:
            raise FitError(f"pool: pooling: expected one of {', '.join(POOLINGS)}, got {pooling!r}")
        self.units, self.bases, self.cache, self.pooling = units, bases, cache or SimCache(), pooling
        # the frame of a device term pooled over every GPU: its prior as the reference GPU states it
        self.reference = reference_base() if pooling == "reference" else None
        base_pred = [self.cache.get(u, bases[u.family], ()) for u in units]
        self.rows = [(i, k) for i, u in enumerate(units) for k in residual_keys(u.prepared, base_pred[i])]
        self.log_meas = np.array([math.log(units[i].prepared.measured[k]) for i, k in self.rows])
        share = [math.sqrt(units[i].prepared.measured[k] / units[i].prepared.measured[VERL_STEP_KEY]) if weighting == "share"
                 else 1.0 for i, k in self.rows]
        self.w = np.array([units[i].weight * s for (i, _), s in zip(self.rows, share)])
        self.candidates = self._candidates()
        self.moves: dict[int, list[int]] = {}   # candidate index -> units it moves (filled by identify)

    def _candidates(self) -> list[Param]:
        seen: dict[tuple[str, str], Param] = {}
        for t in [t for t in T.TERMS if t.pooled == "host"] + [t for t in T.TERMS if t.pooled != "host"]:
            if t.name in NOT_POOLED:
                continue
            for u in self.units:
                path = T.resolve(t, self.bases[u.family], u.prepared.gen_runtime)
                scope = "all" if t.pooled == "host" or self.pooling == "reference" else u.family
                if path is not None and (path, scope) not in seen:
                    seen[(path, scope)] = Param(t, path, scope)
        return list(seen.values())

    def applies(self, p: Param, u: Unit) -> bool:
        """Whether ``p`` sets a number ``u``'s profile prices it with (its scope and its path)."""
        return p.scope in ("all", u.family) and T.resolve(p.term, self.bases[u.family], u.prepared.gen_runtime) == p.path

    def x_base(self, params: list[Param]) -> np.ndarray:
        """Each parameter at its base value (a host term: the first family base that has it; a device term pooled
        over every GPU: the reference GPU's, ``reference_base``)."""
        out = []
        for p in params:
            fam = p.scope if p.scope != "all" else next(u.family for u in self.units if self.applies(p, u))
            base = self.reference if p.scope == "all" and p.term.pooled == "device" else self.bases[fam]
            out.append(T.to_x(p.term, T.get_value(base, p.path)))
        return np.array(out)

    def predictions(self, params: list[Param], x: np.ndarray, only: set[int] | None = None) -> list[dict | None]:
        """Each unit's simulated phases at x (None for units outside ``only``)."""
        out: list[dict | None] = []
        for i, u in enumerate(self.units):
            if only is not None and i not in only:
                out.append(None)
                continue
            mine = [(j, p) for j, p in enumerate(params) if self.applies(p, u) and self._moves(p, i)]
            vals = {p.path: carried(p, T.from_x(p.term, float(x[j])), self.bases[u.family]) for j, p in mine}
            key = tuple(sorted((p.path, float(f"{float(x[j]):.12g}")) for j, p in mine))
            out.append(self.cache.get(u, T.with_values(self.bases[u.family], vals) if vals else self.bases[u.family], key))
        return out

    def _moves(self, p: Param, i: int) -> bool:
        idx = self.candidates.index(p)
        return idx not in self.moves or i in self.moves[idx]

    def residuals_of(self, preds: list[dict | None]) -> np.ndarray:
        p = np.array([max(preds[i].get(k, 0.0), PRED_FLOOR_S) for i, k in self.rows])
        return self.w * (np.log(p) - self.log_meas)

    def residuals(self, params: list[Param], x: np.ndarray) -> np.ndarray:
        return self.residuals_of(self.predictions(params, x))

    def jacobian(self, params: list[Param], x: np.ndarray, r0: np.ndarray, step: float,
                 cols: list[int] | None = None) -> np.ndarray:
        """Forward differences (downward at an upper bound), re-simulating only the units each parameter moves;
        ``cols``: only these parameters' columns (the others left 0)."""
        J = np.zeros((len(r0), len(params)))
        for j, p in enumerate(params):
            if cols is not None and j not in cols:
                continue
            h = step * max(1.0, abs(float(x[j])))
            if x[j] + h > T.x_bounds(p.term)[1] + 1e-12:
                h = -h
            xx = x.copy()
            xx[j] += h
            idx = self.candidates.index(p)
            units = set(self.moves.get(idx, range(len(self.units))))
            rows = [n for n, (i, _) in enumerate(self.rows) if i in units]
            if not rows:
                continue
            preds = self.predictions(params, xx, only=units)
            pr = np.array([max(preds[self.rows[n][0]].get(self.rows[n][1], 0.0), PRED_FLOOR_S) for n in rows])
            J[rows, j] = (self.w[rows] * (np.log(pr) - self.log_meas[rows]) - r0[rows]) / h
        return J

    def find_moves(self) -> None:
        """Which units each candidate moves: its path priced for the unit and a large move (x +/- 1 unit) changing
        some phase of the run's first unit (a run's bins differ in lengths only, so they are priced alike); the rest
        are never re-simulated for it."""
        x0 = self.x_base(self.candidates)
        first: dict[str, int] = {}
        for i, u in enumerate(self.units):
            first.setdefault(u.run.id, i)
        base = self.predictions(self.candidates, x0, only=set(first.values()))
        for j, p in enumerate(self.candidates):
            lo, hi = T.x_bounds(p.term)
            moved = []
            for rid, i in first.items():
                if not self.applies(p, self.units[i]):
                    continue
                for d in (T.plausible_dx(p.term), -T.plausible_dx(p.term)):
                    xj = min(max(x0[j] + d, lo), hi)
                    if xj == x0[j]:
                        continue
                    xx = x0.copy()
                    xx[j] = xj
                    self.moves[j] = [*moved, i]     # let this unit see the move while testing it
                    pr = self.predictions(self.candidates, xx, only={i})[i]
                    if any(abs(pr.get(k, 0.0) - v) > 1e-9 * max(abs(v), 1e-9) for k, v in base[i].items()):
                        moved += [n for n, u in enumerate(self.units) if u.run.id == rid]
                        break
            self.moves[j] = sorted(moved)


def identify(pool: Pool, keep_confounded: bool = False) -> tuple[list[Param], dict[Param, str], dict[Param, Param]]:
    """``fit.identify``'s rules over the pooled candidates (module docstring); for the others, why not, and for a
    confounded one the term it was confounded with. ``keep_confounded``: every relevant term is fitted (a prior
    resolves what the logs cannot tell apart)."""
    pool.find_moves()
    cands = pool.candidates
    x0 = pool.x_base(cands)
    r0 = pool.residuals(cands, x0)
    J = pool.jacobian(cands, x0, r0, FD_STEP)
    chosen: list[int] = []
    basis: list[np.ndarray] = []
    why: dict[Param, str] = {}
    confounded: dict[Param, Param] = {}
    for j, p in enumerate(cands):
        col = J[:, j]
        if not pool.moves.get(j) or np.max(np.abs(col)) * T.plausible_dx(p.term) < RELEVANT:
            why[p] = "no logged phase moves with it (by 2% for a factor of 2 / one unit)"
            continue
        v = col.copy()
        for b in basis:
            v -= (v @ b) * b
        if not keep_confounded and (np.linalg.norm(v) < MIN_SIN * np.linalg.norm(col) or len(chosen) >= len(col)):
            top = max(chosen, key=lambda c: abs(col @ J[:, c]) / (np.linalg.norm(J[:, c]) + 1e-300))
            why[p] = f"confounded with {cands[top].label}: moves the same logged phases alike"
            confounded[p] = cands[top]
            continue
        chosen.append(j)
        if np.linalg.norm(v) > 0:
            basis.append(v / np.linalg.norm(v))
    return [cands[j] for j in chosen], why, confounded


@dataclass
class PoolFit:
    """A pooled fit: the fitted parameters and values, each family's profile, the trace and the units' errors."""

    params: list[Param]
    x: np.ndarray
    bases: dict[str, dict]
    terms: list[dict]
    unidentified: list[dict]
    units: list[dict]
    rms_log_residual: float
    evaluations: int
    simulations: int
    runs: list[str] = field(default_factory=list)
    tails: list[dict] = field(default_factory=list)
    pooling: str = "family"

    def profile(self, fam: str) -> dict:
        """The family's base with the fitted values set as it states them (``carried``: a device term pooled over every
        GPU carried from the reference GPU to the family's; a family no run was on: ``base_for`` it, the terms pooled
        over every GPU set)."""
        base = self.bases.get(fam) or base_for(fam)
        vals = {p.path: carried(p, T.from_x(p.term, float(v)), base) for p, v in zip(self.params, self.x)
                if p.scope in ("all", fam) and T.has_path(base, p.path)}
        return T.with_values(base, vals)


def solve(fun, jac, x0: np.ndarray, lo: np.ndarray, hi: np.ndarray, J0: np.ndarray | None = None,
          max_iter: int = 30, tol: float = 1e-4) -> tuple[np.ndarray, int]:
    """Bounded Levenberg-Marquardt with Broyden's rank-one Jacobian updates: min |fun(x)|^2 on [lo, hi].

    One evaluation of ``fun`` per iteration (a simulation of every unit, cached); the finite-difference Jacobian
    (``jac``, a simulation per term and unit it moves) only at the start (unless ``J0`` is given) and after three
    rejected steps in a row. A term at a bound whose gradient pushes it outward is held there for the step. Stops
    when a step lowers the sum of squares by less than ``tol`` of it, or after ``max_iter`` iterations. Returns
    (x, evaluations)."""
    x = np.clip(x0, lo, hi)
    r = fun(x)
    J = jac(x) if J0 is None else J0.copy()
    cost, lam, evals, fails = float(r @ r), 1e-2, 1, 0
    for _ in range(max_iter):
        g = J.T @ r
        free = ~(((x <= lo) & (g > 0)) | ((x >= hi) & (g < 0)))
        if not free.any():
            break
        A = J[:, free].T @ J[:, free]
        dx = np.zeros_like(x)
        dx[free] = np.linalg.solve(A + lam * (np.diag(np.diag(A)) + 1e-9 * np.eye(int(free.sum()))), -g[free])
        x_new = np.clip(x + dx, lo, hi)
        step = x_new - x
        if not np.any(np.abs(step) > 1e-10):
            break
        r_new = fun(x_new)
        evals += 1
        J += np.outer(r_new - r - J @ step, step) / float(step @ step)    # Broyden: the secant through the new point
        new_cost = float(r_new @ r_new)
        if new_cost < cost:
            done = cost - new_cost < tol * cost
            x, r, cost, lam, fails = x_new, r_new, new_cost, max(lam / 3, 1e-6), 0
            if done:
                break
        else:
            lam, fails = lam * 4, fails + 1
            if fails >= 3:
                J, fails = jac(x), 0
    return x, evals


def prior_rows(params: list[Param], x: np.ndarray, xb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each term's distance from its prior (the base's value) in units of a factor of 2, and d/dx of it: ln(e / e_0)
    / ln 2 for an efficiency; ln((s + 0.1 s_0) / 1.1 s_0) / ln 2 for a time with a prior s_0 > 0 (softened near 0, so a
    term may still reach 0 at a finite cost); for a time whose prior is 0, s in units of its scale; for a share, its
    change over half the range."""
    res, d = np.zeros(len(x)), np.zeros(len(x))
    for j, p in enumerate(params):
        if p.term.kind == "eff":
            res[j], d[j] = (x[j] - xb[j]) / LN2, 1 / LN2
        elif p.term.kind == "share" or xb[j] <= 0:
            unit = T.plausible_dx(p.term)
            res[j], d[j] = (x[j] - xb[j]) / unit, 1 / unit
        else:
            e = 0.1 * xb[j]
            res[j], d[j] = math.log((x[j] + e) / (xb[j] + e)) / LN2, 1 / ((x[j] + e) * LN2)
    return res, d


def fit_pool(units: list[Unit], cache: SimCache | None = None, prior: float = 0.0, weighting: str = "equal",
             max_iter: int = 30, keep_confounded: bool = False, pooling: str = "family") -> PoolFit:
    """The pooled fit (module docstring) over ``units``; ``keep_confounded`` (with ``prior`` > 0): no term is left
    out as confounded, the prior settles how the change is shared; ``pooling`` (``POOLINGS``): a device term per GPU
    family or one for every GPU at the reference GPU."""
    if keep_confounded and prior <= 0:
        raise FitError("pool: keep_confounded needs prior > 0 (nothing else tells confounded terms apart)")
    bases = {fam: base_for(fam) for fam in sorted({u.family for u in units})}
    pool = Pool(units, bases, cache, weighting, pooling)
    sims0 = pool.cache.simulations
    params, why, confounded = identify(pool, keep_confounded)
    if not params:
        raise FitError("pool: expected at least one term the logs identify, got none")
    n_eval, released, J_start = 0, {}, None
    x_start = pool.x_base(params)
    for rnd in range(RELEASE_ROUNDS + 1):
        lo = np.array([T.x_bounds(p.term)[0] for p in params])
        hi = np.array([T.x_bounds(p.term)[1] for p in params])
        xb = pool.x_base(params)

        def fun(x, params=params, xb=xb):
            return np.concatenate([pool.residuals(params, x), prior * prior_rows(params, x, xb)[0]])

        def jac(x, params=params, xb=xb):
            r = pool.residuals(params, x)
            return np.vstack([pool.jacobian(params, x, r, JAC_STEP), prior * np.diag(prior_rows(params, x, xb)[1])])

        sol_x, evals = solve(fun, jac, x_start, lo, hi, J0=J_start, max_iter=max_iter)
        n_eval += evals
        x = np.where(sol_x - lo < 1e-9, lo, np.where(hi - sol_x < 1e-9, hi, sol_x))
        r = pool.residuals(params, x)
        J = pool.jacobian(params, x, r, JAC_STEP)
        free = [j for j in range(len(params)) if lo[j] < x[j] < hi[j]]
        # a term held at its bound while the residuals pull it past: the terms confounded with it are no longer
        # redundant (it cannot move further), so they join the fit, in priority order
        g = J.T @ r
        held = {params[j] for j in range(len(params)) if (x[j] <= lo[j] and g[j] > 0) or (x[j] >= hi[j] and g[j] < 0)}
        add = [q for q in pool.candidates if q in confounded and confounded[q] in held and q not in params]
        if not add or rnd == RELEASE_ROUNDS:     # the last round's solution stands (x matches params)
            break
        for q in add:
            released[q] = confounded[q]
            why.pop(q, None)
        x_start = np.concatenate([x, pool.x_base(add)])
        new = pool.jacobian(params + add, x_start, r, JAC_STEP,
                            cols=list(range(len(params), len(params) + len(add))))[:, len(params):]
        params = params + add
        J_start = np.vstack([np.hstack([J, new]), prior * np.diag(prior_rows(params, x_start, pool.x_base(params))[1])])
    pinv = np.zeros((len(params), len(r)))
    if free:
        aug = np.vstack([J[:, free], prior * np.diag(prior_rows(params, x, xb)[1][free])])
        pinv[free, :] = np.linalg.pinv(aug)[:, :len(r)]
    preds = pool.predictions(params, x)
    base_preds = pool.predictions(params, xb)
    terms_out = []
    for j, p in enumerate(params):
        terms_out.append({"term": p.term.name, "path": p.path, "scope": p.scope, "pooled": p.term.pooled,
                          "meaning": p.term.meaning, "prior": T.from_x(p.term, float(xb[j])),
                          **({"stated_for": REFERENCE_STACK_GPU} if p.scope == "all" and p.term.pooled == "device"
                             else {}),
                          "fitted": T.from_x(p.term, float(x[j])), "at_bound": j not in free,
                          "determined_by": _trace(pool, pinv[j]) if j in free else [],
                          **({"released_by": released[p].label} if p in released else {}),
                          "moves_runs": sorted({units[i].run.id for i in pool.moves.get(pool.candidates.index(p), [])})})
    unit_rows = []
    for i, un in enumerate(units):
        m = un.prepared.measured
        keys = [k for k in m if k in preds[i] and m[k] > 0]
        unit_rows.append({"run": un.run.id, "bin": un.label, "family": un.family, "log": str(un.run.spec.log),
                          "measured_s": {k: round(m[k], 4) for k in keys},
                          "base_s": {k: round(base_preds[i][k], 4) for k in keys},
                          "fitted_s": {k: round(preds[i][k], 4) for k in keys}})
    return PoolFit(params, x, bases, terms_out,
                   [{"term": p.term.name, "path": p.path, "scope": p.scope, "why": w} for p, w in why.items()], unit_rows,
                   float(np.sqrt(np.mean(r ** 2))), n_eval, pool.cache.simulations - sims0,
                   sorted({un.run.id for un in units}), tails(units, unit_rows), pooling)


def tails(units: list[Unit], unit_rows: list[dict]) -> list[dict]:
    """Per run cut into bins: ``timing_s/gen`` against the binned length over its steady steps (least squares
    gen = a + b x: b the seconds per token of the longest response, the decode step at the tail batch; a what gen
    costs besides), and the same slope between its first and last bins as logged, as the base priced it and as the
    fit prices it."""
    out = []
    for rid in dict.fromkeys(u.run.id for u in units):
        idx = [i for i, u in enumerate(units) if u.run.id == rid]
        if len(idx) < 2:
            continue
        key = units[idx[0]].label.split(" ")[0]
        steps = [s for i in idx for s in units[i].prepared.steady.kept]
        xs = np.array([float(s.metrics[key]) for s in steps])
        ys = np.array([float(s.metrics[GEN_KEY]) for s in steps])
        b, a = np.polyfit(xs, ys, 1)
        r2 = 1 - float(np.var(ys - (a + b * xs))) / float(np.var(ys)) if np.var(ys) > 0 else 0.0
        lo, hi = unit_rows[idx[0]], unit_rows[idx[-1]]
        dx = units[idx[-1]].prepared.steady.mean(key) - units[idx[0]].prepared.steady.mean(key)

        def slope(col):
            return (hi[col][GEN_KEY] - lo[col][GEN_KEY]) / dx if dx and GEN_KEY in hi[col] else None

        out.append({"run": rid, "key": key, "steps": len(steps), "per_step_fit": {"a_s": round(float(a), 4),
                    "b_s_per_unit": float(f"{b:.4g}"), "r2": round(r2, 3)},
                    "bin_slope": {c.removesuffix("_s"): (float(f"{v:.4g}") if v is not None else None)
                                  for c in ("measured_s", "base_s", "fitted_s") for v in [slope(c)]}})
    return out


def _trace(pool: Pool, row: np.ndarray) -> list[dict]:
    """The runs that determined a term: |row of the pseudo-inverse| summed over each run's units and phases."""
    w = np.abs(row)
    if w.sum() <= 0:
        return []
    by: dict[str, dict] = {}
    for n, (i, k) in enumerate(pool.rows):
        un = pool.units[i]
        rec = by.setdefault(un.run.id, {"run": un.run.id, "source": un.run.source_group, "log": str(un.run.spec.log),
                                         "share": 0.0, "phases": {}})
        rec["share"] += float(w[n] / w.sum())
        rec["phases"][k] = rec["phases"].get(k, 0.0) + float(w[n] / w.sum())
    out = []
    for rec in sorted(by.values(), key=lambda r: -r["share"]):
        if rec["share"] < 0.02:
            continue
        rec["share"] = round(rec["share"], 3)
        rec["phases"] = [k for k, s in sorted(rec["phases"].items(), key=lambda kv: -kv[1]) if s >= 0.01]
        out.append(rec)
    return out


def predict_run(fit: PoolFit | None, sc, gpu_name: str) -> dict:
    """A scenario simulated with the pooled profile of its GPU's family (``fit`` None: the family's prior)."""
    from rlhfsim.hardware.catalog import get_gpu
    from rlhfsim.sim.run import simulate

    gpu = get_gpu(gpu_name)
    fam = family(gpu.name)
    doc = fit.profile(fam) if fit is not None else base_for(fam)
    return simulate(sc, cost=CostModel(gpu, with_stack_rate(doc, gpu))).summary


def log_path(base_dir: Path, ref: str) -> Path:
    """A run entry's ``log:`` (relative to the file that names it)."""
    return (base_dir / ref).resolve()

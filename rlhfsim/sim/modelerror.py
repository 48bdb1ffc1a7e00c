"""The model's own error, measured on real runs, as it widens a prediction: per phase and for the step.

**Record.** For runs predicted by the simulator and measured (the public field table's scored runs, each predicted
with its own source held out of every fitted term), the residual of run i's phase p is

    r_ip = ln(predicted_ip / measured_ip)

(verl's ``timing_s/gen`` holds the weight update where the release logs none of its own: there the residual is that
of the simulator's generate + weight_sync), and r_i of the step likewise. Per phase, over the runs that logged it:
the bias mu_p = mean r_ip, the spread sigma_p = the sample standard deviation around it (n_p - 1) and n_p; the
step's the same over every run. Errors of one run's phases are correlated, and not all alike: the forward passes
and training run the same kernels on the same cluster and miss together, while generation runs an engine of its own
and its error has little to do with theirs (the field table's record: docs/accuracy.md). So each pair of records
(a, b) logged together by at least ``MIN_PAIRS`` runs takes its own correlation c_ab, the mean product of the two
records' standardised residuals over those runs, clipped to [-1, 1]; a pair measured by fewer takes rho, that mean
over every pair of phases logged by the same run, clipped to [0, 1] (1 where fewer than ``MIN_PAIRS`` pairs measure
even that).

**A phase's interval.** A new run's phase measures predicted x exp(-r), r = mu_p + k_p sigma_p z, z ~ N(0, 1):

    90%: [pred_p exp(-mu_p - 1.645 k_p sigma_p), pred_p exp(-mu_p + 1.645 k_p sigma_p)]

The bias shifts the interval rather than widening it on both sides: an error mostly of one sign (generation
predicted too fast) puts the interval on the side the runs fell, and where the bias is large the point itself
can fall outside it; that is what the runs say, and the point is left as the cost model computes it.
k_p = t(0.95, n_p - 1) sqrt(1 + 1/n_p) / 1.645 is the small-sample prediction interval of a normal sample (a
sigma from 5 runs widens by 1.62, from 25 by 1.06). A phase logged by fewer than ``MIN_RUNS`` runs takes the
record of the phase its residual was measured with (weight_sync: generate's), else the step's.

**The step's interval.** Where the phases run one after another (their spans sum to the step within
``SERIAL_TOL``: every sync schedule, as verl runs), the step is what the simulator makes of them:

    step = gaps + sum_p pred_p exp(-r_p),   r_p = mu_p + k_p sigma_p z_p,   corr(z_a, z_b) = c_ab

(gaps: the step less its phases' spans, held; the matrix of c_ab over the records in use taken to the nearest
positive semi-definite one, z = x S' with S S' that matrix and x a fixed Latin hypercube of independent normals:
the same draws for every prediction), drawn ``MC_DRAWS`` times and its 5th and 95th percentiles taken. A
generation-bound step so carries generation's error and a training-bound one training's.
Where phases overlap (a streamed reward, one-step-off, OPPO) the step is no sum of its phases' spans and takes
the step's own record, as a phase does.

Where the record comes from: the bundled GPU profiles read ``rlhfsim/profiles/model-error/`` (written by
``python scenarios/examples/field/field_table.py --write-model-error``; ``model_error_doc``); a from-run overlay
its own fit's misfit (``rlhfsim.sim.uncertainty``). ``loso_coverage`` evaluates the interval on the field table
with each run's own source left out of the record that widens it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from rlhfsim.contracts import VERL_PHASE_KEYS

LEVEL = 0.90
Z90 = 1.6448536269514722
MIN_RUNS = 3          # a phase's own record needs this many runs (a standard deviation from 2 is no estimate)
MIN_PAIRS = 5         # phase pairs needed to estimate rho
SERIAL_TOL = 0.02     # phases whose spans sum to the step within 2% of it run one after another
MC_DRAWS = 4096
STEP = "step"
# a phase whose residual was measured together with another's (verl's gen holds the weight update)
MEASURED_WITH = {"weight_sync": "generate"}
_VERL_SHORT = {v.removeprefix("timing_s/"): k for k, v in VERL_PHASE_KEYS.items()}


def t95(dof: int) -> float:
    """The 95th percentile of Student's t with ``dof`` degrees of freedom (Cornish-Fisher: within 1.3% of the
    exact value at dof 2, 0.3% from dof 3; the exact one needs scipy, which the simulator does not import)."""
    if dof <= 0:
        return math.inf
    z, n = Z90, float(dof)
    return (z + (z ** 3 + z) / (4 * n) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * n ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * n ** 3))


@dataclass(frozen=True)
class PhaseError:
    """One phase's (or the step's) log error: bias mu, spread sigma, runs n, and k, the factor on sigma for a
    new run's 90% interval (module docstring)."""

    bias: float
    sigma: float
    n: int
    k: float

    @classmethod
    def of(cls, residuals: list[float]) -> "PhaseError":
        n = len(residuals)
        mu = statistics.fmean(residuals)
        sd = statistics.stdev(residuals) if n > 1 else 0.0
        return cls(mu, sd, n, t95(n - 1) * math.sqrt(1 + 1 / n) / Z90 if n > 1 else math.inf)

    def half_width(self, level: float = LEVEL) -> float:
        """Half the ``level`` interval's width in log."""
        return NormalDist().inv_cdf(0.5 + level / 2) * self.k * self.sigma

    def factors(self, level: float = LEVEL) -> tuple[float, float]:
        """(low, high): the measured value as a multiple of the prediction, ``level`` (90%)."""
        w = self.half_width(level)
        return math.exp(-self.bias - w), math.exp(-self.bias + w)

    def to_dict(self) -> dict:
        return {"bias": round(self.bias, 4), "sigma": round(self.sigma, 4), "runs": self.n, "k": round(self.k, 3)}


@dataclass(frozen=True)
class ModelError:
    """What widens a prediction: the step's record, each phase's with enough runs, rho, and where they came from."""

    step: PhaseError
    phases: dict[str, PhaseError]
    rho: float
    source: str
    runs: tuple[str, ...] = ()
    sources: int = 0
    date: str = ""
    method: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    # measured correlations of record pairs, keyed ``pair_key(a, b)``; a pair not here takes rho
    corr: dict[str, float] = field(default_factory=dict)

    def record(self, phase: str) -> tuple[str, PhaseError]:
        """(the record's name, the record) that widens ``phase``: its own, the phase it was measured with, the step's."""
        for name in (phase, MEASURED_WITH.get(phase)):
            if name in self.phases:
                return name, self.phases[name]
        return STEP, self.step

    def correlation(self, a: str, b: str) -> float:
        """The correlation of records a and b's errors in a run: measured for the pair, else the pooled rho."""
        return 1.0 if a == b else self.corr.get(pair_key(a, b), self.rho)

    def with_phases(self, phases: dict[str, PhaseError], source: str) -> "ModelError":
        """These phases' records replacing (or joining) this one's; the source says both."""
        return replace(self, phases={**self.phases, **phases}, source=source)

    def summary(self) -> dict:
        return {"source": self.source, "method": self.method, "date": self.date, "runs": list(self.runs),
                "sources": self.sources, "rho": round(self.rho, 3),
                "correlations": {k: round(v, 3) for k, v in sorted(self.corr.items())}, "step": self.step.to_dict(),
                "phases": {p: e.to_dict() for p, e in sorted(self.phases.items())}}


def pair_key(a: str, b: str) -> str:
    """The key of a pair of records in ``ModelError.corr``: the two names sorted, joined by ``|``."""
    return "|".join(sorted((a, b)))


def from_residuals(rows: list[dict], source: str, exclude_source: str | None = None, **meta) -> ModelError | None:
    """The record (module docstring) of residual rows ``{"run", "source_group", "step": r, "phases": {phase: r}}``,
    leaving out the runs of ``exclude_source``; None when fewer than ``MIN_RUNS`` runs remain."""
    rows = [r for r in rows if r["source_group"] != exclude_source]
    if len(rows) < MIN_RUNS:
        return None
    by_phase: dict[str, list[float]] = {}
    for r in rows:
        for p, v in r["phases"].items():
            by_phase.setdefault(p, []).append(v)
    phases = {p: PhaseError.of(v) for p, v in by_phase.items() if len(v) >= MIN_RUNS}
    by_pair: dict[str, list[float]] = {}
    for r in rows:
        zs = sorted((p, (v - phases[p].bias) / phases[p].sigma) for p, v in r["phases"].items()
                    if p in phases and phases[p].sigma > 0)
        for i in range(len(zs)):
            for j in range(i + 1, len(zs)):
                by_pair.setdefault(pair_key(zs[i][0], zs[j][0]), []).append(zs[i][1] * zs[j][1])
    products = [x for v in by_pair.values() for x in v]
    rho = min(max(statistics.fmean(products), 0.0), 1.0) if len(products) >= MIN_PAIRS else 1.0
    corr = {k: min(max(statistics.fmean(v), -1.0), 1.0) for k, v in by_pair.items() if len(v) >= MIN_PAIRS}
    return ModelError(PhaseError.of([r["step"] for r in rows]), phases, rho, source,
                      tuple(r["run"] for r in rows), len({r["source_group"] for r in rows}), corr=corr, **meta)


def label(doc: dict, runs: int, sources: int) -> str:
    """A file's record in a few words: what it measured, how, on how many runs."""
    what = doc.get("method") or "dev half"
    return (f"the public field table's error ({what}; {runs} runs" + (f" from {sources} sources" if sources else "")
            + (f", {doc['date']}" if doc.get("date") else "") + ")")


def from_doc(doc: dict) -> ModelError:
    """A model-error file: its residual rows when it has them, else its sigmas (``step_sigma``, ``phase_sigma``:
    root mean squares, the bias inside them, so centred; rho taken as 1)."""
    meta = {"date": doc.get("date", ""), "method": doc.get("method", "")}
    if doc.get("residuals"):
        n, groups = len(doc["residuals"]), len({r["source_group"] for r in doc["residuals"]})
        err = from_residuals(doc["residuals"], label(doc, n, groups), **meta)
        if err is not None:
            return err
    runs = tuple(doc.get("runs", ()))
    counts = doc.get("phase_runs", {})

    def rec(sigma: float, n: int) -> PhaseError:
        return PhaseError(0.0, float(sigma), n, t95(n - 1) * math.sqrt(1 + 1 / n) / Z90 if n > 1 else math.inf)

    return ModelError(rec(doc["step_sigma"], len(runs)),
                      {p: rec(s, counts.get(p, len(runs))) for p, s in doc["phase_sigma"].items()
                       if counts.get(p, len(runs)) >= MIN_RUNS},
                      1.0, label(doc, len(runs), 0), runs, 0, **meta)


@lru_cache(maxsize=8)
def _normals(columns: int) -> np.ndarray:
    """A fixed (``MC_DRAWS``, columns) block of standard normals, a Latin hypercube: each column the normal's
    quantiles at (i + 1/2) / MC_DRAWS in its own fixed random order. A phase's percentiles are so the normal's own
    (no sampling noise), the draws are the same for every prediction (an interval is a function of its inputs),
    and the columns are independent of each other. Read only."""
    grid = np.array([NormalDist().inv_cdf((i + 0.5) / MC_DRAWS) for i in range(MC_DRAWS)])
    rng = np.random.default_rng(20261207)
    z = np.stack([rng.permutation(grid) for _ in range(columns)], axis=1)
    z.setflags(write=False)
    return z


def correlated(z: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Independent standard normals ``z`` (draws x records) made correlated as ``matrix`` says: its nearest positive
    semi-definite matrix (negative eigenvalues set to 0, the diagonal put back to 1), z S' with S S' = that matrix.
    Each pair's correlation is measured on its own runs, so the set of them need not be a correlation matrix."""
    w, v = np.linalg.eigh(matrix)
    s = v * np.sqrt(np.clip(w, 0.0, None))
    s /= np.linalg.norm(s, axis=1, keepdims=True)
    return z @ s.T


def serial(step_s: float, phases_s: dict[str, float]) -> bool:
    """Whether the phases run one after another (their spans sum to the step, gaps aside: never above it)."""
    total = sum(phases_s.values())
    return step_s > 0 and total <= step_s * (1 + SERIAL_TOL) and total >= step_s * (1 - SERIAL_TOL)


def widen(err: ModelError, points: list[tuple[float, dict[str, float]]], level: float = LEVEL,
          phases: bool = True) -> dict:
    """The ``level`` interval of the step and of each phase for predictions ``points`` [(step_s, phases_s)]: the
    point prediction, or one per parameter draw (pooled). See the module docstring. A single point's phases are
    in closed form (``PhaseError.factors``); ``phases=False``: the step's alone (a plan's row)."""
    names = sorted({p for _, ph in points for p in ph})
    recs = {p: err.record(p) for p in names}
    used = {name for name, _ in recs.values()}
    keys = sorted(used | {STEP})
    col = {k: i for i, k in enumerate(keys)}

    def c(a: str, b: str) -> float:   # the step's own record widens an overlapped step alone: tied to no phase
        return 0.0 if a != b and STEP not in used and STEP in (a, b) else err.correlation(a, b)

    z = correlated(_normals(len(keys)), np.array([[c(a, b) for b in keys] for a in keys]))
    per = max(1, MC_DRAWS // len(points))
    q = 100 * (1 - level) / 2
    factor: dict[str, np.ndarray] = {}

    def f(k: str) -> np.ndarray:   # exp(-r) of record k over the draws, made when first needed
        if k not in factor:
            rec = err.step if k == STEP else err.phases[k]
            factor[k] = np.exp(-(rec.bias + rec.k * rec.sigma * z[:, col[k]]))
        return factor[k]

    single = len(points) == 1
    steps, drawn, how = [], {p: [] for p in names}, set()
    for i, (step_s, ph) in enumerate(points):
        rows = slice((i * per) % MC_DRAWS, (i * per) % MC_DRAWS + per)
        if phases and not single:
            for p in names:
                drawn[p].append(ph.get(p, 0.0) * f(recs[p][0])[rows])
        if serial(step_s, ph):
            how.add("phases")
            s = step_s - sum(ph.values()) + sum(v * f(recs[p][0])[rows] for p, v in ph.items() if v > 0)
        else:
            how.add("step")
            s = step_s * f(STEP)[rows]
        steps.append(s)

    def pct(v):
        lo, hi = np.percentile(np.concatenate(v), [q, 100 - q])
        return [float(lo), float(hi)]

    if not phases:
        phase_iv = {}
    elif single:
        phase_iv = {p: [v * x for x in recs[p][1].factors(level)] for p, v in points[0][1].items()}
    else:
        phase_iv = {p: pct(v) for p, v in drawn.items()}
    used = {p: {"record": recs[p][0], **recs[p][1].to_dict()} for p in names}
    return {"step_time_s_interval": pct(steps), "phases_s_interval": phase_iv, "step_from": "+".join(sorted(how)),
            "phase_records": used}


# -- the field table: residual rows, the file, leave-one-source-out coverage -----------------------------------

def field_point(row: dict) -> tuple[float, dict[str, float]]:
    """A field-table row's prediction (``field_table.predict``: verl's short phase names, the weight update in gen)
    as (step_s, simulator phases)."""
    return float(row["predicted_step_s"]), {_VERL_SHORT[k]: float(v) for k, v in row["predicted_phases_s"].items()}


def field_residuals(row: dict, source_group: str) -> dict:
    """A field-table row's residual row: the step's and each logged phase's ln(predicted / measured)."""
    _, pred = field_point(row)
    phases = {}
    for k, m in row["measured_phases_s"].items():
        p = _VERL_SHORT.get(k)
        if p is not None and m > 0 and pred.get(p, 0.0) > 0:
            phases[p] = round(math.log(pred[p] / m), 5)
    return {"run": row["id"], "source_group": source_group, "gpu": row["gpu"],
            "step": round(math.log(row["predicted_step_s"] / row["measured_step_s"]), 5), "phases": phases}


def model_error_doc(rows: list[dict], groups: dict[str, str], source: str, method: str, date: str) -> dict:
    """The model-error file of field-table rows (``groups``: run id -> source_group): the residual rows, and the
    summary a reader sees (each record's bias, sigma and runs; ``step_sigma`` and ``phase_sigma`` as root mean
    squares, what files without residual rows hold)."""
    res = [field_residuals(r, groups[r["id"]]) for r in rows]
    err = from_residuals(res, source)
    rms = lambda xs: round(math.sqrt(sum(x * x for x in xs) / len(xs)), 4)  # noqa: E731
    by_phase: dict[str, list[float]] = {}
    for r in res:
        for p, v in r["phases"].items():
            by_phase.setdefault(p, []).append(v)
    return {"source": source, "method": method, "date": date, "runs": [r["run"] for r in res],
            "step_sigma": rms([r["step"] for r in res]),
            "phase_sigma": {p: rms(v) for p, v in sorted(by_phase.items())},
            "phase_runs": {p: len(v) for p, v in sorted(by_phase.items())},
            "summary": err.summary() if err else None, "residuals": res}


def hindsight_width(residuals: list[float], share: float) -> float | None:
    """The narrowest interval of one width (high / low) that holds ``share`` of these runs' step residuals, placed
    with hindsight: a floor under the median width of any interval of one log width that holds them so (a real one
    is estimated without the run it holds, so it is wider). None for no runs."""
    v = sorted(residuals)
    m = math.ceil(share * len(v) - 1e-9)
    if not v or m < 1:
        return None
    return math.exp(min(v[i + m - 1] - v[i] for i in range(len(v) - m + 1)))


def loso_coverage(rows: list[dict], groups: dict[str, str], level: float = LEVEL,
                  record_runs: set[str] | None = None) -> dict:
    """Each scored field-table row's interval from the record of the other sources' runs (its own source left out;
    ``record_runs``: only these runs' residuals make records, e.g. the dev half's, so no record is fitted to the
    test half), whether it holds the measured step, and its width (high / low); the coverage and median width over
    the rows, and each logged phase's coverage."""
    res = [field_residuals(r, groups[r["id"]]) for r in rows]
    pool = [rr for rr in res if record_runs is None or rr["run"] in record_runs]
    out, phase_hits = [], {}
    for row, rr in zip(rows, res):
        err = from_residuals(pool, "field table, this run's source left out", exclude_source=rr["source_group"])
        if err is None:
            continue
        step_s, ph = field_point(row)
        w = widen(err, [(step_s, ph)], level)
        lo, hi = w["step_time_s_interval"]
        meas = row["measured_step_s"]
        for p, r in rr["phases"].items():
            a, b = w["phases_s_interval"][p]
            phase_hits.setdefault(p, []).append(a <= ph[p] * math.exp(-r) <= b)
        out.append({"id": row["id"], "source_group": rr["source_group"], "measured_step_s": meas,
                    "predicted_step_s": step_s, "interval_90_s": [round(lo, 3), round(hi, 3)],
                    "inside": bool(lo <= meas <= hi), "width": round(hi / lo, 3), "step_from": w["step_from"]})
    if not out:
        return {"runs": 0}
    return {"runs": len(out), "inside": sum(r["inside"] for r in out),
            "coverage": round(sum(r["inside"] for r in out) / len(out), 3),
            "median_width": round(statistics.median(r["width"] for r in out), 3),
            "phase_coverage": {p: f"{sum(v)}/{len(v)}" for p, v in sorted(phase_hits.items())}, "rows": out}

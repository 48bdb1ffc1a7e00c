"""Fit a profile's terms to one or more real runs' logged phases (``rlhfsim calibrate --from-run``).

A run is verl's or OpenRLHF's (``rlhfsim.fromrun.frameworks``: told from the launch and the log, or
``RunSpec.framework``); an OpenRLHF run is imported by ``rlhfsim import openrlhf`` and compared timer by timer with
the spans ``frameworks.spans`` gives (``timing/generation``, ``timing/make_experience``, ``timing/ppo_train``,
``timing/broadcast``). What follows describes verl's.

Each run is its launch (read by ``rlhfsim import verl``, with the GPU, the verl release and any ``--set``
the user gives, and the mean prompt and response lengths of its own steady steps; by default the response
lengths' shape too, matched to the log's longest and clipped responses: ``rlhfsim.fromrun.lengths``) and its log's steady steps
(``rlhfsim.fromrun.logs``). Its measured phases are the means over those steps of verl's ``timing_s/*``
metrics. Each is compared with the span that verl's release timed, not the simulator's phase of the same name
alone (``verl_spans``): releases that log no ``timing_s/update_weights`` time the weight sync inside
``timing_s/gen`` (the simulator's ``weight_sync`` is added to its ``generate``). Where the reward is timed
(``reward_span``) goes by release and rollout mode: up to v0.3.0.post1 (before verl PR #1114, commit 6a9bef7,
2025-04-23, first in v0.4.0) verl logs no ``timing_s/reward`` and times the reward model and function inside
``timing_s/adv`` (the simulator's ``reward`` is added to its ``adv``); from v0.6.0 (verl PR #3055, 2025-08-19) the
async rollout mode (the default from v0.7.0, verl #4106) scores each response inside the agent loop as it finishes
(a reward function, or a reward model on its own resource pool; from v0.7.0 while ``reward_model.use_reward_loop``
is on, its default), i.e. inside ``timing_s/gen`` (the simulator's ``reward`` is added to its ``generate``; the
``timing_s/reward`` such a release still logs times only the scores' extraction and is not compared); otherwise
the reward has its own ``timing_s/reward``. verl has no timer of its own for the re-tokenizing the simulator
prices apart (``retokenize``): it sits inside the span that holds the reward. Releases
before verl PR #129 (2025-01-24, first in v0.2) computed the actor's old log-probs inside ``generate_sequences``
and log no ``timing_s/old_log_prob``: there the simulator's ``old_log_prob`` is added to its ``generate``.

Bins. A run may also be fitted as its steady steps cut into bins by their longest response (``prepare_units``, as
the pooled fit cuts them: ``rlhfsim.fromrun.pool.bins``), each bin imported with its own mean lengths and logged
shape and compared with its own mean phases, its residuals weighed 1 / sqrt(its run's bins). Within one log the
longest response moves from step to step and a step's generation is bound by it, so the bins show how
``timing_s/gen`` grows with the longest response (the decode time of the tail batch) apart from what it costs
besides, which one mean per run cannot tell apart.

Pricing. A run is priced as ``rlhfsim simulate`` prices it on its GPU: the profile through
``rlhfsim.costs.model.with_stack_rate`` (a datasheet-derived profile's compute efficiencies carried from the H100
they are stated for to the GPU: ``catalog.carried_compute_eff``, the GEMMs at the stack's sustained rate and the
rest of a pass at the GPU's memory speed), so the base the fit starts from is what ``simulate`` predicts. The fit
moves the profile's own value (bounded to (0.001, 1]); every value it reports (base, fitted, intervals) is mapped
through the same carrying to the value the GPU prices with (``pricer``; ``frame``: their ratio at the fitted
value, which the what-if draws use near it).

Equation. For parameters x (``rlhfsim.fromrun.terms``: x = ln e for an efficiency, s / scale for a time), the
residual of run r's logged phase p is

    res_rp(x) = ln( predicted_rp(x) / measured_rp )

with predicted_rp the simulated steady-state mean of that phase (the simulator re-run for every x; one run
simulates in 0.03-0.12 s here). The fit minimises sum res_rp^2 with scipy's bounded trust-region least squares
(efficiencies in (0.001, 1], times >= 0), over the terms the runs identify:

* relevant: moving the term by one unit (an efficiency by a factor of 2) moves some logged phase by >= 2%
  (Jacobian at the base profile, forward differences);
* not confounded: in priority order (``terms.TERMS``), a term is kept when its Jacobian column keeps at least
  ``MIN_SIN`` (0.3) of its length after projecting out the columns of the terms already kept.

Guard rails: a term the fit holds at a bound while the residuals still pull it past the bound (an efficiency
that would exceed 1, a time that would go negative) is reported in one line naming the phase that pulled it
hardest (the largest term of J_rp,j x res_rp in the pulling direction). Where every run the term moves pulls it
past the bound (summed over each run's rows) and it kept terms confounded with it out of the fit, it explains none
of that pull: it is pinned at the bound (set there in the base, out of the candidates) and the terms identified
again, up to ``MAX_PINS`` rounds, so that a term it kept out may take the pull. A term that runs pull both ways is
their compromise and stays (freeing another term would let one side's residual pick it, and carry it to the runs
on the other side).

Trace: every fitted term lists the logged phases that determined it, with their share (|row| of the
pseudo-inverse of the Jacobian at the solution, normalised) and the log lines of the steps they came from.

Interval: a 90% interval per fitted term from B = 200 bootstrap resamples of each run's steady steps (the same
resampled steps for all phases of a run), propagated through the fit linearly: x_b = x* + J^+ (ln m_b - ln m),
clipped to the bounds. It covers step-to-step noise of the log, not the cost model's form; beside it
``interval_misfit`` is the 90% normal interval of the linearised fit, cov = s^2 (J^T J)^-1 with s^2 = RSS / (n - k),
which grows with what the cost model's form leaves unexplained (none when n <= k).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from rlhfsim.contracts import VERL_PHASE_KEYS, VERL_RESPONSE_LENGTH_KEY, VERL_STEP_KEY
from rlhfsim.costs.model import CostModel, with_stack_rate
from rlhfsim.errors import RlhfsimError
from rlhfsim.fromrun import terms as T
from rlhfsim.fromrun.agree import check_agreement
from rlhfsim.fromrun.bins import bins
from rlhfsim.fromrun.lengths import logged_shape
from rlhfsim.fromrun.logs import DEFAULT_MIN_STEPS, DEFAULT_WARMUP, Steady, read_log, steady_steps

CONFOUNDED = "confounded with {}: moves the same logged phases alike"
MAX_PINS = 4            # rounds of pinning a term held at its bound (``fit``)
LENGTHS = ("logged", "mean")
WEIGHTINGS = ("equal", "share")
MIN_SIN = 0.3
RELEVANT = 0.02
BOOTSTRAP = 200
LEVEL = 0.90
FD_STEP = 0.25          # forward-difference step in x units for the identification Jacobian
PRED_FLOOR_S = 1e-6     # a phase the simulator prices at 0 counts as this in the log residual
UPDATE_WEIGHTS = VERL_PHASE_KEYS["weight_sync"]
GEN = VERL_PHASE_KEYS["generate"]
REWARD = VERL_PHASE_KEYS["reward"]
ADV = VERL_PHASE_KEYS["adv"]
RETOKENIZE = VERL_PHASE_KEYS["retokenize"]
OLD_LOG_PROB = VERL_PHASE_KEYS["old_log_prob"]
OLD_LOG_PROB_IN_GEN = ("the log has timing_s/gen and no timing_s/old_log_prob: verl before PR #129 (2025-01-24, first in "
                       "v0.2) computes the old log-probs inside generate_sequences, so the simulator's old_log_prob is "
                       "added to its gen")
REWARD_IN_ADV = ("the log has timing_s/adv and no timing_s/reward: verl up to v0.3.0.post1 times the reward model and "
                 "function inside adv (verl PR #1114, 2025-04-23, first in v0.4.0, gave them their own timer), so the "
                 "simulator's reward is added to its adv")
REWARD_IN_GEN = ("verl {version} in the async rollout mode scores each response inside the agent loop (verl PR #3055, "
                 "first in v0.6.0), i.e. inside timing_s/gen: the simulator's reward is added to its gen{logged}")
REWARD_IN_GEN_LOGGED = ("; the log's timing_s/reward (the scores' extraction alone) is not compared")
AGENT_LOOP_REWARD_FROM = (0, 6)    # verl PR #3055 (2025-08-19): the agent loop scores each response (first in v0.6.0)
REWARD_TIMER_FROM = (0, 4)         # verl PR #1114 (2025-04-23): timing_s/reward (first in v0.4.0)
REWARD_LOOP_SWITCH_FROM = (0, 7)   # reward_model.use_reward_loop (verl #4452, default true) gates the agent loop's scoring


class FitError(RlhfsimError):
    """A run that cannot be fitted: one line saying why."""


@dataclass(frozen=True)
class RunSpec:
    """A run to fit or predict: its launch, its log and what the launch does not say."""

    id: str
    launch: Path
    log: Path
    gpu: str
    sets: tuple[str, ...] = ()
    verl_version: str | None = None
    warmup: int = DEFAULT_WARMUP
    min_steps: int = DEFAULT_MIN_STEPS
    lengths: str = "logged"    # "logged": the log's mean, max and clip ratio (fromrun.lengths); "mean": the mean only
    strict: bool = False       # a log with any bad record is an error (else skipped and listed: fromrun.logs)
    framework: str | None = None   # "verl" | "openrlhf"; None: told from the launch and log (fromrun.frameworks)


@dataclass
class Run:
    """A prepared run: its steady steps, measured phases and imported scenario."""

    spec: RunSpec
    steady: Steady
    samples: dict[str, np.ndarray]     # verl key -> per steady step seconds
    measured: dict[str, float]         # verl key -> mean seconds
    scenario: object
    gpu: object
    gen_runtime: str
    fold_weights: bool
    lengths: dict[str, float]
    unmapped: list[str] = field(default_factory=list)
    reward_in_adv: bool = False        # the log's release times the reward inside timing_s/adv (module docstring)
    reward_in_gen: bool = False        # ... inside timing_s/gen (the agent loop scores it: ``reward_span``)
    launch_text: str = ""              # as read (the overlay keeps it, so a what-if needs no copy of the file)
    old_log_prob_in_gen: bool = False  # the log's release computes the old log-probs inside timing_s/gen
    framework: str = "verl"            # whose timers ``measured`` holds (fromrun.frameworks)
    reward_logged: bool = False        # the log has timing_s/reward (dropped from ``measured`` where reward_in_gen)
    part: str = ""                     # a bin of the log's steady steps (``prepare_units``); "": all of them
    weight: float = 1.0                # its residuals' weight (a run cut in n bins: 1 / sqrt(n) each)


def read_launch(path: Path) -> str:
    """A launch file's text, read as ``rlhfsim import verl`` reads it (bytes that are not UTF-8 replaced, so a
    comment in another encoding does not stop it); a file that cannot be read or holds binary data (NUL bytes) is
    one line naming it."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise FitError(f"launch: expected a readable verl launch file, got {str(path)!r} ({e.strerror})") from None
    nul = data.find(b"\x00")
    if nul >= 0:
        raise FitError(f"launch: expected a verl launch as text (a shell script or YAML config), got binary data in "
                       f"{str(path)!r} (a NUL byte at offset {nul})")
    return data.decode("utf-8", errors="replace")


def is_config(path: Path) -> bool:
    """A launch given as a verl YAML config (by its suffix, as ``rlhfsim import verl`` tells them apart)."""
    return path.suffix in (".yaml", ".yml")


def verl_spans(phases: dict[str, float], weight_sync_in_gen: bool, reward_in_adv: bool,
               old_log_prob_in_gen: bool = False, reward_in_gen: bool = False) -> dict[str, float]:
    """The simulator's phases (verl names) as a verl release timed them (module docstring): the weight sync inside
    ``timing_s/gen`` where it has no timer of its own, the reward inside ``timing_s/adv`` where it has none or inside
    ``timing_s/gen`` where the agent loop scores it (``reward_span``), the old log-probs inside ``timing_s/gen``
    where they have none. The folds add span means: a reward scored in the agent loop overlaps the generation of
    the responses still running, so the sum is an upper bound of that span (by the reward's own time at most)."""
    out = dict(phases)
    if old_log_prob_in_gen and OLD_LOG_PROB in out:
        out[GEN] = out.get(GEN, 0.0) + out.pop(OLD_LOG_PROB)
    holder = ADV if reward_in_adv else GEN if reward_in_gen else REWARD
    if RETOKENIZE in out:
        out[holder] = out.get(holder, 0.0) + out.pop(RETOKENIZE)
    if holder != REWARD and REWARD in out:
        out[holder] = out.get(holder, 0.0) + out.pop(REWARD)
    if weight_sync_in_gen and UPDATE_WEIGHTS in out:
        out[GEN] = out.get(GEN, 0.0) + out.pop(UPDATE_WEIGHTS)
    return out


def reward_span(keys, version: str | None, settings: dict[str, str], scenario) -> str:
    """The verl timer that holds the reward of a run (module docstring): ``"adv"``, ``"gen"`` or ``"reward"`` (its
    own), from the release (``version``; None: the log's timers and the importer's defaults decide), the launch's
    settings (``settings``: key -> value as given) and the imported scenario (a reward model on the actor's GPUs is
    scored by the trainer, not by the agent loop)."""
    from rlhfsim.importers.verl import AR, VERSIONED, parse_version

    v = parse_version(version) if version is not None else None
    if REWARD not in keys and ADV in keys and (v is None or v < REWARD_TIMER_FROM):
        return "adv"
    mode_key = f"{AR}.rollout.mode"
    if mode_key in settings:
        mode = settings[mode_key].strip("'\"")
    elif v is None:
        mode = "sync"       # no release given: the agent loop only where the launch asks for it (its timers do not
                            # tell a v0.4-v0.6 sync run, which logs timing_s/reward, from a v0.7 async one)
    else:
        since, before, _ = VERSIONED[mode_key]
        mode = before if v < since else "async"
    loop = settings.get("reward_model.use_reward_loop", "True").strip("'\"").lower() not in ("false", "0")
    own_pool = getattr(scenario.placement, "kind", None) == "dedicated_reward"
    if (mode == "async" and (v is None or v >= AGENT_LOOP_REWARD_FROM)
            and (v is None or v < REWARD_LOOP_SWITCH_FROM or loop)
            and (scenario.models.reward.kind == "rule" or own_pool)):
        return "gen"
    return "reward"


def priced(profile: dict, gpu) -> dict:
    """The profile as ``rlhfsim simulate`` prices it on ``gpu`` (``CostModel.load``'s one step:
    ``with_stack_rate``)."""
    return with_stack_rate(profile, gpu)


def prepare(spec: RunSpec) -> Run:
    """Read a run's log and import its launch with the log's own mean lengths."""
    return prepare_steady(spec, steady_steps(read_log(spec.log), spec.log.name, spec.warmup, spec.min_steps,
                                             spec.strict))


def prepare_units(spec: RunSpec, n_bins: int) -> list[Run]:
    """A run's steady steps cut into up to ``n_bins`` bins by their longest response (``rlhfsim.fromrun.bins.bins``:
    by ``response_length/max``, else by the clipped share; one bin when the log has too little spread), each
    prepared as a run of its own (``prepare_steady``: imported with the bin's own mean lengths and logged shape) and
    weighed 1 / sqrt(bins), so every run weighs the same however it is cut (module docstring, "Bins")."""
    steady = steady_steps(read_log(spec.log), spec.log.name, spec.warmup, spec.min_steps, spec.strict)
    parts = bins(steady, n_bins) if n_bins > 1 else [("", steady)]
    if len(parts) == 1:
        return [prepare_steady(spec, steady)]
    return [replace(prepare_steady(spec, st), part=label, weight=1 / math.sqrt(len(parts))) for label, st in parts]


def prepare_steady(spec: RunSpec, steady: Steady) -> Run:
    """``prepare`` on given steady steps (a subset of a log's: ``rlhfsim.fromrun.pool`` prepares each bin of a
    run's steps by their longest response as a run of its own)."""
    from rlhfsim.fromrun import frameworks
    from rlhfsim.hardware.catalog import get_gpu
    from rlhfsim.importers import ImportOptions
    from rlhfsim.importers.common import ImportError_
    from rlhfsim.scenario.loader import load_scenario

    text = read_launch(spec.launch)
    fw = frameworks.detect(spec.framework, text, steady.framework, spec.launch.name)
    samples = {k: np.asarray(v) for k, v in frameworks.samples(fw, steady).items()}
    if VERL_STEP_KEY not in samples:
        raise FitError(f"{spec.log.name}: expected {VERL_STEP_KEY} in every steady step, got it in some only")
    lengths = {"response": steady.mean(VERL_RESPONSE_LENGTH_KEY), "prompt": frameworks.logged_prompt_mean(fw, steady)}
    opts = ImportOptions(gpu=spec.gpu, mean_response_len=lengths["response"], mean_prompt_len=lengths["prompt"],
                         steps=4, name=spec.id, sets=tuple(spec.sets), verl_version=spec.verl_version)
    try:
        res = frameworks.import_launch(fw, text, opts, spec.launch.name, is_config(spec.launch))
    except ImportError_ as e:
        if not str(e).startswith(("--mean-response-len", "--mean-prompt-len")):
            raise
        # the log's own mean lengths do not fit under the launch's caps: launch and log are not one run; the
        # agreement check names the setting and the log line (a mean over the cap has a longest one over it)
        bare = frameworks.import_launch(fw, text, replace(opts, mean_response_len=None, mean_prompt_len=None),
                                        spec.launch.name, is_config(spec.launch))
        check_agreement(steady, load_scenario(bare.scenario, base_dir=spec.launch.parent), fw, spec.launch.name)
        raise FitError(f"{spec.log.name}: its steady steps' mean lengths do not fit the launch's caps "
                       f"({spec.launch.name}): {e}") from None
    sc = load_scenario(res.scenario, base_dir=spec.launch.parent)
    check_agreement(steady, sc, fw, spec.launch.name)   # one run: algorithm, roles and caps as logged
    if spec.lengths not in LENGTHS:
        raise FitError(f"lengths: expected one of {', '.join(LENGTHS)}, got {spec.lengths!r}")
    shape = logged_shape(steady, sc.workload.max_response_tokens, sc.workload.prompts_per_step * sc.algorithm.group_size) \
        if spec.lengths == "logged" else None
    if shape is not None:
        sc = load_scenario(res.scenario, base_dir=spec.launch.parent,
                           overrides=[("workload.response_length", shape["block"])])
        lengths["response_shape"] = shape
    lengths["response_cap"] = sc.workload.max_response_tokens
    holder = reward_span(samples, spec.verl_version, {s.key: str(s.value) for s in res.settings}, sc) \
        if fw == "verl" else "reward"
    reward_logged = REWARD in samples
    if holder == "gen":
        samples.pop(REWARD, None)      # the extraction of scores the agent loop made: nothing the simulator prices
    return Run(spec, steady, samples, {k: float(v.mean()) for k, v in samples.items()}, sc, get_gpu(spec.gpu),
               sc.generation.resolved_runtime, fw == "verl" and UPDATE_WEIGHTS not in samples, lengths,
               [f"{s.key}={s.value}" for s in res.by_status("unmapped")],
               reward_in_adv=holder == "adv", reward_in_gen=holder == "gen", launch_text=text,
               old_log_prob_in_gen=fw == "verl" and GEN in samples and OLD_LOG_PROB not in samples, framework=fw,
               reward_logged=reward_logged)


def predict(run: Run, profile: dict) -> dict[str, float]:
    """The run simulated under ``profile`` priced on the run's GPU as ``simulate`` prices it (``priced``): verl
    key -> seconds (``timing_s/step`` included), in the spans the run's release timed (``verl_spans``)."""
    from rlhfsim.sim.run import simulate

    result = simulate(run.scenario, cost=CostModel(run.gpu, priced(profile, run.gpu)), max_work=None)
    if run.framework != "verl":
        from rlhfsim.fromrun.frameworks import spans

        return spans(result, run.scenario)     # the framework's own timers (fromrun.frameworks)
    summary = result.summary
    out = verl_spans({VERL_PHASE_KEYS[p]: float(v) for p, v in summary["phases_s"].items()}, run.fold_weights,
                     run.reward_in_adv, run.old_log_prob_in_gen, run.reward_in_gen)
    out[VERL_STEP_KEY] = float(summary["step_time_s"])
    return out


def pricer(base: dict, runs: list[Run], path: str):
    """The map from the profile's value at ``path`` to the value the runs' GPU prices with (``priced``: a derived
    profile's compute efficiencies carried to the GPU, ``catalog.carried_compute_eff``, which is not a constant
    factor); the identity unless every run is on one GPU that carries that path."""
    gpus = {r.gpu.name: r.gpu for r in runs}
    if len(gpus) != 1:
        return lambda v: v
    gpu = next(iter(gpus.values()))
    if T.get_value(priced(base, gpu), path) == T.get_value(base, path):
        return lambda v: v
    return lambda v: T.get_value(priced(T.with_values(base, {path: v}), gpu), path)


def frame(base: dict, runs: list[Run], path: str, value: float | None = None) -> float:
    """The ratio of the priced value to the profile's at ``path`` (``pricer``), at ``value`` (default: the base's):
    1 unless every run is on one GPU that carries that path."""
    raw = T.get_value(base, path) if value is None else value
    return pricer(base, runs, path)(raw) / raw if raw else 1.0


def residual_keys(run: Run, pred: dict[str, float]) -> list[str]:
    """The logged phases the simulator prices (the step itself excluded: it is their sum plus gaps)."""
    return [k for k in run.measured if k != VERL_STEP_KEY and k in pred and run.measured[k] > 0]


@dataclass(frozen=True)
class Param:
    """One fitted coordinate: a term at a profile path."""

    term: T.Term
    path: str

    @property
    def label(self) -> str:
        return f"{self.term.name} ({self.path})"


class Problem:
    """The fit's residual function over a set of runs and a base profile."""

    def __init__(self, runs: list[Run], base: dict, weighting: str = "equal", exclude: frozenset[str] = frozenset(),
                 base_pred: list[dict[str, float]] | None = None):
        if weighting not in WEIGHTINGS:
            raise FitError(f"weighting: expected one of {', '.join(WEIGHTINGS)}, got {weighting!r}")
        self.runs, self.base = runs, base
        base_pred = base_pred if base_pred is not None else [predict(r, base) for r in runs]
        self.rows = [(i, k) for i, r in enumerate(runs) for k in residual_keys(r, base_pred[i])]
        if not self.rows:
            raise FitError("fit: expected logged phases the simulator prices (timing_s/gen, timing_s/update_actor, ...), "
                           "got none")
        self.log_meas = np.array([math.log(runs[i].measured[k]) for i, k in self.rows])
        self.w = np.array([runs[i].weight for i, _ in self.rows]) * (
            np.ones(len(self.rows)) if weighting == "equal" else
            np.sqrt([runs[i].measured[k] / runs[i].measured[VERL_STEP_KEY] for i, k in self.rows]))
        seen: dict[str, Param] = {}
        for t in T.TERMS:
            for r in runs:
                path = T.resolve(t, base, r.gen_runtime)
                if path is not None and path not in seen and path not in exclude:
                    seen[path] = Param(t, path)
        self.candidates = list(seen.values())
        self.base_pred = base_pred

    def profile(self, params: list[Param], x: np.ndarray) -> dict:
        return T.with_values(self.base, {p.path: T.from_x(p.term, float(v)) for p, v in zip(params, x)})

    def predictions(self, params: list[Param], x: np.ndarray) -> list[dict[str, float]]:
        prof = self.profile(params, x)
        return [predict(r, prof) for r in self.runs]

    def residuals_of(self, preds: list[dict[str, float]]) -> np.ndarray:
        p = np.array([max(preds[i].get(k, 0.0), PRED_FLOOR_S) for i, k in self.rows])
        return self.w * (np.log(p) - self.log_meas)

    def residuals(self, params: list[Param], x: np.ndarray) -> np.ndarray:
        return self.residuals_of(self.predictions(params, x))

    def x0(self, params: list[Param]) -> np.ndarray:
        return np.array([T.to_x(p.term, T.get_value(self.base, p.path)) for p in params])

    def jacobian(self, params: list[Param], x: np.ndarray, r0: np.ndarray) -> np.ndarray:
        """Forward differences (upward; a term at an upper bound steps down)."""
        J = np.zeros((len(r0), len(params)))
        for j, p in enumerate(params):
            h = FD_STEP if x[j] + FD_STEP <= T.x_bounds(p.term)[1] + 1e-12 else -FD_STEP
            xx = x.copy()
            xx[j] += h
            J[:, j] = (self.residuals(params, xx) - r0) / h
        return J


def identify(prob: Problem) -> tuple[list[Param], dict[str, str]]:
    """The candidates the runs identify (relevant, not confounded, in priority order) and, for the others, why not
    (a confounded one: ``CONFOUNDED`` naming the kept term it moves alike)."""
    cands = prob.candidates
    x0 = prob.x0(cands)
    r0 = prob.residuals(cands, x0)
    J = prob.jacobian(cands, x0, r0)
    chosen: list[int] = []
    basis: list[np.ndarray] = []
    why: dict[str, str] = {}
    for j, p in enumerate(cands):
        col = J[:, j]
        if np.max(np.abs(col)) * T.plausible_dx(p.term) < RELEVANT:
            why[p.path] = "no logged phase moves with it (by 2% for a factor of 2 / one unit)"
            continue
        v = col.copy()
        for b in basis:
            v -= (v @ b) * b
        if np.linalg.norm(v) < MIN_SIN * np.linalg.norm(col) or len(chosen) >= len(col):
            top = max(chosen, key=lambda c: abs(col @ J[:, c]) / (np.linalg.norm(J[:, c]) + 1e-300))
            why[p.path] = CONFOUNDED.format(cands[top].term.name)
            continue
        chosen.append(j)
        basis.append(v / np.linalg.norm(v))
    return [cands[j] for j in chosen], why


def fit(runs: list[Run], base: dict, seed: int = 0, weighting: str = "equal", prior: float = 0.0) -> dict:
    """Fit the identified terms; the result holds everything the overlay records (see the module docstring).
    ``weighting``: each phase's residual as it is (equal) or times sqrt(phase / step) of its run (share);
    ``prior`` > 0: add the rows prior x (x_j - x_base_j) / u_j (u_j one unit of ``terms.plausible_dx``), which
    keep a term near its base value unless the phases move it."""
    prob0 = Problem(runs, base, weighting)
    pinned: dict[str, tuple[Param, float, str]] = {}    # path -> (term, its bound's value, the warning)
    for round_ in range(MAX_PINS + 1):
        work = T.with_values(base, {path: v for path, (_, v, _) in pinned.items()}) if pinned else base
        prob = Problem(runs, work, weighting, frozenset(pinned), prob0.base_pred) if pinned else prob0
        params, unidentified = identify(prob)
        if not params:
            raise FitError("fit: expected at least one term the logged phases identify, got none (" +
                           "; ".join(f"{k}: {v}" for k, v in unidentified.items())[:300] + ")")
        x, r, J, lo, hi, u, sol, pulled = _solve(prob, params, prior)
        # a term held at its bound by a pull past it from every run it moves explains none of that pull; where it
        # kept a term confounded with it out of the fit, pin it at the bound and identify again, so that term may
        # take the pull. A term the runs pull both ways (one past the bound, another back) is a compromise between
        # them, not a term with nothing to explain: it stays, and so do the terms it confounded.
        blocking = {j: w for j, w in pulled.items()
                    if CONFOUNDED.format(params[j].term.name) in unidentified.values()
                    and _unanimous(prob, J[:, j], r, x[j] >= hi[j])}
        if not blocking or round_ == MAX_PINS:
            break
        pinned.update({params[j].path: (params[j], T.from_x(params[j].term, float(x[j])), w)
                       for j, w in blocking.items()})
    warnings = [w for _, _, w in pinned.values()] + list(pulled.values())
    free = [j for j in range(len(params)) if lo[j] < x[j] < hi[j]]
    pinv = np.zeros((len(params), len(r)))
    if free:
        aug = np.vstack([J[:, free], prior * np.diag(1 / u[free])])
        pinv[free, :] = np.linalg.pinv(aug)[:, :len(r)]
    draws = _bootstrap(prob, x, pinv, lo, hi, seed)
    # the misfit's own spread, linearised: cov = s^2 (J^T J)^-1 over the free terms, s^2 = RSS / (n - k)
    dof = len(r) - len(free)
    sd = np.zeros(len(params))
    if free and dof > 0:
        cov = float(r @ r) / dof * np.linalg.pinv(J[:, free].T @ J[:, free])
        sd[free] = np.sqrt(np.clip(np.diag(cov), 0, None))
    preds = prob.predictions(params, x)
    terms_out = [_pinned_record(p, v, base, runs) for p, v, _ in pinned.values()]
    # values as the runs' GPU prices them (``pricer``); ``frame``: the priced-to-profile ratio at the fitted value
    # (a carried efficiency is no constant multiple: each value goes through the map itself)
    prices = [pricer(base, runs, p.path) for p in params]
    frames = [frame(base, runs, p.path, T.from_x(p.term, float(x[j]))) for j, p in enumerate(params)]
    for j, p in enumerate(params):
        f, price = frames[j], prices[j]
        vals = sorted(price(T.from_x(p.term, v)) for v in draws[:, j])
        q = (1 - LEVEL) / 2
        terms_out.append({
            "term": p.term.name, "path": p.path, "meaning": p.term.meaning,
            "base": price(T.get_value(base, p.path)), "fitted": price(T.from_x(p.term, float(x[j]))),
            "interval": [float(np.quantile(vals, q)), float(np.quantile(vals, 1 - q))],
            "interval_misfit": ([float(price(T.from_x(p.term, float(np.clip(x[j] + z * 1.6448536269514722 * sd[j], lo[j], hi[j])))))
                                  for z in (-1, 1)] if sd[j] > 0 else None),
            "at_bound": j not in free,
            "determined_by": _trace(prob, pinv[j]) if j in free else [],
            **({"frame": f} if f != 1.0 else {}),
        })
    # the joint spread of the fitted coordinates (x: ln e or s / scale), for drawing what-ifs
    # (rlhfsim.fromrun.whatif): the bootstrap's covariance and the misfit's, zero for a term held at a bound
    cov_boot = np.atleast_2d(np.cov(draws, rowvar=False)) if len(params) else np.zeros((0, 0))
    cov_mis = np.zeros((len(params), len(params)))
    if free and dof > 0:
        cov_mis[np.ix_(free, free)] = cov
    spread = {"paths": [p.path for p in params], "kinds": [p.term.kind for p in params],
              "scales": [p.term.scale for p in params], "x": [float(v) for v in x], "frames": frames,
              "lower": [float(v) for v in lo], "upper": [float(v) if np.isfinite(v) else None for v in hi],
              "cov_bootstrap": cov_boot.tolist(), "cov_misfit": cov_mis.tolist()}
    return {"params": params, "x": x, "terms": terms_out, "warnings": warnings, "spread": spread,
            "unidentified": [{"term": p.term.name, "path": p.path, "why": unidentified[p.path]}
                             for p in prob.candidates if p.path in unidentified],
            "pinned": [p.path for p, _, _ in pinned.values()],
            "runs": [_run_record(r, prob.base_pred[i], preds[i]) for i, r in enumerate(runs)],
            "rms_log_residual": float(np.sqrt(np.mean(r ** 2))), "evaluations": int(sol.nfev),
            "options": {"weighting": weighting, "prior": prior},
            "profile": prob.profile(params, x)}


def _solve(prob: Problem, params: list[Param], prior: float):
    """Least squares over ``params`` from the base: (x, residuals, Jacobian, bounds lo and hi, units, the solver's
    result, {index: warning} for the terms held at a bound by a pull past it)."""
    from scipy.optimize import least_squares

    lo = np.array([T.x_bounds(p.term)[0] for p in params])
    hi = np.array([T.x_bounds(p.term)[1] for p in params])
    x0 = np.clip(prob.x0(params), lo, hi)
    xb = prob.x0(params)
    u = np.array([T.plausible_dx(p.term) for p in params])
    sol = least_squares(lambda x: np.concatenate([prob.residuals(params, x), prior * (x - xb) / u]), x0,
                        bounds=(lo, hi), method="trf", diff_step=0.02, x_scale=1.0, max_nfev=60 * len(params))
    x = np.where(sol.x - lo < 1e-6, lo, np.where(hi - sol.x < 1e-6, hi, sol.x))   # a term at its bound: exactly there
    r = prob.residuals(params, x)
    J = prob.jacobian(params, x, r)
    return x, r, J, lo, hi, u, sol, _bound_warnings(prob, params, x, r, J, lo, hi)


def _unanimous(prob: Problem, col: np.ndarray, r: np.ndarray, upper: bool, tol: float = 0.05) -> bool:
    """Whether every run the term moves (``col``: its Jacobian column, one entry per residual row) pulls it past its
    bound: each such run's pull, J_rj x res_r summed over its rows (negative pulling the term up), at least ``tol``
    of the largest run's. A run already matched by other terms (no pull) or pulling back does not agree."""
    pull: dict[int, float] = {}
    moved: dict[int, float] = {}
    for (i, _), jc, rr in zip(prob.rows, col, r):
        pull[i] = pull.get(i, 0.0) + float(jc * rr)
        moved[i] = moved.get(i, 0.0) + abs(float(jc))
    top_move = max(moved.values(), default=0.0)
    past = [(-pull[i] if upper else pull[i]) for i in pull if moved[i] > 1e-3 * top_move]
    top = max((abs(v) for v in past), default=0.0)
    return top > 0 and all(v >= tol * top for v in past)


def _pinned_record(p: Param, value: float, base: dict, runs: list[Run]) -> dict:
    """A term pinned at its bound (``fit``): its value there, no interval, determined by no phase."""
    price = pricer(base, runs, p.path)
    f = frame(base, runs, p.path, value)
    return {"term": p.term.name, "path": p.path, "meaning": p.term.meaning, "base": price(T.get_value(base, p.path)),
            "fitted": price(value), "interval": [price(value), price(value)], "interval_misfit": None,
            "at_bound": True, "pinned": True, "determined_by": [], **({"frame": f} if f != 1.0 else {})}


def _bound_warnings(prob: Problem, params, x, r, J, lo, hi) -> dict[int, str]:
    out = {}
    for j, p in enumerate(params):
        contrib = J[:, j] * r      # d(cost/2)/dx_j by residual; negative: pulls x_j up
        if x[j] >= hi[j] and contrib.sum() < 0:
            i, what = int(np.argmin(contrib)), "above 1 (not physical)"
        elif x[j] <= lo[j] and contrib.sum() > 0:
            i, what = int(np.argmax(contrib)), ("below 0 (not physical)" if p.term.kind == "seconds" else "below 0.001")
        else:
            continue
        run, key = prob.runs[prob.rows[i][0]], prob.rows[i][1]
        bound = T.from_x(p.term, float(x[j]))
        out[j] = (f"{p.path}: the fit wants it {what}; held at {bound:.4g}; pulled by {key} of {run.spec.id} "
                   f"(measured {run.measured[key]:.4g} s, log lines {run.steady.lines()})")
    return out


def _trace(prob: Problem, row: np.ndarray) -> list[dict]:
    w = np.abs(row)
    if w.sum() <= 0:
        return []
    share = w / w.sum()
    out = []
    for i in np.argsort(-share):
        if share[i] < 0.05:
            break
        run = prob.runs[prob.rows[i][0]]
        out.append({"run": run.spec.id, "phase": prob.rows[i][1], "share": round(float(share[i]), 3),
                    "log": str(run.spec.log), "lines": run.steady.lines()})
    return out


def _bootstrap(prob: Problem, x, pinv, lo, hi, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    draws = np.empty((BOOTSTRAP, len(x)))
    for b in range(BOOTSTRAP):
        idx = [rng.integers(0, len(r.steady.kept), len(r.steady.kept)) for r in prob.runs]
        lm = np.array([math.log(max(float(prob.runs[i].samples[k][idx[i]].mean()), PRED_FLOOR_S)) for i, k in prob.rows])
        draws[b] = np.clip(x + pinv @ (prob.w * (lm - prob.log_meas)), lo, hi)
    return draws


def _run_record(run: Run, base_pred: dict, pred: dict) -> dict:
    keys = [k for k in run.measured if k in pred]
    return {
        "id": run.spec.id, **({"part": run.part, "weight": run.weight} if run.part else {}),
        "launch": str(run.spec.launch), "launch_text": run.launch_text, "log": str(run.spec.log),
        "gpu": run.spec.gpu,
        "sets": list(run.spec.sets), "verl_version": run.spec.verl_version, "lengths": run.lengths,
        "framework": run.framework,
        "steady_steps": [s.step for s in run.steady.kept], "steady_lines": run.steady.lines(),
        "skipped_steps": {str(k): v for k, v in run.steady.skipped.items()},
        "log_read": run.steady.record(),      # format, bad records skipped with their reasons, notes, notices
        "weight_sync_in_gen": run.fold_weights, "reward_in_adv": run.reward_in_adv,
        "reward_in_gen": run.reward_in_gen, "old_log_prob_in_gen": run.old_log_prob_in_gen,
        "spans": [REWARD_IN_ADV] * run.reward_in_adv + [OLD_LOG_PROB_IN_GEN] * run.old_log_prob_in_gen
        + [REWARD_IN_GEN.format(version=run.spec.verl_version or "(its release not given: the current default)",
                                logged=REWARD_IN_GEN_LOGGED if run.reward_logged else "")] * run.reward_in_gen,
        "measured_s": {k: round(run.measured[k], 4) for k in keys},
        "base_s": {k: round(base_pred[k], 4) for k in keys if k in base_pred},
        "fitted_s": {k: round(pred[k], 4) for k in keys},
        "fitted_error_pct": {k: round(100 * (pred[k] - run.measured[k]) / run.measured[k], 1) for k in keys
                             if run.measured[k] > 0},
        "unobserved_phases": sorted(k for k in pred if k not in run.measured),
        "unlogged_priced": sorted(k for k in run.measured if k not in pred),
        "unmapped_settings": run.unmapped,
    }

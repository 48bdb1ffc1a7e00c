"""Library entry points: simulate a scenario, compare schedule variants, write a run directory."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from rlhfsim import contracts as C
from rlhfsim.costs.model import CostModel
from rlhfsim.errors import ScenarioError
from rlhfsim.files import write_atomic
from rlhfsim.scenario.checks import build_setup
from rlhfsim.scenario.loader import validate_model
from rlhfsim.scenario.schema import Scenario
from rlhfsim.sim.budget import DEFAULT_MAX_WORK, check_work
from rlhfsim.sim.schedules import VARIANT_OWNER, VARIANTS
from rlhfsim.sim.simulation import SimResult, Simulation, summarize



def simulate(sc: Scenario, *, profile: str | None = None, steps: int | None = None, seed: int | None = None,
             rollouts: list[tuple[int, int]] | None = None, cost: CostModel | None = None,
             max_work: float | None = DEFAULT_MAX_WORK, terms: bool = False) -> SimResult:
    """Run the scenario's schedule for ``steps`` steps and summarize it. A run whose estimated work
    (``rlhfsim.sim.budget``) exceeds ``max_work`` is refused before it starts (None or 0: no limit).
    ``terms``: also keep each phase's seconds by cost term (``rlhfsim explain``), in the summary as
    ``phase_terms_s``, and a streamed phase's seconds waiting for rollouts (generate's: its replica idle) as
    ``phase_waiting_s`` (means over the steady steps, ``Recorder.phase_terms``)."""
    if steps is not None or seed is not None:
        upd = {}
        if steps is not None:
            upd["steps"] = steps
            upd["warmup_steps"] = min(sc.warmup_steps, steps - 1)
        if seed is not None:
            upd["seed"] = seed
        sc = rebuild(sc, upd)
    setup = build_setup(sc)
    check_work(setup, max_work=max_work)
    cost = cost or CostModel.load(setup.gpu, profile)
    if sc.models.reward.kind == "model" and sc.models.reward.runtime and sc.models.reward.runtime not in cost.runtimes:
        raise ScenarioError("models.reward.runtime", f"expected a scoring runtime of profile {cost.name!r} "
                            f"({', '.join(cost.runtimes) or 'it has none'}), got {sc.models.reward.runtime!r}")
    sim = Simulation(setup, cost, rollouts=rollouts)
    if terms:
        sim.rec.record_terms()
    records = sim.run(sc.steps)
    summary = summarize(sim, records)
    if terms:
        steady = {r.step for r in records[summary["warmup_steps"]:]}
        acc: dict[str, dict[str, float]] = {}
        waiting: dict[str, float] = {}
        for (st, ph), (parts, wait) in sim.rec.phase_terms().items():
            if st in steady:
                mine = acc.setdefault(ph, {})
                for k, v in parts.items():
                    mine[k] = mine.get(k, 0.0) + v / len(steady)
                if wait is not None:
                    waiting[ph] = waiting.get(ph, 0.0) + wait / len(steady)
        summary["phase_terms_s"] = acc
        summary["phase_waiting_s"] = waiting
    return SimResult(setup, records, sim.rec.intervals, summary, cost)


def simulate_uncertain(sc: Scenario, *, profile: str | None = None, steps: int | None = None,
                       seed: int | None = None, draws: int | None = None, rollouts: list[tuple[int, int]] | None = None,
                       cost: CostModel | None = None, max_work: float | None = DEFAULT_MAX_WORK,
                       point: SimResult | None = None) -> tuple[SimResult, dict]:
    """The point prediction and its 90% interval (``rlhfsim.sim.uncertainty``): on a GPU the model's own error
    (the field table's, or an overlay's fit misfit with its fitted terms drawn), on a CPU the profile's parameter
    uncertainty; the same scenario, seed and rollouts re-simulated once per parameter draw, where anything is drawn.
    ``max_work`` bounds the point prediction's run (``simulate``); each draw is the same run. This is the one
    interval of ``simulate``, ``plan`` (its analytic part) and ``rlhfsim whatif``. ``point``: the point prediction
    of these same arguments, when already simulated."""
    from rlhfsim.sim.uncertainty import DEFAULT_DRAWS, interval

    base = point or simulate(sc, profile=profile, steps=steps, seed=seed, rollouts=rollouts, cost=cost, max_work=max_work)
    unc = interval(lambda c: simulate(sc, steps=steps, seed=seed, rollouts=rollouts, cost=c, max_work=None),
                   base.cost.profile, base.setup.gpu, n=draws or DEFAULT_DRAWS, point=base.summary)
    lo, hi = unc["step_time_s_interval"]
    unc["point_inside"] = bool(lo <= base.summary["step_time_s"] <= hi)
    return base, unc


def rebuild(sc: Scenario, update: dict) -> Scenario:
    """A copy of the scenario with top-level fields replaced, validated again."""
    data = sc.model_dump(mode="json")
    data.update(update)
    new = validate_model(Scenario, data)
    new._base_dir = sc.base_dir
    return new


def variant(sc: Scenario, name: str) -> Scenario:
    """The scenario under a named schedule variant (``VARIANTS``): the schedule that offers the name
    (``Schedule.variants``) says which schedule block it stands for."""
    owner = VARIANT_OWNER.get(name)
    if owner is None:
        raise ScenarioError("--compare", f"expected variant names from {', '.join(VARIANTS)}, got {name!r}")
    return rebuild(sc, {"schedule": owner.variants(sc)[name]})


def compare(sc: Scenario, names: list[str], base: SimResult | None = None, **kw) -> tuple[dict, dict[str, SimResult]]:
    """Run each variant on the same seed (same sampled lengths) and report speedup over ``sync``.
    ``base``: the scenario's own run with the same ``kw``, reused for a variant that is exactly the
    scenario's schedule instead of simulating it again."""
    for n in names:
        if n not in VARIANTS:
            raise ScenarioError("--compare", f"expected variant names from {', '.join(VARIANTS)}, got {n!r}")
    results = {}
    for n in names:
        v = variant(sc, n)
        results[n] = base if base is not None and v.schedule == sc.schedule else simulate(v, **kw)
    base = results["sync"].summary["step_time_s"] if "sync" in results else None
    out = {}
    for n, r in results.items():
        s = r.summary
        out[n] = {"step_time_s": s["step_time_s"], "speedup": (base / s["step_time_s"]) if base else None,
                  "gpu_utilization": s["gpu_utilization"], "gpu_busy": s["gpu_busy"],
                  "gpu_active": s["gpu_active"], "phases_s": s["phases_s"],
                  "tokens_per_s": s["tokens_per_s"],
                  "off_policy_token_frac": s["schedule_stats"]["off_policy_token_frac"]}
    return {"variants": out}, results


def write_outputs(result: SimResult, out: Path, variants: dict | None = None) -> list[str]:
    """A run directory ``out``: ``summary.json``, ``steps.csv``, ``intervals.csv`` (one row per GPU of each
    interval, with its active seconds), ``lengths.csv``, the step metrics under verl's names
    (``metrics.jsonl``) and as TensorBoard event files (``tensorboard/``). Every file is written
    atomically. Returns the names written."""
    out.mkdir(parents=True, exist_ok=True)
    summary = dict(result.summary)
    if variants:
        summary["variants"] = variants["variants"]
    write_atomic(out / C.SUMMARY_FILE, json.dumps(summary, indent=1) + "\n")
    write_atomic(out / C.STEPS_FILE, _csv([C.STEP_COLUMNS] + [
        [r.step, r.start_s, r.end_s, r.step_time_s, r.generated_tokens, r.trained_rollouts, r.deferred,
         r.off_policy_token_frac, r.chunk_tokens, r.delta, r.staleness] + [r.phases_s.get(p, 0.0) for p in C.PHASES]
        for r in result.steps]))
    write_atomic(out / C.INTERVALS_FILE, _csv([C.INTERVAL_COLUMNS] + [
        [iv.step, iv.pool, g, iv.role, iv.phase, f"{iv.start_s:.6f}", f"{iv.end_s:.6f}", f"{iv.active:.6f}"]
        for iv in result.intervals for g in range(iv.gpu0, iv.gpu0 + iv.n_gpus)]))
    write_atomic(out / C.LENGTHS_FILE, _csv([C.LENGTH_COLUMNS] + [
        [r.step, rid, pl, rl] for r in result.steps for rid, pl, rl in r.lengths]))
    rows = verl_metrics(result)
    write_atomic(out / C.VERL_METRICS_FILE, "".join(json.dumps(m) + "\n" for m in rows))
    from rlhfsim.report.tfevents import event_file_bytes, event_file_name

    # Wall time of each event: the step's simulated end, so TensorBoard's "relative" axis is simulated time.
    events = [(m["step"], result.steps[i].end_s, {k: v for k, v in m.items() if k != "step"}) for i, m in enumerate(rows)]
    tb = out / C.TENSORBOARD_DIR
    for old in tb.glob("events.out.tfevents.*") if tb.is_dir() else ():
        old.unlink()  # one event file per run directory: TensorBoard would merge a stale one
    write_atomic(tb / event_file_name(0), event_file_bytes(events))
    return [*C.RUN_FILES, C.VERL_METRICS_FILE, C.TENSORBOARD_DIR + "/"]


def verl_metrics(result: SimResult) -> list[dict]:
    """One dict per step under verl's metric names (``rlhfsim.contracts.VERL_PHASE_KEYS``): each phase's
    span, the step time, tokens (prompt + response of the trained rollouts) and ``perf/throughput``, tokens
    per second per GPU as verl computes it (total tokens / (step time x GPUs)). verl counts steps from 1."""
    n_gpus = sum(p.gpus for p in result.setup.pools)
    rows = []
    for r in result.steps:
        tokens = sum(pl + rl for _, pl, rl in r.lengths)
        m = {"step": r.step + 1}
        m.update({key: r.phases_s[p] for p, key in C.VERL_PHASE_KEYS.items() if p in r.phases_s})
        m[C.VERL_STEP_KEY] = r.step_time_s
        m[C.VERL_TOTAL_TOKENS_KEY] = tokens
        m[C.VERL_THROUGHPUT_KEY] = tokens / (r.step_time_s * n_gpus) if r.step_time_s > 0 else 0.0
        if r.lengths:
            m[C.VERL_RESPONSE_LENGTH_KEY] = sum(rl for _, _, rl in r.lengths) / len(r.lengths)
            m[C.VERL_PROMPT_LENGTH_KEY] = sum(pl for _, pl, _ in r.lengths) / len(r.lengths)
        rows.append(m)
    return rows


def _csv(rows: list) -> str:
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    return buf.getvalue()

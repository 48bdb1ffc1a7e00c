"""Library entry points: simulate a scenario, compare schedule variants, write a run directory."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from rlhfsim.costs.model import CostModel
from rlhfsim.errors import ScenarioError
from rlhfsim.scenario.checks import build_setup
from rlhfsim.scenario.loader import validate_model
from rlhfsim.scenario.schema import Scenario
from rlhfsim.sim.simulation import PHASES, SimResult, Simulation, summarize

VARIANTS = ("sync", "oppo-intra", "oppo-inter", "oppo", "partial", "async")


def simulate(sc: Scenario, *, profile: str | None = None, steps: int | None = None, seed: int | None = None,
             rollouts: list[tuple[int, int]] | None = None, cost: CostModel | None = None) -> SimResult:
    """Run the scenario's schedule for ``steps`` steps and summarize it."""
    if steps is not None or seed is not None:
        upd = {}
        if steps is not None:
            upd["steps"] = steps
            upd["warmup_steps"] = min(sc.warmup_steps, steps - 1)
        if seed is not None:
            upd["seed"] = seed
        sc = rebuild(sc, upd)
    setup = build_setup(sc)
    cost = cost or CostModel.load(setup.gpu, profile)
    if sc.models.reward.kind == "model" and sc.models.reward.runtime and sc.models.reward.runtime not in cost.runtimes:
        raise ScenarioError("models.reward.runtime", f"expected a scoring runtime of profile {cost.name!r} "
                            f"({', '.join(cost.runtimes) or 'it has none'}), got {sc.models.reward.runtime!r}")
    sim = Simulation(setup, cost, rollouts=rollouts)
    records = sim.run(sc.steps)
    return SimResult(setup, records, sim.rec.intervals, summarize(sim, records))


def simulate_uncertain(sc: Scenario, *, profile: str | None = None, steps: int | None = None,
                       seed: int | None = None, draws: int | None = None, rollouts: list[tuple[int, int]] | None = None,
                       cost: CostModel | None = None) -> tuple[SimResult, dict]:
    """The point prediction and its 90% interval from the profile's parameter uncertainty
    (``rlhfsim.sim.uncertainty``): the same scenario, seed and rollouts re-simulated once per draw."""
    from rlhfsim.sim.uncertainty import DEFAULT_DRAWS, interval

    base = simulate(sc, profile=profile, steps=steps, seed=seed, rollouts=rollouts, cost=cost)
    cost = cost or CostModel.load(base.setup.gpu, profile)
    unc = interval(lambda c: simulate(sc, steps=steps, seed=seed, rollouts=rollouts, cost=c), cost.profile,
                   base.setup.gpu, n=draws or DEFAULT_DRAWS)
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
    """The scenario under a named schedule variant. OPPO parts come from the scenario's own oppo block
    when it has one (else defaults); ``oppo-intra`` turns inter-step off, ``oppo-inter`` intra-step off.
    ``partial`` defaults to a per-step token budget of max_response_tokens / 4, ``async`` to
    max_staleness 1, unless the scenario's schedule is already of that kind."""
    cur = sc.schedule.model_dump(mode="json")
    if name == "sync":
        sched = {"kind": "sync"}
    elif name in ("oppo", "oppo-intra", "oppo-inter"):
        sched = cur if cur["kind"] == "oppo" else {"kind": "oppo"}
        sched = json.loads(json.dumps(sched))
        sched.setdefault("intra", {})
        sched.setdefault("inter", {})
        if name == "oppo-intra":
            sched["inter"]["enabled"] = False
        if name == "oppo-inter":
            sched["intra"]["enabled"] = False
    elif name == "partial":
        sched = cur if cur["kind"] == "partial" else {"kind": "partial", "token_budget": max(sc.workload.max_response_tokens // 4, 1)}
    elif name == "async":
        sched = cur if cur["kind"] == "async" else {"kind": "async", "max_staleness": 1}
    else:
        raise ScenarioError("--compare", f"expected variant names from {', '.join(VARIANTS)}, got {name!r}")
    return rebuild(sc, {"schedule": sched})


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


def write_outputs(result: SimResult, out: Path, variants: dict | None = None) -> None:
    """``summary.json``, ``steps.csv``, ``intervals.csv`` (one row per GPU of each interval, with its
    active seconds) and ``lengths.csv`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    summary = dict(result.summary)
    if variants:
        summary["variants"] = variants["variants"]
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    with open(out / "steps.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "start_s", "end_s", "step_time_s", "generated_tokens", "trained_rollouts", "deferred",
                    "off_policy_token_frac", "chunk_tokens", "delta", "staleness"] + [f"{p}_s" for p in PHASES])
        for r in result.steps:
            w.writerow([r.step, r.start_s, r.end_s, r.step_time_s, r.generated_tokens, r.trained_rollouts, r.deferred,
                        r.off_policy_token_frac, r.chunk_tokens, r.delta, r.staleness]
                       + [r.phases_s.get(p, 0.0) for p in PHASES])
    with open(out / "intervals.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "pool", "gpu", "role", "phase", "start_s", "end_s", "active_s"])
        for iv in result.intervals:
            for g in range(iv.gpu0, iv.gpu0 + iv.n_gpus):
                w.writerow([iv.step, iv.pool, g, iv.role, iv.phase, f"{iv.start_s:.6f}", f"{iv.end_s:.6f}",
                            f"{iv.active:.6f}"])
    with open(out / "lengths.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "rollout_id", "prompt_len", "response_len"])
        for r in result.steps:
            for rid, pl, rl in r.lengths:
                w.writerow([r.step, rid, pl, rl])

"""Why a parallelism search's best configuration beats the base scenario's own parallelism (the published layout, in
the bundled plans): both simulated in full once more with the cost terms kept (``rlhfsim explain``'s machinery,
``simulate(terms=True)``), and each phase's span and each term's seconds compared, largest changes first. Predicted
by the simulator, not measured."""

from __future__ import annotations

from typing import Optional

from rlhfsim.plan.spec import Plan

NOTE = "predicted by the simulator with the plan's profile, not measured"


def _explained(plan: Plan, index: int) -> dict:
    from rlhfsim.costs.model import CostModel
    from rlhfsim.hardware.catalog import get_gpu
    from rlhfsim.sim.run import simulate

    cfg = plan.configs[index]
    r = simulate(cfg.scenario, cost=CostModel(get_gpu(cfg.gpu_type), plan.profiles[cfg.gpu_type]), terms=True)
    s = r.summary
    # what the generation engine gets: a training layout on a shared pool moves its KV cache
    gen = {"replicas": r.setup.replicas, "kv_capacity_tokens": r.setup.kv_capacity_tokens}
    return {"step_time_s": s["step_time_s"], "phases_s": s["phases_s"], "terms_s": s["phase_terms_s"], "generation": gen}


def _layout(plan: Plan, row: dict) -> dict:
    return {a: row[a] for a in plan.axes}


def compare_with_base(plan: Plan, rows: list[dict], best: Optional[dict]) -> Optional[dict]:
    """The comparison (module docstring) as a JSON-ready dict, or None where the base or the best is missing."""
    base_i = next((i for i, c in enumerate(plan.configs) if c.base), None)
    if base_i is None or best is None:
        return None
    base_row = rows[base_i]
    if not base_row["feasible"]:
        return {"base": _layout(plan, base_row), "base_reason": base_row["reason"], "note": NOTE}
    best_i = next(i for i, r in enumerate(rows) if r["config"] == best["config"])
    a, b = _explained(plan, base_i), _explained(plan, best_i)
    phases = []
    for ph in dict.fromkeys([*a["phases_s"], *b["phases_s"]]):
        x, y = a["phases_s"].get(ph, 0.0), b["phases_s"].get(ph, 0.0)
        ta, tb = a["terms_s"].get(ph, {}), b["terms_s"].get(ph, {})
        terms = [{"term": t, "base_s": ta.get(t, 0.0), "best_s": tb.get(t, 0.0), "delta_s": tb.get(t, 0.0) - ta.get(t, 0.0)}
                 for t in dict.fromkeys([*ta, *tb])]
        terms.sort(key=lambda d: -abs(d["delta_s"]))
        phases.append({"phase": ph, "base_s": x, "best_s": y, "delta_s": y - x, "terms": terms})
    phases.sort(key=lambda d: -abs(d["delta_s"]))
    same = best["config"] == base_row["config"]
    return {"base": _layout(plan, base_row), "best": _layout(plan, best),
            "base_step_s": a["step_time_s"], "best_step_s": b["step_time_s"],
            "base_generation": a["generation"], "best_generation": b["generation"],
            "delta_s": b["step_time_s"] - a["step_time_s"], "same": same, "phases": phases, "why": why(a, b, phases, same),
            "note": NOTE}


def why(a: dict, b: dict, phases: list[dict], same: bool) -> str:
    """One paragraph: the step's change and the phases and terms that make it (changes under 1% of the step left out)."""
    if same:
        return "the base scenario's own parallelism is the best found"
    step = a["step_time_s"]
    d = b["step_time_s"] - step
    out = [f"{abs(d):.1f} s a step {'faster' if d < 0 else 'slower'} ({100 * d / step:+.0f}%)"]
    for p in phases:
        if abs(p["delta_s"]) < 0.01 * step:
            continue
        terms = ", ".join(f"{t['term']} {t['delta_s']:+.1f}" for t in p["terms"] if abs(t["delta_s"]) >= 0.005 * step)
        out.append(f"{p['phase']} {p['delta_s']:+.1f} s ({p['base_s']:.1f} -> {p['best_s']:.1f}" + (f"; {terms})" if terms else ")"))
    ga, gb = a["generation"], b["generation"]
    if ga != gb:
        out.append(f"the engine: {ga['replicas']} -> {gb['replicas']} replicas, KV cache {ga['kv_capacity_tokens']:,} -> "
                   f"{gb['kv_capacity_tokens']:,} tokens per replica")
    return "; ".join(out)

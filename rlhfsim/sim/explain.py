"""Which cost terms a step's time is made of (``rlhfsim explain SCENARIO``).

The scenario is simulated once with the recorder keeping, for every forward and training phase, the seconds of
the replica (forward) or rank (training) that sets the phase's span, by cost term (``rlhfsim.costs.terms``:
kernels, op_overhead, logprob_head, fsdp_exposed, host_launch_bound, framework_piece, offload, optimizer);
their mean over the steady steps is reported beside the phase's mean span. Generation is a sum of decode
segments of changing batch and context, so it is explained by one representative decode step instead: the
first step of a full batch (``generation.max_batch`` rows, or the rollouts per engine replica if fewer) with
the mean prompt plus half the mean response in its cache, by term (decode_kernels, engine_step,
sampling_tail, host_launch_bound). The weight update is given by its named parts (``weight_sync_parts_s``).
"""

from __future__ import annotations

from rlhfsim.contracts import VERL_PHASE_KEYS
from rlhfsim.costs.terms import BY_NAME
from rlhfsim.scenario.schema import Scenario
from rlhfsim.sim.run import simulate


def explain(sc: Scenario, *, profile: str | None = None, steps: int | None = None, seed: int | None = None) -> dict:
    """The breakdown (module docstring) as a JSON-ready dict."""
    result = simulate(sc, profile=profile, steps=steps, seed=seed, terms=True)
    summ, setup = result.summary, result.setup
    phases = {}
    for ph, span in summ["phases_s"].items():
        entry = {"span_s": span, "verl_name": VERL_PHASE_KEYS.get(ph)}
        terms = summ.get("phase_terms_s", {}).get(ph)
        if terms:
            entry["terms_s"] = terms
        phases[ph] = entry
    doc = {"scenario": summ["scenario"], "profile": summ["profile"], "step_time_s": summ["step_time_s"],
           "phases": phases, "weight_sync_parts_s": summ.get("weight_sync_parts_s")}
    doc["decode_step"] = representative_decode_step(result)
    doc["terms"] = {name: {"prices": t.prices, "key": t.key, "devices": t.devices}
                    for name, t in BY_NAME.items()
                    if any(name in (e.get("terms_s") or {}) for e in phases.values()) or name in doc["decode_step"]["terms_s"]}
    return doc


def render(doc: dict) -> list[str]:
    """The breakdown as text lines: each phase's mean span and its terms (seconds and share)."""
    out = [f"{doc['scenario']}  profile {doc['profile']}  step {doc['step_time_s']:.3f} s", "",
           f"{'phase':<14} {'span_s':>9}  what it is made of"]
    for ph, e in doc["phases"].items():
        terms = e.get("terms_s")
        if terms:
            total = sum(terms.values()) or 1.0
            what = ", ".join(f"{k} {v:.3f} ({100 * v / total:.0f}%)" for k, v in
                             sorted(terms.items(), key=lambda kv: -kv[1]) if v >= 0.005 * total)
        elif ph == "generate":
            d = doc["decode_step"]
            what = (f"decode steps; one of {d['batch']} rows, {d['cached_tokens']:.0f} cached tokens ({d['runtime']}): "
                    f"{d['step_s'] * 1e3:.2f} ms = " + " + ".join(f"{k} {v * 1e3:.2f}" for k, v in d["terms_s"].items() if v > 0))
        elif ph == "weight_sync" and doc.get("weight_sync_parts_s"):
            what = ", ".join(f"{k.removesuffix('_s')} {v:.3f}" for k, v in doc["weight_sync_parts_s"].items() if v > 0)
        else:
            what = ""
        out.append(f"{ph:<14} {e['span_s']:>9.3f}  {what}")
    out += ["", "Forward and training phases: the replica or rank that sets the span, mean over the steady steps; "
            "terms under 0.5% left out. The terms (devices; where their numbers live):"]
    out += [f"  {k:<18} ({t['devices']}) {t['key']}" for k, t in doc["terms"].items()]
    out.append("Every term: docs/reference/cost-terms.md; equations: docs/cost-model.md.")
    return out


def representative_decode_step(result) -> dict:
    """One decode step of a full batch at the mean context (module docstring), by cost term."""
    setup = result.setup
    sc = setup.scenario
    rows = [r for st in result.steps for r in st.lengths]
    prompt = sum(r[1] for r in rows) / len(rows) if rows else 0.0
    response = sum(r[2] for r in rows) / len(rows) if rows else 0.0
    per_replica = max(len(rows) // max(len(result.steps), 1) // max(setup.replicas, 1), 1) if rows else 1
    batch = min(sc.generation.max_batch, per_replica)
    kv = batch * (prompt + response / 2)
    cost = result.cost
    runtime = sc.generation.resolved_runtime
    d = cost.decoder(setup.shapes["rollout"], setup.dtypes["rollout"], setup.tp["rollout"], runtime)
    terms = d.terms(batch, kv)
    return {"runtime": runtime, "batch": batch, "cached_tokens": kv, "step_s": sum(terms.values()), "terms_s": terms}

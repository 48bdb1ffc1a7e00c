"""Which cost terms a step's time is made of (``rlhfsim explain SCENARIO``).

The scenario is simulated once with the recorder keeping, for every phase, the seconds by cost term
(``rlhfsim.costs.terms``) of the work that sets the phase's span; their mean over the steady steps is reported
beside the phase's mean span:

* a forward or training phase: the replica (forward) or rank (training) that sets the span (kernels,
  op_overhead, logprob_head, fsdp_exposed, host_launch_bound, framework_piece, offload, optimizer, and on a
  CPU the host effects split out of them: logprob_tail_cpu, page_faults, width_rate);
* a streamed phase (OPPO intra-step: ``reward``, and ``reference`` or ``critic_fwd`` when streamed): the
  replica whose calls end last, its busy seconds by term (kernels, op_overhead, reencode_prefix, retokenize,
  interference, ...), and apart from them the rest of the span, which it spends waiting for generation to
  hand tokens over: not a cost term (``terms.WAITING``, ``waiting_s``);
* the CPU-side phases (advantage, retokenize, a rule reward) and the weight update: one term each, the weight
  update with its named parts (``weight_sync_parts_s``);
* ``generate``: the engine replica that ends last (ties: the busier), its seconds by term over the step
  (``rlhfsim.sim.engines.accounting``): its decode segments' steps summed (decode_kernels, engine_step,
  sampling_tail, host_launch_bound; on a CPU gemm_footprint, cold_overheads), its prefill calls' forward terms
  (kernels, op_overhead), a static batch's gen_call_overhead and left_padding, handoff at chunk boundaries and
  interference where co-running scoring slowed its decode (OPPO intra-step); apart from them the rest of the
  span, in which it is idle (between the step's generation requests): not a cost term (``waiting_s``). The
  event clock and a detached replica's deferred clock account alike.

Beside it, one representative decode step tells the per-step cost: the first step of a full batch
(``generation.max_batch`` rows, or the rollouts per engine replica if fewer) with the mean prompt plus half
the mean response in its cache, by term (``decode_step``).

Every name printed as a term is a registry term; ``explained_names`` lists them (a test checks it).
"""

from __future__ import annotations

from rlhfsim.contracts import VERL_PHASE_KEYS
from rlhfsim.costs.terms import BY_NAME, WAITING
from rlhfsim.scenario.schema import Scenario
from rlhfsim.sim.run import simulate

# generate's seconds inside its span that the replica setting it spends idle: not a cost term
IDLE = "idle"


def explain(sc: Scenario, *, profile: str | None = None, steps: int | None = None, seed: int | None = None) -> dict:
    """The breakdown (module docstring) as a JSON-ready dict: per phase ``span_s``, ``terms_s`` and, for a
    streamed phase and ``generate``, ``waiting_s`` (generate's: idle); ``decode_step``; ``terms`` (the
    registry's entry of every term named)."""
    result = simulate(sc, profile=profile, steps=steps, seed=seed, terms=True)
    summ = result.summary
    phases = {}
    for ph, span in summ["phases_s"].items():
        entry = {"span_s": span, "verl_name": VERL_PHASE_KEYS.get(ph)}
        terms = summ["phase_terms_s"].get(ph)
        if terms:
            entry["terms_s"] = terms
        if ph in summ["phase_waiting_s"]:
            entry["waiting_s"] = summ["phase_waiting_s"][ph]
        phases[ph] = entry
    doc = {"scenario": summ["scenario"], "profile": summ["profile"], "step_time_s": summ["step_time_s"],
           "phases": phases, "weight_sync_parts_s": summ.get("weight_sync_parts_s"),
           "decode_step": representative_decode_step(result), "waiting": WAITING}
    doc["terms"] = {name: {"prices": BY_NAME[name].prices, "key": BY_NAME[name].key, "devices": BY_NAME[name].devices}
                    for name in sorted(explained_names(doc), key=list(BY_NAME).index)}
    return doc


def explained_names(doc: dict) -> set[str]:
    """Every term name ``doc`` gives seconds for (non-zero): the phases' and the decode step's."""
    names = {k for e in doc["phases"].values() for k, v in (e.get("terms_s") or {}).items() if v}
    return names | {k for k, v in doc["decode_step"]["terms_s"].items() if v}


def _shares(terms: dict[str, float], whole: float) -> str:
    """``terms`` largest first with their share of ``whole``; those under 0.5% of it (either sign) left out."""
    whole = whole or 1.0
    return ", ".join(f"{k} {v:.3f} ({100 * v / whole:.0f}%)" for k, v in sorted(terms.items(), key=lambda kv: -kv[1])
                     if abs(v) >= 0.005 * whole)


def render(doc: dict) -> list[str]:
    """The breakdown as text lines: each phase's mean span and its terms (seconds and share of the span)."""
    out = [f"{doc['scenario']}  profile {doc['profile']}  step {doc['step_time_s']:.3f} s", "",
           f"{'phase':<14} {'span_s':>9}  what it is made of"]
    for ph, e in doc["phases"].items():
        terms = e.get("terms_s")
        if ph == "generate" and terms:
            idle = e.get("waiting_s", 0.0)
            idle = 0.0 if abs(idle) <= 1e-9 * e["span_s"] else idle   # float rounding of the span's sum
            what = (f"one replica busy {sum(terms.values()):.3f}: {_shares(terms, e['span_s'])}; {IDLE} "
                    f"{idle:.3f} ({100 * idle / (e['span_s'] or 1.0):.0f}%, not a cost term)")
            d = doc["decode_step"]
            what += (f"\n{'':<26}decode steps; one of {d['batch']} rows, {d['cached_tokens']:.0f} cached tokens "
                     f"({d['runtime']}): {d['step_s'] * 1e3:.2f} ms = " + " + ".join(
                         f"{k} {v * 1e3:.2f}" for k, v in d["terms_s"].items() if abs(v) >= 0.005 * d["step_s"]))
        elif terms:
            what = _shares(terms, e["span_s"])
            if "waiting_s" in e:
                what = (f"one replica busy {sum(terms.values()):.3f}: {what}; {WAITING} {e['waiting_s']:.3f} "
                        f"({100 * e['waiting_s'] / (e['span_s'] or 1.0):.0f}%, not a cost term)")
            if ph == "weight_sync" and doc.get("weight_sync_parts_s"):
                what += " [weight_sync's parts: " + ", ".join(
                    f"{k.removesuffix('_s')} {v:.3f}" for k, v in doc["weight_sync_parts_s"].items()
                    if v and k not in ("offload_s", "host_swap_s")) + "]"
        else:
            what = "nothing to do" if e["span_s"] == 0 else ""
        out += f"{ph:<14} {e['span_s']:>9.3f}  {what}".split("\n")
    out += ["", "Each phase: the replica or rank that sets its span, mean over the steady steps; a streamed phase's "
            f"replica is busy part of its span and the rest is {WAITING}; generate's replica is {IDLE} for the rest "
            "of its span; terms under 0.5% of the span left out. "
            "The terms (devices; where their numbers live):"]
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
    tp = setup.tp["rollout"]
    d = cost.decoder(setup.shapes["rollout"], setup.dtypes["rollout"], tp, runtime,
                     tp_inter_node=tp > setup.gpu.link_domain(sc.cluster.gpus_per_node), par=setup.gen_parallel)
    terms = d.price(batch, kv, 1).terms()
    return {"runtime": runtime, "batch": batch, "cached_tokens": kv, "step_s": sum(terms.values()), "terms_s": terms}

"""Measured against predicted for one scenario: the step time and each phase's span, and every operation the
executor timed inside the real steps priced at its own shape with the simulator's own pricing
(``rlhfsim.costs.price``; this module prices nothing itself, so a per-call table cannot drift from what the
simulator charges): the generation runtime's calls (``operations``), the scorer's calls under intra-step
streaming (``scoring_operations``), and the sequential phases' forward and training calls
(``phase_operations``, each phase's first call apart); plus the page faults and allocator counters the
executor recorded per phase."""

from __future__ import annotations

import statistics

from rlhfsim.contracts import PHASES
from rlhfsim.costs import price
from rlhfsim.costs.terms import Price, add_terms
from rlhfsim.errors import RlhfsimError

def _mean_phases(phase_dicts: list[dict]) -> dict[str, float]:
    out = {}
    for ph in PHASES:
        vals = [d.get(ph) for d in phase_dicts]
        if any(v is not None for v in vals):
            out[ph] = statistics.fmean(v or 0.0 for v in vals)
    return out


def _err(pred: float, meas: float) -> float | None:
    return 100.0 * (pred - meas) / meas if meas > 0 else None


def price_op(cost, model, dtype: str, runtime: str, name: str, shape: dict, logprobs: bool = False) -> Price:
    """The profile's price of one in-step generation operation (``StepLog.op``), with the calls the
    simulator's engines make for the same work (``rlhfsim.costs.price.generation_op``: tp 1, no co-running
    scoring), its terms beside it. ``logprobs``: the sampled tokens' log-probs are recorded (the executor always
    records them: ``generation.sampling_logprobs``)."""
    return price.generation_op(cost, model, dtype, runtime, name, shape, logprobs)


SCORER_OPS = ("chunk_prefill", "rescore")   # the scorer thread's calls under intra-step streaming (StepLog.op)
PHASE_OPS = ("forward_call", "train_call")  # the sequential phases' calls: reward, reference, critic, training


def price_scorer_op(cost, setup, name: str, shape: dict) -> Price:
    """The profile's price of one scorer call of the reward model, timed by the scorer thread, as the
    simulator's chunk scorer prices a call alone (``rlhfsim.costs.price.scorer_call``: no co-running
    slowdown): ``chunk_prefill`` on a cached prefix (incremental) or ``rescore`` from scratch (reencode,
    final_only), plus re-tokenizing the call's tokens when the reward model reads another tokenizer."""
    from rlhfsim.sim.simulation import forward_runtime
    from rlhfsim.sim.streaming import STREAMING

    if name not in SCORER_OPS:
        raise RlhfsimError(f"price_scorer_op: expected one of {SCORER_OPS}, got {name!r}")
    strategy = STREAMING["incremental" if name == "chunk_prefill" else "reencode"]
    return price.scorer_call(cost, strategy, setup.shapes["reward"], setup.dtypes["reward"], shape["tokens"], 1,
                             shape.get("prefix", 0), 1, setup.head("reward"),
                             forward_runtime(cost, "reward", setup.scenario), bool(shape.get("retokenize")))


def _op_row(calls: int, measured_s: float, predicted_s: float, steps: int, terms: dict | None = None) -> dict:
    """One in-step operation's row over ``steps`` steady steps: calls and seconds per step, ms per call,
    the error, and the predicted seconds per step by cost term (a ``Price``'s terms)."""
    row = {"calls_per_step": calls / steps, "measured_s": measured_s / steps, "predicted_s": predicted_s / steps,
           "measured_ms_per_call": 1e3 * measured_s / calls, "predicted_ms_per_call": 1e3 * predicted_s / calls,
           "error_pct": _err(predicted_s, measured_s)}
    if terms is not None:
        row["predicted_terms_s"] = {k: v / steps for k, v in sorted(terms.items(), key=lambda kv: -kv[1])}
    return row


def scoring_operations(setup, cost, steps: list) -> dict:
    """Per scorer operation (``SCORER_OPS``) over the given (steady) steps: calls, measured and predicted
    (alone) seconds per step, the error, and what the simulator does to a call that starts while decode
    runs on its device: ``prefill_slowdown``, the factor, and ``prefill_added_s``, the seconds added per
    call (``CostModel.corun``: the added-time fit where the profile has one, else the hand-over figure for
    the scenario's generation runtime and models, and 0)."""
    n = max(len(steps), 1)
    acc: dict[str, list[float]] = {}
    for r in steps:
        for name, secs, shape in r.ops:
            if name in SCORER_OPS:
                a = acc.setdefault(name, [0, 0.0, 0.0, {}])
                a[0] += 1
                a[1] += secs
                p = price_scorer_op(cost, setup, name, shape)
                a[2] += p.total_s
                add_terms(a[3], p.terms())
    _, _, slow, add, _ = cost.corun(setup.scenario.generation.resolved_runtime, setup.shapes["actor"],
                                    setup.shapes.get("reward"))
    return {"operations": {name: _op_row(c, m, p, n, t) for name, (c, m, p, t) in sorted(acc.items())},
            "prefill_slowdown": slow, "prefill_added_s": add}


def operations(setup, cost, steps: list) -> dict:
    """Per generation operation over the given (steady) steps: calls, measured and predicted seconds per
    step, the error; plus ``outside_ops_s``: the generate span per step minus the operations in it."""
    model, dtype = setup.shapes["actor"], setup.dtypes["actor"]
    runtime = setup.scenario.generation.resolved_runtime
    n = max(len(steps), 1)
    acc: dict[str, list[float]] = {}
    for r in steps:
        for name, secs, shape in r.ops:
            if name in SCORER_OPS or name in PHASE_OPS:
                continue
            a = acc.setdefault(name, [0, 0.0, 0.0, {}])
            a[0] += 1
            a[1] += secs
            p = price_op(cost, model, dtype, runtime, name, shape, setup.scenario.generation.sampling_logprobs)
            a[2] += p.total_s
            add_terms(a[3], p.terms())
    ops = {name: _op_row(c, m, p, n, t) for name, (c, m, p, t) in sorted(acc.items())}
    span = statistics.fmean(r.phases["generate"][1] - r.phases["generate"][0] for r in steps) if steps else 0.0
    return {"runtime": runtime, "operations": ops,
            "outside_ops_s": span - sum(v["measured_s"] for v in ops.values()), "generate_span_s": span}


def price_phase_op(cost, setup, name: str, shape: dict) -> Price:
    """The profile's price of one call of a sequential phase (``PHASE_OPS``) on one device, as the
    simulator's stages price it (``rlhfsim.costs.price``): a forward call (reward, reference, critic values)
    is the padded piece over ``rows`` x ``width`` tokens plus the framework's host time per piece; a
    training call (one minibatch: forward, loss, backward, AdamW) is the training piece, the host time per
    piece and the optimizer step."""
    from rlhfsim.sim.simulation import forward_runtime

    role = shape["role"]
    tokens, rows = shape["rows"] * shape["width"], shape["rows"]
    if name == "forward_call":   # a reward forward call is timed only with a reward model (not a rule)
        return price.forward_piece(cost, setup, role, tokens, rows, forward_runtime(cost, role, setup.scenario))
    if name == "train_call":
        return price.train_piece(cost, setup, role, tokens, rows)
    raise RlhfsimError(f"price_phase_op: expected one of {PHASE_OPS}, got {name!r}")


def phase_operations(setup, cost, steps: list) -> dict:
    """Per sequential phase (reward, reference, critic_fwd, actor_train, critic_train), every call the
    executor timed inside the real steps (``PHASE_OPS``) priced at its own shape (``price_phase_op``):
    calls, measured and predicted seconds per step, the error; and the same split into each phase's
    first call (the first after another model's work: generation, or the previous phase) and the rest,
    so a cost of switching models shows as the first call's error beyond the others'; and the calls' mean
    padded shape (``rows_per_call``, ``tokens_per_call``: rows x width), so a miss can be set against its
    shape afterwards."""
    n = max(len(steps), 1)
    # (phase, first call?) -> calls, measured s, predicted s, rows, rows x width
    acc: dict[tuple[str, bool], list[float]] = {}
    terms: dict[str, dict[str, float]] = {}   # phase -> predicted seconds by cost term
    for r in steps:
        for name, secs, shape in r.ops:
            if name in PHASE_OPS:
                a = acc.setdefault((shape["phase"], shape["index"] == 0), [0, 0.0, 0.0, 0, 0])
                a[0] += 1
                a[1] += secs
                p = price_phase_op(cost, setup, name, shape)
                a[2] += p.total_s
                a[3] += shape["rows"]
                a[4] += shape["rows"] * shape["width"]
                add_terms(terms.setdefault(shape["phase"], {}), p.terms())
    out = {}
    for ph in PHASES:
        first, other = acc.get((ph, True)), acc.get((ph, False))
        if first is None and other is None:
            continue
        both = [sum(x) for x in zip(*(a for a in (first, other) if a is not None))]
        out[ph] = {**_op_row(*both[:3], n, terms.get(ph)),
                   "first_call_error_pct": _err(first[2], first[1]) if first else None,
                   "other_calls_error_pct": _err(other[2], other[1]) if other else None,
                   "rows_per_call": both[3] / both[0], "tokens_per_call": both[4] / both[0]}
    return out


def allocator(steps: list) -> dict:
    """The CUDA caching allocator's counters each phase moved, per measured step (the executor's
    ``StepLog.allocs``, ``calibrate.executor.timing.ALLOC_KEYS``); empty off CUDA. Nothing prices them:
    they say whether a phase mapped and returned device memory while it ran, a cost a profile measured
    with a warm allocator does not contain."""
    n = max(len(steps), 1)
    acc: dict[str, dict[str, float]] = {}
    for r in steps:
        for phase, counts in getattr(r, "allocs", {}).items():
            a = acc.setdefault(phase, {})
            for k, v in counts.items():
                a[k] = a.get(k, 0) + v / n
    return {ph: acc[ph] for ph in sorted(acc)}


FAULT_PATTERNS = {"reference": ("reference", "logprob_forward"), "actor_train": ("actor", "logprob_train")}


def page_faults(setup, cost, steps: list) -> dict:
    """Fresh pages touched per step by the minibatches of the sequential phases (the executor's
    ``StepLog.faults``) next to what the profile's page-fault term prices for the same minibatches
    (``calibrate.cpu.pagefaults``: logits-sized tensors above the threshold; value-head phases price none),
    in MiB per step, with the measured bytes' cost at the profile's ``fault_s_per_byte``."""
    from rlhfsim.costs.cpuhost import page_fault_s

    pf = cost.page_faults
    n = max(len(steps), 1)
    acc: dict[str, list[float]] = {}
    for r in steps:
        for phase, nbytes, rows, width in getattr(r, "faults", []):
            a = acc.setdefault(phase, [0, 0.0, 0.0])
            a[0] += 1
            a[1] += nbytes
            role, pattern = FAULT_PATTERNS.get(phase, (None, None))
            if pf and role in setup.shapes:   # the priced bytes: the term at one second per byte
                a[2] += page_fault_s({**pf, "fault_s_per_byte": 1.0}, rows * (width - 1), setup.shapes[role].vocab, pattern)
    rate = pf["fault_s_per_byte"] if pf else None
    return {ph: {"minibatches_per_step": c / n, "measured_mib": m / n / 2**20, "priced_mib": p / n / 2**20,
                 "measured_s_at_profile_rate": None if rate is None else m / n * rate}
            for ph, (c, m, p) in sorted(acc.items())}


def validate_scenario(prepared, profile: str, visits: list[list]) -> dict:
    """Measured (the executor's StepResults of this scenario, one list per visit: each visit ran the
    scenario's steps from the start on a fresh executor) against the simulation of the same rollouts. The
    measured side pools every visit's steps after the warm-up; ``measured_step_time_s_visits`` and
    ``error_pct_visits`` give each visit's own mean and error against the same prediction."""
    from rlhfsim.costs.model import CostModel
    from rlhfsim.sim.run import simulate_uncertain

    sc, setup, cfg, rollouts = prepared
    # The executor scores with the Hugging Face model in eager mode; the simulator prices reward passes
    # with the profile's eager fit by default (Simulation.forward_runtime).
    cost = CostModel.load(setup.gpu, profile)
    predicted, unc = simulate_uncertain(sc, cost=cost, rollouts=rollouts)
    warm = sc.warmup_steps
    measured = visits[0]
    m_steps = [r for v in visits for r in v[warm:]]
    p_steps = predicted.steps[warm:]
    m_time = statistics.fmean(r.step_time_s for r in m_steps)
    p_time = statistics.fmean(r.step_time_s for r in p_steps)
    v_times = [statistics.fmean(r.step_time_s for r in v[warm:]) for v in visits]
    m_ph = _mean_phases([{k: b - a for k, (a, b) in r.phases.items()} for r in m_steps])
    p_ph = _mean_phases([r.phases_s for r in p_steps])
    phases = {ph: {"measured_s": m_ph.get(ph, 0.0), "predicted_s": p_ph.get(ph, 0.0),
                   "error_pct": _err(p_ph.get(ph, 0.0), m_ph.get(ph, 0.0))} for ph in PHASES if ph in m_ph or ph in p_ph}
    checks_ids = [r.rollout_ids for r in measured]
    checks = {
        "measured_generated_tokens": sum(r.generated_tokens for r in measured),
        "predicted_generated_tokens": sum(r.generated_tokens for r in predicted.steps),
        "measured_trained_ids": checks_ids,
        "predicted_trained_ids": [r.trained_ids for r in predicted.steps],
        "measured_chunks_scored": sum(r.chunks_scored for r in measured),
        "measured_deferred": [r.deferred_out for r in measured],
        "predicted_deferred": [r.deferred for r in predicted.steps],
        "visits_trained_the_same_ids": all([r.rollout_ids for r in v] == checks_ids for v in visits[1:]),
    }
    return {"name": sc.name, "steps": sc.steps, "warmup_steps": warm,
            "generation_runtime": sc.generation.resolved_runtime,
            "profile": cost.name if not str(profile).endswith(".json") else str(profile),
            "measured_step_time_s": m_time, "predicted_step_time_s": p_time, "error_pct": _err(p_time, m_time),
            "visits": len(visits), "measured_step_time_s_visits": v_times,
            "error_pct_visits": [_err(p_time, t) for t in v_times],
            "predicted_step_time_s_interval": unc["step_time_s_interval"], "interval_level": unc["level"],
            "interval_source": unc["source"],
            "inside_interval": bool(unc["step_time_s_interval"][0] <= m_time <= unc["step_time_s_interval"][1]),
            "phases": phases, "generation_ops": operations(setup, cost, m_steps),
            "page_faults": page_faults(setup, cost, m_steps),
            "scoring_ops": scoring_operations(setup, cost, m_steps),
            "phase_ops": phase_operations(setup, cost, m_steps), "checks": checks,
            **({"allocator": allocs} if (allocs := allocator(m_steps)) else {})}


def error_block(rows: list[dict]) -> dict:
    """Per-scenario rows with the median and largest |step-time error| over them."""
    errs = [abs(s["error_pct"]) for s in rows if s["error_pct"] is not None]
    by_phase = {ph: [abs(s["phases"][ph]["error_pct"]) for s in rows
                     if ph in s["phases"] and s["phases"][ph]["error_pct"] is not None] for ph in PHASES}
    return {"scenarios": rows, "median_abs_error_pct": statistics.median(errs) if errs else None,
            "max_abs_error_pct": max(errs) if errs else None,
            "phase_median_abs_error_pct": {ph: statistics.median(v) for ph, v in by_phase.items() if v}}

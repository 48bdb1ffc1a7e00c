"""``rlhfsim validate``: run real small RLHF steps on the local device and put measured next to predicted.

For each scenario:
  1. Load it (it must describe the local device: ``cluster.gpu: cpu`` with one device for ``--device
     cpu``; one GPU with ``--device cuda``) and draw its rollouts (prompt and response lengths) from the
     simulator's own seeded stream.
  2. Run the real steps with ``calibrate.executor`` on exactly those lengths, the scenarios' steps
     round-robin (``run_interleaved``; ``--sequential``, the default with ``--generate``: one scenario
     after another).
  3. Simulate the same scenario on the same lengths with a calibrated profile (``--profile``, or a quick
     calibration of exactly the scenario's models, cached; when measured, its passes alternate with
     blocks of the real steps; shapes outside the catalog get the lean grid of ``operating_points``),
     which never sees the validation runs. Comma-separated profiles (``quick`` naming that calibration,
     ``generic`` the quick generic calibration of this CPU, ``measure_generic``, its passes alternating
     with blocks of the real steps too) each predict the same measured steps.
  4. Compare the steady-state mean step time and each phase's mean span (warm-up steps excluded):
     error_pct = 100 x (predicted - measured) / measured.
  5. Find where generation's time goes (and, under intra-step streaming, the scorer's: each scorer call
     the executor timed, ``chunk_prefill`` or ``rescore``, priced alone at its shape, ``scoring_ops``): every generation operation the executor timed inside the real
     steps (a prefill call, a decode step, a ``generate()`` call; ``StepLog.op``, with its shape) is priced
     with the profile at that shape, exactly as the simulator prices it (``price_op``), and summed per
     operation (``operations``); the generate span not covered by any operation is host work between
     operations (token bookkeeping, the scorer handoff), which the simulator does not price. The
     other phases' calls (each reward, reference and critic forward piece, each training minibatch) are
     priced the same way (``phase_operations``, ``phase_ops``), each phase's first call apart.

Needs both sides (torch for the executor; pydantic and simpy for the simulator).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

import click

from calibrate.frameworks import FRAMEWORKS
from rlhfsim.contracts import PHASES
from rlhfsim.errors import RlhfsimError, ScenarioError

EXECUTOR_RUNTIMES = ("kv_decoder", "hf_generate")  # generation runtimes calibrate.executor runs


def cache_dir() -> Path:
    base = os.environ.get("RLHFSIM_CACHE_DIR") or str(Path.home() / ".cache" / "rlhfsim")
    return Path(base) / "validate"


def exec_config(sc, setup, device: str, steps: int, rollouts: list[tuple[int, int]], threads: int | None):
    """The executor's config for a scenario (schedules the executor runs: sync and fixed-knob oppo)."""
    from calibrate.executor import ExecConfig

    sched = sc.schedule
    intra = inter = False
    chunk, delta, keep_kv = 1, 0, True
    if sched.kind == "oppo":
        if sched.intra.adaptive is not None or sched.inter.adaptive is not None:
            raise ScenarioError("schedule", "expected fixed chunk size and delta for validation, got an adaptive block")
        if sched.intra.stream_reference_critic:
            raise ScenarioError("schedule.intra.stream_reference_critic", "expected false for validation (the executor streams to the reward model only), got true")
        intra = sched.intra.enabled and setup.rule_reward is None
        inter = sched.inter.enabled and sched.inter.delta > 0
        chunk, delta, keep_kv = sched.intra.chunk_tokens, sched.inter.delta if inter else 0, sched.inter.keep_kv
    elif sched.kind != "sync":
        raise ScenarioError("schedule.kind", f"expected sync or oppo for validation (the executor runs those), got {sched.kind!r}")
    runtime = sc.generation.resolved_runtime
    if runtime not in EXECUTOR_RUNTIMES:
        raise ScenarioError("generation.runtime", f"expected a runtime the executor runs ({', '.join(EXECUTOR_RUNTIMES)}; "
                            f"set it explicitly: the {sc.generation.engine} engine's default is {runtime}), got {runtime!r}")
    if setup.reward_max_tokens is not None:   # the simulator truncates as the frameworks do; the executor does not
        w = sc.workload
        raise ScenarioError("workload.max_response_tokens", (
            f"expected prompt + response within the reward model's {setup.reward_max_tokens} positions for validation "
            f"(the executor scores rows whole, it does not truncate them), got {w.max_prompt_tokens} + {w.max_response_tokens}"))
    if len(setup.pools) != 1 or setup.pools[0].gpus != 1:
        raise ScenarioError("placement", f"expected every role colocated on one device for validation, got {len(setup.pools)} pool(s) of {[p.gpus for p in setup.pools]} GPUs")
    m = sc.models
    cfg = ExecConfig(
        device=device, dtype=m.actor.dtype, actor=setup.shapes["actor"], critic=setup.shapes.get("critic"),
        reference=setup.shapes.get("reference"), reward=setup.shapes.get("reward"),
        rule_reward_s=setup.rule_reward.cpu_s_per_sample if setup.rule_reward else 0.0,
        algorithm=sc.algorithm.kind, group_size=sc.algorithm.group_size,
        prompts_per_step=sc.workload.prompts_per_step, ppo_epochs=sc.algorithm.ppo_epochs,
        minibatch_size=sc.algorithm.minibatch_size, engine=sc.generation.engine,
        max_batch=sc.generation.max_batch, schedule=sched.kind, intra=intra, chunk_tokens=chunk,
        inter=inter, delta=delta, keep_kv=keep_kv, steps=steps, rollouts=rollouts, seed=sc.seed,
        threads=threads, gen_runtime=runtime, reward_streaming=setup.reward_streaming, retokenize=setup.retokenize)
    check_exec_config(cfg)
    return cfg


# The scenario path behind each ExecConfig field exec_config sets from one (for the executor's own checks).
EXEC_PATHS = {"dtype": "models.actor.dtype", "algorithm": "algorithm.kind", "group_size": "algorithm.group_size",
              "prompts_per_step": "workload.prompts_per_step", "ppo_epochs": "algorithm.ppo_epochs",
              "minibatch_size": "algorithm.minibatch_size", "engine": "generation.engine",
              "max_batch": "generation.max_batch", "schedule": "schedule.kind", "chunk_tokens": "schedule.intra.chunk_tokens",
              "delta": "schedule.inter.delta", "keep_kv": "schedule.inter.keep_kv", "steps": "steps",
              "gen_runtime": "generation.runtime", "critic": "models.critic", "rule_reward_s": "models.reward.cpu_s_per_sample",
              "reward_streaming": "models.reward.streaming"}


def check_exec_config(cfg) -> None:
    """The executor's own checks of its config (``calibrate.executor.config.validate``), run now rather
    than when the executor starts (after any calibration), their ``ExecConfig.<field>`` named by the
    scenario path it comes from (``EXEC_PATHS``). The rollouts are drawn after (``prepare``): until then
    placeholders stand in for them (the executor checks the real ones when it starts)."""
    import dataclasses

    from calibrate.executor.config import validate as validate_exec

    try:
        validate_exec(dataclasses.replace(cfg, rollouts=cfg.rollouts or [(1, 1)] * cfg.rollouts_needed))
    except RlhfsimError as e:
        text = str(e)
        field, sep, rest = text.partition(": ")
        name = field.removeprefix("ExecConfig.")
        if not sep or not field.startswith("ExecConfig.") or name not in EXEC_PATHS:
            raise
        raise ScenarioError(EXEC_PATHS[name], rest.replace("gen_runtime", "generation.runtime")) from None


def executor_runtime(sc):
    """(the scenario validate runs, a note or None). A scenario that names no generation runtime, whose
    engine's default is one the executor does not run (``vllm`` for the continuous engine), is validated
    with the executor's runtime for that engine (``kv_decoder``): the executor runs it and the simulator
    prices it, and the note says so. A runtime the scenario names is kept (and refused by exec_config
    when the executor does not run it)."""
    from rlhfsim.costs.genruntimes import GEN_RUNTIMES
    from rlhfsim.sim.run import rebuild

    g = sc.generation
    if g.runtime is not None or g.resolved_runtime in EXECUTOR_RUNTIMES:
        return sc, None
    rt = next(r for r in EXECUTOR_RUNTIMES if GEN_RUNTIMES[r] in (g.engine, "any"))
    note = (f"{sc.name}: generation.runtime names none and the {g.engine} engine's default ({g.resolved_runtime}) is "
            f"not one the executor runs; validating with {rt}, measured and priced (name generation.runtime to choose)")
    return rebuild(sc, {"generation": {**g.model_dump(mode="json"), "runtime": rt}}), note


def draw_rollouts(setup, n: int) -> list[tuple[int, int]]:
    """The first n rollouts of the simulator's own stream for this scenario (same generator, same order)."""
    import numpy as np

    from rlhfsim.sim.rollouts import RolloutStream

    stream = RolloutStream(setup, np.random.default_rng([setup.scenario.seed, 0]))
    return [(r.prompt_len, r.response_len) for r in stream.take(n, 0)]


def calibration_plan(device: str, shapes: list, dtype: str, interference: list | None = None,
                     threads: int | None = None, points: dict | None = None) -> tuple[Path, dict | None]:
    """Where the quick calibration of exactly these model shapes is cached, and its grid overrides.
    Cached by device, shapes, dtype, torch version, thread count, grid and ``MEASUREMENT_VERSION``.
    ``interference``: (decode batch, decode context, chunk batch, chunk tokens) of the scenarios that
    stream chunks while decoding, so the slowdowns are measured where the prediction needs them rather
    than at the grid's default shape; ``points``: grid fields with the scenarios' operating points added
    (``operating_points``)."""
    import torch

    from calibrate import MEASUREMENT_VERSION

    grid = {k: [list(x) if isinstance(x, (list, tuple)) else x for x in v] if isinstance(v, list) else v
            for k, v in (points or {}).items()}
    if interference:
        grid["interference"] = [list(x) for x in sorted(set(interference))]
    grid = grid or None
    key = json.dumps([device, dtype, torch.__version__, sorted(s.name for s in shapes), grid, threads, MEASUREMENT_VERSION])
    return cache_dir() / f"profile-{hashlib.sha1(key.encode()).hexdigest()[:12]}.json", grid


def _partial(path: Path) -> Path:
    return path.with_name(path.stem + ".partial.json")


def calibrate_passes(device: str, shapes: list, dtype: str, path: Path, grid: dict | None, upto: int,
                     threads: int | None, progress: bool) -> None:
    """Measure passes 0 .. upto - 1 of the calibration cached at ``path`` into its partial journal (a
    pass already in the journal is not measured again, so an interrupted run resumes); ``finish``
    moves the result into place once the last pass is in."""
    from calibrate.devstate import pool_pass_probes, profile_probes
    from calibrate.run import run_calibration

    out = _partial(path)
    prior = profile_probes(json.loads(out.read_text())) if upto > 1 and out.is_file() else []
    run_calibration(device, gpu_name=None, models=shapes, runtimes=["eager"], quick=True, out=out,
                    resume=True, dtype=dtype, progress=progress, grid={**(grid or {}), "passes": upto}, threads=threads)
    pool_pass_probes(out, prior)


def finish_calibration(path: Path) -> None:
    from calibrate.journal import journal_path

    part = _partial(path)
    os.replace(journal_path(part), journal_path(path))
    os.replace(part, path)


def discard_calibration(path: Path) -> None:
    from calibrate.journal import journal_path

    for p in (path, journal_path(path), _partial(path), journal_path(_partial(path))):
        p.unlink(missing_ok=True)


OPERATING_SAMPLE = 256  # rollouts drawn from a scenario's stream to place its operating points


def _round(x: float, q: int = 16) -> int:
    return max(q, int(round(x / q)) * q)


LEAN_BASE_POINTS = 3   # lean calibration: base-grid points kept per operation (smallest, middle, largest)


def _thin(points, k: int = LEAN_BASE_POINTS) -> set:
    """k points of a base grid spanning it by size (batch x tokens): its smallest, its largest, and
    evenly spaced ones between."""
    pts = sorted(set(points), key=lambda x: (x[0] * x[1], x))
    if len(pts) <= k:
        return set(pts)
    return {pts[round(i * (len(pts) - 1) / (k - 1))] for i in range(k)}


def is_new_shape(shape) -> bool:
    from rlhfsim.models.catalog import CATALOG

    return CATALOG.get(shape.name) != shape


def operating_points(prepared, kind: str, lean: bool = False) -> dict:
    """Calibration grid fields extended with the shapes the scenarios run at (so the fits are measured
    where the predictions need them, not extrapolated from the default grid): per scenario, decode at
    ``max_batch`` rows with the mean cached context at mid-response and at the 90th-percentile response,
    the generation prefill (a static batch of padded prompts, or one prompt at a time when continuous),
    the forward passes (``max_batch`` rows padded to a typical sequence) and a training minibatch.
    Lengths are rounded to 16 tokens so near-identical scenarios share points.

    ``lean`` (a calibration of shapes no profile has seen, within minutes): of the base grid only
    ``LEAN_BASE_POINTS`` points per operation spanning it (the operating points are all kept); chunked
    scoring at the scenarios' chunk sizes only when one streams chunks (else one point), one batching
    strategy point; each decoder measured in the roles it plays (``Grid.actor_models``: generation and
    LM training for actor and reference shapes; ``Grid.critic_models``: value training for critic shapes,
    or the first actor's where no scenario has a critic); a reward-only shape is measured as a scorer;
    the measured cost terms at a few points (``_lean_roles``)."""
    import numpy as np

    from calibrate.grid import default_grid

    base = default_grid(kind, True)
    extra = {"decode": set(), "prefill": set(), "score": set(), "train": set(),
             "gen_prefill": set(), "gen_decode": set(), "handoff": set()}
    runtimes = set()
    for sc, setup, _, _ in prepared:
        used = draw_rollouts(setup, OPERATING_SAMPLE)   # not the run's own: the grid must not depend on --steps
        p = np.array([x for x, _ in used], dtype=float)
        r = np.array([y for _, y in used], dtype=float)
        mb = sc.generation.max_batch
        extra["decode"].add((mb, _round(p.mean() + r.mean() / 2)))
        extra["decode"].add((mb, _round(p.mean() + np.quantile(r, 0.9))))
        if sc.generation.engine == "static":
            extra["prefill"].add((mb, _round(np.quantile(p, 0.9))))
        else:
            extra["prefill"].add((1, _round(p.mean())))
        seq = _round(np.quantile(p + r, 0.75))
        extra["score"].add((mb, seq))
        extra["train"].add((sc.algorithm.minibatch_size, seq))
        rt = sc.generation.resolved_runtime
        if rt != "kv_decoder":
            # The runtime's own calls at the same operating points (calibrate.genbench).
            runtimes.add(rt)
            extra["gen_prefill"].add((mb, _round(np.quantile(p, 0.9))))
            extra["gen_decode"].add((mb, _round(p.mean() + r.mean() / 2)))
            extra["gen_decode"].add((mb, _round(p.mean() + np.quantile(r, 0.9))))
            sched = sc.schedule
            if sched.kind == "oppo" and sched.intra.enabled:
                k = sched.intra.chunk_tokens
                extra["handoff"].add((mb, _round(p.mean()), 4 * k, k))
    gen_keys = ("gen_prefill", "gen_decode", "handoff")
    basis = (lambda k: _thin(getattr(base, k))) if lean else (lambda k: set(getattr(base, k)))
    out = {k: sorted(basis(k) | v) for k, v in extra.items() if k not in gen_keys}
    # Only the runtimes the scenarios generate with (kv_decoder's points are the plain prefill/decode).
    out["gen_runtimes"] = sorted(runtimes)
    if runtimes:
        out.update({k: sorted(basis(k) | extra[k]) for k in gen_keys})
    if lean:
        out.update(_lean_roles(prepared, base))
    if kind == "cpu":
        # Three passes over the whole grid, samples pooled (calibrate.journal.merge_passes): a shared VM's
        # speed wanders from second to second and from minute to minute, and the real runs see its usual
        # speed, not the speed of the minute in which one operation's points happened to be measured.
        out.update(passes=3, point_budget_s=0.15)
    return out


def _lean_roles(prepared, base) -> dict:
    """The lean calibration's chunk, strategy and role fields (``operating_points``)."""
    actors, critics, chunks = set(), set(), set()
    for sc, setup, _, _ in prepared:
        actors.update(setup.shapes[r].name for r in ("actor", "reference") if r in setup.shapes)
        if "critic" in setup.shapes:
            critics.add(setup.shapes["critic"].name)
        sched = sc.schedule
        if sched.kind == "oppo" and sched.intra.enabled and sc.models.reward.kind == "model":
            chunks.add(sched.intra.chunk_tokens)
    first_actor = prepared[0][1].shapes["actor"].name
    out = {"actor_models": sorted(actors), "critic_models": sorted(critics) or [first_actor],
           "strategies": [min(base.strategies)]}
    # The measured cost terms (calibrate.sampling, calibrate.cpu.gemm, calibrate.cpu.widths), leanly: the sampling
    # tail at the base grid's three spanning points plus each actor's (max_batch, vocab); two matrices at
    # 1 and 2 rows, alone and cycled through the base grid's footprints; the widths of the trained models
    # between the base grid's narrowest and widest.
    sampling = _thin(base.sampling) | {(sc.generation.max_batch, setup.shapes["actor"].vocab) for sc, setup, _, _ in prepared}
    widths = {setup.shapes[r].hidden for _, setup, _, _ in prepared for r in ("actor", "critic") if r in setup.shapes}
    out.update(sampling=sorted(sampling), gemm=[(r, o, i) for o, i in ((1024, 256), (4096, 256)) for r in (1, 2)],
               gemm_footprints_mib=list(base.gemm_footprints_mib),
               widths=sorted(widths | ({min(base.widths), max(base.widths)} if base.widths else set())))
    if chunks:
        out.update(chunk_batches=[1], chunk_prefixes=[0, 128], chunk_sizes=sorted(chunks))
    else:
        out.update(chunk_batches=[1], chunk_prefixes=[0], chunk_sizes=[min(base.chunk_sizes)])
    return out


def corun_shape(sc, rollouts: list[tuple[int, int]]) -> tuple[int, int, int, int] | None:
    """The co-running configuration of a scenario that streams chunks during decode: the decode batch
    (max_batch), the mean cached context while decoding (prompt + half the response), the chunk batch
    and the chunk size."""
    sched = sc.schedule
    if not _streams_to_reward_model(sc):
        return None
    sample = rollouts[:OPERATING_SAMPLE]
    ctx = sum(p + r / 2 for p, r in sample) / len(sample)
    return (sc.generation.max_batch, _round(ctx), sched.intra.max_chunk_batch, sched.intra.chunk_tokens)


def handover_shape(sc, setup, rollouts: list[tuple[int, int]]) -> tuple | None:
    """The hand-over co-running point of a scenario that streams chunks into a reward model while
    decoding (``Grid.handover``, ``calibrate.cpu.corun``): its generation runtime, actor and reward shapes,
    the decode batch (max_batch), the mean prompt and the chunk size."""
    if not _streams_to_reward_model(sc):
        return None
    sample = rollouts[:OPERATING_SAMPLE]
    prompt = sum(p for p, _ in sample) / len(sample)
    return (sc.generation.resolved_runtime, setup.shapes["actor"].name, setup.shapes["reward"].name,
            sc.generation.max_batch, _round(prompt), sc.schedule.intra.chunk_tokens)


def _streams_to_reward_model(sc) -> bool:
    """Does the scenario stream chunks into a reward model while decoding (OPPO intra-step)?"""
    sched = sc.schedule
    return sched.kind == "oppo" and sched.intra.enabled and sc.models.reward.kind == "model"


def _mean_phases(phase_dicts: list[dict]) -> dict[str, float]:
    out = {}
    for ph in PHASES:
        vals = [d.get(ph) for d in phase_dicts]
        if any(v is not None for v in vals):
            out[ph] = statistics.fmean(v or 0.0 for v in vals)
    return out


def _err(pred: float, meas: float) -> float | None:
    return 100.0 * (pred - meas) / meas if meas > 0 else None


def price_op(cost, model, dtype: str, runtime: str, name: str, shape: dict, logprobs: bool = False) -> float:
    """The profile's price of one in-step generation operation (``StepLog.op``), with the calls the
    simulator's engines make for the same work (tp 1, no co-running scoring). ``logprobs``: the sampled
    tokens' log-probs are recorded (the executor always records them: ``generation.sampling_logprobs``)."""
    lp = logprobs
    if name == "prefill":
        return cost.forward_s(model, dtype, shape["n_tokens"], shape["n_seqs"], 1, op="prefill", head="lm",
                              gen_runtime=runtime, gen_logprobs=lp)
    if name == "decode":
        return cost.decode_steps_s(model, dtype, shape["batch"], shape["kv0"], 1, runtime=runtime, logprobs=lp)
    if name == "generate_call":
        b, w, k = shape["rows"], shape["width"], shape["steps"]
        # a left-padded batch (rows of different contexts) pays the padding mask at every decode step
        pad = cost.pad_step_s(runtime, b) if shape.get("padded") else 0.0
        if shape["first"]:   # one call: its host overhead, the padded prefill (first token), k - 1 steps
            return (cost.call_overhead_s(runtime) + (cost.pad_prefill_s(runtime) if shape.get("padded") else 0.0)
                    + cost.forward_s(model, dtype, b * w, b, 1, op="prefill", head="lm", gen_runtime=runtime, gen_logprobs=lp)
                    + cost.decode_steps_s(model, dtype, b, b * (w + 1), k - 1, runtime=runtime, logprobs=lp) + (k - 1) * pad)
        # a continuation under streaming: the chunk handoff, then k steps on the cached prefix
        return (cost.handoff_s(runtime, b) + cost.decode_steps_s(model, dtype, b, b * w, k, runtime=runtime, logprobs=lp)
                + k * pad)
    raise RlhfsimError(f"price_op: expected prefill, decode or generate_call, got {name!r}")


SCORER_OPS = ("chunk_prefill", "rescore")   # the scorer thread's calls under intra-step streaming (StepLog.op)
PHASE_OPS = ("forward_call", "train_call")  # the sequential phases' calls: reward, reference, critic, training


def price_scorer_op(cost, setup, name: str, shape: dict) -> float:
    """The profile's price of one scorer call of the reward model, timed by the scorer thread, exactly as
    the simulator's chunk scorer prices it alone (``rlhfsim.sim.streaming``: no co-running slowdown):
    ``chunk_prefill`` on a cached prefix (incremental) or ``rescore`` from scratch (reencode,
    final_only), plus re-tokenizing the call's tokens when the reward model reads another tokenizer."""
    from rlhfsim.sim.streaming import STREAMING

    from rlhfsim.sim.simulation import forward_runtime

    rm, dtype = setup.shapes["reward"], setup.dtypes["reward"]
    runtime = forward_runtime(cost, "reward", setup.scenario)
    strategy = STREAMING["incremental" if name == "chunk_prefill" else "reencode"]
    t = strategy.price(cost, rm, dtype, shape["tokens"], 1, shape.get("prefix", 0), 1, "value", runtime)[0]
    return t + (cost.retokenize_s(1, shape["tokens"]) if shape.get("retokenize") else 0.0)


def _op_row(calls: int, measured_s: float, predicted_s: float, steps: int) -> dict:
    """One in-step operation's row over ``steps`` steady steps: calls and seconds per step, ms per call,
    the error."""
    return {"calls_per_step": calls / steps, "measured_s": measured_s / steps, "predicted_s": predicted_s / steps,
            "measured_ms_per_call": 1e3 * measured_s / calls, "predicted_ms_per_call": 1e3 * predicted_s / calls,
            "error_pct": _err(predicted_s, measured_s)}


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
                a = acc.setdefault(name, [0, 0.0, 0.0])
                a[0] += 1
                a[1] += secs
                a[2] += price_scorer_op(cost, setup, name, shape)
    _, _, slow, add, _ = cost.corun(setup.scenario.generation.resolved_runtime, setup.shapes["actor"],
                                    setup.shapes.get("reward"))
    return {"operations": {name: _op_row(c, m, p, n) for name, (c, m, p) in sorted(acc.items())},
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
            a = acc.setdefault(name, [0, 0.0, 0.0])
            a[0] += 1
            a[1] += secs
            a[2] += price_op(cost, model, dtype, runtime, name, shape, setup.scenario.generation.sampling_logprobs)
    ops = {name: _op_row(c, m, p, n) for name, (c, m, p) in sorted(acc.items())}
    span = statistics.fmean(r.phases["generate"][1] - r.phases["generate"][0] for r in steps) if steps else 0.0
    return {"runtime": runtime, "operations": ops,
            "outside_ops_s": span - sum(v["measured_s"] for v in ops.values()), "generate_span_s": span}


def price_phase_op(cost, setup, name: str, shape: dict) -> float:
    """The profile's price of one call of a sequential phase (``PHASE_OPS``), exactly as the simulator
    prices it (``rlhfsim.sim.stages``): a forward call (reward, reference, critic values) is the padded
    pass over ``rows`` x ``width`` tokens with all logits, plus the framework's host time per piece; a
    training call (one minibatch: forward, loss, backward, AdamW) is ``train`` at that shape, the host time
    per piece and the optimizer step."""
    from rlhfsim.sim.simulation import forward_runtime

    role = shape["role"]
    model, dtype, head = setup.shapes[role], setup.dtypes[role], setup.head(role)
    tokens, rows = shape["rows"] * shape["width"], shape["rows"]
    if name == "forward_call":   # a reward forward call is timed only with a reward model (not a rule)
        runtime = forward_runtime(cost, role, setup.scenario)
        return (cost.forward_parts(model, dtype, tokens, rows, 1, op="prefill", runtime=runtime, head=head,
                                   all_logits=True)[0] + cost.step_scalar("microbatch_forward_s"))
    if name == "train_call":
        return (cost.train_parts(model, dtype, tokens, rows, 1, head)[0] + cost.step_scalar("microbatch_train_s")
                + cost.optimizer_parts(model, dtype, 1, 1, head, False)[0])
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
    for r in steps:
        for name, secs, shape in r.ops:
            if name in PHASE_OPS:
                a = acc.setdefault((shape["phase"], shape["index"] == 0), [0, 0.0, 0.0, 0, 0])
                a[0] += 1
                a[1] += secs
                a[2] += price_phase_op(cost, setup, name, shape)
                a[3] += shape["rows"]
                a[4] += shape["rows"] * shape["width"]
    out = {}
    for ph in PHASES:
        first, other = acc.get((ph, True)), acc.get((ph, False))
        if first is None and other is None:
            continue
        both = [sum(x) for x in zip(*(a for a in (first, other) if a is not None))]
        out[ph] = {**_op_row(*both[:3], n),
                   "first_call_error_pct": _err(first[2], first[1]) if first else None,
                   "other_calls_error_pct": _err(other[2], other[1]) if other else None,
                   "rows_per_call": both[3] / both[0], "tokens_per_call": both[4] / both[0]}
    return out


def allocator(steps: list) -> dict:
    """The CUDA caching allocator's counters each phase moved, per measured step (the executor's
    ``StepLog.allocs``, ``calibrate.executor.timing.ALLOC_KEYS``); empty off CUDA. Nothing prices them:
    they say whether a phase mapped and returned device memory while it ran (docs/validation.md "GPU")."""
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
    from rlhfsim.costs.flops import page_fault_s

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


def prepare(path: Path, device: str, steps: int | None, threads: int | None, overrides: list | None = None):
    """Scenario, setup, the executor config and the shared rollout list of one validation scenario."""
    from rlhfsim.scenario import build_setup, load_scenario
    from rlhfsim.sim.run import rebuild

    sc = load_scenario(path, overrides=overrides)
    sc, note = executor_runtime(sc)
    if note:
        click.echo(f"note: {note}", err=True)
    if not sc.generation.sampling_logprobs:
        # the executor records every sampled token's log-prob (its PPO ratio's old log-probs), in every runtime
        sc = rebuild(sc, {"generation": {**sc.generation.model_dump(mode="json"), "sampling_logprobs": True}})
    if steps is not None:
        sc = rebuild(sc, {"steps": steps, "warmup_steps": min(sc.warmup_steps, steps - 1)})
    setup = build_setup(sc)
    if device == "cpu" and setup.gpu.kind != "cpu":
        raise ScenarioError("cluster.gpu", f"expected cpu for --device cpu validation, got {sc.cluster.gpu!r}")
    cfg = exec_config(sc, setup, device, sc.steps, [], threads)
    cfg.rollouts = draw_rollouts(setup, cfg.rollouts_needed + 8 * setup.rollouts_per_step)
    return sc, setup, cfg, cfg.rollouts


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


QUICK = "quick"   # --profile name of validate's own quick calibration of the scenarios' models
GENERIC = "generic"   # --profile name of the generic quick calibration measured now, its passes between blocks of the steps


# The generic calibration under validate: the bundled quick grid in GENERIC_PASSES passes whose samples are
# pooled (calibrate.journal.merge_passes), each with a third of the quick grid's point budget, so that it
# takes about as long as one pass at the full budget, and so that its passes can alternate with blocks of
# the real steps (``validate``): both sides then time the machine over the same stretch of the run.
GENERIC_PASSES = 3
GENERIC_POINT_BUDGET_S = 0.1


def generic_runtimes(prepared: list) -> list[str]:
    """The scoring runtimes the generic calibration measures for these scenarios: eager (the reference,
    critic and reward passes the executor runs in the training framework) and any runtime a scenario
    names for its reward model; none of the others prices anything in the validated steps."""
    from rlhfsim.sim.simulation import scoring_runtime

    return sorted({"eager"} | {r for sc, _, _, _ in prepared for r in (scoring_runtime(sc),) if r})


def measure_generic(device: str, threads: int | None, out: Path, progress: bool = True, *, models: list | None = None,
                    runtimes: list[str] | None = None, grid: dict | None = None,
                    handover: tuple[int, int, int] = (4, 64, 32), upto: int | None = None) -> str:
    """``--profile generic``: the quick generic calibration of this device (``rlhfsim calibrate --device cpu
    --quick``: the default quick grid on the catalog's models, then the hand-over pattern of each decoder
    it measured, as the bundled ``cpu`` profile is made), measured in ``GENERIC_PASSES`` passes at
    ``GENERIC_POINT_BUDGET_S`` per point and pass. Blind to the scenarios (no operating point of theirs is
    measured), in the state of the machine the steps run in: on a shared host whose speed moves by 10-30%
    between hours, a profile measured hours before prices another machine (docs/validation.md).
    ``upto``: measure passes 0 .. upto - 1 (those already in the journal are not measured again), so the
    passes can alternate with blocks of the real steps; the hand-over pattern is measured with the last
    pass (default: all of them now). Written to ``out`` (the ``generic-profile.json`` of a ``--generate``
    directory, else a time-stamped file in the cache), its journals beside it (an interrupted one resumes
    when ``out`` is given again; ``python -m calibrate calibrate --from-journal`` builds a profile of what it
    holds). ``models``, ``runtimes`` (scoring runtimes; default all), ``grid`` (over the defaults above) and
    ``handover`` (batch, prompt, chunk) replace the defaults (tests). Returns the profile's path."""
    if device != "cpu":
        raise RlhfsimError(f"--profile {GENERIC}: expected --device cpu (a GPU's generic calibration is "
                           f"`rlhfsim calibrate --gpu NAME`), got --device {device}")
    from calibrate.devstate import pool_pass_probes, profile_probes
    from calibrate.extend import _profile_decoders, extend_handover, extension_journal
    from calibrate.journal import journal_path
    from calibrate.run import run_calibration

    g = {"passes": GENERIC_PASSES, "point_budget_s": GENERIC_POINT_BUDGET_S, **(grid or {})}
    passes = int(g["passes"])
    upto = passes if upto is None else max(1, min(int(upto), passes))
    out.parent.mkdir(parents=True, exist_ok=True)
    if progress:
        click.echo(f"generic calibration of this device (quick grid, catalog models), pass {upto} of {passes}"
                   f"{', then the hand-over pattern' if upto == passes else ''}: {out}", err=True)
    prior = profile_probes(json.loads(out.read_text())) if upto > 1 and out.is_file() else []
    doc = run_calibration(device, quick=True, out=out, resume=journal_path(out).is_file(), progress=progress, models=models,
                          runtimes=runtimes, grid={**g, "passes": upto}, threads=threads, name=GENERIC,
                          command=f"rlhfsim validate --profile {GENERIC}")
    pool_pass_probes(out, prior)
    if upto == passes:
        decoders = [m.name for m in _profile_decoders(doc)]
        batch, prompt, chunk = handover
        extend_handover(out, decoders, threads or doc["device"].get("threads") or 1, batch=batch, prompt=prompt,
                        chunk=chunk, resume=extension_journal(out, "handover").is_file())
    return str(out)


def calibration_groups(prepared: list) -> list[list]:
    """Scenarios sharing one quick calibration: all of them together, unless one has a shape outside
    the catalog; then each scenario is calibrated on its own (its own shapes at its own operating
    points: one calibration of every drawn shape at every scenario's points grows with the square of
    the number of scenarios)."""
    if any(is_new_shape(s) for _, setup, _, _ in prepared for s in setup.shapes.values()):
        return [[p] for p in prepared]
    return [prepared]


@dataclass(frozen=True)
class QuickPlan:
    """One quick calibration: its model shapes, dtype, cache path, grid overrides, and whether it is on
    the lean grid (shapes no profile has seen)."""

    shapes: list
    dtype: str
    path: Path
    grid: dict | None
    lean: bool

    @property
    def passes(self) -> int:
        return int((self.grid or {}).get("passes", 1))


def quick_plan(group: list, device: str, threads: int | None) -> QuickPlan:
    """The quick calibration of these scenarios' models at their operating points."""
    shapes = {s.name: s for _, setup, _, _ in group for r, s in setup.shapes.items() if r != "rollout"}
    dtypes = {sc.models.actor.dtype for sc, _, _, _ in group}
    if len(dtypes) != 1:
        raise ScenarioError("models.actor.dtype", f"expected one dtype across the validated scenarios (one calibration), got {sorted(dtypes)}")
    dtype = dtypes.pop()
    corun, handover = [], set()
    for sc, setup, _, _ in group:
        if _streams_to_reward_model(sc):
            used = draw_rollouts(setup, OPERATING_SAMPLE)   # one draw for both co-running points
            corun += [c for c in (corun_shape(sc, used),) if c is not None]
            handover.add(handover_shape(sc, setup, used))
    # Calibrate with the thread count the real runs use: CPU kernels scale with it. Shapes no profile
    # has seen get the lean grid, so a new scenario is calibrated within minutes.
    lean = any(is_new_shape(s) for s in shapes.values())
    # Co-running in the hand-over pattern only where a scenario streams (none otherwise).
    points = {**operating_points(group, "cuda" if device == "cuda" else "cpu", lean), "handover": sorted(handover)}
    path, grid = calibration_plan(device, list(shapes.values()), dtype, corun, threads, points)
    return QuickPlan(list(shapes.values()), dtype, path, grid, lean)


def profile_list(profile: str | None) -> list[str]:
    """``--profile``: comma-separated names or paths; ``quick`` (or none given) is the quick calibration."""
    names = [p.strip() for p in (profile or QUICK).split(",") if p.strip()]
    if not names or len(set(names)) != len(names):
        raise RlhfsimError(f"--profile: expected distinct comma-separated profile names or paths, got {profile!r}")
    return names


def step_blocks(n: int, passes: int) -> list[range]:
    """The ``passes + 1`` blocks of ``n`` scenarios run one after another around ``passes`` calibration
    passes (block k before pass k, the last after the last pass), as even as whole scenarios allow."""
    return [range(round(k * n / (passes + 1)), round((k + 1) * n / (passes + 1))) for k in range(passes + 1)]


def visit_blocks(n: int, visits: int, passes: int) -> list[list[tuple[int, int]]]:
    """One scenario after another, each run ``visits`` times: the ``(scenario, visit)`` runs in visit-major
    order (every scenario's first visit, then every second one, ...) split into the ``passes + 1`` blocks
    around the calibration passes as evenly as whole runs allow (``step_blocks``). With one visit per
    block, every block runs every scenario once, so each scenario's measured steps sample the machine over
    the same stretch of time as the calibration's pooled passes."""
    order = [(j, v) for v in range(visits) for j in range(n)]
    return [[order[i] for i in b] for b in step_blocks(len(order), passes)]


def check_visits(visits: int | None, sequential: bool) -> None:
    """More than one visit needs one scenario after another (``--visits``, ``validate``)."""
    if visits is not None and visits > 1 and not sequential:
        raise RlhfsimError(f"--visits: expected 1 with round-robin steps (every executor stays in memory and its steps "
                           f"are already spread over the run), got {visits}; add --sequential")


def validate(scenarios: list[Path], device: str, profile: str | None, steps: int | None,
             threads: int | None = None, progress: bool = True, sequential: bool = False,
             recalibrate: bool = False, overrides: list | None = None, generic_out: Path | None = None,
             visits: int | None = None) -> dict:
    """Measured against predicted for each scenario (see the module docstring). The scenarios' real
    steps run round-robin (``RoundRobin``) unless ``sequential``: one scenario after another keeps
    one executor in memory at a time, as a job runs alone (and for models too large to hold every
    scenario's at once); round-robin steps were measured a few percent slower than alone (0.95-1.14x,
    median 1.03x, back to back on one set; docs/validation.md "2026-12-01, later"), which a profile
    measured in its own process does not contain. ``steps_run`` in the document says which. Without
    ``profile`` (or with ``quick`` among its comma-separated names), the cached quick calibration is
    used; when there is none (or ``recalibrate``), it is measured here. Several profiles predict the same
    measured steps: the document has the first one's results (``scenarios``, ``median_abs_error_pct``) and
    each further one's under ``other_profiles``, as ``validate --framework trl`` has. ``generic`` among the
    profiles is measured here too (``measure_generic``, to ``generic_out`` or the cache). The passes of
    every calibration measured here alternate with blocks of the real steps (P passes, P + 1 blocks: one
    before the first pass, one after the last), in either order of running the steps. One scenario after
    another, each scenario runs ``visits`` times (default: once per block, P + 1; each visit a fresh
    executor running the scenario's steps from the start, ``visit_blocks``), and its measured steps are
    those of every visit: a scenario's steps all taken in one 10-second window measure that window's
    machine (docs/validation.md, "2026-12-03, fifth session")."""
    profiles = profile_list(profile)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise RlhfsimError("--device: expected a CUDA device, found none (torch.cuda.is_available() is False)")
    if device == "cpu" and threads is None:
        import torch

        threads = torch.get_num_threads()   # explicit, so the cached calibration is keyed by it
    prepared = [prepare(p, device, steps, threads, overrides) for p in scenarios]
    from calibrate.executor import RoundRobin, run_steps

    from calibrate.devstate import host_probe, state_probe

    cfgs, names = [cfg for _, _, cfg, _ in prepared], [sc.name for sc, _, _, _ in prepared]
    generic_path = None
    passes: list = []   # per calibration measured in this run, a function measuring its pass k (k < its passes)
    if GENERIC in profiles:
        import time

        gen_out = generic_out or cache_dir() / "generic" / f"generic-{time.strftime('%Y%m%d-%H%M%S')}.json"
        generic_path = str(gen_out)
        rts = generic_runtimes(prepared)
        passes.append((GENERIC_PASSES, lambda k: measure_generic(device, threads, gen_out, progress, runtimes=rts, upto=k + 1)))
    quick_paths: list[str] = []
    todo: list[QuickPlan] = []
    if QUICK in profiles:
        groups = calibration_groups(prepared)
        plans = [quick_plan(group, device, threads) for group in groups]
        if recalibrate:
            for pl in plans:
                discard_calibration(pl.path)
        todo = list({pl.path: pl for pl in plans if not pl.path.is_file()}.values())   # one per cached file
        if todo:
            if progress:
                click.echo(f"quick calibration: {len(todo)} calibration(s) of {sum(len(pl.shapes) for pl in todo)} model shape(s) in all, "
                           f"{sum(pl.lean for pl in todo)} of them on the lean grid (shapes no profile has seen), "
                           f"{max(pl.passes for pl in todo)} pass(es)", err=True)
            for pl in todo:
                passes.append((pl.passes, lambda k, pl=pl: calibrate_passes(device, pl.shapes, pl.dtype, pl.path, pl.grid,
                                                                            k + 1, threads, progress)))
        by_scenario = {id(p): str(pl.path) for group, pl in zip(groups, plans) for p in group}
        quick_paths = [by_scenario[id(p)] for p in prepared]
    n_passes = max((n for n, _ in passes), default=0)
    check_visits(visits, sequential)
    if visits is None:
        visits = n_passes + 1 if sequential else 1
    if n_passes and progress:
        click.echo(f"{n_passes} calibration pass(es) alternating with {n_passes + 1} block(s) of the real steps", err=True)

    def measure_pass(k: int) -> None:
        for n, fn in passes:
            if k < n:
                fn(k)

    # The calibrations measured here (the generic one, the quick one) alternate with blocks of the real
    # steps, the first block before the first pass and the last after the last, so that on a machine
    # whose speed drifts from minute to minute both sides are measured over the same stretch of time
    # (docs/validation.md, "How a run is made").
    probes = [state_probe(threads)] if device == "cpu" else []
    hosts = [] if device == "cpu" else [host_probe(device)]   # a GPU's host: before and after the steps
    around: list[list[dict]] = []   # --sequential on CPU: per scenario, the state probes just before and after each visit
    if sequential:
        measured: list[list] = [[None] * visits for _ in cfgs]   # per scenario, per visit: its StepResults
        around = [[] for _ in cfgs]   # per scenario, the probes just before and after each of its visits
        if progress and visits > 1:
            click.echo(f"each scenario runs {visits} times (visits), its steps from the start each time", err=True)
        for k, block in enumerate(visit_blocks(len(cfgs), visits, n_passes)):
            if k:
                measure_pass(k - 1)
            for j, v in block:
                before = state_probe(threads) if probes else None
                measured[j][v] = run_steps(cfgs[j], progress=progress)
                if probes:
                    around[j] += [before, state_probe(threads)]
    else:
        with RoundRobin(cfgs, progress, names) as rr:
            for k in range(n_passes + 1):
                if k:
                    measure_pass(k - 1)
                rr.run(round((k + 1) * rr.steps / (n_passes + 1)))
            measured = [[r] for r in rr.results]
    for pl in todo:
        finish_calibration(pl.path)

    def profile_of(name: str, j: int) -> str:
        return quick_paths[j] if name == QUICK else generic_path if name == GENERIC else name

    blocks = [{"profile": name, **error_block([validate_scenario(p, profile_of(name, j), m)
                                               for j, (p, m) in enumerate(zip(prepared, measured))])}
              for name in profiles]
    doc = {"device": device, "steps_run": "sequential" if sequential else "round-robin", **blocks[0],
           "other_profiles": blocks[1:]}
    if generic_path is not None:
        doc["generic_profile"] = generic_path
    if hosts:
        hosts.append(host_probe(device))
        doc["host_probes"] = hosts
        if progress:
            click.echo("host dispatch rate before / after the steps (thousand operator calls/s): CPU "
                       + " / ".join(f"{h['dispatch_kops_s']:.0f}" for h in hosts) + f", {device} "
                       + " / ".join(f"{h['device_dispatch_kops_s']:.0f}" for h in hosts), err=True)
    if probes:
        probes.append(state_probe(threads))
        doc["device_check"] = device_checks([profile_of(name, j) for name in profiles for j in range(len(prepared))], probes)
        if around:
            scenario_device_ratios(doc, profile_of, around)
        from calibrate.devstate import TOLERANCE

        mark_inconclusive(doc, [[profile_of(name, j) for j in range(len(prepared))] for name in profiles], TOLERANCE)
        for w in doc["device_check"]["warnings"]:
            click.echo(f"warning: {w}", err=True)
    return doc


def device_checks(refs: list[str], probes: list[dict]) -> dict:
    """``device_check`` of a validation on CPU: the device state probes taken before and after the real
    steps (``calibrate.devstate``) and, per distinct profile, its comparison with them."""
    from calibrate.devstate import compare
    from rlhfsim.costs.profile import load_profile

    per = [{"ref": ref, **compare(load_profile(ref), probes)} for ref in dict.fromkeys(refs)]
    return {"probes": probes, "profiles": per, "warnings": [w for c in per for w in c["warnings"]]}


def mark_inconclusive(doc: dict, refs: list[list[str]], tolerance: float) -> None:
    """A scenario's error measures its profile only when the steps ran on the machine the profile priced:
    its row gets ``conclusive: false`` and ``inconclusive_reason`` when the device check (``device_check``:
    the state probes around the steps against the profile's own, ``calibrate.devstate.compare``) found
    another CPU model, or a rate of this machine that moved by more than ``tolerance`` (now / then; the
    scenario's own ``device_ratios`` when it has them, else the run's). A run whose memory rates read
    0.57-0.84x its cached calibration's turned a -23% error into +9% after recalibrating in the same
    window (issue 48): such an error describes the machine's state, not the model. ``refs``: per profile
    block (the document's, then ``other_profiles``), the profile reference of each scenario. Each block
    gets ``inconclusive_scenarios`` and the median |error| over its conclusive scenarios."""
    checks = {c["ref"]: c for c in doc["device_check"]["profiles"]}
    for block, block_refs in zip([doc, *doc["other_profiles"]], refs):
        for s, ref in zip(block["scenarios"], block_refs):
            c = checks[ref]
            ratios = s.get("device_ratios") or c["ratios"]
            moved = {k: r for k, r in ratios.items() if abs(r - 1) > tolerance}
            reasons = []
            if c["same_cpu_model"] is False:
                reasons.append(f"profile measured on {c['profile_cpu_model']!r}, this machine is {c['local_cpu_model']!r}")
            if moved:
                reasons.append("this machine's rates now / the profile's: " + ", ".join(f"{k} x{r:.2f}" for k, r in moved.items())
                               + f" (beyond {tolerance:.0%}; recalibrate in this state: --recalibrate)")
            s["conclusive"] = not reasons
            s["inconclusive_reason"] = "; ".join(reasons) or None
        errs = [abs(s["error_pct"]) for s in block["scenarios"] if s["conclusive"] and s["error_pct"] is not None]
        block["inconclusive_scenarios"] = sum(not s["conclusive"] for s in block["scenarios"])
        block["median_abs_error_pct_conclusive"] = statistics.median(errs) if errs else None


def scenario_device_ratios(doc: dict, profile_of, around: list[list[dict]]) -> None:
    """One scenario after another: each scenario's ``device_ratios``, the device check of its profile
    against the probes taken just before and just after its own steps (``around``: per scenario, a pair
    per visit, their medians), so a scenario measured in a slow minute of a shared machine says so next to its error.
    The probe takes 0.15 s: a burst, not the minute's average."""
    from calibrate.devstate import compare
    from rlhfsim.costs.profile import load_profile

    loaded: dict[str, dict] = {}
    for block in [doc, *doc["other_profiles"]]:
        name = block["profile"]
        for j, s in enumerate(block["scenarios"]):
            ref = profile_of(name, j)
            prof = loaded.setdefault(ref, load_profile(ref))
            s["device_ratios"] = compare(prof, list(around[j]))["ratios"]   # medians over its visits' probes


def error_block(rows: list[dict]) -> dict:
    """Per-scenario rows with the median and largest |step-time error| over them."""
    errs = [abs(s["error_pct"]) for s in rows if s["error_pct"] is not None]
    by_phase = {ph: [abs(s["phases"][ph]["error_pct"]) for s in rows
                     if ph in s["phases"] and s["phases"][ph]["error_pct"] is not None] for ph in PHASES}
    return {"scenarios": rows, "median_abs_error_pct": statistics.median(errs) if errs else None,
            "max_abs_error_pct": max(errs) if errs else None,
            "phase_median_abs_error_pct": {ph: statistics.median(v) for ph, v in by_phase.items() if v}}


def print_table(doc: dict) -> None:
    from rich.console import Console

    c = Console()
    blocks = [doc] + doc.get("other_profiles", [])
    for b in blocks:
        _print_block(c, b)
    for b in blocks:
        if b["median_abs_error_pct"] is not None:
            n_bad = b.get("inconclusive_scenarios", 0)
            tail = ""
            if n_bad:
                good = b["median_abs_error_pct_conclusive"]
                tail = (f"; {n_bad} inconclusive (the machine ran at other rates than the profile's)"
                        + (f", median over the other {len(b['scenarios']) - n_bad}: {good:.1f}%" if good is not None else ""))
            c.print(f"profile {b['profile']}: median |step-time error| over {len(b['scenarios'])} scenario(s): "
                    f"{b['median_abs_error_pct']:.1f}%, max {b['max_abs_error_pct']:.1f}%" + tail)
    if doc.get("steps_run"):
        c.print(f"real steps run {doc['steps_run']}" + (" (one executor in memory at a time, as a job runs alone)"
                                                       if doc["steps_run"] == "sequential" else
                                                       " (every scenario's executor in memory; slower than a job alone)"))
    g = doc.get("generated")
    if g:
        c.print(f"generated set: seed {g['seed']}, {g['n']} scenario(s) in {g['dir']} ({g['redraws']} re-draw(s)); rerun: {g['rerun']}")


def _print_block(c, doc: dict) -> None:
    from rich.table import Table

    for s in doc["scenarios"]:
        nv = s.get("visits", 1)
        t = Table(title=f"{s['name']}  ({s['steps']} steps, first {s['warmup_steps']} excluded"
                        + (f"; {nv} visits" if nv > 1 else "") + f")  profile {s['profile']}")
        for col in ("", "measured s", "predicted s", "error"):
            t.add_column(col, justify="right" if col else "left")
        inconclusive = s.get("conclusive") is False
        t.add_row("[bold]step[/bold]", f"{s['measured_step_time_s']:.3f}", f"{s['predicted_step_time_s']:.3f}",
                  f"{s['error_pct']:+.1f}%" + (" [red]inconclusive[/red]" if inconclusive else ""))
        if nv > 1:
            t.add_row("step, each visit", " ".join(f"{x:.3f}" for x in s["measured_step_time_s_visits"]), "",
                      " ".join(f"{x:+.1f}%" for x in s["error_pct_visits"]))
        lo, hi = s["predicted_step_time_s_interval"]
        t.add_row(f"{100 * s['interval_level']:.0f}% interval ({s['interval_source']})", "", f"{lo:.3f}-{hi:.3f}",
                  "inside" if s["inside_interval"] else "[red]outside[/red]")
        for ph, v in s["phases"].items():
            e = "-" if v["error_pct"] is None else f"{v['error_pct']:+.1f}%"
            t.add_row(ph, f"{v['measured_s']:.3f}", f"{v['predicted_s']:.3f}", e)
        c.print(t)
        if inconclusive:
            c.print(f"[red]inconclusive[/red]: the error above describes the machine's state, not the model: {s['inconclusive_reason']}")
        g = s.get("generation_ops")
        if g and g["operations"]:
            t = _ops_table(f"generation inside the step ({g['runtime']}; per step; priced alone, no co-running scoring)",
                           g["operations"])
            t.add_row("host work between operations", "", f"{g['outside_ops_s']:.3f}", "0.000 (not priced)", "", "", "")
            c.print(t)
        g = s.get("scoring_ops")
        if g and g["operations"]:
            add = g.get("prefill_added_s") or 0.0
            c.print(_ops_table(f"scorer calls inside the step (per step; priced alone: the simulator multiplies a call "
                               f"that starts while decode runs by prefill_slowdown {g['prefill_slowdown']:.2f}"
                               + (f" and adds {1e3 * add:.2f} ms" if add else "") + ")", g["operations"]))
        g = s.get("phase_ops")
        if g:
            c.print(_ops_table("the other phases' calls inside the step (per step; each priced alone at its own shape; "
                               "error of a phase's first call / of the others)", g, split=True))
        pf = s.get("page_faults")
        if pf:
            t = Table(title="fresh pages faulted in by the minibatches (per step; calibrate.cpu.pagefaults)")
            for col in ("phase", "minibatches", "measured MiB", "priced MiB", "measured at the profile's rate s"):
                t.add_column(col, justify="left" if col == "phase" else "right")
            for ph, v in pf.items():
                rate = "-" if v["measured_s_at_profile_rate"] is None else f"{v['measured_s_at_profile_rate']:.3f}"
                t.add_row(ph, f"{v['minibatches_per_step']:.1f}", f"{v['measured_mib']:.1f}", f"{v['priced_mib']:.1f}", rate)
            c.print(t)


def _ops_table(title: str, ops: dict, split: bool = False):
    """One row per in-step operation: calls per step, measured and predicted seconds, error, ms per call
    (``split``: and the error of each phase's first call and of its other calls, ``phase_operations``)."""
    from rich.table import Table

    def pct(x):
        return "-" if x is None else f"{x:+.1f}%"

    t = Table(title=title)
    cols = ["operation", "calls", "measured s", "predicted s", "error", "measured ms/call", "predicted ms/call"]
    for col in cols + (["first call", "other calls"] if split else []):
        t.add_column(col, justify="left" if col == "operation" else "right")
    for name, v in ops.items():
        row = [name, f"{v['calls_per_step']:.1f}", f"{v['measured_s']:.3f}", f"{v['predicted_s']:.3f}", pct(v["error_pct"]),
               f"{v['measured_ms_per_call']:.2f}", f"{v['predicted_ms_per_call']:.2f}"]
        if split:
            row += [pct(v["first_call_error_pct"]), pct(v["other_calls_error_pct"])]
        t.add_row(*row)
    return t


@click.command("validate")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--scenario", "scenarios", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Scenario YAML (repeatable); or --generate.")
@click.option("--generate", metavar="N",
              help="Draw N scenarios (1-100) from the documented ranges (rlhfsim.validate_gen.RANGES) and validate "
                   "them, one scenario after another; --profile defaults to 'generic,cpu', two blind profiles "
                   "(docs/validation.md 'Generated scenarios').")
@click.option("--seed", metavar="S", help="--generate: the draw's seed (default: drawn at run time and printed).")
@click.option("--ranges", "ranges_file", type=click.Path(dir_okay=False, path_type=Path),
              help="--generate: a JSON file replacing some RANGES entries (copied into the output directory).")
@click.option("--profile", help="Calibration profile names or paths, comma-separated, each predicting the same measured steps; "
                                "'quick' is validate's own quick calibration of the scenarios' models, cached (the default "
                                "with --scenario); 'generic' is the quick generic calibration of this CPU measured now, "
                                "in three passes alternating with blocks of the steps (blind: no operating point of the scenarios; about 6 minutes; with --generate the default is 'generic,cpu').")
@click.option("--steps", type=click.IntRange(min=2), help="Steps per scenario (default: the scenario's).")
@click.option("--threads", type=click.IntRange(min=1),
              help="torch intra-op threads for the real runs and their calibration (default: torch's).")
@click.option("--sequential", is_flag=True,
              help="Run one scenario's steps after another, one executor in memory at a time, as a job runs alone "
                   "(the default with --generate).")
@click.option("--visits", metavar="N",
              help="One scenario after another: run each scenario this many times, each visit its steps from the "
                   "start, spread over the blocks between the calibration passes, and pool the visits' steps "
                   "(default: one visit per block, 4 with --profile generic; 1 with nothing calibrated here).")
@click.option("--round-robin", "round_robin", is_flag=True,
              help="Run the scenarios' steps round-robin, every scenario's executor in memory at once (the default "
                   "with --scenario; steps a few percent slower than a job alone, docs/validation.md 'Generated scenarios').")
@click.option("--recalibrate", is_flag=True,
              help="Measure the quick calibration again (between blocks of the real steps) instead of using the cached one.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--set", "sets", multiple=True, metavar="PATH=VALUE",
              help="Override a field of every scenario (repeatable): a dotted path and a YAML value, e.g. --set steps=4.")
@click.option("-o", "--out", type=click.Path(path_type=Path), help="Also write the JSON document as validation.json in this directory (a path ending in .json: that file, the older usage). With --generate the directory (a new or empty one) also receives the drawn scenarios, their models' config.json files and generated.json (default: a fresh directory under the cache).")
@click.option("--framework", type=click.Choice(["rlhfsim", *FRAMEWORKS]), default="rlhfsim", show_default=True,
              help="What runs the real steps: rlhfsim's own executor, or a real RL framework (trl: TRL's GRPO/RLOO "
                   "trainers, calibrate/validate_trl.py; --profile defaults to the bundled cpu profile and takes "
                   "comma-separated profiles, compared side by side).")
def validate_command(device, scenarios, generate, seed, ranges_file, profile, steps, threads, sequential,
                     visits, round_robin, recalibrate, fmt, sets, out, framework):
    """Run real small RLHF steps on this device and compare them with the simulator's prediction."""
    from rlhfsim.contracts import VALIDATION_FILE
    from rlhfsim.files import out_path
    from rlhfsim.scenario.loader import parse_set

    out_file = out_path(out, VALIDATION_FILE)
    overrides = [parse_set(s) for s in sets]
    if sequential and round_robin:
        raise RlhfsimError("--sequential, --round-robin: expected at most one of them, got both")
    if visits is not None:
        try:
            n_visits = int(visits)
        except ValueError:
            n_visits = 0
        if not 1 <= n_visits <= 100:
            raise RlhfsimError(f"--visits: expected a number of runs per scenario from 1 to 100, got {visits!r}")
        visits = n_visits
    if visits is not None and framework != "rlhfsim":
        raise RlhfsimError(f"--visits: expected it with --framework rlhfsim only (TRL's trainer runs its steps once), got --framework {framework}")
    # A generated scenario stands for a user's job, which runs alone: its steps run one scenario after
    # another unless --round-robin (the shipped scenarios keep round-robin, their own calibration's passes
    # alternating with blocks of those steps).
    sequential = sequential or (generate is not None and not round_robin)
    check_visits(visits, sequential)
    generated = None
    if generate is not None:
        if scenarios or framework != "rlhfsim":
            raise RlhfsimError("--generate: expected no --scenario and --framework rlhfsim (the drawn scenarios are "
                               "what runs), got " + ("--scenario" if scenarios else f"--framework {framework}"))
        if overrides:
            raise RlhfsimError("--set: expected no overrides with --generate (the drawn scenarios are what runs)")
        from calibrate.validate_generated import BLIND_PROFILE, generate_set

        gen_dir = out_file.parent if out_file is not None else None
        scenarios, generated = generate_set(generate, seed, gen_dir, ranges_file, device)
        profile = profile or BLIND_PROFILE
    elif seed is not None or ranges_file is not None:
        raise RlhfsimError("--seed, --ranges: expected them only with --generate N")
    elif not scenarios:
        raise RlhfsimError("validate: expected --scenario FILE (repeatable) or --generate N, got neither")
    if framework != "rlhfsim":
        if overrides:
            raise click.UsageError("--set: supported with --framework rlhfsim only (edit the scenario for --framework trl)")
        from calibrate.validate_trl import validate_trl_command

        return validate_trl_command(list(scenarios), device, profile, steps, threads, recalibrate, fmt, out)
    if recalibrate and QUICK not in profile_list(profile):
        raise click.UsageError("--recalibrate: the calibration is the quick one validate measures; it needs --profile quick (or none)")
    doc = validate(list(scenarios), device, profile, steps, threads, progress=fmt == "table", sequential=sequential,
                   recalibrate=recalibrate, overrides=overrides, visits=visits,
                   generic_out=Path(generated["dir"]) / "generic-profile.json" if generated else None)
    from rlhfsim.files import write_json_atomic

    if generated:
        doc["generated"] = generated
        write_json_atomic(Path(generated["dir"]) / VALIDATION_FILE, doc)
    if out_file is not None and not (generated and out_file == Path(generated["dir"]) / VALIDATION_FILE):
        write_json_atomic(out_file, doc)
    if fmt == "json":
        def slim(b):
            return {**b, "scenarios": [{k: v for k, v in s.items() if k != "checks"} for s in b["scenarios"]]}

        click.echo(json.dumps({**slim(doc), "other_profiles": [slim(b) for b in doc["other_profiles"]]}))
    else:
        print_table(doc)

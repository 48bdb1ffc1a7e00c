"""``rlhfsim validate --framework trl``: a framework nobody here wrote, against the simulator.

For each scenario (``algorithm.kind`` grpo or rloo; ``calibrate.frameworks.base.spec_from_scenario`` says
what a framework step must look like):

  1. Run TRL's trainer for the scenario's steps (``calibrate.frameworks.trl.run_trl``): models of the
     scenario's shapes with random weights, the actor's EOS row scaled for the scenario's mean response
     length, then free sampling. Record each step's wall time, phase timers and every completion's
     prompt and response length.
  2. Write those lengths as a trace (``rlhfsim.workload.trace``) and simulate the same scenario with
     ``workload.response_length: {kind: trace}``: the same rollouts, prompt lengths included, one for one
     in the same steps (static engine, ``hf_generate`` runtime).
  3. Predict with each given profile (blind: the bundled ``cpu`` profile, or a ``rlhfsim calibrate --device
     cpu --quick`` profile at its default grid; never one measured at these runs' operating points, which
     is why the default quick calibration of ``--framework rlhfsim`` is not used here).
  4. Compare the **median** over the steady steps (warm-up excluded) of the step time and of each phase,
     on both sides: error_pct = 100 x (predicted - measured) / measured. A median, not the mean the
     executor validation uses: TRL runs one scenario after another (no round-robin), so a burst of
     another process on the shared machine lands in whole steps, and a median of steps is robust to it
     (means are reported beside it).

Phases (``FRAMEWORK_PHASES`` against the simulator's): generate, reward, reference and actor_train are the
same on both sides; TRL's old_logprobs pass (RLOO) and its other batch preparation have no simulator
phase (predicted 0); the simulator's weight_sync has no TRL counterpart (transformers generation uses the
training weights in place: measured 0).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from calibrate.frameworks.base import FRAMEWORK_PHASES
from rlhfsim.errors import RlhfsimError

PHASES = FRAMEWORK_PHASES + ("weight_sync",)   # the simulator's weight_sync has no TRL counterpart


def _err(pred: float, meas: float) -> float | None:
    return 100.0 * (pred - meas) / meas if meas > 0 else None


def trace_rows(steps) -> list:
    """The framework's completions as trace rows, in generation order."""
    from rlhfsim.workload.trace import TraceRow

    return [TraceRow(s.step, r.prompt_id, r.rollout, r.prompt_len, r.response_len) for s in steps for r in s.rollouts]


def replay_scenario(sc, trace_path: Path):
    """The scenario with its response lengths replaced by the trace at ``trace_path``."""
    from rlhfsim.sim.run import rebuild

    w = sc.workload.model_dump(mode="json")
    w["response_length"] = {"kind": "trace", "path": str(Path(trace_path).resolve())}
    return rebuild(sc, {"workload": w})


def train_detail(setup, cost, measured) -> dict:
    """actor_train split as the simulator prices it (forward+backward of the padded batch, then the AdamW
    step: ``CostModel.train`` and ``optimizer``), per steady step, beside TRL's own split."""
    shape, dtype = setup.shapes["actor"], setup.dtypes["actor"]
    warm = setup.scenario.warmup_steps
    fb, opt = [], cost.optimizer(shape, dtype).total_s
    for s in measured[warm:]:
        n = len(s.rollouts)
        length = max(r.prompt_len + r.response_len for r in s.rollouts)
        fb.append(cost.train(shape, dtype, n * length, n).total_s)
    keys = sorted({k for s in measured for k in s.detail_s})
    return {"measured": {k: statistics.median(s.detail_s.get(k, 0.0) for s in measured[warm:]) for k in keys},
            "predicted": {"forward_backward": statistics.median(fb), "optimizer": opt}}


def compare(sc, measured, predicted, profile: str) -> dict:
    """One scenario's measured steps (FrameworkStep) against one simulation (SimResult) of its trace."""
    warm = sc.warmup_steps
    m_steps, p_steps = measured[warm:], predicted.steps[warm:]

    def phase_vals(ph):
        m = [s.phases_s.get(ph, 0.0) for s in m_steps]
        p = [r.phases_s.get(ph, 0.0) for r in p_steps]
        return m, p

    m_time = [s.wall_s for s in m_steps]
    p_time = [r.step_time_s for r in p_steps]
    phases = {}
    for ph in PHASES:
        m, p = phase_vals(ph)
        if any(m) or any(p):
            mm, pm = statistics.median(m), statistics.median(p)
            phases[ph] = {"measured_s": mm, "predicted_s": pm, "error_pct": _err(pm, mm),
                          "measured_mean_s": statistics.fmean(m), "predicted_mean_s": statistics.fmean(p)}
    replayed = [[(pl, rl) for _, pl, rl in sorted(r.lengths)] for r in predicted.steps]   # by rollout id: stream order
    recorded = [[(x.prompt_len, x.response_len) for x in s.rollouts] for s in measured]
    trl_times = [s.framework_step_time_s for s in m_steps if s.framework_step_time_s is not None]
    mt, pt = statistics.median(m_time), statistics.median(p_time)
    return {
        "name": sc.name, "framework": "trl", "algorithm": sc.algorithm.kind, "steps": sc.steps, "warmup_steps": warm,
        "profile": profile, "measured_step_time_s": mt, "predicted_step_time_s": pt, "error_pct": _err(pt, mt),
        "measured_mean_s": statistics.fmean(m_time), "predicted_mean_s": statistics.fmean(p_time),
        "trl_step_time_s": statistics.median(trl_times) if trl_times else None,
        "per_step": {"measured_s": [s.wall_s for s in measured], "predicted_s": [r.step_time_s for r in predicted.steps],
                     "measured_phases_s": [s.phases_s for s in measured],
                     "predicted_phases_s": [r.phases_s for r in predicted.steps]},
        "phases": phases,
        "checks": {"steps_trained": len(measured), "steps_simulated": len(predicted.steps),
                   "trl_global_steps_logged": sorted(int(s.framework_log["step"]) for s in measured if "step" in s.framework_log),
                   "recorded_lengths_match_trl_metrics": all(
                       abs(statistics.fmean(x.response_len for x in s.rollouts) - s.framework_log["completions/mean_length"]) < 1e-6
                       and max(x.response_len for x in s.rollouts) == s.framework_log["completions/max_length"]
                       for s in measured),
                   "rollouts_recorded": sum(len(x) for x in recorded),
                   "lengths_replayed_one_for_one": replayed == recorded,
                   "recorded_lengths": recorded, "replayed_lengths": replayed},
    }


def validate_trl(scenarios: list[Path], device: str, profiles: list[str], steps: int | None = None,
                 threads: int | None = None, progress: bool = True, trace_dir: Path | None = None) -> dict:
    """Measured TRL steps against predictions with each profile (module docstring). The document has
    today's validate shape for the first profile (``scenarios``, ``median_abs_error_pct``) and the same
    for each further profile under ``other_profiles``. ``trace_dir``: keep each scenario's trace
    (``NAME.trace.csv``) and the adapter's completions log (``NAME.completions.jsonl``) there."""
    from calibrate.frameworks import FRAMEWORKS
    from calibrate.frameworks.base import spec_from_scenario
    from rlhfsim.costs.model import CostModel
    from rlhfsim.scenario import build_setup, load_scenario
    from rlhfsim.sim.run import rebuild, simulate_uncertain
    from rlhfsim.workload.trace import write_trace

    if device != "cpu":
        raise RlhfsimError(f"--framework trl: expected --device cpu (the TRL adapter runs on the CPU), got {device!r}")
    prepared = []
    for path in scenarios:
        sc = load_scenario(path)
        if steps is not None:
            sc = rebuild(sc, {"steps": steps, "warmup_steps": min(sc.warmup_steps, steps - 1)})
        setup = build_setup(sc)
        prepared.append((sc, setup, spec_from_scenario(sc, setup, device, threads)))
    for p in profiles:   # fail before any run
        CostModel.load(prepared[0][1].gpu, p)
    tmp = tempfile.TemporaryDirectory(prefix="rlhfsim-trl-trace-") if trace_dir is None else None
    out_dir = Path(tmp.name if tmp else trace_dir)
    by_profile: dict[str, list] = {p: [] for p in profiles}
    walls: dict[str, dict] = {}
    try:
        for sc, setup, spec in prepared:
            if progress:
                print(f"[trl] {sc.name}: {spec.algorithm}, {spec.prompts_per_step} prompts x {spec.group_size}, {sc.steps} steps", flush=True)
            t0 = time.perf_counter()
            if trace_dir is not None:
                spec = replace(spec, log_path=str(out_dir / f"{sc.name}.completions.jsonl"))
            measured = FRAMEWORKS["trl"](spec)
            walls[sc.name] = {"trl_run_s": time.perf_counter() - t0}
            trace = out_dir / f"{sc.name}.trace.csv"
            write_trace(trace, trace_rows(measured))
            replay = replay_scenario(sc, trace)
            for p in profiles:
                t0 = time.perf_counter()
                cost = CostModel.load(setup.gpu, p)
                predicted, unc = simulate_uncertain(replay, cost=cost)
                walls[sc.name][f"simulate_s[{p}]"] = time.perf_counter() - t0
                row = compare(replay, measured, predicted, p)
                lo, hi = unc["step_time_s_interval"]   # an interval of the mean steady step
                row.update(predicted_step_time_s_interval=[lo, hi], interval_level=unc["level"],
                           interval_source=unc["source"], inside_interval=bool(lo <= row["measured_mean_s"] <= hi))
                row["actor_train_detail"] = train_detail(predicted.setup, cost, measured)
                row["wall_s"] = walls[sc.name]
                by_profile[p].append(row)
    finally:
        if tmp:
            tmp.cleanup()

    def block(rows):
        errs = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None]
        return {"scenarios": rows, "median_abs_error_pct": statistics.median(errs) if errs else None}

    first, *rest = profiles
    return {"device": device, "framework": "trl", **block(by_profile[first]), "profile": first,
            "other_profiles": [{"profile": p, **block(by_profile[p])} for p in rest]}


def slim(doc: dict) -> dict:
    """The JSON printed by ``--format json``: the document without the per-step values and per-rollout
    length lists (``--out`` keeps them)."""
    def strip(rows):
        return [{**{k: v for k, v in r.items() if k != "per_step"},
                 "checks": {k: v for k, v in r["checks"].items() if not k.endswith("_lengths")}} for r in rows]

    return {**doc, "scenarios": strip(doc["scenarios"]),
            "other_profiles": [{**o, "scenarios": strip(o["scenarios"])} for o in doc["other_profiles"]]}


def print_table(doc: dict) -> None:
    """Measured against predicted, one table per scenario, a column pair per profile."""
    from rich.console import Console
    from rich.table import Table

    blocks = [(doc["profile"], doc["scenarios"])] + [(o["profile"], o["scenarios"]) for o in doc["other_profiles"]]
    c = Console()
    for i, s in enumerate(doc["scenarios"]):
        t = Table(title=f"{s['name']} (TRL {s['algorithm']}, {s['steps']} steps, first {s['warmup_steps']} excluded, medians)")
        t.add_column("")
        t.add_column("measured s", justify="right")
        for prof, _ in blocks:
            t.add_column(f"predicted s\n{Path(prof).stem}", justify="right", no_wrap=True)
        cells = [f"{b[i]['predicted_step_time_s']:.3f} ({b[i]['error_pct']:+.1f}%)" for _, b in blocks]
        t.add_row("[bold]step[/bold]", f"{s['measured_step_time_s']:.3f}", *cells)
        for ph in PHASES:
            if not any(ph in b[i]["phases"] for _, b in blocks):
                continue
            v = s["phases"].get(ph) or blocks[-1][1][i]["phases"][ph]
            row = []
            for _, b in blocks:
                x = b[i]["phases"].get(ph, {"predicted_s": 0.0, "error_pct": None})
                row.append(f"{x['predicted_s']:.3f}" + ("" if x["error_pct"] is None else f" ({x['error_pct']:+.0f}%)"))
            t.add_row(ph, f"{v['measured_s']:.3f}", *row)
        c.print(t)
    for prof, rows in blocks:
        errs = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None]
        if errs:
            c.print(f"profile {prof}: median |step-time error| over {len(rows)} scenario(s): {statistics.median(errs):.1f}%")


def validate_trl_command(scenarios: list[Path], device: str, profile: str | None, steps: int | None,
                         threads: int | None, recalibrate: bool, fmt: str, out: Path | None) -> None:
    """``rlhfsim validate --framework trl``: ``--profile`` names one profile or several, comma-separated
    (default: the bundled ``cpu`` profile); the first is the document's own, the others ``other_profiles``.
    With ``--out OUT.json``, each scenario's trace and TRL completions log are kept in ``OUT.trl/``."""
    import json

    import click

    if recalibrate:
        raise click.UsageError("--recalibrate: --framework trl predicts with blind profiles (--profile), it measures no calibration of its own")
    profiles = [p.strip() for p in (profile or "cpu").split(",") if p.strip()]
    if not profiles:
        raise click.UsageError("--profile: expected a profile name or path (comma-separated for several), got none")
    # With --out, the traces and completions logs are kept beside it (OUT.trl/), for `rlhfsim lengths import`.
    keep = out.with_name(out.stem + ".trl") if out else None
    doc = validate_trl(scenarios, device, profiles, steps, threads, progress=fmt == "table", trace_dir=keep)
    if out:
        from rlhfsim.files import write_json_atomic

        write_json_atomic(out, doc)
    if fmt == "json":
        click.echo(json.dumps(slim(doc)))
    else:
        print_table(doc)

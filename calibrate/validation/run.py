"""Orchestration of ``rlhfsim validate``: prepare the scenarios, measure the calibrations the profiles
need in passes alternating with blocks of the real steps (round-robin, or one scenario after another in
visits), then compare each profile's prediction with the measured steps (``calibrate.validation.compare``)
and check the device's state around them (``calibrate.validation.devcheck``)."""

from __future__ import annotations

from pathlib import Path

import click

from calibrate.validation.calibration import (GENERIC, GENERIC_PASSES, QUICK, QuickPlan, cache_dir,
                                              calibrate_passes, calibration_groups, discard_calibration,
                                              finish_calibration, generic_runtimes, measure_generic,
                                              profile_list, quick_plan)
from calibrate.validation.compare import error_block, validate_scenario
from calibrate.validation.devcheck import device_checks, mark_inconclusive, scenario_device_ratios
from calibrate.validation.scenario import prepare
from rlhfsim.errors import RlhfsimError


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
    median 1.03x, back to back on one set of scenarios), which a profile
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
    machine, and a shared host's speed moves from one such window to the next."""
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

    from calibrate.measuring.devstate import host_probe, state_probe

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
    # whose speed drifts from minute to minute both sides are measured over the same stretch of time.
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
        from calibrate.measuring.devstate import TOLERANCE

        mark_inconclusive(doc, [[profile_of(name, j) for j in range(len(prepared))] for name in profiles], TOLERANCE)
        for w in doc["device_check"]["warnings"]:
            click.echo(f"warning: {w}", err=True)
    return doc

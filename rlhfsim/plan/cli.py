"""``rlhfsim plan PLAN.yaml``: parse, run the sweep (``rlhfsim.plan.run_plan``), print the result."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import click

from rlhfsim.errors import RlhfsimError


@click.command(name="plan")
@click.argument("plan_file", metavar="PLAN.yaml", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--backend", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: worker processes; ray: Ray tasks (a local Ray cluster unless --address).")
@click.option("--address", help="Join this Ray cluster (e.g. ray://head:10001 or auto); --backend ray only.")
@click.option("--workers", type=click.IntRange(min=1), help="Worker processes / Ray CPUs (default: CPU count).")
@click.option("--set", "sets", multiple=True, metavar="PATH=VALUE",
              help="Override a base-scenario field (repeatable), added to the plan's `set:`, e.g. --set workload.prompts_per_step=56.")
@click.option("--profile", metavar="NAME|PATH",
              help="Calibration profile for every configuration, in place of the plan's `profile:` (a name, or a JSON "
                   "path from here), e.g. the overlay `rlhfsim calibrate --from-run` wrote.")
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path),
              help="Plan directory for results.csv and plan.json (default: runs/plan-<name>).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--resume", is_flag=True, help="Keep the configurations already in results.csv and run the rest.")
@click.option("--uncertainty/--no-uncertainty", default=True, show_default=True,
              help="Each configuration on a GPU carries the 90% interval of its step (the model's own error, "
                   "analytic: docs/accuracy.md); results.csv's step_time_lo_s, step_time_hi_s.")
def plan_command(plan_file, backend, address, workers, sets, profile, out, fmt, resume, uncertainty):
    """Sweep a base scenario over the axes of PLAN.yaml: every configuration's step time, phases,
    utilization and cost (or why it cannot run), the Pareto front of step time against cost and the best
    configuration for the plan's objective."""
    from rich.console import Console

    from rlhfsim.plan import load_plan, run_plan

    if address is not None and backend != "ray":
        raise RlhfsimError(f"--address: expected only with --backend ray, got {address!r} with --backend {backend}")
    err = Console(stderr=True)
    from rlhfsim.scenario.loader import parse_set

    plan = load_plan(plan_file, overrides=[parse_set(s) for s in sets], profile=profile)
    with _Progress(err, plan.name) as bar:
        try:
            outcome = run_plan(plan, backend=backend, workers=workers, address=address, out=out, resume=resume,
                               progress=bar.update, uncertainty=uncertainty)
        except KeyboardInterrupt:
            bar.stop()
            dest = out or f"runs/plan-{plan.name}"
            err.print(f"interrupted: finished configurations are in {dest}/results.csv; "
                      f"run again with --resume to continue")
            sys.exit(130)
    if fmt == "json":
        click.echo(json.dumps(outcome.summary()))
        return
    print_outcome(outcome, Console())


class _Progress:
    """A rich progress bar on stderr (drawn only on a terminal), started on the first update."""

    def __init__(self, console, name: str):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.progress = Progress(TextColumn(f"plan {name}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TimeRemainingColumn(), console=console, transient=True,
                                 disable=not console.is_terminal)
        self.task = None

    def __enter__(self):
        return self

    def update(self, done: int, total: int) -> None:
        if self.task is None:  # started on the first update: after the local backend has forked its workers
            self.progress.start()
            self.task = self.progress.add_task("sweep", total=total)
        self.progress.update(self.task, completed=done, total=total)

    def stop(self) -> None:
        self.progress.stop()

    def __exit__(self, *exc):
        self.progress.stop()


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def _short(axis: str, axes) -> str:
    """The last part of an axis path when no other axis ends the same way (the table stays narrow)."""
    last = axis.rsplit(".", 1)[-1]
    return last if sum(a.rsplit(".", 1)[-1] == last for a in axes) == 1 else axis


def _band(r: dict) -> str:
    """A row's 90% interval of the step, or "-" where it has none (a CPU row)."""
    lo, hi = r.get("step_time_lo_s"), r.get("step_time_hi_s")
    return "-" if lo is None else f"{lo:.2f} - {hi:.2f}"


def print_outcome(o, console) -> None:
    from rich.table import Table

    p = o.plan
    screened = [r for r in o.rows if r.get("method") == "screened"]   # a search's refine: not simulated
    infeasible = [r for r in o.rows if not r["feasible"] and r.get("method") != "screened"]
    shared = f", {o.shared} priced on a shared generation" if p.search is not None else ""
    console.print(f"[bold]plan {p.name}[/bold]: {len(o.rows)} configurations, {o.feasible} feasible, "
                  f"{len(infeasible)} infeasible" + (f", {len(screened)} screened out (not simulated)" if screened else "")
                  + f"; {o.simulated} simulated{shared} in {o.wall_s:.1f} s"
                  + (f" ({o.resumed} resumed from results.csv)" if o.resumed else ""))
    if p.search is not None and p.search.excluded:
        console.print(f"  not buildable (not configurations): {sum(p.search.excluded.values())}: " + "; ".join(
            f"{why} x{n}" for why, n in p.search.excluded.most_common(4)))
    for reason, n in Counter(r["reason"] for r in infeasible).most_common(5):
        console.print(f"  infeasible x{n}: {reason}")
    shown = any(r.get("step_time_lo_s") is not None for r in o.pareto)
    t = Table(title="Pareto front: step time vs cost per 1,000 steps")
    for a in p.axes:
        t.add_column(_short(a, p.axes))
    for c in ("step s", *(("step 90%",) if shown else ()), "$ / 1k steps", "GPUs"):
        t.add_column(c, justify="right")
    for r in o.pareto:
        t.add_row(*(_fmt(r[a]) for a in p.axes), f"{r['step_time_s']:.2f}", *((_band(r),) if shown else ()),
                  f"{r['cost_per_1000_steps']:.2f}", str(r["gpus"]))
    console.print(t)
    bound = f" with step time <= {p.max_step_time_s:g} s" if p.max_step_time_s is not None else ""
    if o.best is None:
        fastest = min((r["step_time_s"] for r in o.rows if r["feasible"]), default=None)
        console.print(f"[bold]best ({p.objective}{bound})[/bold]: none" +
                      (f" (the fastest feasible configuration takes {fastest:.2f} s)" if fastest is not None else ""))
    else:
        b = o.best
        axes = ", ".join(f"{a}={_fmt(b[a])}" for a in p.axes)
        band = f" (90%: {_band(b)} s)" if b.get("step_time_lo_s") is not None else ""
        console.print(f"[bold]best ({p.objective}{bound})[/bold]: {axes}: {b['step_time_s']:.2f} s/step{band}, "
                      f"${b['cost_per_1000_steps']:.2f} per 1,000 steps on {b['gpus']} x {b['gpu_type']}")
        console.print(f"  {b['why']}")
    if p.search is not None:
        print_search(o, console)
    console.print(f"wrote {o.out}/results.csv, {o.out}/plan.json (rlhfsim report {o.out} -o plan.html)")


def _layout_text(values: dict) -> str:
    """A search's row as Megatron's degrees per role, e.g. ``actor tp1 pp1 vpp1 cp1 ep8, rollout tp2, colocated``."""
    roles: dict[str, list[str]] = {}
    for k, v in values.items():
        if k == "pools":
            continue
        role, deg = k.split(".")
        roles.setdefault(role, []).append(f"{deg}{v}")
    return ", ".join(f"{r} {' '.join(d)}" for r, d in roles.items()) + f", {values['pools']}"


def print_search(o, console) -> None:
    """The base scenario's parallelism (the published one, in the bundled plans) against the best found, and why."""
    c = o.compare
    if c is None:
        return
    console.print(f"[bold]base layout[/bold] ({_layout_text(c['base'])}): "
                  + (f"infeasible: {c['base_reason']}" if "base_reason" in c else f"{c['base_step_s']:.2f} s/step"))
    if "best" not in c:
        return
    console.print(f"[bold]best found[/bold] ({_layout_text(c['best'])}): {c['best_step_s']:.2f} s/step")
    console.print(f"  why ({c['note']}): {c['why']}")

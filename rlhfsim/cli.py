"""The ``rlhfsim`` command line: a thin click group. Each command parses, calls one library function and
writes results. Heavy modules (pydantic, simpy, plotly, torch) are imported inside commands, so that
``rlhfsim calibrate`` runs where only torch is installed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from rlhfsim.errors import RlhfsimError


LAZY = {
    "calibrate": "calibrate.cli:calibrate_command",
    "runtimes": "calibrate.cli:runtimes_command",
    "validate": "calibrate.validate:validate_command",
    "plan": "rlhfsim.plan.cli:plan_command",
    "lengths": "rlhfsim.lengths.cli:lengths_group",
    "import": "rlhfsim.importers.cli:import_group",
}


class Group(click.Group):
    """Turns every user-facing error into one line on stderr and exit code 2, and imports the commands
    in LAZY (torch, Ray) only when they are invoked."""

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(LAZY))

    def get_command(self, ctx, name):
        if name in LAZY and name not in self.commands:
            mod, attr = LAZY[name].split(":")
            try:
                import importlib

                return getattr(importlib.import_module(mod), attr)
            except ImportError as e:
                return _missing(name, e)
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except RlhfsimError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)


@click.group(cls=Group)
@click.version_option(package_name="rlhfsim")
def main():
    """Predict how long an RLHF (PPO/GRPO) step takes, on which GPUs, under which schedule, and why."""


@main.command()
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--steps", type=click.IntRange(min=1), help="Steps to simulate (default: the scenario's).")
@click.option("--seed", type=click.IntRange(min=0), help="Random seed (default: the scenario's).")
@click.option("--profile", "profile", help="Calibration profile name or JSON path (default: bundled).")
@click.option("--compare", "compare_", help="Comma-separated schedule variants: sync,oppo-intra,oppo-inter,oppo,partial,async.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Write summary.json, steps.csv, intervals.csv, lengths.csv here.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--names", "phase_names", type=click.Choice(["rlhfsim", "verl"]), default="rlhfsim", show_default=True,
              help="Phase names in the table: the simulator's, or verl's timing_s/* metrics (the JSON always "
                   "has both: phases_s and verl_timing).")
def simulate(scenario, steps, seed, profile, compare_, out, fmt, phase_names):
    """Simulate SCENARIO (a YAML file) and print step time, phases and GPU utilization."""
    from rlhfsim.report.text import print_comparison, print_summary
    from rlhfsim.scenario import load_scenario
    from rlhfsim.sim.run import compare, simulate as run_sim, write_outputs

    sc = load_scenario(scenario)
    names = [n.strip() for n in compare_.split(",") if n.strip()] if compare_ else (sc.compare or [])
    kw = {"profile": profile, "steps": steps, "seed": seed}
    result = run_sim(sc, **kw)
    variants = None
    if names:
        variants, _ = compare(sc, names, base=result, **kw)
    if out:
        write_outputs(result, out, variants)
    if fmt == "json":
        doc = dict(result.summary)
        if variants:
            doc["variants"] = variants["variants"]
        click.echo(json.dumps(doc))
    else:
        print_summary(result.summary, names=phase_names)
        if variants:
            print_comparison(variants)
        if out:
            click.echo(f"wrote {out}/summary.json, steps.csv, intervals.csv, lengths.csv")


@main.command()
def schema():
    """Print the JSON Schema of a scenario."""
    from rlhfsim.scenario.schema import Scenario

    click.echo(json.dumps(Scenario.model_json_schema(), indent=1))


@main.command()
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def models(fmt):
    """List the model catalog."""
    from rlhfsim.models.catalog import CATALOG

    rows = [{**m.to_dict(), "params_b": round(m.params() / 1e9, 3)} for m in CATALOG.values()]
    if fmt == "json":
        click.echo(json.dumps(rows))
        return
    click.echo(f"{'name':18} {'arch':8} {'layers':>6} {'hidden':>6} {'inter':>6} {'heads':>5} {'kv':>3} {'vocab':>7} {'tied':>5} {'params':>8}")
    for r in rows:
        click.echo(f"{r['name']:18} {r['arch']:8} {r['layers']:>6} {r['hidden']:>6} {r['intermediate']:>6} {r['heads']:>5} "
                   f"{r['kv_heads']:>3} {r['vocab']:>7} {str(r['tied_embeddings']):>5} {r['params_b']:>7.3f}B")


@main.command()
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def gpus(fmt):
    """List the hardware catalog (datasheet dense peaks)."""
    from rlhfsim.hardware.catalog import GPUS

    if fmt == "json":
        click.echo(json.dumps([g.to_dict() for g in GPUS.values()]))
        return
    click.echo(f"{'name':10} {'bf16 TFLOP/s':>12} {'fp32 TFLOP/s':>12} {'HBM GB/s':>9} {'memory GB':>9} {'NVLink GB/s':>11} {'net GB/s':>8} {'$/h':>5}")
    for g in GPUS.values():
        click.echo(f"{g.name:10} {g.peak('bfloat16') / 1e12:>12.1f} {g.peak('float32') / 1e12:>12.1f} {g.mem_bw / 1e9:>9.0f} "
                   f"{g.mem_bytes / 1e9:>9.1f} {g.intra_node_bw / 1e9:>11.0f} {g.inter_node_bw / 1e9:>8.1f} {g.price_per_hour:>5.2f}")


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out_html", type=click.Path(dir_okay=False, path_type=Path), help="Write a self-contained HTML report.")
@click.option("--trace", type=click.Path(dir_okay=False, path_type=Path), help="Write a Chrome/Perfetto trace JSON.")
@click.pass_context
def report(ctx, run_dir, out_html, trace):
    """Render a run (or plan) directory as HTML and/or a Chrome trace; a rollout-length file (a trace,
    a TRL completions log, a verl dump, a CSV/JSONL table) as its distribution next to lognormal and
    Pareto fits (`rlhfsim lengths report`)."""
    from rlhfsim.report import render

    if run_dir.is_file():
        if trace is not None:
            raise RlhfsimError(f"report --trace: expected a run directory for a Chrome trace, got the file {str(run_dir)!r}")
        from rlhfsim.lengths.cli import report_command

        return ctx.invoke(report_command, source=run_dir, fmt="auto", tokenizer=None, group_size=1,
                          prompts_per_step=None, out_html=out_html, as_json=False)
    if out_html is None and trace is None:
        raise RlhfsimError("report: expected -o FILE.html and/or --trace FILE.json, got neither")
    render(run_dir, out_html, trace)
    for p in (out_html, trace):
        if p is not None:
            click.echo(f"wrote {p}")


def _missing(name: str, err: ImportError) -> click.Command:
    @click.command(name=name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    def cmd():
        raise RlhfsimError(f"{name}: expected its dependencies installed (pip install torch==2.13.0 && "
                           f"pip install -e '.[calibrate]'), got an import error: {err}")

    return cmd


if __name__ == "__main__":
    main()

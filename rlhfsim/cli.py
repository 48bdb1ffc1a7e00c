"""The ``rlhfsim`` command line: a thin click group. Each command parses, calls one library function and
writes results. Heavy modules (pydantic, simpy, plotly, torch) are imported inside commands, so that
``rlhfsim calibrate`` runs where only torch is installed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from rlhfsim.errors import RlhfsimError, ScenarioError


LAZY = {
    "calibrate": "rlhfsim.fromrun.cli:calibrate_command",   # MEASURING's, plus --from-run (rlhfsim/fromrun)
    "runtimes": "calibrate.cli:runtimes_command",
    "validate": "calibrate.validation.cli:validate_command",
    "plan": "rlhfsim.plan.cli:plan_command",
    "lengths": "rlhfsim.lengths.cli:lengths_group",
    "import": "rlhfsim.importers.cli:import_group",
}


# The measuring side's ``calibrate`` command, which ``rlhfsim calibrate`` extends with --from-run
# (``rlhfsim.fromrun.cli``). The entry points above and this one name calibrate/ by path, loaded on use: no module
# of rlhfsim imports calibrate/ (tests/unit/test_import_graph.py), which must not be needed to simulate.
MEASURING = "calibrate.cli:calibrate_command"


def load_entry(path: str):
    """The object an entry point ``MODULE:NAME`` names, its module imported now (ImportError where it cannot be)."""
    import importlib

    mod, attr = path.split(":")
    return getattr(importlib.import_module(mod), attr)


class Group(click.Group):
    """Turns every user-facing error into one line on stderr and exit code 2, and imports the commands
    in LAZY (torch, Ray) only when they are invoked."""

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(LAZY))

    def get_command(self, ctx, name):
        if name in LAZY and name not in self.commands:
            try:
                return load_entry(LAZY[name])
            except ImportError as e:
                return _missing(name, e)
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except RlhfsimError as e:
            for line in e.lines() if isinstance(e, ScenarioError) else [str(e)]:
                click.echo(f"error: {line}", err=True)
            sys.exit(2)


class RegistryHelp(click.Option):
    """An option whose help names the registered schedule variants, looked up only when help is shown
    (the registry imports pydantic and simpy, which the CLI loads lazily)."""

    def get_help_record(self, ctx):
        from rlhfsim.sim.schedules import VARIANTS

        self.help = f"Comma-separated schedule variants: {', '.join(VARIANTS)}."
        return super().get_help_record(ctx)


def set_option(f):
    return click.option("--set", "sets", multiple=True, metavar="PATH=VALUE",
                        help="Override a scenario field (repeatable): a dotted path as the planner's axes write it, "
                             "and a YAML value, e.g. --set workload.prompts_per_step=56 --set schedule.kind=sync.")(f)


def to_json(doc) -> str:
    """JSON of a result; a non-finite number is an error, never a bare NaN (which is not JSON)."""
    try:
        return json.dumps(doc, allow_nan=False)
    except ValueError:
        raise RlhfsimError("result: expected finite numbers, got NaN or infinity (a time or size in the scenario "
                           "is too large; check the fields set near their limits)") from None


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rlhfsim")
def main():
    """Predict how long an RLHF (PPO/GRPO) step takes, on which GPUs, under which schedule, and why."""


@main.command()
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--steps", type=click.IntRange(min=1), help="Steps to simulate (default: the scenario's).")
@click.option("--seed", type=click.IntRange(min=0), help="Random seed (default: the scenario's).")
@click.option("--profile", "profile", help="Calibration profile name or JSON path; `auto`: the bundled profile of the scenario's GPU built from public per-operation measurements where there is one (default: the bundled `default`).")
@click.option("--compare", "compare_", cls=RegistryHelp, help="Comma-separated schedule variants.")
@set_option
@click.option("--max-work", type=click.FloatRange(min=0), metavar="UNITS",
              help="Refuse runs whose estimated work exceeds this (docs/schedules.md, rlhfsim.sim.budget); 0: no limit.  [default: 1e8]")
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path),
              help="Run directory: summary.json, steps.csv, intervals.csv, lengths.csv, metrics.jsonl (verl's names), tensorboard/.")
@click.option("--uncertainty/--no-uncertainty", default=None,
              help="The 90% interval of the step time and phases beside the point (docs/accuracy.md). On by default "
                   "on a GPU: the model's own error measured on the public field table (an overlay: its fit's misfit, "
                   "its fitted terms drawn and re-simulated). On a CPU, off unless asked: the profile's parameter "
                   "uncertainty, re-simulated once per draw.")
@click.option("--draws", type=click.IntRange(min=4), help="Parameter draws for the interval, where any are drawn (default 24).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--names", "phase_names", type=click.Choice(["rlhfsim", "verl"]), default="rlhfsim", show_default=True,
              help="Phase names in the table: the simulator's, or verl's timing_s/* metrics (the JSON always "
                   "has both: phases_s and verl_timing).")
def simulate(scenario, steps, seed, profile, compare_, sets, max_work, out, uncertainty, draws, fmt, phase_names):
    """Simulate SCENARIO (a YAML file) and print step time, phases and GPU utilization."""
    from rlhfsim.report.text import print_comparison, print_summary
    from rlhfsim.scenario.loader import load_scenario, parse_set
    from rlhfsim.sim.budget import DEFAULT_MAX_WORK
    from rlhfsim.sim.run import compare, simulate as run_sim, simulate_uncertain, write_outputs

    sc = load_scenario(scenario, overrides=[parse_set(s) for s in sets])
    names = [n.strip() for n in compare_.split(",") if n.strip()] if compare_ else (sc.compare or [])
    kw = {"profile": profile, "steps": steps, "seed": seed, "max_work": DEFAULT_MAX_WORK if max_work is None else max_work}
    unc = None
    if uncertainty is None:   # the default: on where the prediction is a GPU's
        from rlhfsim.sim.uncertainty import is_gpu

        # terms: a streamed phase's seconds waiting for rollouts (phase_waiting_s) for the phase table
        result = run_sim(sc, terms=True, **kw)
        uncertainty = is_gpu(result.cost.profile, result.setup.gpu)
        if uncertainty:
            result, unc = simulate_uncertain(sc, draws=draws, **kw, point=result)
    elif uncertainty:
        result, unc = simulate_uncertain(sc, draws=draws, **kw)
    else:
        result = run_sim(sc, terms=True, **kw)
    if unc is not None:
        result.summary.update(step_time_s_interval=unc["step_time_s_interval"],
                              phases_s_interval=unc["phases_s_interval"],
                              uncertainty={k: v for k, v in unc.items() if k not in ("step_time_s_interval", "phases_s_interval")})
    variants = None
    if names:
        variants, _ = compare(sc, names, base=result, **kw)
    doc = dict(result.summary)
    if variants:
        doc["variants"] = variants["variants"]
    text = to_json(doc)  # checks the numbers before anything is written
    if out:
        written = write_outputs(result, out, variants)
    if fmt == "json":
        click.echo(text)
    else:
        print_summary(result.summary, names=phase_names)
        if variants:
            print_comparison(variants)
        if out:
            click.echo(f"wrote {out}/" + ", ".join(written))


@main.command()
def schema():
    """Print the JSON Schema of a scenario."""
    from rlhfsim.scenario.schema import Scenario

    click.echo(json.dumps(Scenario.model_json_schema(), indent=1))


@main.command()
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def models(fmt):
    """List the model catalog (experts: routed/top-k+shared of a mixture-of-experts model; params: total, active:
    those one token meets)."""
    from rlhfsim.models.catalog import CATALOG

    rows = [{**m.to_dict(), "params_b": round(m.params() / 1e9, 3), "active_params_b": round(m.active_params() / 1e9, 3),
             "experts": f"{m.num_experts}/{m.experts_per_token}" + (f"+{m.shared_experts}" if m.shared_experts else "")
             if m.is_moe else "-"} for m in CATALOG.values()]
    if fmt == "json":
        click.echo(json.dumps(rows))
        return
    cols = [("name", "name", "{}"), ("arch", "arch", "{}"), ("layers", "layers", "{}"), ("hidden", "hidden", "{}"),
            ("inter", "intermediate", "{}"), ("heads", "heads", "{}"), ("kv", "kv_heads", "{}"), ("attn", "attention", "{}"),
            ("experts", "experts", "{}"), ("vocab", "vocab", "{}"), ("tied", "tied_embeddings", "{}"),
            ("params", "params_b", "{:.3f}B"), ("active", "active_params_b", "{:.3f}B")]
    _print_table("models", cols, rows)


@main.command()
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def gpus(fmt):
    """List the hardware catalog (datasheet dense peaks, fp8 "-" where the GPU has no FP8 tensor cores; memory in GiB,
    bandwidths in GB/s; the NVLink domain where it spans nodes, else "node"; the server's host CPU and
    how long host work takes on it against the H100/H200 servers' Xeon, rlhfsim.hardware.hosts)."""
    from rlhfsim.hardware.catalog import GPUS, GiB
    from rlhfsim.hardware.hosts import host_scale

    rows = [{"name": g.name, "bf16_tflops": g.peak("bfloat16") / 1e12, "fp32_tflops": g.peak("float32") / 1e12,
             "fp8_tflops": f"{g.peak('float8') / 1e12:.1f}" if "float8" in g.peak_flops else "-",
             "nvlink_domain": str(g.nvlink_domain) if g.nvlink_domain else "node",
             "hbm_gb_s": g.mem_bw / 1e9, "memory_gib": g.mem_bytes / GiB, "intra_node_gb_s": g.intra_node_bw / 1e9,
             "inter_node_gb_s": g.inter_node_bw / 1e9, "price_per_hour": g.price_per_hour, "host_cpu": g.host_cpu or "-",
             "host_x": f"{host_scale(g.host_cpu):.2f}" if g.host_cpu else "-"} for g in GPUS.values()]
    if fmt == "json":
        click.echo(json.dumps([{**g.to_dict(), "memory_gib": g.mem_bytes / GiB} for g in GPUS.values()]))
        return
    cols = [("name", "name", "{}"), ("bf16 TFLOP/s", "bf16_tflops", "{:.1f}"), ("fp8 TFLOP/s", "fp8_tflops", "{}"),
            ("fp32 TFLOP/s", "fp32_tflops", "{:.1f}"),
            ("HBM GB/s", "hbm_gb_s", "{:.0f}"), ("memory GiB", "memory_gib", "{:.1f}"),
            ("NVLink GB/s", "intra_node_gb_s", "{:.0f}"), ("domain", "nvlink_domain", "{}"), ("net GB/s", "inter_node_gb_s", "{:.1f}"), ("$/h", "price_per_hour", "{:.2f}"),
            ("host CPU", "host_cpu", "{}"), ("host x", "host_x", "{}")]
    _print_table("gpus", cols, rows)


def _print_table(title: str, cols: list[tuple[str, str, str]], rows: list[dict]) -> None:
    """A rich table, as every other command prints (numbers right-aligned)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for head, key, _ in cols:
        t.add_column(head, justify="left" if key in ("name", "arch") else "right", no_wrap=True)
    for r in rows:
        t.add_row(*(fmt.format(r[key]) for _, key, fmt in cols))
    console = Console()
    console.width = max(console.width, 160)  # a catalog row on one line, also when piped
    console.print(t)


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("-o", "--out", "--output", "out_html", type=click.Path(path_type=Path),
              help="Directory for a self-contained report.html (a path ending in .html: that file, the older usage).")
@click.option("--trace", type=click.Path(path_type=Path),
              help="Write a Chrome/Perfetto trace: trace.json in this directory (a path ending in .json: that file).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_context
def report(ctx, run_dir, out_html, trace, fmt):
    """Render a run (or plan) directory as HTML and/or a Chrome trace; a rollout-length file (a trace,
    a TRL completions log, a verl dump, a CSV/JSONL table) as its distribution next to lognormal and
    Pareto fits (`rlhfsim lengths report`)."""
    from rlhfsim.contracts import REPORT_FILE, TRACE_FILE
    from rlhfsim.files import out_path
    from rlhfsim.report import render

    out_html, trace = out_path(out_html, REPORT_FILE), out_path(trace, TRACE_FILE)
    if run_dir.is_file():
        if trace is not None:
            raise RlhfsimError(f"report --trace: expected a run directory for a Chrome trace, got the file {str(run_dir)!r}")
        from rlhfsim.lengths.cli import report_command

        return ctx.invoke(report_command, source=run_dir, fmt="auto", tokenizer=None, group_size=1,
                          prompts_per_step=None, out_html=out_html, as_json=fmt == "json")
    if out_html is None and trace is None:
        raise RlhfsimError("report: expected -o DIR (or FILE.html) and/or --trace DIR (or FILE.json), got neither")
    render(run_dir, out_html, trace)
    written = [str(p) for p in (out_html, trace) if p is not None]
    if fmt == "json":
        click.echo(json.dumps({"written": written}))
        return
    for p in written:
        click.echo(f"wrote {p}")


@main.command()
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--steps", type=click.IntRange(min=1), help="Steps to simulate (default: the scenario's).")
@click.option("--profile", "profile", help="Calibration profile name or JSON path; `auto`: the bundled profile of the scenario's GPU built from public per-operation measurements where there is one (default: the bundled `default`).")
@set_option
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def explain(scenario, steps, profile, sets, fmt):
    """Which cost terms SCENARIO's step time is made of: each phase's seconds by named term (rlhfsim.costs.terms)."""
    from rlhfsim.scenario.loader import load_scenario, parse_set
    from rlhfsim.sim.explain import explain as run_explain, render

    sc = load_scenario(scenario, overrides=[parse_set(s) for s in sets])
    doc = run_explain(sc, profile=profile, steps=steps)
    if fmt == "json":
        click.echo(to_json(doc))
    else:
        click.echo("\n".join(render(doc)))


@main.command()
@click.argument("overlay", metavar="OVERLAY", type=click.Path(dir_okay=False))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="What changes (repeatable): a launch setting, applied after the run's own as `rlhfsim import verl "
                   "--set` applies it (trainer.n_gpus_per_node=16, data.max_response_length=2048), or a scenario path "
                   "as `rlhfsim simulate --set` sets it (schedule.kind=oppo, cluster.gpus_per_node=8).")
@click.option("--mean-response-len", metavar="TOKENS|Nx",
              help="Responses this long on average (as verl logs response_length/mean), or N times the logged mean "
                   "(2x): the fitted shape is re-derived for it (its log-sd kept).")
@click.option("--mean-prompt-len", metavar="TOKENS|Nx", help="Prompts this long on average, or N times the logged mean.")
@click.option("--run", "run_id", help="Which of the overlay's runs (default: each of them).")
@click.option("--draws", type=click.IntRange(min=0), default=32, show_default=True,
              help="Draws of the fitted terms for the 90% interval, each one simulation, widened by the fit's misfit "
                   "(0: the misfit alone; on a CPU profile, no interval).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the draws.")
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path),
              help="Also write each what-if as a scenario, DIR/RUN.yaml (the fitted lengths' shape in it): a base for "
                   "`rlhfsim plan --profile OVERLAY` or `rlhfsim simulate --profile OVERLAY`.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def whatif(overlay, sets, mean_response_len, mean_prompt_len, run_id, draws, seed, out, fmt):
    """A run fitted by `calibrate --from-run` with something changed, under the same fitted terms: measured |
    fitted | what-if per phase and for the step, with a 90% interval from the fitted terms' draws and the fit's
    misfit (docs/from-run.md)."""
    from dataclasses import replace

    from rlhfsim.fromrun.whatif import render, split_sets, whatif as run_whatif, write_scenarios

    change = replace(split_sets(sets), mean_response=mean_response_len, mean_prompt=mean_prompt_len)
    doc = run_whatif(overlay, change, run_id=run_id, draws=draws, seed=seed)
    written = write_scenarios(doc, out) if out else []
    if fmt == "json":
        click.echo(to_json({**doc, "written": written} if out else doc))
    else:
        click.echo("\n".join(render(doc)))
        for w in written:
            click.echo(f"wrote {w}")


def _missing(name: str, err: ImportError) -> click.Command:
    @click.command(name=name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    def cmd():
        raise RlhfsimError(f"{name}: expected its dependencies installed (pip install torch==2.13.0 && "
                           f"pip install -e '.[calibrate]'), got an import error: {err}")

    return cmd


if __name__ == "__main__":
    main()

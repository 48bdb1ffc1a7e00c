"""``rlhfsim import verl|openrlhf``: a training framework's launch as a scenario. Each command parses,
calls the framework's importer and writes the scenario with its settings table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from rlhfsim.errors import RlhfsimError


def _options(f):
    f = click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True,
                     help="yaml: the scenario with the settings table as a header; json: scenario, settings and assumptions.")(f)
    f = click.option("-o", "--out", "out", type=click.Path(path_type=Path),
                     help="Directory to write the scenario in: DIR/scenario.yaml (--format json: DIR/import.json); "
                          "a path ending in .yaml/.yml (.json) is written as that file. Default: print it.")(f)
    f = click.option("--execution/--no-execution", default=True, show_default=True,
                     help="Map the framework's step mechanics (old-log-prob pass, micro-batches, packing, checkpointing, "
                          "offload, weight resharding) into the scenario's execution block; --no-execution leaves it off.")(f)
    f = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                     help="A setting applied after the launch's own (repeatable), e.g. for a shell variable the script leaves unset.")(f)
    f = click.option("--name", help="Scenario name (default: the launch's experiment name).")(f)
    f = click.option("--steps", type=click.IntRange(min=1), default=4, show_default=True, help="Steps to simulate.")(f)
    f = click.option("--gpus-per-node", type=click.IntRange(min=1), help="GPUs per node (OpenRLHF and verl's async recipes; default 8).")(f)
    f = click.option("--mean-prompt-len", type=click.FloatRange(min=0, min_open=True),
                     help="Mean prompt tokens (default: a quarter of the prompt cap).")(f)
    f = click.option("--mean-response-len", type=click.FloatRange(min=0, min_open=True),
                     help="Mean response tokens (default: half the response cap); e.g. the run's response_length/mean.")(f)
    f = click.option("--log", "log", type=click.Path(dir_okay=True, path_type=Path),
                     help="The run's log (verl console or metrics JSONL, TensorBoard events, a wandb CSV, OpenRLHF's "
                          "console; .gz allowed): the mean prompt and response lengths, the longest response and the "
                          "clip ratio over its steady steps, where the options above do not give them.")(f)
    f = click.option("--clip-ratio", type=click.FloatRange(min=0, max=1),
                     help="The share of responses cut at the response cap (verl's response_length/clip_ratio, its "
                          "mean over steps): the response lengths put that share at the cap.")(f)
    f = click.option("--max-response-len-logged", type=click.FloatRange(min=0, min_open=True),
                     help="The run's longest response per step (verl's response_length/max, its mean over steps): "
                          "the response lengths' tail is matched to it (with --mean-response-len).")(f)
    f = click.option("--verl-version", metavar="X.Y", help="The verl release the launch ran on (verl only): settings "
                     "it leaves out take that release's defaults where they changed (rollout.enforce_eager was True "
                     "before v0.6.0); default: verl's current defaults.")(f)
    f = click.option("--gpu", help="GPU of the run, from the hardware catalog (`rlhfsim gpus`); a launch does not name it.")(f)
    return click.argument("launch", nargs=-1, required=True)(f)


def _run(framework: str, launch, gpu, mean_response_len, mean_prompt_len, gpus_per_node, steps, name, sets, execution,
         out, fmt, verl_version=None, max_response_len_logged=None, clip_ratio=None, log=None):
    from rlhfsim.contracts import IMPORT_JSON_FILE, IMPORTED_SCENARIO_FILE
    from rlhfsim.files import out_path, write_atomic
    from rlhfsim.hardware.catalog import get_gpu
    from rlhfsim.importers import IMPORTERS, ImportOptions, render_yaml
    from rlhfsim.scenario.loader import load_scenario

    if gpu is not None:
        get_gpu(gpu, "--gpu")
    if verl_version is not None and framework != "verl":
        raise RlhfsimError(f"--verl-version: expected only with `rlhfsim import verl`, got it with import {framework}")
    if len(launch) == 1 and (launch[0] == "-" or Path(launch[0]).is_file()):
        src = launch[0]
        text = sys.stdin.read() if src == "-" else Path(src).read_text(errors="replace")
        is_yaml = src.endswith((".yaml", ".yml"))
    elif len(launch) == 1 and launch[0].endswith((".sh", ".yaml", ".yml")):
        raise RlhfsimError(f"import {framework}: expected a launch script or config file, got {launch[0]!r} (no such file)")
    else:
        src, text, is_yaml = "command line", " ".join(launch), False
    source = prompt_source = None
    steady, clip_given = None, clip_ratio
    if log is not None:
        got, steady = logged_lengths_of(log)
        source = f"--log {log.name}" if mean_response_len is None else None
        prompt_source = f"--log {log.name}" if mean_prompt_len is None and got["prompt_mean"] is not None else None
        mean_response_len = mean_response_len if mean_response_len is not None else got["mean"]
        mean_prompt_len = mean_prompt_len if mean_prompt_len is not None else got["prompt_mean"]
        max_response_len_logged = max_response_len_logged if max_response_len_logged is not None else got["max"]
        clip_ratio = clip_ratio if clip_ratio is not None else got["clip_ratio"]
    opts = ImportOptions(gpu=gpu, mean_response_len=mean_response_len, mean_prompt_len=mean_prompt_len,
                         steps=steps, name=name, sets=tuple(sets), gpus_per_node=gpus_per_node, execution=execution,
                         verl_version=verl_version, max_response_len_logged=max_response_len_logged,
                         clip_ratio=clip_ratio, lengths_source=source, prompt_source=prompt_source)
    res = IMPORTERS[framework](text, opts, src, is_yaml)
    if steady is not None and opts.clip_ratio is not None and clip_given is None:
        # the share at the cap needs the cap, which the launch gives (rlhfsim.fromrun.lengths.logged_lengths)
        from dataclasses import replace

        from rlhfsim.fromrun.lengths import logged_lengths

        at_cap = logged_lengths(steady, res.scenario["workload"]["max_response_tokens"])["clip_ratio"]
        if at_cap != opts.clip_ratio:
            opts = replace(opts, clip_ratio=at_cap)
            res = IMPORTERS[framework](text, opts, src, is_yaml)
    out = out_path(out, IMPORTED_SCENARIO_FILE, (".yml",)) if fmt == "yaml" else out_path(out, IMPORT_JSON_FILE)
    load_scenario(res.scenario, base_dir=out.parent.resolve() if out else None)  # the result must load and pass checks
    doc = render_yaml(res) if fmt == "yaml" else json.dumps(res.to_json(), indent=1) + "\n"
    if out is None:
        click.echo(doc, nl=False)
        return
    write_atomic(out, doc)
    unm = res.by_status("unmapped")
    click.echo(f"wrote {out}: {len(res.by_status('mapped'))} settings mapped, {len(res.by_status('no_cost'))} "
               f"without cost here, {len(unm)} unmapped, {len(res.assumptions)} assumptions")
    for s in unm:
        click.echo(f"  unmapped {s.key}={s.value}: {s.target}")


def logged_lengths_of(path: Path) -> tuple[dict, object]:
    """The steady steps' mean lengths of a run's log (``rlhfsim.fromrun``: its reader and steady steps) and the steady
    steps, each skipped record's notice echoed to stderr."""
    from rlhfsim.fromrun.lengths import logged_lengths
    from rlhfsim.fromrun.logs import read_log, steady_steps

    steady = steady_steps(read_log(path), path.name, min_steps=1)
    for line in steady.notices():
        click.echo(f"log: {line}", err=True)
    got = logged_lengths(steady)
    if got["mean"] is None:
        raise RlhfsimError(f"--log: expected response_length/mean in {path.name}'s steady steps, got none")
    return got, steady


@click.group("import")
def import_group():
    """A training framework's launch (command line, script or config) as a scenario, listing every
    setting it could not map and every assumption it made."""


@import_group.command("verl", context_settings={"ignore_unknown_options": True})
@_options
def verl_command(**kw):
    """Import a verl launch: a script running `python3 -m verl.trainer.main_ppo key=value ...`, the
    Hydra overrides themselves as arguments, or a verl YAML config. Synchronous and colocated (the
    hybrid engine), as verl runs by default; the async recipes (one_step_off_policy, fully_async_policy)
    as separate training and generation pools under the async schedule."""
    _run("verl", **kw)


@import_group.command("openrlhf", context_settings={"ignore_unknown_options": True})
@_options
def openrlhf_command(**kw):
    """Import an OpenRLHF launch: a script running `openrlhf.cli.train_ppo_ray --flag value ...` or
    the flags themselves as arguments. One pool per Ray actor group unless colocated."""
    _run("openrlhf", **kw)

"""``rlhfsim validate``: the click command; it parses, calls ``calibrate.validation.run.validate`` (or
the TRL adapter, or draws a generated set first), writes the JSON document and prints the tables."""

from __future__ import annotations

import json
from pathlib import Path

import click

from calibrate.frameworks import FRAMEWORKS
from calibrate.validation.calibration import QUICK, profile_list
from calibrate.validation.run import check_visits, validate
from calibrate.validation.tables import print_table
from rlhfsim.errors import RlhfsimError


@click.command("validate")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--scenario", "scenarios", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Scenario YAML (repeatable); or --generate.")
@click.option("--generate", metavar="N",
              help="Draw N scenarios (1-100) from the documented ranges (rlhfsim.validate_gen.RANGES) and validate "
                   "them, one scenario after another; --profile defaults to 'generic,cpu', two blind profiles "
                   "(docs/guide/validating.md 'Generated scenarios').")
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
                   "with --scenario; steps measured a few percent slower than a job alone, back to back on one set).")
@click.option("--recalibrate", is_flag=True,
              help="Measure the quick calibration again (between blocks of the real steps) instead of using the cached one.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--set", "sets", multiple=True, metavar="PATH=VALUE",
              help="Override a field of every scenario (repeatable): a dotted path and a YAML value, e.g. --set steps=4.")
@click.option("-o", "--out", type=click.Path(path_type=Path), help="Also write the JSON document as validation.json in this directory (a path ending in .json: that file, the older usage). With --generate the directory (a new or empty one) also receives the drawn scenarios, their models' config.json files and generated.json (default: a fresh directory under the cache).")
@click.option("--framework", type=click.Choice(["rlhfsim", *FRAMEWORKS]), default="rlhfsim", show_default=True,
              help="What runs the real steps: rlhfsim's own executor, or a real RL framework (trl: TRL's GRPO/RLOO "
                   "trainers, calibrate/validation/trl.py; --profile defaults to the bundled cpu profile and takes "
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
        from calibrate.validation.generated import BLIND_PROFILE, generate_set

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
        from calibrate.validation.trl import validate_trl_command

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

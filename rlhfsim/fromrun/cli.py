"""``rlhfsim calibrate --from-run LAUNCH LOG --gpu NAME``: the measuring ``calibrate`` command (calibrate/cli.py)
with the from-run options added. Without ``--from-run`` the command is the measuring one, unchanged (its options
as that module defines them, whatever they are); with it, nothing is measured and no device is touched: the
run's launch and log are fitted (``rlhfsim.fromrun.overlay.calibrate_from_runs``) and an overlay profile written.
Where the measuring side cannot be imported (no torch), ``--from-run`` still works."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import click

from rlhfsim.errors import RlhfsimError

FROM_RUN_PARAMS = ("from_run", "base", "run_sets", "verl_version", "warmup", "min_steps", "lengths", "weighting",
                   "prior", "strict", "framework")
SHARED = ("gpu_name", "out", "name", "fmt")   # the measuring command's options --from-run reads too


def _extra() -> list[click.Option]:
    return [
        click.Option(["--from-run", "from_run"], nargs=2, multiple=True, metavar="LAUNCH LOG",
                     type=click.Path(path_type=Path),      # a LOG may be a directory of TensorBoard event files
                     help="Fit a profile overlay to a run you already have: its verl or OpenRLHF launch (script or "
                          "config) and its log (verl console, metrics JSONL, TensorBoard events, a wandb CSV or "
                          "OpenRLHF's console, .gz allowed; bad "
                          "records skipped and listed); repeatable (runs fitted together). Measures "
                          "nothing; needs --gpu (the run's GPU). See docs/from-run.md."),
        click.Option(["--base"], default="default", show_default=True, metavar="PROFILE",
                     help="--from-run: the profile the overlay extends (a name or a path)."),
        click.Option(["--set", "run_sets"], multiple=True, metavar="[RUN:]KEY=VALUE",
                     help="--from-run: a launch setting applied after the launch's own (as `rlhfsim import verl --set`); "
                          "to every run, or with RUN: to one (its place among the --from-run pairs, 1, 2, ..., or its "
                          "name, the log's file name less .log/.gz), e.g. --set 2:critic.model.use_remove_padding=False."),
        click.Option(["--verl-version"], metavar="X.Y", help="--from-run: the verl release the run used."),
        click.Option(["--framework"], type=click.Choice(["verl", "openrlhf"]), default=None,
                     help="--from-run: the runs' framework (default: told from each launch's trainer and its log)."),
        click.Option(["--warmup"], type=click.IntRange(min=0), default=1, show_default=True,
                     help="--from-run: leading steps skipped as warm-up."),
        click.Option(["--min-steps"], type=click.IntRange(min=1), default=3, show_default=True,
                     help="--from-run: fewer steady steps than this is an error."),
        click.Option(["--strict"], is_flag=True, default=False,
                     help="--from-run: refuse a log with any bad record (a truncated line, a NaN or negative time, a "
                          "duplicate step, ...) instead of skipping and listing it."),
        click.Option(["--lengths"], type=click.Choice(["logged", "mean"]), default="logged", show_default=True,
                     help="--from-run: response lengths from the log's mean, longest and clipped responses (logged), "
                          "or from its mean alone with the importer's assumed shape (mean)."),
        click.Option(["--weighting"], type=click.Choice(["equal", "share"]), default="equal", show_default=True,
                     help="--from-run: each logged phase's log residual as it is, or weighted by sqrt(its share of the step)."),
        click.Option(["--prior"], type=click.FloatRange(min=0), default=0.0, show_default=True,
                     help="--from-run: weight of rows keeping each term near its base value (0: none)."),
    ]


def _fallback_params() -> list[click.Option]:
    return [click.Option(["--gpu", "gpu_name"], metavar="NAME"), click.Option(["-o", "--out"], type=click.Path()),
            click.Option(["--name"], metavar="NAME"),
            click.Option(["--format", "fmt"], type=click.Choice(["table", "json"]), default="table", show_default=True)]


def build(measured: click.Command | None, import_error: str = "") -> click.Command:
    """The calibrate command: ``measured``'s options plus the from-run ones (see the module docstring)."""
    extra = _extra()
    params = list(measured.params) if measured is not None else _fallback_params()

    def callback(**kw):
        mine = {k: kw.pop(k) for k in FROM_RUN_PARAMS}
        if mine["from_run"]:
            given = [p.opts[-1] for p in params if p.name not in SHARED and kw.get(p.name) not in (None, False, (), p.default)]
            if given:
                raise click.UsageError(f"--from-run fits a run's log and measures nothing: {', '.join(given)} apply "
                                       f"to measuring; drop them")
            return from_run_command(mine, kw)
        stray = [f"--{k.replace('_', '-')}" for k in FROM_RUN_PARAMS
                 if mine[k] not in (None, (), next(p.default for p in extra if p.name == k))]
        if stray:
            raise click.UsageError(f"{', '.join(stray)}: used only with --from-run LAUNCH LOG")
        if measured is None:
            raise RlhfsimError(f"calibrate: expected its dependencies installed to measure (pip install torch==2.13.0 && "
                               f"pip install -e '.[calibrate]'), got an import error: {import_error}; "
                               f"`--from-run LAUNCH LOG` needs none")
        return measured.callback(**kw)

    help_text = ("Make a calibration profile, one of three ways:\n\n"
                 "\b\n"
                 "  measure this machine:   rlhfsim calibrate [--device cpu | --gpu NAME] [--quick] [-o DIR]\n"
                 "  fit a run's own log:    rlhfsim calibrate --from-run LAUNCH LOG --gpu NAME [-o overlay.json]\n"
                 "  fit published op data:  rlhfsim calibrate --from-ops DIR --gpu NAME [-o DIR]\n\n"
                 + (f"Measuring: {measured.help or ''}" if measured is not None else
                    f"Measuring needs the calibrate extra (not importable here: {import_error}).")
                 + " --from-run and --from-ops measure nothing and touch no device.")
    return GroupedCommand("calibrate", params=[*params, *extra], callback=callback, help=help_text,
                          short_help="Measure this machine, or fit a run's log, into a calibration profile.",
                          groups=[("Every mode (--gpu: the GPU measured, or the one the run or the measurements ran on)",
                                   list(SHARED) + ["help"]),
                                  ("--from-run LAUNCH LOG: fit a run you already have (docs/from-run.md)",
                                   [p.name for p in extra]),
                                  ("--from-ops DIR: fit published per-operation measurements", ["from_ops"]),
                                  ("Measuring this machine (the default)", None)])


class GroupedCommand(click.Command):
    """A command whose help lists its options in named groups (``groups``: title and parameter names in order;
    None: every parameter not named in another group)."""

    def __init__(self, *args, groups: list[tuple[str, list[str] | None]], **kw):
        super().__init__(*args, **kw)
        self.groups = groups

    def format_options(self, ctx, formatter):
        records = {p.name: p.get_help_record(ctx) for p in self.get_params(ctx)}
        helper = self.get_help_option(ctx)
        groups = [(t, [helper.name if n == "help" and helper is not None else n for n in names] if names else names)
                  for t, names in self.groups]
        named = {n for _, names in groups if names for n in names}
        for title, names in groups:
            chosen = names if names is not None else [n for n in records if n not in named]
            rows = [records[n] for n in chosen if records.get(n)]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def from_run_command(mine: dict, kw: dict) -> None:
    from rlhfsim.costs.profile import user_profile_dir
    from rlhfsim.fromrun.fit import RunSpec
    from rlhfsim.fromrun.overlay import calibrate_from_runs

    gpu = kw.get("gpu_name")
    if not gpu:
        raise RlhfsimError("calibrate --from-run: expected --gpu NAME (the run's GPU, from `rlhfsim gpus`), got none")
    ids = unique_ids([run_id(Path(log)) for _, log in mine["from_run"]])
    sets = sets_by_run(mine["run_sets"], ids)
    specs = [RunSpec(id=ids[i], launch=Path(launch), log=Path(log), gpu=gpu,
                     sets=sets[i], verl_version=mine["verl_version"], warmup=mine["warmup"],
                     min_steps=mine["min_steps"], lengths=mine["lengths"], strict=mine["strict"],
                     framework=mine["framework"])
             for i, (launch, log) in enumerate(mine["from_run"])]
    name = kw.get("name") or f"fromrun-{specs[0].id}"
    out = Path(kw["out"]) if kw.get("out") else user_profile_dir() / f"{name}.json"
    command = " ".join(["rlhfsim", *map(shlex.quote, sys.argv[1:])])
    res = calibrate_from_runs(specs, mine["base"], out, name, command, weighting=mine["weighting"], prior=mine["prior"])
    if kw.get("fmt") == "json":
        click.echo(json.dumps({"path": res["path"], **res["doc"]["from_run"]}))
        return
    print_fit(res["doc"]["from_run"], res["path"])


def unique_ids(ids: list[str]) -> list[str]:
    """Run names, a repeated one numbered by its place (two logs named alike in different folders)."""
    return [f"{x}#{i + 1}" if ids.count(x) > 1 else x for i, x in enumerate(ids)]


def sets_by_run(items, ids: list[str]) -> list[tuple[str, ...]]:
    """``--set [RUN:]KEY=VALUE`` per run: unscoped items go to every run, ``RUN:`` ones (a 1-based place or a run
    name) to that run only, each run's in the order given."""
    out: list[list[str]] = [[] for _ in ids]
    for item in items:
        key = item.partition("=")[0]
        scope, colon, rest = key.partition(":")
        if not colon:
            for lst in out:
                lst.append(item)
            continue
        value = item[len(key):]
        target = int(scope) - 1 if scope.isdigit() else (ids.index(scope) if scope in ids else None)
        if target is None or not 0 <= target < len(ids):
            raise RlhfsimError(f"--set {item}: expected RUN: to be 1..{len(ids)} or one of {', '.join(ids)} (the "
                               f"--from-run pairs in order), got {scope!r}")
        out[target].append(rest + value)
    return [tuple(x) for x in out]


def run_id(log: Path) -> str:
    """A run's name from its log's file name, less the log suffixes (``.gz``, ``.steps``, ``.log``, ``.jsonl``)."""
    name = log.name
    for suffix in (".gz", ".steps", ".jsonl", ".log", ".txt"):
        name = name.removesuffix(suffix)
    return name or log.name


def print_fit(fr: dict, path: str) -> None:
    """The fit as text: terms with intervals and the phases behind them, warnings, unidentified terms, phases."""
    echo = click.echo
    echo(f"wrote {path}")
    echo("fitted terms (base -> fitted, 90% interval over steady steps; misfit interval; determined by):")
    for t in fr["terms"]:
        mis = t["interval_misfit"]
        by = ", ".join(f"{d['run']} {d['phase']} {100 * d['share']:.0f}%" for d in t["determined_by"][:4]) or (
            "pinned at its bound (the terms it kept out fitted in its place)" if t.get("pinned") else "at its bound")
        echo(f"  {t['term']:21} {t['path']}: {t['base']:.4g} -> {t['fitted']:.4g} [{t['interval'][0]:.4g}, "
             f"{t['interval'][1]:.4g}]" + (f" misfit [{mis[0]:.4g}, {mis[1]:.4g}]" if mis else "") + f"; {by}")
    for w in fr["warnings"]:
        echo(f"warning: {w}")
    for u in fr["unidentified"]:
        echo(f"  not fitted: {u['term']} ({u['path']}): {u['why']}")
    for r in fr["runs"]:
        skipped = ", ".join(f"{k} {v}" for k, v in list(r["skipped_steps"].items())[:6])
        echo(f"run {r['id']}: {len(r['steady_steps'])} steady steps ({r['steady_lines']}); skipped {skipped}"
             + (" ..." if len(r["skipped_steps"]) > 6 else ""))
        for note in r.get("spans", []):
            echo(f"  note: {note}")
        for notice in r["log_read"]["notices"]:
            echo(f"  log: {notice}")

        def sec(v):
            return f"{v:9.3f} s" if v is not None else f"{'-':>9}  "

        for k, m in r["measured_s"].items():
            err = r["fitted_error_pct"].get(k)
            echo(f"  {k:26} measured {sec(m)}  base {sec(r['base_s'].get(k))}  fitted {sec(r['fitted_s'].get(k))}"
                 + (f"  ({err:+.1f}%)" if err is not None else "  (no error: measured 0)"))
        if r["unobserved_phases"]:
            echo(f"  priced but not in the log: {', '.join(r['unobserved_phases'])}")
        if r.get("whatif_command"):
            echo(f"  what-if: {r['whatif_command']}")


def _load() -> click.Command:
    from rlhfsim.cli import MEASURING, load_entry

    try:
        measured = load_entry(MEASURING)
    except ImportError as e:
        return build(None, str(e))
    return build(measured)


calibrate_command = _load()

"""Click commands ``calibrate`` and ``runtimes`` (added to the ``rlhfsim`` group by rlhfsim/cli.py, and to
``python -m calibrate``). Each parses its options, calls one library function and prints the result;
a user error is one line ``error: ...`` on stderr and exit code 2."""

from __future__ import annotations

import json
import shlex
import signal
import sys
import time
from pathlib import Path

import click

from rlhfsim.errors import RlhfsimError


def _fail(msg: str) -> None:
    click.echo(f"error: {msg}", err=True)
    raise click.exceptions.Exit(2)


def _split(values: tuple[str, ...]) -> list[str]:
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def _command_line() -> str:
    prog = "python -m calibrate" if sys.argv and sys.argv[0].endswith("__main__.py") else "rlhfsim"
    return " ".join([prog, *map(shlex.quote, sys.argv[1:])])


def _grid_overrides(text: str | None) -> dict | None:
    if not text:
        return None
    src = Path(text).read_text() if not text.lstrip().startswith("{") and Path(text).is_file() else text
    try:
        doc = json.loads(src)
    except json.JSONDecodeError as e:
        raise RlhfsimError(f"--grid: expected a JSON object or a JSON file, got {text[:60]!r} ({e.msg})") from None
    if not isinstance(doc, dict):
        raise RlhfsimError(f"--grid: expected a JSON object, got {type(doc).__name__}")
    return doc


def _on_sigterm(signum, frame):  # a kill ends the run like Ctrl-C: the journal is already durable
    raise KeyboardInterrupt


@click.command("calibrate")
@click.option("--gpu", "gpu_name", metavar="NAME", help="Calibrate the local CUDA device as this catalog GPU "
              "(a100, h100, h200, l40s, ...); the profile gets this name. Fails if there is no such device.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), help="Calibrate the CPU, or the local CUDA "
              "device under the catalog name its device name matches.  [default: cpu; cuda with --gpu]")
@click.option("--force", is_flag=True, help="With --gpu: skip the check that the local device is that GPU.")
@click.option("--quick", is_flag=True, help="Small shapes and a short grid (CPU: about 5 minutes on 2 cores).")
@click.option("--models", multiple=True, metavar="NAMES", help="Model shapes to measure: catalog names or "
              "config.json paths, comma-separated or repeated (default: a set per device and --quick).")
@click.option("--model-path", "model_paths", multiple=True, type=click.Path(file_okay=False), metavar="DIR",
              help="A local checkpoint directory to measure with its real weights (repeatable).")
@click.option("--runtimes", multiple=True, metavar="NAMES", help="Scoring runtimes (comma-separated or repeated; "
              "default all; with --quick all but aoti_python and aoti_cpp, compiled per shape): eager, compile, onnxruntime, "
              "aoti_python, aoti_cpp, tensorrt. eager always runs (the baseline).")
@click.option("-o", "--out", type=click.Path(), help="Directory for profile.json (default: the user profile directory as "
              "<name>.json, where `rlhfsim simulate --profile NAME` finds it); a path ending in .json is the profile file "
              "itself (older usage; how the bundled profile is written).")
@click.option("--resume", is_flag=True, help="Continue an interrupted run: points already in the journal are skipped.")
@click.option("--from-journal", "from_journal", is_flag=True, help="Measure nothing and touch no device: build the "
              "profile from the points in the journal of --out (a run cut short, or one measured on another machine; "
              "what was measured comes from the journal; operations without points fall back as in any profile).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), help="Default: float32 on CPU, "
              "bfloat16 on CUDA.")
@click.option("--threads", type=click.IntRange(min=1), help="torch threads (default: the usable cores).")
@click.option("--cache-dir", type=click.Path(file_okay=False), help="Where exported/compiled artifacts and the "
              "C++ program are cached (default: $RLHFSIM_CACHE_DIR or ~/.cache/rlhfsim).")
@click.option("--grid", "grid_json", metavar="JSON|PATH", help="Override grid fields (calibrate/running/grid.py), as a JSON "
              "object or a JSON file, e.g. '{\"score\": [[1, 64], [8, 256]], \"max_iters\": 10}'.")
@click.option("--no-progress", is_flag=True, help="No progress display (warnings still print).")
@click.option("--name", "name", metavar="NAME", help="Profile name (default: the device's: cpu-<cpu model>, or the "
              "GPU's catalog name such as h200). A bundled profile's name (cpu, default) is refused where it "
              "would shadow the bundled profile.")
@click.option("--launches", type=click.IntRange(min=1), help="Measure each scoring shape in N separate process "
              "launches (each with the grid's interleaved rounds), pooled (default 1: in this process).")
@click.option("--rounds", type=click.IntRange(min=1), help="Interleaved rounds per scoring shape (grid field rounds).")
@click.option("--from-ops", "from_ops", type=click.Path(file_okay=False), metavar="DIR", help="Measure nothing: fit "
              "the GPU kernel terms of --gpu (kernels_by_shape, collectives) from published per-operation measurements in "
              "Vidur's data/profiling layout (calibrate/public/vidur is a copy) and write a profile that extends the "
              "default one (calibrate.fitting.fromops).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="json: the profile's name, path, seconds taken, quality and runtime summary as one JSON object.")
def calibrate_command(gpu_name, device, force, quick, models, model_paths, runtimes, out, resume, dtype, threads,
                      cache_dir, grid_json, no_progress, name, launches, rounds, fmt, from_journal, from_ops=None):
    """Measure this machine's costs and write a calibration profile."""
    if from_ops:
        return _from_ops(from_ops, gpu_name, out, fmt)
    if gpu_name and device == "cpu":
        raise click.UsageError("--gpu and --device cpu contradict each other; give one")
    device = device or ("cuda" if gpu_name else "cpu")  # the same default as `rlhfsim validate`
    from rlhfsim.contracts import PROFILE_FILE
    from rlhfsim.files import out_path

    out = out_path(out, PROFILE_FILE)
    from rlhfsim.models.catalog import load_model, shape_from_hf_config, with_name

    try:
        grid = _grid_overrides(grid_json)
        for key, v in (("launches", launches), ("rounds", rounds)):
            if v is not None:
                grid = {**(grid or {}), key: v}
        shapes = [load_model(ref, "--models") for ref in _split(models)] or None
        checkpoints: dict[str, Path] = {}
        for d in model_paths:
            shape = with_name(shape_from_hf_config(d, "--model-path"), Path(d).resolve().name)
            checkpoints[shape.name] = Path(d)
            shapes = (shapes or []) + [shape]
    except RlhfsimError as e:
        _fail(str(e))
    from calibrate.running.journal import journal_path
    from calibrate.running.report import fit_table, interference_line, runtime_table
    from calibrate.running.run import assemble_journal, run_calibration

    old = signal.signal(signal.SIGTERM, _on_sigterm)
    t0 = time.perf_counter()
    try:
        if from_journal:
            if not out:
                raise RlhfsimError("--from-journal: expected --out, the profile whose journal to read")
            profile = assemble_journal(Path(out), gpu_name=gpu_name, name=name, grid=grid, command=_command_line())
        else:
            profile = run_calibration(device or "cuda", gpu_name=gpu_name, models=shapes, runtimes=_split(runtimes) or None,
                                  quick=quick, out=Path(out) if out else None, resume=resume, dtype=dtype,
                                  grid=grid, progress=not no_progress, threads=threads, checkpoints=checkpoints, force=force,
                                  cache_dir=Path(cache_dir) if cache_dir else None, command=_command_line(),
                                  name=name)
    except RlhfsimError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        where = f" in {journal_path(Path(out))}" if out else ""
        click.echo(f"interrupted: measured points are kept{where}; rerun with --resume to continue", err=True)
        raise click.exceptions.Exit(130)
    finally:
        signal.signal(signal.SIGTERM, old)
    if fmt == "json":
        from calibrate.running.report import runtime_json

        click.echo(json.dumps({"profile": profile["name"], "path": profile["_path"],
                               "seconds": time.perf_counter() - t0, "quality": profile["quality"],
                               "runtimes": runtime_json(profile)}))
        return
    click.echo(runtime_table(profile))
    click.echo("")
    click.echo(fit_table(profile))
    click.echo(interference_line(profile))
    q = profile["quality"]
    for w in q["warnings"]:
        click.echo(f"warning: {w}", err=True)
    status = "" if q["status"] == "ok" else f" with quality {q['status']!r} (see the warnings above)"
    click.echo(f"profile {profile['name']!r} written to {profile['_path']}{status} ({time.perf_counter() - t0:.0f} s)")


def _rich_runtime_table(profile: dict) -> None:
    """The scoring-runtime comparison as a rich table (plain text where rich is not installed)."""
    from calibrate.running.report import RUNTIME_HEADER, runtime_cells, runtime_rows, runtime_table

    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        click.echo(runtime_table(profile))
        return
    colour = {"faster": "green", "slower": "red", "tie": "yellow"}
    t = Table(title="scoring runtimes: median with 95% CI (bootstrap over rounds), speedup over eager with "
                    "95% CI, Welch verdict at 95%", title_justify="left")
    for i, h in enumerate(RUNTIME_HEADER):
        t.add_column(h, justify="left" if i in (0, 3) else "right")
    for r in runtime_rows(profile):
        cells = runtime_cells(r)
        if r["verdict"] in colour and r["runtime"] != "eager":
            cells[7] = f"[{colour[r['verdict']]}]{cells[7]}[/]"
        t.add_row(*cells)
    Console(width=220).print(t)
    notes = runtime_table(profile).split("\n\n", 1)
    if len(notes) > 1:
        click.echo(notes[1])


def _from_ops(root: str, gpu_name: str | None, out: str | None, fmt: str) -> None:
    """``calibrate --from-ops DIR --gpu GPU [-o OUT]``: ``calibrate.fitting.fromops.run`` (no torch, no device)."""
    from calibrate.fitting.fromops import run
    from rlhfsim.contracts import PROFILE_FILE
    from rlhfsim.files import out_path

    if not gpu_name:
        raise click.UsageError("--from-ops: expected --gpu, the catalog GPU whose measurements to fit (h100-sxm, a100-80gb)")
    target = out_path(out, PROFILE_FILE)
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
    try:
        prof, _, lines = run(Path(root), gpu_name, str(target) if target else None, command=_command_line())
    except RlhfsimError as e:
        _fail(str(e))
    if fmt == "json":
        click.echo(json.dumps({"profile": prof["name"], "path": str(target) if target else None,
                               "kernels_by_shape": prof["kernels_by_shape"], "collectives": prof["collectives"]}))
        return
    click.echo("\n".join(lines))


@click.command("runtimes")
@click.option("--profile", "profile_ref", required=True, metavar="NAME|PATH", help="A profile name or JSON path.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def runtimes_command(profile_ref, fmt):
    """Compare the scoring runtimes, batching strategies and generation runtimes a profile measured."""
    from calibrate.running.journal import points_path, with_points
    from calibrate.running.report import batching_table, chunk_table, generation_table, runtime_json, sampling_table
    from rlhfsim.costs.profile import load_profile

    try:
        profile = with_points(load_profile(profile_ref))   # the bundled cpu profile keeps them beside it
        if "runtimes" not in profile:
            raise RlhfsimError(f"profile {profile['name']}.runtimes: expected a measured profile from "
                               f"`rlhfsim calibrate`, got none")
        if "points" not in profile:
            raise RlhfsimError(f"profile {profile['name']}.points: expected them in the profile or beside it in "
                               f"{points_path(profile['_path']).name}, got neither (the bundled cpu profile's are in "
                               f"the repository, not in an installed package)")
    except RlhfsimError as e:
        _fail(str(e))
    if fmt == "json":
        click.echo(json.dumps(runtime_json(profile), indent=1))
        return
    click.echo(f"profile {profile['name']} ({profile['device'].get('name')}, {profile['dtype']}, "
               f"{profile['device'].get('threads')} threads)")
    _rich_runtime_table(profile)
    if profile.get("quality", {}).get("warnings"):
        for w in profile["quality"]["warnings"]:
            click.echo(f"warning: {w}")
    if profile.get("batching"):
        click.echo("\nbatching strategies (eager; against scoring one sequence at a time, batch1):")
        click.echo(batching_table(profile))
    if profile.get("chunked_scoring"):
        click.echo("\nchunked scoring (chunk on a cached prefix vs one-shot prefill):")
        click.echo(chunk_table(profile))
    click.echo("\ngeneration runtimes (one decode step at batch x mean cached tokens; call overhead per generate() "
               "call; handoff per chunk boundary and what left padding adds to a decode step, at that batch):")
    click.echo(generation_table(profile))
    tails = sampling_table(profile)
    if tails is not None:
        click.echo("\nsampling tails (per generation step: fixed + per logit x rows x vocabulary; the prefill/decode "
                   "fits exclude them, the simulator adds them back):")
        click.echo(tails)
    kernels = profile.get("kernels") or {}
    if kernels.get("gemm_weight_passes") is not None:
        click.echo(f"\nGEMM weight passes (a decode step of 2+ rows against 1 row): {kernels['gemm_weight_passes']:.2f}")
        by = kernels.get("gemm_passes_by_footprint")
        if by:
            click.echo("  by weight footprint: " + ", ".join(f"{f:g} MiB {p:.2f}" for f, p in zip(by["footprint_mib"], by["passes"])))
            for n, per in zip((by.get("by_rows") or {}).get("rows", []), (by.get("by_rows") or {}).get("passes", [])):
                click.echo(f"  at {n} rows: " + ", ".join(f"{f:g} MiB {p:.2f}" for f, p in zip(by["footprint_mib"], per)))
            from rlhfsim.costs.cpuhost import footprint_rates
            from rlhfsim.hardware.catalog import get_gpu

            rates = footprint_rates(by)
            if rates:
                dec = (profile.get("operations") or {}).get("decode") or {}
                try:
                    fit_bw = (f"; the decode fit's bandwidth {get_gpu(profile.get('gpu') or '').mem_bw * dec['memory_eff'] / 1e9:.1f} GB/s"
                              if dec.get("memory_eff") else "")
                except RlhfsimError:
                    fit_bw = ""
                click.echo("  one-row streaming rate (a decode step's weights stream no faster): "
                           + ", ".join(f"{f:g} MiB {r:.1f} GB/s" for f, r in zip(by["footprint_mib"], rates)) + fit_bw)
    co = kernels.get("cold_overheads")
    if co:
        click.echo(f"decode fixed costs after the weights stream ({co.get('model', '?')}'s step after F MiB, x no sweep; "
                   "the decode overheads and sampling tail at the model's footprint): "
                   + ", ".join(f"{f:g} MiB x{x:.2f}" for f, x in zip(co["footprint_mib"], co["factor"])))
    if kernels.get("width_efficiency"):
        we = kernels["width_efficiency"]
        click.echo("training rate by width, relative to the fastest: " + ", ".join(
            f"{w}: {r:.2f}" for w, r in zip(we["widths"], we["relative_rate"])))
    pf = kernels.get("page_faults")
    if pf:
        t = pf["tensors"]
        click.echo(f"page faults of large tensors: {1e9 * pf['fault_s_per_byte']:.3f} ns per byte above "
                   f"{pf['threshold_bytes'] / 2**20:.0f} MiB; logits-sized tensors per call: log-prob forward "
                   f"{t['logprob_forward']:.1f}, with backward {t['logprob_train']:.1f}, labels loss {t['labels_train']:.1f}")
        if pf.get("logprob_tail"):
            click.echo(f"log-prob tail after the LM head (log-softmax + gather, added to every log-prob pass): "
                       f"{1e9 * pf['logprob_tail']['s_per_logit']:.2f} ns per logit")
    for rt, h in sorted(((profile.get("interference") or {}).get("handover") or {}).items()):
        ov = h.get("overlap") if isinstance(h, dict) else None
        if ov:
            line = ov.get("lost")
            by = (f"; share of a call's time the actor loses: {line['intercept']:.3f} {line['per_log_params']:+.4f} x "
                  f"ln(actor parameters)") if line else ""
            click.echo(f"co-running, {rt} beside an intra-step scorer (calibrate.cpu.corun.overlap_fit, "
                       f"{ov['n_configs']} actors): x{ov['idle_x']:.2f} while it waits, x{ov['busy_x']:.2f} while a call runs (medians){by}")
    if profile.get("kernels_by_shape") or profile.get("collectives"):
        from calibrate.fitting.fromops import term_lines

        click.echo("\nGPU kernel terms from public per-operation measurements (calibrate.fitting.fromops), with provenance:")
        click.echo("\n".join(term_lines(profile)))
    if profile.get("from_logs"):
        from rlhfsim.fromrun.bundle import provenance_lines

        click.echo("\nterms fitted to public runs' logs (rlhfsim.fromrun.pool; every other term keeps its prior), each "
                   "with the runs and logs it came from (share of the fit):")
        click.echo("\n".join(provenance_lines(profile)))
    dev = profile.get("device") or {}
    probe = dev.get("state_probe_at_start")
    if probe:
        click.echo("device state probe at the start (validate compares it): GEMV " + ", ".join(
            f"{k} MiB {v:.0f} GB/s" for k, v in probe["gemv_gb_s"].items()) + f", GEMM {probe['gemm_gflop_s']:.0f} GFLOP/s"
            + (f", dispatch {probe['dispatch_kops_s']:.0f} k ops/s" if probe.get("dispatch_kops_s") else "")
            + f" ({probe['cpu_model']})")

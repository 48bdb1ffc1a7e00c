"""One calibration: measure every operation on this device, journal each point as it is taken, fit, and
write the Profile atomically.

Roles of the given model shapes: every decoder shape is measured as actor (prefill, decode, the
generation runtimes of ``Grid.gen_runtimes``, training with the LM head), as reward model (scoring,
chunked scoring) and as critic (training with the value head); every encoder shape as reward model
(scoring). Interference pairs the first decoder shape as actor with
the first decoder shape as reward model. Defaults per device and ``quick``: ``calibrate.running.grid``.

Torch threads are set explicitly (``threads``, default: the cores this process may use) and recorded.
Dtype: float32 on CPU (bfloat16 matmuls there are slow and unrepresentative), bfloat16 on CUDA.
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from calibrate.fitting.assemble import build_profile
from calibrate.fitting.quality import assess_quality
from calibrate.measuring.bench import measure_chunks, measure_generation, measure_interference, measure_training
from calibrate.cpu.corun import handover_plan, measure_handover
from calibrate.measuring.device_info import catalog_gpu, contention_probe, contention_ratio, cpu_model, describe, load_avg, \
    resolve_cuda_gpu, usable_cores
from calibrate.measuring.devstate import state_probe
from calibrate.measuring.genbench import measure_gen_runtimes
from calibrate.genruntimes import GEN_RUNTIMES_IMPL
from calibrate.measuring.stepbench import measure_step_scalars
from calibrate.measuring.genbench import plan_size as gen_plan_size
from calibrate.running.grid import DEFAULT_MODELS, Grid, default_grid, with_overrides, within
from calibrate.running.journal import Journal, PassView, journal_path, profile_inputs, read_journal, write_profile
from calibrate.measuring.measure import spread
from calibrate.measuring.models import dtype_name
from calibrate.cpu.pagefaults import count_shape, measure_page_faults
from calibrate.running.progress import Progress
from calibrate.runtimes import RUNTIMES
from calibrate.runtimes.aoti_cpp import default_cache_dir
from calibrate.measuring.reencode import measure_reencode
from calibrate.cpu.coldfixed import measure_cold
from calibrate.cpu.coldfixed import plan_size as cold_plan_size
from calibrate.cpu.gemm import measure_gemm
from calibrate.cpu.gemm import plan_size as gemm_plan_size
from calibrate.measuring.sampling import measure_sampling
from calibrate.measuring.sampling import plan_size as sampling_plan_size
from calibrate.cpu.widths import measure_widths
from calibrate.cpu.widths import plan_size as widths_plan_size
from calibrate.measuring.reencode import plan_size as reencode_plan_size
from calibrate.measuring.scoring import STRATEGIES, measure_runtimes, measure_strategies
from calibrate.running.session import CONTENTION_LIMIT, Session
from rlhfsim.costs.profile import bundled_names, user_profile_dir
from rlhfsim.errors import RlhfsimError
from rlhfsim.hardware.catalog import GpuSpec, get_gpu
from rlhfsim.models.catalog import CATALOG, ModelShape


def default_out(name: str) -> Path:
    return user_profile_dir() / f"{name}.json"


def cpu_profile_name(model: str) -> str:
    """``cpu-<model>``: the CPU model as a slug (``Intel(R) Xeon(R) Processor`` -> ``cpu-intel-xeon-processor``)."""
    slug = re.sub(r"\((r|tm)\)", "", model.lower())
    slug = re.sub(r"(\s+cpu)?\s*@.*$", "", slug)       # "... CPU @ 3.60GHz": the clock is not the model
    slug = re.sub(r"[^a-z0-9]+", "-", slug).strip("-")
    return f"cpu-{slug[:48].strip('-') or 'unknown'}"


def resolve_target(device: str, gpu_name: str | None, force: bool) -> tuple[str, GpuSpec, str]:
    """(torch device string, catalog entry the fit is relative to, default profile name: the GPU's catalog
    name, or ``cpu-<model>`` for the CPU; never a bundled profile's name)."""
    kind = torch.device(device).type
    if kind == "cuda":
        spec = resolve_cuda_gpu(gpu_name, device, force)
        return device, spec, (gpu_name or spec.name).lower()
    if kind != "cpu":
        raise RlhfsimError(f"--device: expected cpu or cuda, got {device!r}")
    if gpu_name not in (None, "cpu"):
        raise RlhfsimError(f"--gpu {gpu_name}: expected a CUDA device; --device cpu calibrates the CPU")
    return "cpu", get_gpu("cpu"), cpu_profile_name(cpu_model())


def profile_target(default_name: str, name: str | None, out: Path | None) -> tuple[str, Path]:
    """(profile name, path): ``--name``, else the device's name; written to ``--out`` or the user profile
    directory as ``<name>.json``. A profile that ``--profile NAME`` would find in place of a
    bundled one (a bundled name in the user profile directory) is refused: it would shadow the bundled
    profile for every later command."""
    if name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise RlhfsimError(f"--name: expected letters, digits, '.', '_' or '-', got {name!r}")
    final = name or default_name
    path = Path(out) if out is not None else default_out(final)
    bundled = bundled_names()
    if path.stem in bundled and path.resolve().parent == user_profile_dir().resolve():
        raise RlhfsimError(f"profile name {path.stem!r} is a bundled profile's; a profile of that name in "
                           f"{user_profile_dir()} would shadow it for every later command; pick another "
                           "--name (default: the device's, e.g. cpu-<model> or h200)")
    return final, path


def runtime_shapes(grid: Grid, name: str) -> tuple:
    return grid.runtime_score_static if name in grid.static_shape_runtimes else grid.runtime_score


def in_role(names: tuple[str, ...] | None, decoders: list[ModelShape]) -> list[ModelShape]:
    """The decoders a role (``Grid.actor_models``, ``Grid.critic_models``) is measured on."""
    return [m for m in decoders if names is None or m.name in names]


def plan_size(grid: Grid, models: list[ModelShape], rts: dict, runtime_models: set[str]) -> int:
    dec = [m for m in models if m.arch == "decoder"]
    actors, critics = in_role(grid.actor_models, dec), in_role(grid.critic_models, dec)
    n = len(dec) * len(grid.chunk_points()) + len(actors) * (len(grid.prefill) + len(grid.decode) + len(grid.train) + 1)
    n += len(critics) * (len(grid.train) + 1)
    for m in models:
        n += len(within(grid.score, m.max_positions))
        if m.name in runtime_models:
            n += len(STRATEGIES) * len(within(grid.strategies, m.max_positions))
            n += sum(len(within(runtime_shapes(grid, name), m.max_positions)) for name in rts if name != "eager")
        n += reencode_plan_size(grid, m, [r for r in rts if r == "eager" or m.name in runtime_models])
    n += 2 * len(handover_plan(grid, models, actors))
    n += sampling_plan_size(grid, grid.gen_runtimes) + gemm_plan_size(grid) + cold_plan_size(grid, actors) if actors else 0
    n += widths_plan_size(grid) if dec else 0
    return n + (2 * len(grid.interference) if dec else 0) + gen_plan_size(grid, actors)


def pick_runtime_models(models: list[ModelShape], limit: int | None) -> set[str]:
    out: set[str] = set()
    for arch in ("decoder", "encoder"):
        names = [m.name for m in models if m.arch == arch]
        out.update(names if limit is None else names[:limit])
    return out


def run_calibration(device: str, *, gpu_name: str | None = None, models: list[ModelShape] | None = None,
                    runtimes: list[str] | None = None, quick: bool = True, out: Path | None = None,
                    resume: bool = False, dtype: str | None = None, progress: bool = True,
                    grid: dict | None = None, threads: int | None = None,
                    checkpoints: dict[str, Path] | None = None, force: bool = False,
                    cache_dir: Path | None = None, command: str | None = None, name: str | None = None) -> dict:
    """Calibrate ``device`` ("cpu", "cuda", "cuda:N") and write the profile to ``out`` (default: the user
    profile directory, ``<name>.json``); returns the profile. ``grid`` overrides fields of the default
    ``calibrate.running.grid.Grid``; ``checkpoints`` maps shape names to local checkpoint directories whose weights
    replace the random ones. Interrupting loses at most the point in flight: rerun with ``resume=True``
    (or build a profile of what the journal holds with ``assemble_journal``)."""
    device, spec, default_name = resolve_target(device, gpu_name, force)
    name, out = profile_target(default_name, name, out)
    kind = torch.device(device).type
    dtype = dtype_name(dtype or ("bfloat16" if kind == "cuda" else "float32"))
    threads = threads or usable_cores()
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _calibrate(device=device, spec=spec, name=name, kind=kind, dtype=dtype, threads=threads,
                          models=models, runtimes=runtimes, quick=quick, out=out, resume=resume, progress=progress,
                          grid=grid, checkpoints=checkpoints, cache_dir=cache_dir, command=command)
    finally:
        torch.set_num_threads(old_threads)  # a library call leaves the process as it found it


def default_runtimes(grid: Grid, quick: bool) -> list[str]:
    """The scoring runtimes measured when ``--runtimes`` names none: all of them, except with ``--quick`` those
    compiled per shape (``grid.static_shape_runtimes``: AOTInductor's packages take 10-15 s to build per model
    and shape on two CPU cores, most of a cold quick run's time, for fits a quick grid's one shape cannot
    determine); ``--runtimes`` measures them in a quick run too."""
    return [r for r in RUNTIMES if not (quick and r in grid.static_shape_runtimes)]


def _calibrate(*, device: str, spec: GpuSpec, name: str, kind: str, dtype: str, threads: int,
               models: list[ModelShape] | None, runtimes: list[str] | None, quick: bool, out: Path | None,
               resume: bool, progress: bool, grid: dict | None, checkpoints: dict[str, Path] | None,
               cache_dir: Path | None, command: str | None) -> dict:
    if models is None:
        models = [CATALOG[n] for n in DEFAULT_MODELS[(kind, quick)]]
    if not models:
        raise RlhfsimError("--models: expected at least one model shape, got none")
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise RlhfsimError(f"--models: expected distinct model names, got {', '.join(names)}")
    g = with_overrides(default_grid(kind, quick), grid)
    rt_names = default_runtimes(g, quick) if runtimes is None else list(dict.fromkeys(["eager", *runtimes]))
    bad = [r for r in rt_names if r not in RUNTIMES]
    if bad:
        raise RlhfsimError(f"--runtimes: expected some of {', '.join(RUNTIMES)}, got {', '.join(bad)}")
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    info = describe(device, threads)
    meta = {"device_kind": kind, "device_name": info["name"], "dtype": dtype, "threads": threads,
            "models": names, "runtimes": rt_names, "quick": quick, "device": info}
    rts = {r: RUNTIMES[r]() for r in rt_names}
    rt_models = pick_runtime_models(models, g.runtime_models)
    decoders = [m for m in models if m.arch == "decoder"]
    passes = max(int(g.passes), 1)
    t0 = time.perf_counter()
    with Journal.open(journal_path(out), meta, resume) as journal, \
            Progress(plan_size(g, models, rts, rt_models) * passes, enabled=progress) as prog:
        s = Session(device, dtype, g, journal, prog, cache_dir, dict(checkpoints or {}), threads)
        left_out = [r for r in RUNTIMES if r not in rt_names and runtimes is None]
        gen_out = [r for r in g.gen_runtimes if GEN_RUNTIMES_IMPL[r].COMPILED] if g.gen_compiled_models == 0 else []
        if left_out or gen_out:
            prog.note("runtimes compiled per shape left out (" + "; ".join(
                [f"scoring: {', '.join(left_out)}, --runtimes names them"] * bool(left_out)
                + [f"generation: {', '.join(gen_out)}, --grid '{{\"gen_compiled_models\": 1}}' measures them"] * bool(gen_out)) + ")")
        if kind == "cpu":
            info["contention_probe_at_start"] = contention_probe(threads)
            info["state_probe_at_start"] = state_probe(threads)
        if kind == "cpu" and threads > 1:
            ratio = info["contention_ratio"] = contention_ratio(threads)
            if ratio > CONTENTION_LIMIT:
                prog.note(f"warning: other processes compete for the CPU: a matmul with {threads} threads runs "
                          f"{ratio:.1f}x the time of 1 thread; each point waits up to {g.quiet_wait_s:.0f} s for "
                          "them to stop (use a quiet machine, or --threads 1)")
        for k in range(passes):
            s.journal = PassView(journal, k)
            _measure_all(s, g, models, decoders, rts, rt_models)
        points, records = profile_inputs(journal.records)
        page_faults = None
        if kind == "cpu" and g.page_faults and decoders:
            # timed directly, not journaled (a few seconds): measured again on a resumed run
            if progress:
                prog.note("page faults of large tensors (calibrate.cpu.pagefaults)")
            page_faults = measure_page_faults(count_shape(decoders), threads)
    profile = build_profile(name=name, gpu=spec, dtype=dtype, device=info, quick=quick,
                            command=command or shlex.join(["python", *sys.argv]), points=points,
                            records=records, grid={**asdict(g), "runtime_models_measured": sorted(rt_models)},
                            page_faults=page_faults)
    if g.step_iters > 0 and decoders:
        # Framework step scalars (rlhfsim.costs.stepcosts): timed directly, not journaled (seconds).
        with torch.inference_mode(False):
            profile["step"] = measure_step_scalars(device, dtype, decoders[0], spec, iters=g.step_iters)
    profile["provenance"]["wall_s"] = time.perf_counter() - t0
    profile["provenance"]["quiet_spent_s"] = s.quiet_spent_s   # waiting for quiet cores and retakes (Grid.quiet_budget_s)
    profile["device"]["load_avg_1m_at_end"] = load_avg()
    if kind == "cpu":
        profile["device"]["contention_probe_at_end"] = contention_probe(threads)
        profile["device"]["state_probe_at_end"] = state_probe(threads)
    return _write(profile, out)


def _write(profile: dict, out: Path) -> dict:
    profile["quality"] = assess_quality(profile)
    write_profile(out, profile)   # its points beside it where they are kept so (the bundled cpu profile)
    profile["_path"] = str(out)
    return profile


def assemble_journal(out: Path, *, gpu_name: str | None = None, name: str | None = None, grid: dict | None = None,
                     command: str | None = None) -> dict:
    """The profile of the points the journal of ``out`` holds, measuring nothing and touching no device
    (``rlhfsim calibrate --from-journal``): a run cut short, or one measured on a lent machine and
    assembled elsewhere. What was measured comes from the journal's meta record (device kind and name,
    dtype, threads, quick; the device description where the journal has one, else the meta fields);
    the GPU's catalog entry from ``gpu_name`` or else the device name; ``grid`` overrides the quick or
    full default grid, as in the run. Operations without points fall back as in any profile."""
    out = Path(out)
    jp = journal_path(out)
    if not jp.is_file():
        raise RlhfsimError(f"--from-journal: expected the journal of an earlier run at {str(jp)!r}, found none")
    records = read_journal(jp)
    meta = next((r for r in records if r.get("kind") == "meta"), None)
    if meta is None or meta.get("device_kind") not in ("cpu", "cuda"):
        raise RlhfsimError(f"--from-journal: journal {str(jp)!r} has no meta record with device_kind cpu or cuda")
    kind, dev_name = meta["device_kind"], str(meta.get("device_name") or "")
    info = dict(meta.get("device") or {"kind": kind, "name": dev_name, "threads": meta.get("threads"),
                                       "source": "the journal's meta record (no device description in it)"})
    if kind == "cpu":
        spec, default_name = get_gpu("cpu"), cpu_profile_name(dev_name)
    else:
        spec = get_gpu(gpu_name, "--gpu") if gpu_name else catalog_gpu(dev_name, info.get("memory_bytes"))
        if spec is None:
            raise RlhfsimError(f"--from-journal: the journal's device {dev_name!r} is not in the hardware catalog; "
                               "pass --gpu NAME")
        default_name = (gpu_name or spec.name).lower()
    name, out = profile_target(default_name, name, out)
    quick = bool(meta.get("quick", True))
    g = with_overrides(default_grid(kind, quick), grid)
    models = [CATALOG[n] for n in meta.get("models", []) if n in CATALOG]
    runtime_models = pick_runtime_models(models, g.runtime_models) if models else set()
    points, runtimes = profile_inputs(records)
    profile = build_profile(name=name, gpu=spec, dtype=meta.get("dtype", "float32"), device=info, quick=quick,
                            command=command or shlex.join(["python", *sys.argv]), points=points, records=runtimes,
                            grid={**asdict(g), "runtime_models_measured": sorted(runtime_models)})
    profile["provenance"]["assembled_from_journal"] = {
        "journal": jp.name, "points": len(points), "torch_here": torch.__version__,
        "note": "built by --from-journal: nothing was measured by this command"}
    return _write(profile, out)


def _valid_runtimes(s: Session, name: str, shape: ModelShape) -> set[str]:
    """{name} when the scoring runtime ran and agreed with eager on ``shape`` (its journal record), else
    the empty set: re-encoding is not measured with a runtime already found unavailable or invalid."""
    from calibrate.measuring.scoring import runtime_key

    rec = s.journal.get(runtime_key(name, shape.name))
    return {name} if rec is None or rec.get("valid", True) else set()


def _measure_all(s: Session, g: Grid, models: list[ModelShape], decoders: list[ModelShape], rts: dict,
                 rt_models: set[str]) -> None:
    """One pass over the whole grid (``Grid.passes`` passes spread every operation's samples over the
    whole calibration, not one stretch of it)."""
    with torch.inference_mode(False), spread(g.bursts, g.burst_gap_s):
        actors = in_role(g.actor_models, decoders)
        for m in decoders:
            if m in actors:
                measure_generation(s, m)
            measure_chunks(s, m)
        measure_gen_runtimes(s, actors)
        for m in models:
            model = s.hf_model(m, "value")
            mine = {r: rt for r, rt in rts.items() if r == "eager" or m.name in rt_models}
            shapes = {r: within(g.score if r == "eager" else runtime_shapes(g, r), m.max_positions) for r in mine}
            measure_runtimes(s, mine, model, m, shapes)
            measure_reencode(s, {r: rt for r, rt in mine.items() if r in _valid_runtimes(s, r, m)}, model, m)
            # batching strategies: a table of scoring choices (``rlhfsim runtimes``) that no cost term reads,
            # measured on the models the scoring runtimes are compared on (all of them where runtime_models is None)
            for b, n in within(g.strategies, m.max_positions) if m.name in rt_models else ():
                measure_strategies(s, model, m, b, n)
            del model
            s.free()
        for m in actors:
            measure_training(s, m, "lm")
        for m in in_role(g.critic_models, decoders):
            measure_training(s, m, "value")
        if decoders:
            measure_interference(s, decoders[0], decoders[0])
        for rt, actor, reward, b, p, c in handover_plan(g, models, actors):
            measure_handover(s, rt, actor, reward, b, p, c)
        if actors:
            measure_gemm(s)
            measure_cold(s, actors)
            measure_sampling(s, g.gen_runtimes)
        if decoders:
            measure_widths(s)

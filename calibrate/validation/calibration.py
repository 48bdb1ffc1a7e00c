"""The calibrations validate predicts with: its quick calibration of exactly the scenarios' models at their
operating points (cached; a lean grid for shapes no profile has seen), and the generic quick calibration of
this CPU measured now (``--profile generic``), both measured in passes that alternate with blocks of the
real steps (``calibrate.validation.run``), so that both sides time the machine over the same stretch."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import click

from calibrate.validation.scenario import draw_rollouts
from rlhfsim.errors import RlhfsimError, ScenarioError


def cache_dir() -> Path:
    base = os.environ.get("RLHFSIM_CACHE_DIR") or str(Path.home() / ".cache" / "rlhfsim")
    return Path(base) / "validate"

def calibration_plan(device: str, shapes: list, dtype: str, interference: list | None = None,
                     threads: int | None = None, points: dict | None = None) -> tuple[Path, dict | None]:
    """Where the quick calibration of exactly these model shapes is cached, and its grid overrides.
    Cached by device, shapes, dtype, torch version, thread count, grid and ``MEASUREMENT_VERSION``.
    ``interference``: (decode batch, decode context, chunk batch, chunk tokens) of the scenarios that
    stream chunks while decoding, so the slowdowns are measured where the prediction needs them rather
    than at the grid's default shape; ``points``: grid fields with the scenarios' operating points added
    (``operating_points``)."""
    import torch

    from calibrate import MEASUREMENT_VERSION

    grid = {k: [list(x) if isinstance(x, (list, tuple)) else x for x in v] if isinstance(v, list) else v
            for k, v in (points or {}).items()}
    if interference:
        grid["interference"] = [list(x) for x in sorted(set(interference))]
    grid = grid or None
    key = json.dumps([device, dtype, torch.__version__, sorted(s.name for s in shapes), grid, threads, MEASUREMENT_VERSION])
    return cache_dir() / f"profile-{hashlib.sha1(key.encode()).hexdigest()[:12]}.json", grid


def _partial(path: Path) -> Path:
    return path.with_name(path.stem + ".partial.json")


def calibrate_passes(device: str, shapes: list, dtype: str, path: Path, grid: dict | None, upto: int,
                     threads: int | None, progress: bool) -> None:
    """Measure passes 0 .. upto - 1 of the calibration cached at ``path`` into its partial journal (a
    pass already in the journal is not measured again, so an interrupted run resumes); ``finish``
    moves the result into place once the last pass is in."""
    from calibrate.measuring.devstate import pool_pass_probes, profile_probes
    from calibrate.running.run import run_calibration

    out = _partial(path)
    prior = profile_probes(json.loads(out.read_text())) if upto > 1 and out.is_file() else []
    run_calibration(device, gpu_name=None, models=shapes, runtimes=["eager"], quick=True, out=out,
                    resume=True, dtype=dtype, progress=progress, grid={**(grid or {}), "passes": upto}, threads=threads)
    pool_pass_probes(out, prior)


def finish_calibration(path: Path) -> None:
    from calibrate.running.journal import journal_path

    part = _partial(path)
    os.replace(journal_path(part), journal_path(path))
    os.replace(part, path)


def discard_calibration(path: Path) -> None:
    from calibrate.running.journal import journal_path

    for p in (path, journal_path(path), _partial(path), journal_path(_partial(path))):
        p.unlink(missing_ok=True)


OPERATING_SAMPLE = 256  # rollouts drawn from a scenario's stream to place its operating points


def _round(x: float, q: int = 16) -> int:
    return max(q, int(round(x / q)) * q)


LEAN_BASE_POINTS = 3   # lean calibration: base-grid points kept per operation (smallest, middle, largest)


def _thin(points, k: int = LEAN_BASE_POINTS) -> set:
    """k points of a base grid spanning it by size (batch x tokens): its smallest, its largest, and
    evenly spaced ones between."""
    pts = sorted(set(points), key=lambda x: (x[0] * x[1], x))
    if len(pts) <= k:
        return set(pts)
    return {pts[round(i * (len(pts) - 1) / (k - 1))] for i in range(k)}


def is_new_shape(shape) -> bool:
    from rlhfsim.models.catalog import CATALOG

    return CATALOG.get(shape.name) != shape


def operating_points(prepared, kind: str, lean: bool = False) -> dict:
    """Calibration grid fields extended with the shapes the scenarios run at (so the fits are measured
    where the predictions need them, not extrapolated from the default grid): per scenario, decode at
    ``max_batch`` rows with the mean cached context at mid-response and at the 90th-percentile response,
    the generation prefill (a static batch of padded prompts, or one prompt at a time when continuous),
    the forward passes (``max_batch`` rows padded to a typical sequence) and a training minibatch.
    Lengths are rounded to 16 tokens so near-identical scenarios share points.

    ``lean`` (a calibration of shapes no profile has seen, within minutes): of the base grid only
    ``LEAN_BASE_POINTS`` points per operation spanning it (the operating points are all kept); chunked
    scoring at the scenarios' chunk sizes only when one streams chunks (else one point), one batching
    strategy point; each decoder measured in the roles it plays (``Grid.actor_models``: generation and
    LM training for actor and reference shapes; ``Grid.critic_models``: value training for critic shapes,
    or the first actor's where no scenario has a critic); a reward-only shape is measured as a scorer;
    the measured cost terms at a few points (``_lean_roles``)."""
    import numpy as np

    from calibrate.running.grid import Grid, default_grid

    base = default_grid(kind, True)
    extra = {"decode": set(), "prefill": set(), "score": set(), "train": set(),
             "gen_prefill": set(), "gen_decode": set(), "handoff": set()}
    runtimes = set()
    for sc, setup, _, _ in prepared:
        used = draw_rollouts(setup, OPERATING_SAMPLE)   # not the run's own: the grid must not depend on --steps
        p = np.array([x for x, _ in used], dtype=float)
        r = np.array([y for _, y in used], dtype=float)
        mb = sc.generation.max_batch
        extra["decode"].add((mb, _round(p.mean() + r.mean() / 2)))
        extra["decode"].add((mb, _round(p.mean() + np.quantile(r, 0.9))))
        if sc.generation.engine == "static":
            extra["prefill"].add((mb, _round(np.quantile(p, 0.9))))
        else:
            extra["prefill"].add((1, _round(p.mean())))
        seq = _round(np.quantile(p + r, 0.75))
        extra["score"].add((mb, seq))
        extra["train"].add((sc.algorithm.minibatch_size, seq))
        rt = sc.generation.resolved_runtime
        if rt != "kv_decoder":
            # The runtime's own calls at the same operating points (calibrate.measuring.genbench).
            runtimes.add(rt)
            extra["gen_prefill"].add((mb, _round(np.quantile(p, 0.9))))
            extra["gen_decode"].add((mb, _round(p.mean() + r.mean() / 2)))
            extra["gen_decode"].add((mb, _round(p.mean() + np.quantile(r, 0.9))))
            sched = sc.schedule
            if sched.kind == "oppo" and sched.intra.enabled:
                k = sched.intra.chunk_tokens
                extra["handoff"].add((mb, _round(p.mean()), 4 * k, k))
    gen_keys = ("gen_prefill", "gen_decode", "handoff")
    basis = (lambda k: _thin(getattr(base, k))) if lean else (lambda k: set(getattr(base, k)))
    out = {k: sorted(basis(k) | v) for k, v in extra.items() if k not in gen_keys}
    # Only the runtimes the scenarios generate with (kv_decoder's points are the plain prefill/decode).
    out["gen_runtimes"] = sorted(runtimes)
    if runtimes:
        out.update({k: sorted(basis(k) | extra[k]) for k in gen_keys})
    if lean:
        out.update(_lean_roles(prepared, base))
    if kind == "cpu":
        # Three passes over the whole grid, samples pooled (calibrate.running.journal.merge_passes): a shared VM's
        # speed wanders from second to second and from minute to minute, and the real runs see its usual
        # speed, not the speed of the minute in which one operation's points happened to be measured.
        out.update(passes=3, point_budget_s=0.15)
        # The scenarios' calibration keeps the grid its CPU validations were measured with where the quick grid
        # was cut for `rlhfsim calibrate --quick`'s time (chunked prefill at three prefixes, left padding at
        # three shapes, hand-over and padding on every decoder, a compiled generation runtime on the first)
        # (where the lean grid did not set its own)
        for k, v in (("chunk_prefixes", [0, 128, 384]), ("gen_pad", [list(x) for x in Grid.gen_pad]),
                     ("gen_host_models", None), ("gen_compiled_models", 1)):
            out.setdefault(k, v)
    return out


def _lean_roles(prepared, base) -> dict:
    """The lean calibration's chunk, strategy and role fields (``operating_points``)."""
    actors, critics, chunks = set(), set(), set()
    for sc, setup, _, _ in prepared:
        actors.update(setup.shapes[r].name for r in ("actor", "reference") if r in setup.shapes)
        if "critic" in setup.shapes:
            critics.add(setup.shapes["critic"].name)
        sched = sc.schedule
        if sched.kind == "oppo" and sched.intra.enabled and sc.models.reward.kind == "model":
            chunks.add(sched.intra.chunk_tokens)
    first_actor = prepared[0][1].shapes["actor"].name
    out = {"actor_models": sorted(actors), "critic_models": sorted(critics) or [first_actor],
           "strategies": [min(base.strategies)]}
    # The measured cost terms (calibrate.measuring.sampling, calibrate.cpu.gemm, calibrate.cpu.widths), leanly: the sampling
    # tail at the base grid's three spanning points plus each actor's (max_batch, vocab); two matrices at
    # 1 and 2 rows, alone and cycled through the base grid's footprints; the widths of the trained models
    # between the base grid's narrowest and widest.
    sampling = _thin(base.sampling) | {(sc.generation.max_batch, setup.shapes["actor"].vocab) for sc, setup, _, _ in prepared}
    widths = {setup.shapes[r].hidden for _, setup, _, _ in prepared for r in ("actor", "critic") if r in setup.shapes}
    out.update(sampling=sorted(sampling))
    if base.gemm:   # CPU host effects (calibrate.running.grid.CPU_ONLY_FIELDS): a GPU's base grid schedules none of them
        out.update(gemm=[(r, o, i) for o, i in ((1024, 256), (4096, 256)) for r in (1, 2)],
                   gemm_footprints_mib=list(base.gemm_footprints_mib),
                   widths=sorted(widths | ({min(base.widths), max(base.widths)} if base.widths else set())))
    if chunks:
        out.update(chunk_batches=[1], chunk_prefixes=[0, 128], chunk_sizes=sorted(chunks))
    else:
        out.update(chunk_batches=[1], chunk_prefixes=[0], chunk_sizes=[min(base.chunk_sizes)])
    return out


def corun_shape(sc, rollouts: list[tuple[int, int]]) -> tuple[int, int, int, int] | None:
    """The co-running configuration of a scenario that streams chunks during decode: the decode batch
    (max_batch), the mean cached context while decoding (prompt + half the response), the chunk batch
    and the chunk size."""
    sched = sc.schedule
    if not _streams_to_reward_model(sc):
        return None
    sample = rollouts[:OPERATING_SAMPLE]
    ctx = sum(p + r / 2 for p, r in sample) / len(sample)
    return (sc.generation.max_batch, _round(ctx), sched.intra.max_chunk_batch, sched.intra.chunk_tokens)


def handover_shape(sc, setup, rollouts: list[tuple[int, int]]) -> tuple | None:
    """The hand-over co-running point of a scenario that streams chunks into a reward model while
    decoding (``Grid.handover``, ``calibrate.cpu.corun``): its generation runtime, actor and reward shapes,
    the decode batch (max_batch), the mean prompt and the chunk size."""
    if not _streams_to_reward_model(sc):
        return None
    sample = rollouts[:OPERATING_SAMPLE]
    prompt = sum(p for p, _ in sample) / len(sample)
    return (sc.generation.resolved_runtime, setup.shapes["actor"].name, setup.shapes["reward"].name,
            sc.generation.max_batch, _round(prompt), sc.schedule.intra.chunk_tokens)


def _streams_to_reward_model(sc) -> bool:
    """Does the scenario stream chunks into a reward model while decoding (OPPO intra-step)?"""
    sched = sc.schedule
    return sched.kind == "oppo" and sched.intra.enabled and sc.models.reward.kind == "model"


QUICK = "quick"   # --profile name of validate's own quick calibration of the scenarios' models
GENERIC = "generic"   # --profile name of the generic quick calibration measured now, its passes between blocks of the steps


# The generic calibration under validate: the bundled quick grid in GENERIC_PASSES passes whose samples are
# pooled (calibrate.running.journal.merge_passes), each with a third of the quick grid's point budget, so that it
# takes about as long as one pass at the full budget, and so that its passes can alternate with blocks of
# the real steps (``validate``): both sides then time the machine over the same stretch of the run.
GENERIC_PASSES = 3
GENERIC_POINT_BUDGET_S = 0.1


def generic_runtimes(prepared: list) -> list[str]:
    """The scoring runtimes the generic calibration measures for these scenarios: eager (the reference,
    critic and reward passes the executor runs in the training framework) and any runtime a scenario
    names for its reward model; none of the others prices anything in the validated steps."""
    from rlhfsim.sim.simulation import scoring_runtime

    return sorted({"eager"} | {r for sc, _, _, _ in prepared for r in (scoring_runtime(sc),) if r})


def measure_generic(device: str, threads: int | None, out: Path, progress: bool = True, *, models: list | None = None,
                    runtimes: list[str] | None = None, grid: dict | None = None,
                    handover: tuple[int, int, int] = (4, 64, 32), upto: int | None = None) -> str:
    """``--profile generic``: the quick generic calibration of this device (``rlhfsim calibrate --device cpu
    --quick``: the default quick grid on the catalog's models, then the hand-over pattern of each decoder
    it measured, as the bundled ``cpu`` profile is made), measured in ``GENERIC_PASSES`` passes at
    ``GENERIC_POINT_BUDGET_S`` per point and pass. Blind to the scenarios (no operating point of theirs is
    measured), in the state of the machine the steps run in: on a shared host whose speed moves by 10-30%
    between hours, a profile measured hours before prices another machine.
    ``upto``: measure passes 0 .. upto - 1 (those already in the journal are not measured again), so the
    passes can alternate with blocks of the real steps; the hand-over pattern is measured with the last
    pass (default: all of them now). Written to ``out`` (the ``generic-profile.json`` of a ``--generate``
    directory, else a time-stamped file in the cache), its journals beside it (an interrupted one resumes
    when ``out`` is given again; ``python -m calibrate calibrate --from-journal`` builds a profile of what it
    holds). ``models``, ``runtimes`` (scoring runtimes; default all), ``grid`` (over the defaults above) and
    ``handover`` (batch, prompt, chunk) replace the defaults (tests). Returns the profile's path."""
    if device != "cpu":
        raise RlhfsimError(f"--profile {GENERIC}: expected --device cpu (a GPU's generic calibration is "
                           f"`rlhfsim calibrate --gpu NAME`), got --device {device}")
    from calibrate.measuring.devstate import pool_pass_probes, profile_probes
    from calibrate.running.extend import _profile_decoders, extend_handover, extension_journal
    from calibrate.running.journal import journal_path
    from calibrate.running.run import run_calibration

    g = {"passes": GENERIC_PASSES, "point_budget_s": GENERIC_POINT_BUDGET_S, **(grid or {})}
    passes = int(g["passes"])
    upto = passes if upto is None else max(1, min(int(upto), passes))
    out.parent.mkdir(parents=True, exist_ok=True)
    if progress:
        click.echo(f"generic calibration of this device (quick grid, catalog models), pass {upto} of {passes}"
                   f"{', then the hand-over pattern' if upto == passes else ''}: {out}", err=True)
    prior = profile_probes(json.loads(out.read_text())) if upto > 1 and out.is_file() else []
    doc = run_calibration(device, quick=True, out=out, resume=journal_path(out).is_file(), progress=progress, models=models,
                          runtimes=runtimes, grid={**g, "passes": upto}, threads=threads, name=GENERIC,
                          command=f"rlhfsim validate --profile {GENERIC}")
    pool_pass_probes(out, prior)
    if upto == passes:
        decoders = [m.name for m in _profile_decoders(doc)]
        batch, prompt, chunk = handover
        extend_handover(out, decoders, threads or doc["device"].get("threads") or 1, batch=batch, prompt=prompt,
                        chunk=chunk, resume=extension_journal(out, "handover").is_file())
    return str(out)


def calibration_groups(prepared: list) -> list[list]:
    """Scenarios sharing one quick calibration: all of them together, unless one has a shape outside
    the catalog; then each scenario is calibrated on its own (its own shapes at its own operating
    points: one calibration of every drawn shape at every scenario's points grows with the square of
    the number of scenarios)."""
    if any(is_new_shape(s) for _, setup, _, _ in prepared for s in setup.shapes.values()):
        return [[p] for p in prepared]
    return [prepared]


@dataclass(frozen=True)
class QuickPlan:
    """One quick calibration: its model shapes, dtype, cache path, grid overrides, and whether it is on
    the lean grid (shapes no profile has seen)."""

    shapes: list
    dtype: str
    path: Path
    grid: dict | None
    lean: bool

    @property
    def passes(self) -> int:
        return int((self.grid or {}).get("passes", 1))


def quick_plan(group: list, device: str, threads: int | None) -> QuickPlan:
    """The quick calibration of these scenarios' models at their operating points."""
    shapes = {s.name: s for _, setup, _, _ in group for r, s in setup.shapes.items() if r != "rollout"}
    dtypes = {sc.models.actor.dtype for sc, _, _, _ in group}
    if len(dtypes) != 1:
        raise ScenarioError("models.actor.dtype", f"expected one dtype across the validated scenarios (one calibration), got {sorted(dtypes)}")
    dtype = dtypes.pop()
    corun, handover = [], set()
    for sc, setup, _, _ in group:
        if _streams_to_reward_model(sc):
            used = draw_rollouts(setup, OPERATING_SAMPLE)   # one draw for both co-running points
            corun += [c for c in (corun_shape(sc, used),) if c is not None]
            handover.add(handover_shape(sc, setup, used))
    # Calibrate with the thread count the real runs use: CPU kernels scale with it. Shapes no profile
    # has seen get the lean grid, so a new scenario is calibrated within minutes.
    lean = any(is_new_shape(s) for s in shapes.values())
    # Co-running in the hand-over pattern only where a scenario streams (none otherwise).
    points = {**operating_points(group, "cuda" if device == "cuda" else "cpu", lean), "handover": sorted(handover)}
    path, grid = calibration_plan(device, list(shapes.values()), dtype, corun, threads, points)
    return QuickPlan(list(shapes.values()), dtype, path, grid, lean)


def profile_list(profile: str | None) -> list[str]:
    """``--profile``: comma-separated names or paths; ``quick`` (or none given) is the quick calibration."""
    names = [p.strip() for p in (profile or QUICK).split(",") if p.strip()]
    if not names or len(set(names)) != len(names):
        raise RlhfsimError(f"--profile: expected distinct comma-separated profile names or paths, got {profile!r}")
    return names

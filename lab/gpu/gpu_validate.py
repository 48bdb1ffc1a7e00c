"""One time-boxed validation session on a lent GPU (``python lab/gpu/gpu_validate.py --out DIR``).

``lab/gpu/gpu_session.py`` spends a lease on calibration; this spends one on ``rlhfsim validate --device
cuda``: real steps of the GPU-sized scenarios (``scenarios/validate/h200/``) next to the simulator's
prediction from profiles that never saw them (by default the bundled ``h200-measured``, calibrated on
another lease, and the derived ``default``). A lent machine comes for minutes and gives back only what
lies under one directory, at most 8 files, so:

1. ``env``: ``python lab/gpu/gpu_session.py --env-only`` (``nvidia-smi``, package versions, the copy
   and bf16 matmul ceilings measured here), ``env.json``.
2. one ``validate`` stage per scenario, in the order given (most wanted first), each a child process
   ``rlhfsim validate --device cuda --sequential --steps N --profile P --scenario S`` writing
   ``val-<scenario>.json`` as soon as it ends: a stage that runs long is cut at its deadline (SIGTERM,
   SIGKILL 20 s later) and costs only itself. A stage starts only with ``--min-stage-s`` left; it may run
   to ``--stage-cap-s`` or the budget, whichever comes first.

With ``--calibrate MODELS``, a ``calibrate`` stage comes first: a quick calibration of those models on this
lease (``LEASE_GRID``: the operations the sync scenarios price, their generation runtimes, training with
both heads; chunked scoring, scoring runtimes, strategies, hand-over and the GEMM and width sweeps left
out), cut at ``--calibrate-s`` and then assembled from whatever its journal holds, into ``lease.json``,
which goes first in every validate stage's ``--profile``: a profile measured minutes before the steps on
the same host, where the bundled one came from another lease. With ``--variant NAME:VAR=VALUE`` the first
scenario runs once more, right after itself, with that environment variable set (``val-<scenario>-NAME.json``): an A/B of one
mechanism on the same lease (e.g. ``expandable:PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, the
caching allocator mapping growing segments instead of new blocks).

``session.json`` records every stage's command, exit code, seconds and whether its deadline cut it, and a
summary of each finished scenario (measured and predicted seconds per step, error per profile);
``session.log`` has every stage's output. ``--device cpu`` rehearses the same session here (with ``--set``
overrides to tiny models: ``--set cluster.gpu=cpu --set models.actor.model=tiny-qwen2 ...``). Needs torch,
transformers, simpy and pydantic (carried as wheels to the device image: docs/guide/calibrating.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Run as a script from a checkout (``python lab/gpu/NAME.py``): the repository root on the import path, so a
# bare device image needs no install; children get it through PYTHONPATH (Session.run).
ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [p for p in (str(ROOT), str(Path(__file__).resolve().parent)) if p not in sys.path]

from gpu_session import PLANS, Session

SCENARIOS = ("sync-static", "oppo-intra", "sync-continuous", "oppo-inter", "oppo-full")
# --calibrate: the calibration plan of lab/gpu/gpu_session.py ("quick-session") narrowed to what the sync
# scenarios price (prefill, decode, scoring, both training heads, the generation runtimes' points with
# left padding, the sampling tail at the scenarios' vocabulary, interference), so one small model fits in
# minutes
# (the grid's lists that may not be empty keep one small point each: one strategy, one chunked point, one
# hand-off)
LEASE_GRID = {"strategies": [[8, 256]], "chunk_batches": [8], "chunk_prefixes": [0], "chunk_sizes": [128],
              "handoff": [[8, 128, 32, 4]], "handover": [], "gemm": [], "widths": [],
              "sampling": [[16, 151936], [64, 151936]], "gen_runtimes": ["hf_generate", "kv_decoder"]}
MAX_FILES = 8   # what the device tool brings back from one directory
OWN_FILES = 3   # env.json, session.json, session.log


def summary(doc: dict) -> dict:
    """Per scenario and profile: measured and predicted seconds per step, the error, the phases' errors and
    (on CUDA) the allocator counters each phase moved per step."""
    out = {}
    for block in [doc, *doc.get("other_profiles", [])]:
        for sc in block.get("scenarios", []):
            out.setdefault(sc["name"], {})[block["profile"]] = {
                "measured_s": sc["measured_step_time_s"], "predicted_s": sc["predicted_step_time_s"],
                "error_pct": sc["error_pct"],
                "phases_error_pct": {k: v.get("error_pct") for k, v in sc.get("phases", {}).items()},
                **({"allocator": sc["allocator"]} if "allocator" in sc else {})}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python lab/gpu/gpu_validate.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="Directory for the session's files (at most 8).")
    ap.add_argument("--budget-s", type=float, default=420.0, help="Wall time for all stages together.")
    ap.add_argument("--device", default="cuda", help="cuda (the session's purpose) or cpu (to rehearse it).")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS),
                    help="Names under --dir (or YAML paths), comma-separated, most wanted first.")
    ap.add_argument("--dir", default="scenarios/validate/h200", help="Where scenario names are looked up.")
    ap.add_argument("--profile", default="h200-measured,default", help="validate's --profile.")
    ap.add_argument("--steps", type=int, default=2, help="Steps per scenario, the first a warm-up.")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                    help="validate's --set, for every scenario (repeatable).")
    ap.add_argument("--stage-cap-s", type=float, default=200.0, help="The most one scenario's stage may run.")
    ap.add_argument("--min-stage-s", type=float, default=45.0, help="A scenario starts only with this much left.")
    ap.add_argument("--calibrate", default="", metavar="MODELS",
                    help="First calibrate these catalog models on this device (lease.json, first in --profile).")
    ap.add_argument("--calibrate-s", type=float, default=200.0, help="The most the calibrate stage may run.")
    ap.add_argument("--gpu", default="h200", help="--calibrate: the catalog GPU the device is.")
    ap.add_argument("--grid-extra", default="{}", help="--calibrate: JSON grid fields over LEASE_GRID (rehearsals).")
    ap.add_argument("--variant", default="", metavar="NAME:VAR=VALUE",
                    help="Run the first scenario again with this environment variable set (val-<scenario>-NAME.json).")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = ROOT
    names = [n for n in args.scenarios.split(",") if n]
    if len(names) > MAX_FILES - OWN_FILES:
        ap.error(f"--scenarios: expected at most {MAX_FILES - OWN_FILES} (the device tool returns {MAX_FILES} files), "
                 f"got {len(names)}")
    extra_files = (2 if args.calibrate else 0) + (1 if args.variant else 0)   # lease.json + its journal; the variant
    if len(names) + extra_files > MAX_FILES - OWN_FILES:
        ap.error(f"--scenarios: expected at most {MAX_FILES - OWN_FILES - extra_files} with --calibrate/--variant "
                 f"(the device tool returns {MAX_FILES} files), got {len(names)}")
    paths = [Path(n) if n.endswith((".yaml", ".yml")) else root / args.dir / f"{n}.yaml" for n in names]
    for n, p in zip(names, paths):
        if not p.is_file():
            ap.error(f"--scenarios: {n!r}: expected a scenario file, found none at {p}")
    variant = None
    if args.variant:
        vname, _, assign = args.variant.partition(":")
        var, eq, value = assign.partition("=")
        if not (vname and vname.replace("-", "").isalnum() and var and eq):
            ap.error(f"--variant: expected NAME:VAR=VALUE (NAME in letters, digits and '-'), got {args.variant!r}")
        variant = (vname, var, value)
    try:
        extra_grid = json.loads(args.grid_extra)
        if not isinstance(extra_grid, dict):
            raise ValueError("not an object")
    except ValueError as e:
        ap.error(f"--grid-extra: expected a JSON object, got {args.grid_extra!r} ({e})")

    s = Session(out, args.budget_s)
    py = sys.executable
    s.run("env", [py, str(Path(__file__).resolve().parent / "gpu_session.py"), "--out", str(out), "--env-only"], min(60.0, s.left()))
    profile = args.profile
    if args.calibrate:
        lease = out / "lease.json"
        target = ["--gpu", args.gpu] if args.device == "cuda" else ["--device", "cpu", "--name", "lease"]
        grid = json.dumps({**PLANS["quick-session"], **LEASE_GRID, "actor_models": None, "critic_models": None,
                           **extra_grid})
        cal = [py, "-m", "calibrate", "calibrate", *target, "--quick", "--models", args.calibrate, "--runtimes",
               "eager", "--out", str(lease), "--grid", grid]
        s.run("calibrate", cal, min(args.calibrate_s, s.left() - 60))
        if not lease.is_file():    # cut before it wrote the profile: whatever the journal holds
            s.run("assemble", cal + ["--no-progress", "--from-journal"], min(60.0, s.left()))
        if lease.is_file():
            profile = f"{lease},{profile}" if profile else str(lease)
    sets = [a for o in args.overrides for a in ("--set", o)]
    results = {}
    runs = [(p, p.stem, None) for p in paths]
    if variant:
        runs.insert(1, (paths[0], f"{paths[0].stem}-{variant[0]}", {variant[1]: variant[2]}))   # right after its base
    for p, stem, env in runs:
        dest = out / f"val-{stem}.json"
        left = s.left() - 5
        limit = min(left, args.stage_cap_s) if left >= args.min_stage_s else 0.0
        rec = s.run(f"validate {stem}", [py, "-m", "rlhfsim.cli", "validate", "--device", args.device, "--sequential",
                                         "--steps", str(args.steps), "--profile", profile, "--format", "json",
                                         "--out", str(dest), "--scenario", str(p), *sets], limit, env=env)
        if rec["rc"] == 0 and dest.is_file():
            this = {(k if env is None else f"{k}-{variant[0]}"): v for k, v in summary(json.loads(dest.read_text())).items()}
            results.update(this)
            for by in this.values():
                s.say("   " + "; ".join(f"{prof}: measured {r['measured_s']:.3f} s, predicted {r['predicted_s']:.3f} s "
                                             f"({r['error_pct']:+.1f}%)" for prof, r in by.items()))
    doc = json.loads((out / "session.json").read_text())
    doc.update(device=args.device, profile=profile, steps=args.steps, overrides=args.overrides, results=results,
               **({"variant": {"name": variant[0], "env": {variant[1]: variant[2]}}} if variant else {}))
    (out / "session.json").write_text(json.dumps(doc, indent=1))
    s.say("== files: " + ", ".join(sorted(q.name for q in out.iterdir())))
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())

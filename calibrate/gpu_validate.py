"""One time-boxed validation session on a lent GPU (``python -m calibrate.gpu_validate --out DIR``).

``calibrate.gpu_session`` spends a lease on calibration; this spends one on ``rlhfsim validate --device
cuda``: real steps of the GPU-sized scenarios (``scenarios/validate/h200/``) next to the simulator's
prediction from profiles that never saw them (by default the bundled ``h200-measured``, calibrated on
another lease, and the derived ``default``). A lent machine comes for minutes and gives back only what
lies under one directory, at most 8 files, so:

1. ``env``: ``python -m calibrate.gpu_session --env-only`` (``nvidia-smi``, package versions, the copy
   and bf16 matmul ceilings measured here), ``env.json``.
2. one ``validate`` stage per scenario, in the order given (most wanted first), each a child process
   ``rlhfsim validate --device cuda --sequential --steps N --profile P --scenario S`` writing
   ``val-<scenario>.json`` as soon as it ends: a stage that runs long is cut at its deadline (SIGTERM,
   SIGKILL 20 s later) and costs only itself. A stage starts only with ``--min-stage-s`` left; it may run
   to ``--stage-cap-s`` or the budget, whichever comes first.

``session.json`` records every stage's command, exit code, seconds and whether its deadline cut it, and a
summary of each finished scenario (measured and predicted seconds per step, error per profile);
``session.log`` has every stage's output. ``--device cpu`` rehearses the same session here (with ``--set``
overrides to tiny models: ``--set cluster.gpu=cpu --set models.actor.model=tiny-qwen2 ...``). Needs torch,
transformers, simpy and pydantic (carried as wheels to the device image, docs/validation.md "GPU").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from calibrate.gpu_session import Session

SCENARIOS = ("sync-static", "oppo-intra", "sync-continuous", "oppo-inter", "oppo-full")
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
    ap = argparse.ArgumentParser(prog="python -m calibrate.gpu_validate", description=__doc__.split("\n\n")[0])
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
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[1]
    names = [n for n in args.scenarios.split(",") if n]
    if len(names) > MAX_FILES - OWN_FILES:
        ap.error(f"--scenarios: expected at most {MAX_FILES - OWN_FILES} (the device tool returns {MAX_FILES} files), "
                 f"got {len(names)}")
    paths = [Path(n) if n.endswith((".yaml", ".yml")) else root / args.dir / f"{n}.yaml" for n in names]
    for n, p in zip(names, paths):
        if not p.is_file():
            ap.error(f"--scenarios: {n!r}: expected a scenario file, found none at {p}")

    s = Session(out, args.budget_s)
    py = sys.executable
    s.run("env", [py, "-m", "calibrate.gpu_session", "--out", str(out), "--env-only"], min(60.0, s.left()))
    sets = [a for o in args.overrides for a in ("--set", o)]
    results = {}
    for p in paths:
        dest = out / f"val-{p.stem}.json"
        left = s.left() - 5
        limit = min(left, args.stage_cap_s) if left >= args.min_stage_s else 0.0
        rec = s.run(f"validate {p.stem}", [py, "-m", "rlhfsim.cli", "validate", "--device", args.device, "--sequential",
                                           "--steps", str(args.steps), "--profile", args.profile, "--format", "json",
                                           "--out", str(dest), "--scenario", str(p), *sets], limit)
        if rec["rc"] == 0 and dest.is_file():
            this = summary(json.loads(dest.read_text()))
            results.update(this)
            for by in this.values():
                s.say("   " + "; ".join(f"{prof}: measured {r['measured_s']:.3f} s, predicted {r['predicted_s']:.3f} s "
                                             f"({r['error_pct']:+.1f}%)" for prof, r in by.items()))
    doc = json.loads((out / "session.json").read_text())
    doc.update(device=args.device, profile=args.profile, steps=args.steps, overrides=args.overrides, results=results)
    (out / "session.json").write_text(json.dumps(doc, indent=1))
    s.say("== files: " + ", ".join(sorted(q.name for q in out.iterdir())))
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())

"""The chunk-size curve of a scenario under OPPO intra-step streaming: step time per fixed chunk size,
with the parts that make it (the actor's handoff pauses, the scorer's calls, the drain after
generation). Not a speed benchmark: it regenerates the table in docs/schedules.md.

    python examples/chunk_curve.py                         # scenarios/oppo.yaml, bundled profile
    python examples/chunk_curve.py scenarios/paper/se-3b.yaml --steps 10 --inter
    python examples/chunk_curve.py scenarios/paper/se-7b.yaml --inter --steps 20 --resume cached --stop-at token
"""

from __future__ import annotations

import argparse
import json

from rlhfsim.scenario.loader import load_scenario
from rlhfsim.sim.run import rebuild, simulate

CHUNKS = (50, 100, 250, 500, 1000, 3000)  # the sizes the OPPO paper discusses (100, 500, 3000) and between


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", nargs="?", default="scenarios/oppo.yaml")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--inter", action="store_true", help="keep inter-step overcommitment on (default: intra only)")
    ap.add_argument("--chunks", default=None, help="comma-separated chunk sizes (default: %s)" % ",".join(map(str, CHUNKS)))
    ap.add_argument("--resume", choices=("cached", "reprefill"), default=None,
                    help="schedule.intra.resume for every point (default: the scenario's own)")
    ap.add_argument("--stop-at", choices=("token", "call"), default=None,
                    help="schedule.intra.stop_at for every point (default: the scenario's own)")
    ap.add_argument("--format", choices=("table", "json"), default="table")
    a = ap.parse_args()
    chunks = tuple(int(x) for x in a.chunks.split(",")) if a.chunks else CHUNKS
    sc = load_scenario(a.scenario)
    sched = sc.schedule.model_dump(mode="json") if sc.schedule.kind == "oppo" else {"kind": "oppo"}
    sched.setdefault("inter", {})["enabled"] = bool(a.inter)
    rows = []
    for k in chunks:
        intra = {**sched.get("intra", {}), "enabled": True, "chunk_tokens": k, "adaptive": None}
        if a.resume:
            intra["resume"] = a.resume
        if a.stop_at:
            intra["stop_at"] = a.stop_at
        v = rebuild(sc, {"schedule": {**sched, "intra": intra}})
        r = simulate(v, profile=a.profile, steps=a.steps)
        s = r.summary
        g = s["generation_runtime"]
        rows.append({"chunk_tokens": k, "step_time_s": s["step_time_s"], "generate_s": s["phases_s"].get("generate", 0.0),
                     "reward_s": s["phases_s"].get("reward", 0.0),
                     "reward_after_generate_s": max(s["phases_s"].get("reward", 0.0) - s["phases_s"].get("generate", 0.0), 0.0),
                     "chunks_per_step": s["schedule_stats"]["chunks_scored"] / max(s["steps"], 1),
                     "gpu_busy": s["gpu_busy"], "gpu_active": s["gpu_active"], "runtime": g["runtime"]})
    best = min(rows, key=lambda x: x["step_time_s"])
    if a.format == "json":
        print(json.dumps({"scenario": sc.name, "steps": a.steps, "best_chunk_tokens": best["chunk_tokens"], "rows": rows}, indent=1))
        return
    it = v.schedule.intra
    print(f"{sc.name}: {a.steps} steps, profile {a.profile or 'bundled'}, runtime {rows[0]['runtime']}, "
          f"inter {'on' if a.inter else 'off'}, resume {it.resume}, stop_at {it.stop_at}")
    print(f"{'chunk':>6} {'step s':>8} {'generate s':>10} {'reward s':>9} {'chunks/step':>11}  busy/active per pool")
    for x in rows:
        util = "  ".join(f"{p} {x['gpu_busy'][p]:.0%}/{x['gpu_active'][p]:.0%}" for p in x["gpu_busy"])
        mark = "  <- fastest" if x is best else ""
        print(f"{x['chunk_tokens']:>6} {x['step_time_s']:>8.2f} {x['generate_s']:>10.2f} {x['reward_s']:>9.2f} "
              f"{x['chunks_per_step']:>11.0f}  {util}{mark}")


if __name__ == "__main__":
    main()

"""The OPPO paper's speedups against the simulator's, setting by setting (scenarios/paper/).

The paper (arXiv 2509.25762; /work/shared/REFERENCES.md section 1, items marked (s) from secondary
summaries) reports, per setting, OPPO's end-to-end speedup over its synchronous TRL baseline and, for the
two Stack-Exchange settings, the intra-step-only and inter-step-only speedups of its ablation. Each is a
check, never a fit: nothing in scenarios/paper/ or in the cost model reads these numbers.

Error of one speedup: predicted / paper - 1 (negative: the simulator predicts less gain). The summary
line gives the median |error| over every number the paper states.

    python examples/oppo_paper.py                       # bundled default profile, 20 steps
    python examples/oppo_paper.py --profile h200-measured --steps 20
    python examples/oppo_paper.py --resume cached --stop-at token   # as before the TRL call mechanisms
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rlhfsim.scenario.loader import load_scenario
from rlhfsim.sim.run import compare, rebuild

PAPER = Path(__file__).resolve().parent.parent / "scenarios" / "paper"

# (scenario file, {variant: the paper's speedup over sync}); REFERENCES.md section 1 "Results" and
# "Ablation": SE 7B 1.9x (intra only 1.2x, inter only 1.6x), SE 3B 2.5x (1.3x / 2.06x), OpenCoder 3B
# 2.4x, GSM8K 7B 2.8x, two-node A100 498.3 s -> 111.1 s.
SETTINGS = (
    ("se-7b.yaml", {"oppo": 1.9, "oppo-intra": 1.2, "oppo-inter": 1.6}),
    ("se-3b.yaml", {"oppo": 2.5, "oppo-intra": 1.3, "oppo-inter": 2.06}),
    ("opencoder-3b.yaml", {"oppo": 2.4}),
    ("gsm8k-7b.yaml", {"oppo": 2.8}),
    ("a100-2node-7b.yaml", {"oppo": 498.3 / 111.1}),
)


def run(profile: str | None, steps: int, only: list[str] | None = None, resume: str | None = None,
        chunk: int | None = None, stop_at: str | None = None) -> list[dict]:
    rows = []
    for fname, paper in SETTINGS:
        if only and fname.removesuffix(".yaml") not in only:
            continue
        sc = load_scenario(PAPER / fname)
        if resume or chunk or stop_at:   # overrides of the scenarios' own schedule.intra (a diagnostic)
            sched = sc.schedule.model_dump(mode="json")
            if resume:
                sched["intra"]["resume"] = resume
            if stop_at:
                sched["intra"]["stop_at"] = stop_at
            if chunk:
                sched["intra"].update({"chunk_tokens": chunk, "adaptive": None})
            sc = rebuild(sc, {"schedule": sched})
        out, _ = compare(sc, ["sync", "oppo-intra", "oppo-inter", "oppo"], profile=profile, steps=steps)
        v = out["variants"]
        for name in ("oppo", "oppo-intra", "oppo-inter"):
            pred = v[name]["speedup"]
            ref = paper.get(name)
            rows.append({"setting": fname.removesuffix(".yaml"), "variant": name, "paper_speedup": ref,
                         "predicted_speedup": pred, "error": (pred / ref - 1) if ref else None,
                         "sync_step_s": v["sync"]["step_time_s"], "step_s": v[name]["step_time_s"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=None, help="profile name or path (default: the scenarios' own, the bundled one)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--only", default=None, help="comma-separated settings (file stems), e.g. se-7b,se-3b")
    ap.add_argument("--resume", choices=("cached", "reprefill"), default=None,
                    help="schedule.intra.resume for every setting (default: the scenarios' own)")
    ap.add_argument("--stop-at", choices=("token", "call"), default=None,
                    help="schedule.intra.stop_at for every setting (default: the scenarios' own)")
    ap.add_argument("--chunk", type=int, default=None,
                    help="a fixed chunk size instead of the scenarios' adaptive candidates (a diagnostic)")
    ap.add_argument("--format", choices=("table", "json"), default="table")
    a = ap.parse_args()
    rows = run(a.profile, a.steps, a.only.split(",") if a.only else None, a.resume, a.chunk, a.stop_at)
    errs = [abs(r["error"]) for r in rows if r["error"] is not None]
    med = statistics.median(errs) if errs else None
    if a.format == "json":
        print(json.dumps({"profile": a.profile or "bundled", "steps": a.steps, "resume": a.resume, "stop_at": a.stop_at, "chunk": a.chunk, "median_abs_error": med,
                          "rows": rows}, indent=1))
        return
    print(f"OPPO paper settings: {a.steps} steps, profile {a.profile or 'bundled'}, "
          f"intra.resume {a.resume or 'as in the scenarios'}, stop_at {a.stop_at or 'as in the scenarios'}, "
          f"chunk {a.chunk or 'as in the scenarios'}")
    print(f"{'setting':<14} {'variant':<11} {'sync s':>8} {'step s':>8} {'paper':>6} {'predicted':>9} {'error':>7}")
    for r in rows:
        paper = f"{r['paper_speedup']:.2f}x" if r["paper_speedup"] else "-"
        err = f"{r['error']:+.0%}" if r["error"] is not None else "-"
        print(f"{r['setting']:<14} {r['variant']:<11} {r['sync_step_s']:>8.1f} {r['step_s']:>8.1f} {paper:>6} "
              f"{r['predicted_speedup']:>8.2f}x {err:>7}")
    if med is not None:
        print(f"median |error| over the paper's {len(errs)} speedups: {med:.1%} (target <= 15%)")


if __name__ == "__main__":
    main()

"""Benchmark: a parallelism search of about 10,000 configurations (issue 55 item 7: under 60 s on 2 cores).

    python benchmarks/parallel_plan_speed.py                 # the 12,193-configuration search, timed
    python benchmarks/parallel_plan_speed.py --check 20      # and 20 sampled rows simulated in full, compared

The search: N6-H7 (NeMo RL's Qwen3-30B-A3B GRPO on 32 H100s, scenarios/examples/megatron-field/N6-H7.yaml) over the
actor's Megatron layout (TP 1-8, PP 1-4, VPP 1-2, CP 1-4, EP 1-32), a reference layout of its own (TP 1-4, EP 1-32)
and the engine's TP (1-8), colocated: 12,193 buildable configurations (the unbuildable are counted apart). The base
runs NeMo RL's expert tensor parallelism of 1 (runs.yaml's A8), under which EP need only divide a stage's GPUs, so more
layouts build than with etp = tp (11,161 with the reference's PP 1-2 too before; 21,337 with it now).
Every configuration is counted in the time: expanding and checking the search, the memory estimate, the priced rows
(``rlhfsim.plan.fastpath``: one generation simulated per generation setup and KV capacity that setup's generation
needed, ``fastpath.share``; the training phases priced per layout) and results.csv; not the two full simulations of
the report's comparison (``compare``), timed apart. It prints how many generations were simulated: 166 for the
12,193 configurations (4 generation setups, one per engine TP, with 192 KV capacities each; 768 generations when
every capacity got its own).

The generations go to 2 forked worker processes. On a shared machine the wall time includes waiting for the CPU, so
the CPU seconds of every process (this one and its reaped workers) are printed beside it: on 2 idle cores the sweep
takes at most that long (nothing in it waits on anything but the CPU).
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "scenarios/examples/megatron-field/N6-H7.yaml"
SEARCH = {
    "actor": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "vpp": [1, 2], "cp": [1, 2, 4], "ep": [1, 2, 4, 8, 16, 32]},
    "reference": {"tp": [1, 2, 4], "pp": [1], "ep": [1, 8, 16, 32]},
    "rollout": {"tp": [1, 2, 4, 8]},
    "pools": ["colocated"],
}
TARGET_CONFIGS, TARGET_S = 10_000, 60.0


def _cpu_s() -> float:
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", type=int, default=0, metavar="N", help="simulate N sampled priced rows in full and compare")
    args = ap.parse_args(argv)
    from rlhfsim.plan import load_plan, run_plan
    from rlhfsim.plan import sweep

    with tempfile.TemporaryDirectory(prefix="parallel-plan-") as tmp:
        d = Path(tmp)
        plan_path = d / "plan-bench.yaml"
        plan_path.write_text(yaml.safe_dump({"name": "parallel-bench", "base": str(BASE), "objective": "min_step_time",
                                             "search": {"parallelism": SEARCH}}, sort_keys=False))
        # the comparison's two full simulations are not the sweep's: timed apart
        compare, sweep_compare = None, None
        import rlhfsim.plan.compare as cmp

        real = cmp.compare_with_base

        def timed_compare(*a):
            nonlocal compare
            t = time.perf_counter()
            out = real(*a)
            compare = time.perf_counter() - t
            return out
        cmp.compare_with_base = timed_compare
        t0, c0 = time.perf_counter(), _cpu_s()
        plan = load_plan(plan_path)
        t_load = time.perf_counter() - t0
        o = run_plan(plan, out=d / "out", uncertainty=True, workers=2)
        wall, cpu = time.perf_counter() - t0 - compare, _cpu_s() - c0
        cmp.compare_with_base = real
        methods = Counter(r["method"] for r in o.rows)
        print(f"configurations {len(o.rows):,} (not buildable, not counted: {sum(plan.search.excluded.values()):,}); "
              f"by method: {dict(methods)}")
        print(f"generations simulated for the {o.shared:,} priced rows: {o.generations:,} (rlhfsim.plan.fastpath.share)")
        cpu -= compare
        print(f"load+expand+check {t_load:.1f} s; whole sweep {wall:.1f} s wall, {cpu:.1f} s CPU in all processes "
              f"(2 workers; the report's comparison, 2 full simulations: {compare:.1f} s more, not counted)")
        n = len(o.rows)
        bound = min(wall, cpu)
        verdict = "met" if n >= TARGET_CONFIGS and bound <= TARGET_S else "MISSED"
        print(f"target: >= {TARGET_CONFIGS:,} configurations in <= {TARGET_S:.0f} s on 2 cores: {verdict} "
              f"({n:,} in at most {bound:.1f} s on 2 idle cores: min(wall, CPU seconds))")
        b = o.best
        if b is not None:
            print(f"best: {', '.join(f'{a}={b[a]}' for a in plan.axes)}: {b['step_time_s']:.2f} s/step "
                  f"(base {o.compare['base_step_s']:.2f} s)" if o.compare and 'base_step_s' in o.compare else "")
        if args.check:
            from rlhfsim.costs.model import CostModel
            from rlhfsim.hardware.catalog import get_gpu
            from rlhfsim.sim.run import simulate

            priced = [(c, r) for c, r in zip(plan.configs, o.rows) if r["method"] == "shared-generation"]
            sample = random.Random(0).sample(priced, min(args.check, len(priced)))
            worst = 0.0
            for c, r in sample:
                full = simulate(c.scenario, cost=CostModel(get_gpu(c.gpu_type), plan.profiles[c.gpu_type])).summary
                worst = max(worst, abs(r["step_time_s"] - full["step_time_s"]) / full["step_time_s"])
            print(f"check: {len(sample)} sampled priced rows simulated in full; largest relative difference of the step "
                  f"{worst:.2e}")
    del sweep, sweep_compare
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: a plan sweep of 2,000 configurations (5 steps each, 512 rollouts per step), locally and on Ray,
and what it says about a 10,000-configuration sweep.

    python benchmarks/plan_speed.py                       # local backend, 2 workers, 2,000 configs
    python benchmarks/plan_speed.py --backend both        # also Ray (a local 2-CPU cluster), same configs
    python benchmarks/plan_speed.py --configs 10000       # the 10,000-configuration sweep itself
    python benchmarks/plan_speed.py --configs 100         # a quick run (axes trimmed)
    python benchmarks/plan_speed.py --profile 20          # cProfile 20 sampled configurations in-process
    python benchmarks/plan_speed.py --no-uncertainty      # rows without the step's 90% interval

Target (issue 12): 10,000 configurations in at most 5 minutes on 2 cores, locally and on Ray. The sweep:
a PPO setup (Qwen2.5-1.5B actor, critic and reference, Qwen2.5-0.5B reward model, 512 prompts per step)
over 4 GPU types x 5 node sizes x 5 engine batch sizes x 2 engines x 5 schedules (1,000 configurations),
repeated for ``configs / 1,000`` seeds (the ``seed`` axis: the same mix of configurations with other
sampled lengths). Every configuration is distinct and feasible, so all are simulated.

Extrapolation to 10,000: each seed repeats the same 1,000-configuration mix, so the cost per
configuration does not depend on how many seeds are swept; the measured run is split into its fixed part
(starting the backend: forking the local workers, or starting and stopping a local Ray cluster with its
workers' imports, measured separately with an empty task and one import task per worker) and the rest,
which is scaled linearly: ``t(10,000) = fixed + (wall - fixed) x 10,000 / configs``. The local backend also reports CPU time per
configuration: on a shared machine the wall time includes waiting for the CPU, and
``CPU-s / workers`` is what the sweep takes on that many idle cores.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import resource
import sys
import tempfile
import time
from pathlib import Path

import yaml

BASE = {
    "name": "bench",
    "models": {"actor": {"model": "qwen2.5-1.5b"}, "critic": {"model": "qwen2.5-1.5b"},
               "reference": {"model": "qwen2.5-1.5b"}, "reward": {"model": "qwen2.5-0.5b"}},
    "cluster": {"gpu": "h100", "nodes": 1, "gpus_per_node": 8},
    "placement": {"kind": "colocated"},
    "algorithm": {"kind": "ppo", "minibatch_size": 64},
    "workload": {"prompts_per_step": 512, "prompt_length": {"kind": "normal", "mean": 256, "std": 64},
                 "response_length": {"kind": "lognormal", "median": 400, "p99": 3000},
                 "max_response_tokens": 4096},
    "generation": {"engine": "continuous", "max_batch": 64},
    "schedule": {"kind": "sync"},
    "steps": 5,
    "warmup_steps": 1,
    "seed": 0,
}
AXES = {
    "cluster.gpu": ["a100-80gb", "h100", "h200", "a100-40gb"],
    "cluster.gpus_per_node": [2, 3, 4, 6, 8],
    "generation.max_batch": [32, 64, 128, 256, 512],
    "generation.engine": ["static", "continuous"],
    "schedule.kind": ["sync", "oppo", "oppo-inter", "partial", "async"],
}
GRID = 1000  # configurations per seed
TARGET_CONFIGS, TARGET_S = 10_000, 300.0


def write_plan(d: Path, configs: int) -> Path:
    """The plan file: the 1,000-configuration grid times ``configs // 1,000`` seeds; below 1,000, the
    slowest-varying axes trimmed until the product is at most ``configs`` (for quick runs)."""
    axes = json.loads(json.dumps(AXES))
    axes["seed"] = list(range(max(configs // GRID, 1)))

    def size():
        n = 1
        for v in axes.values():
            n *= len(v)
        return n
    for key in axes:
        while size() > configs and len(axes[key]) > 1:
            axes[key].pop()
    path = d / "plan-bench.yaml"
    path.write_text(yaml.safe_dump({"name": "bench", "base": BASE, "axes": axes, "objective": "min_cost"}, sort_keys=False))
    return path


def _cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the local backend's workers)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def run(backend: str, workers: int, plan_path: Path, out: Path, uncertainty: bool = True) -> tuple[float, int]:
    """Run the sweep; returns (wall seconds, configurations). ``uncertainty``: each row's 90% interval of the step
    (the plan's default; ``--no-uncertainty`` measures the sweep without it)."""
    from rlhfsim.plan import load_plan, run_plan

    t0, c0 = time.perf_counter(), _cpu_s()
    plan = load_plan(plan_path)
    t_load = time.perf_counter() - t0
    o = run_plan(plan, backend=backend, workers=workers, out=out, uncertainty=uncertainty)
    wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
    line = (f"{backend:5}  workers={workers}  interval={'on' if uncertainty else 'off'}  configs={len(o.rows)} (feasible {o.feasible}, simulated {o.simulated})  "
            f"load+check {t_load:.2f} s  wall {wall:.1f} s  {len(o.rows) / wall:.1f} configs/s")
    if backend == "local":
        # On a shared machine the wall time includes waiting for the CPU; CPU time / workers is what the
        # sweep would take on `workers` idle cores (the work is spread evenly over many chunks).
        line += f"  cpu {cpu:.1f} s -> {cpu / workers:.1f} s on {workers} idle cores ({cpu / max(o.simulated, 1) * 1000:.1f} cpu-ms per config)"
    print(line, flush=True)
    return wall, len(o.rows)


def local_fixed_overhead(workers: int) -> float:
    """Fork the local workers and run one empty chunk, the way --backend local does; seconds."""
    from rlhfsim.plan.backends import LocalBackend

    t0 = time.perf_counter()
    with LocalBackend(workers) as be:
        list(be.run([[]], {}))
    return time.perf_counter() - t0


def _worker_imports() -> int:
    """What a fresh Ray worker imports before its first configuration (a local worker is forked from this
    process and inherits them)."""
    import rlhfsim.plan.backends  # noqa: F401
    import rlhfsim.sim.run  # noqa: F401

    return os.getpid()


def ray_fixed_overhead(workers: int) -> float:
    """Start and stop a local Ray cluster the way --backend ray does, with one empty chunk and each worker's
    imports (one task per worker); seconds."""
    from rlhfsim.plan.backends import RayBackend

    t0 = time.perf_counter()
    with RayBackend(workers) as be:
        t1 = time.perf_counter()
        list(be.run([[]], {}))
        t2 = time.perf_counter()
        warm = be.ray.remote(num_cpus=1)(_worker_imports)
        pids = be.ray.get([warm.remote() for _ in range(workers)])
        t3 = time.perf_counter()
    t4 = time.perf_counter()
    print(f"ray fixed overhead: start {t1 - t0:.1f} s, first (empty) task {t2 - t1:.2f} s, workers' imports "
          f"{t3 - t2:.2f} s ({len(set(pids))} workers), shutdown {t4 - t3:.1f} s")
    return t4 - t0


def extrapolate(backend: str, wall: float, configs: int, fixed: float) -> None:
    t = fixed + (wall - fixed) * TARGET_CONFIGS / configs
    print(f"{backend:5}  {TARGET_CONFIGS:,} configurations: {fixed:.1f} s fixed + ({wall:.1f} - {fixed:.1f}) s x "
          f"{TARGET_CONFIGS:,} / {configs:,} = {t:.0f} s  (target <= {TARGET_S:.0f} s: {'met' if t <= TARGET_S else 'MISSED'})")


def profile(plan_path: Path, n: int) -> None:
    from rlhfsim.costs.model import CostModel
    from rlhfsim.hardware.catalog import get_gpu
    from rlhfsim.plan import load_plan
    from rlhfsim.plan.backends import run_one

    plan = load_plan(plan_path)
    step = max(len(plan.configs) // n, 1)
    sample = plan.configs[::step][:n]
    costs = {g: CostModel(get_gpu(g), p) for g, p in plan.profiles.items()}
    pr = cProfile.Profile()
    t0 = time.perf_counter()
    pr.enable()
    for c in sample:
        run_one(c.doc, str(plan.base_dir), costs[c.gpu_type])
    pr.disable()
    wall = time.perf_counter() - t0
    print(f"profiled {len(sample)} configurations: {wall / len(sample) * 1000:.0f} ms each under cProfile")
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(key).print_stats(18)
        print(s.getvalue())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["local", "ray", "both"], default="local")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--configs", type=int, default=2000, help="configurations: 1,000 per seed; fewer trims the axes")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile N sampled configurations instead")
    ap.add_argument("--no-uncertainty", dest="uncertainty", action="store_false",
                    help="rows without the step's 90%% interval (rlhfsim plan --no-uncertainty)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="plan-bench-") as tmp:
        d = Path(tmp)
        plan_path = write_plan(d, args.configs)
        if args.profile:
            profile(plan_path, args.profile)
            return 0
        walls = {}
        for be in (["local", "ray"] if args.backend == "both" else [args.backend]):
            walls[be] = run(be, args.workers, plan_path, d / f"out-{be}", args.uncertainty)
        if len(walls) == 2:
            a = (d / "out-local" / "results.csv").read_text()
            b = (d / "out-ray" / "results.csv").read_text()
            print(f"ray - local wall: {walls['ray'][0] - walls['local'][0]:+.1f} s; results identical: {a == b}")
        for be, (wall, n) in walls.items():
            fixed = local_fixed_overhead(args.workers) if be == "local" else ray_fixed_overhead(args.workers)
            extrapolate(be, wall, n, fixed)
    return 0


if __name__ == "__main__":
    sys.exit(main())

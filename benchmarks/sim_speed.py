"""How fast the simulator simulates: milliseconds of wall time and SimPy events per simulated step.

The step: synchronous GRPO on one node of 8 H100-SXM, Qwen2.5-7B actor, reference and reward model
colocated, continuous batching (vLLM-like, at most 256 sequences per engine, one engine per GPU),
512-token prompts, response lengths lognormal with median 600 and p99 8,000 tokens capped at 16,384.
It is run with 1,024 rollouts (128 prompts x 8) and 8,192 rollouts (1,024 prompts x 8).

Target (the foundation issue): at most 50 ms per 1,024-rollout step on one core, and cost growing no
faster than linearly in rollouts. The process pins itself to one core. Each configuration is simulated
``--repeats`` times from scratch (timing ``Simulation.run`` only, not loading); the best and the median
are printed, because other processes on a shared machine only ever make a run slower. Events are
counted in a separate run, by wrapping the environment's ``step`` (one call per processed event).

    python benchmarks/sim_speed.py [--rollouts 1024 8192] [--steps 3] [--repeats 5] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

from _common import pin_to_one_core, run_counting_events

from rlhfsim.costs.model import CostModel
from rlhfsim.scenario import load_scenario
from rlhfsim.scenario.checks import build_setup
from rlhfsim.sim.simulation import Simulation

GROUP = 8
TARGET_MS = 50.0


def scenario(rollouts: int, steps: int) -> dict:
    return {
        "name": f"speed-{rollouts}",
        "models": {"actor": {"model": "qwen2.5-7b"}, "reference": {"model": "qwen2.5-7b"},
                   "reward": {"model": "qwen2.5-7b"}},
        "cluster": {"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 8},
        "placement": {"kind": "colocated"},
        "algorithm": {"kind": "grpo", "group_size": GROUP, "minibatch_size": 256},
        "workload": {"prompts_per_step": rollouts // GROUP,
                     "prompt_length": {"kind": "fixed", "value": 512}, "max_prompt_tokens": 1024,
                     "response_length": {"kind": "lognormal", "median": 600, "p99": 8000},
                     "max_response_tokens": 16384},
        "generation": {"engine": "continuous", "max_batch": 256},
        "schedule": {"kind": "sync"},
        "steps": steps,
        "warmup_steps": 0,
        "seed": 0,
    }


def build(rollouts: int, steps: int) -> Simulation:
    setup = build_setup(load_scenario(scenario(rollouts, steps)))
    return Simulation(setup, CostModel.load(setup.gpu))


def time_run(rollouts: int, steps: int) -> float:
    sim = build(rollouts, steps)
    t0 = time.perf_counter()
    sim.run(steps)
    return (time.perf_counter() - t0) / steps


def count_events(rollouts: int, steps: int) -> tuple[float, float]:
    """(events per step, mean simulated step time in seconds)."""
    count, records = run_counting_events(build(rollouts, steps), steps)
    return count / steps, statistics.fmean(r.step_time_s for r in records)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rollouts", type=int, nargs="+", default=[1024, 8192])
    ap.add_argument("--steps", type=int, default=3, help="simulated steps per run")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per configuration")
    ap.add_argument("--profile", action="store_true", help="print the top functions of a cProfile run")
    args = ap.parse_args()
    print(f"sim_speed: synchronous step, continuous batching, lognormal(600, p99 8000) cap 16384; {pin_to_one_core()}")
    print(f"{'rollouts':>8} {'best ms/step':>12} {'median ms/step':>14} {'events/step':>11} {'us/event':>8} "
          f"{'ms per 1k rollouts':>18} {'sim step s':>10}")
    per_rollout = {}
    for n in args.rollouts:
        times = [time_run(n, args.steps) for _ in range(args.repeats)]
        best, med = min(times) * 1e3, statistics.median(times) * 1e3
        events, step_s = count_events(n, args.steps)
        per_rollout[n] = best / n
        print(f"{n:>8} {best:>12.1f} {med:>14.1f} {events:>11.0f} {best * 1e3 / events:>8.1f} "
              f"{best / n * 1e3:>18.1f} {step_s:>10.1f}")
    if 1024 in per_rollout:
        best = per_rollout[1024] * 1024
        print(f"target <= {TARGET_MS:.0f} ms per 1,024-rollout step: {'met' if best <= TARGET_MS else 'MISSED'} ({best:.1f} ms)")
    if len(per_rollout) > 1:
        lo, hi = min(per_rollout), max(per_rollout)
        print(f"cost per rollout, {hi} vs {lo} rollouts: {per_rollout[hi] / per_rollout[lo]:.2f}x (1.00x = linear)")
    if args.profile:
        for n in args.rollouts:
            sim = build(n, 1)
            prof = cProfile.Profile()
            prof.runcall(sim.run, 1)
            print(f"\ncProfile, one step of {n} rollouts (profiling inflates times):")
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()

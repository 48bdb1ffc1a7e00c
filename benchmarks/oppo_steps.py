"""How long 100 simulated steps of ``scenarios/oppo.yaml`` under its ``oppo`` schedule take.

The OPPO paper's setup (8 x H200, 7+1 placement, Qwen2.5-7B actor, critic, reference and reward model,
batch 112, static-batch generation, adaptive chunk size and delta 16). Target (the schedules issue): at
most 10 s on one core. The process pins itself to one core and times ``rlhfsim.sim.run.simulate``
(simulation plus summary; loading the YAML is timed separately), ``--repeats`` times from scratch; the
best and the median are printed. Events are counted in a separate run.

    python benchmarks/oppo_steps.py [--steps 100] [--repeats 3] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from pathlib import Path

from _common import pin_to_one_core, run_counting_events

from rlhfsim.costs.model import CostModel
from rlhfsim.scenario import load_scenario
from rlhfsim.scenario.checks import build_setup
from rlhfsim.sim.run import simulate
from rlhfsim.sim.simulation import Simulation

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "oppo.yaml"
TARGET_S = 10.0


def count_events(sc, steps: int) -> int:
    setup = build_setup(sc.model_copy(update={"steps": steps}))
    return run_counting_events(Simulation(setup, CostModel.load(setup.gpu)), steps)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="print the top functions of a cProfile run")
    args = ap.parse_args()
    print(f"oppo_steps: {SCENARIO.name} under oppo, {args.steps} steps; {pin_to_one_core()}")
    t0 = time.perf_counter()
    sc = load_scenario(SCENARIO)
    load_s = time.perf_counter() - t0
    assert sc.schedule.kind == "oppo", sc.schedule.kind
    times, res = [], None
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        res = simulate(sc, steps=args.steps)
        times.append(time.perf_counter() - t0)
    events = count_events(sc, args.steps)
    best, med = min(times), statistics.median(times)
    s = res.summary
    print(f"load {load_s * 1e3:.0f} ms; simulate best {best:.2f} s, median {med:.2f} s "
          f"({best / args.steps * 1e3:.1f} ms/step); {events} events ({events / args.steps:.0f}/step, "
          f"{best / events * 1e6:.1f} us/event)")
    print(f"simulated: mean step {s['step_time_s']:.2f} s, chunk sizes tried "
          f"{sorted(set(s['schedule_stats']['chunk_tokens']))}, delta {sorted(set(s['schedule_stats']['delta']))}, "
          f"{s['schedule_stats']['chunks_scored']} chunks scored")
    print(f"target <= {TARGET_S:.0f} s for {args.steps} steps: {'met' if best <= TARGET_S else 'MISSED'} ({best:.2f} s)")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(simulate, sc, steps=args.steps)
        print("\ncProfile (profiling inflates times):")
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()

"""Helpers the speed benchmarks share (run as ``python benchmarks/NAME.py``: this directory is on the import
path): pin the process to one core, count the SimPy events a simulation processes."""

from __future__ import annotations

import os


def pin_to_one_core() -> str:
    """Pin this process to its lowest allowed core; says what was done."""
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (no sched_setaffinity)"
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return f"pinned to core {core}"


def run_counting_events(sim, steps: int) -> tuple[int, list]:
    """Run ``steps`` steps of a Simulation, counting the SimPy events it processes (one
    ``Environment.step`` call per event); returns (events, step records)."""
    env = sim.env
    count = 0
    step = env.step

    def counting_step():
        nonlocal count
        count += 1
        step()

    env.step = counting_step  # Environment.run looks up self.step on each event
    records = sim.run(steps)
    return count, records

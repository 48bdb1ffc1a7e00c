"""The shape every schedule shares: a ``NAME``, its config model, and one entry method ``run(steps)``
(a SimPy process generator that appends a StepRecord per step)."""

from __future__ import annotations

from typing import ClassVar


class Schedule:
    """Drives a Simulation's steps. Subclasses set NAME and implement run()."""

    NAME: ClassVar[str]

    def __init__(self, sim, cfg):
        self.sim = sim
        self.cfg = cfg

    def run(self, steps: int):  # pragma: no cover - interface
        raise NotImplementedError

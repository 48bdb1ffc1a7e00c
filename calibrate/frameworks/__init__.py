"""Framework adapters: run a real RL framework for a scenario's steps and record its step times, phase
timers and every completion's length (``calibrate.frameworks.base``: the spec and the records).

One adapter per framework, each a module with one entry point ``run_<name>(spec) -> list[FrameworkStep]``
that imports its framework lazily (``calibrate`` stays importable without it). ``FRAMEWORKS`` is the one
list of names; ``rlhfsim validate --framework NAME`` dispatches through it.
"""

from __future__ import annotations

from calibrate.frameworks.trl import run_trl

FRAMEWORKS = {"trl": run_trl}

"""Generation engines, one registry: ``ENGINES[scenario.generation.engine]``.

Each engine is a module over the shared event clock (``clock.py``: decode segments in closed form, the
"stop" and "rate" interrupts, partial-step credit) and the shared engine steps (``base.py``)."""

from rlhfsim.sim.engines.base import Engine
from rlhfsim.sim.engines.continuous import ContinuousEngine
from rlhfsim.sim.engines.static import StaticEngine

ENGINES: dict[str, type[Engine]] = {"static": StaticEngine, "continuous": ContinuousEngine}

__all__ = ["ENGINES", "Engine"]

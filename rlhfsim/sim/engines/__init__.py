"""Generation engines, one registry: ``ENGINES[scenario.generation.engine]``.

Each engine is a module over the shared event clock (``clock.py``: decode segments in closed form, the
"stop" interrupt, rate changes re-timed in place, partial-step credit), the deferred clock of a detached
generation (``deferred.py``: every segment booked, then priced in one numpy pass) and the shared engine
steps (``base.py``)."""

from rlhfsim.sim.engines.base import Engine
from rlhfsim.sim.engines.continuous import ContinuousEngine
from rlhfsim.sim.engines.static import StaticEngine

ENGINES: dict[str, type[Engine]] = {"static": StaticEngine, "continuous": ContinuousEngine}

__all__ = ["ENGINES", "Engine"]

"""Pipeline schedules, one registry: ``SCHEDULES[scenario.schedule.kind]``."""

from rlhfsim.sim.schedules.asynchronous import Async
from rlhfsim.sim.schedules.base import Schedule
from rlhfsim.sim.schedules.overlap import Oppo, Partial, Sync

SCHEDULES: dict[str, type[Schedule]] = {"sync": Sync, "oppo": Oppo, "partial": Partial, "async": Async}

__all__ = ["SCHEDULES", "Schedule"]

"""Pipeline schedules, one registry: ``SCHEDULES[scenario.schedule.kind]``. It is the only list of
schedules: the schema's ``schedule`` union, the ``--compare`` variant names (``VARIANTS``), the CLI help
and the test matrix are derived from it. A new schedule is one module defining its config model and its
class, and one line here."""

from rlhfsim.sim.schedules.asynchronous import Async
from rlhfsim.sim.schedules.base import Schedule
from rlhfsim.sim.schedules.overlap import Oppo, Partial, Sync
from rlhfsim.sim.schedules.tail import TailBatching

SCHEDULES: dict[str, type[Schedule]] = {cls.NAME: cls for cls in (Sync, Oppo, Partial, Async, TailBatching)}

# --compare names, in registry order; each belongs to exactly one schedule.
VARIANTS: tuple[str, ...] = tuple(v for cls in SCHEDULES.values() for v in cls.variant_names())
VARIANT_OWNER: dict[str, type[Schedule]] = {v: cls for cls in SCHEDULES.values() for v in cls.variant_names()}

__all__ = ["SCHEDULES", "VARIANTS", "VARIANT_OWNER", "Schedule"]

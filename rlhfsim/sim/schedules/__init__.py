"""Pipeline schedules, one registry: ``SCHEDULES[scenario.schedule.kind]``. Each class's config model
(``cls.Config``) lives in ``rlhfsim.scenario.schedules`` (so that loading a scenario imports no
simulator) and that module's ``CONFIGS`` lists them in this registry's order: the check below fails the
import when the two disagree, so a schedule's name is written once (its config's ``kind``). The
schema's ``schedule`` union, the ``--compare`` variant names (``VARIANTS``), the CLI help and the test
matrix are derived from them. A new schedule is its config model there, one module here defining its
class, and one line in each registry."""

from rlhfsim.scenario.schedules import CONFIGS, VARIANTS
from rlhfsim.sim.schedules.asynchronous import Async
from rlhfsim.sim.schedules.base import Schedule
from rlhfsim.sim.schedules.overlap import Oppo, Partial, Sync
from rlhfsim.sim.schedules.tail import TailBatching

SCHEDULES: dict[str, type[Schedule]] = {cls.NAME: cls for cls in (Sync, Oppo, Partial, Async, TailBatching)}
if [(n, cls.Config) for n, cls in SCHEDULES.items()] != [(cfg.kind_name(), cfg) for cfg in CONFIGS]:
    raise ImportError("rlhfsim.sim.schedules.SCHEDULES: expected one class per config of rlhfsim.scenario.schedules."
                      f"CONFIGS in its order ({', '.join(c.kind_name() for c in CONFIGS)}), got {', '.join(SCHEDULES)}")

# --compare names (rlhfsim.scenario.schedules.VARIANTS), each owned by exactly one schedule.
VARIANT_OWNER: dict[str, type[Schedule]] = {v: cls for cls in SCHEDULES.values() for v in cls.variant_names()}

__all__ = ["SCHEDULES", "VARIANTS", "VARIANT_OWNER", "Schedule"]

"""Bounded work: before simulating, estimate how much the run would do and refuse a run past a limit,
naming the estimate and the field to change.

Work units (about one Python-level operation of the simulator each, a few microseconds), per step:

    generation      2 x rollouts in flight                   (admission and completion events)
    forward passes  rollouts x scored roles                  (reward, reference, critic rows; the actor's
                                                             old-log-prob pass with execution.old_log_prob)
    training        ppo_epochs x rollouts x trained models   (minibatch rows dealt over ranks)
    schedule        Schedule.work_per_step                   (e.g. OPPO: one scorer call per chunk)

    work = steps x (generation + forward passes + training + schedule)

Rollouts in flight come from the schedule (``Schedule.in_flight``: B, or B + delta x group for OPPO);
more than ``MAX_IN_FLIGHT`` at once is refused too (memory: each holds a few hundred bytes).
``DEFAULT_MAX_WORK`` is a few minutes on one core (oppo.yaml runs at about 500,000 units/s); ``--max-work`` raises it (0: no limit).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhfsim.errors import ScenarioError

DEFAULT_MAX_WORK = 100_000_000
# Rollouts in flight at once, a memory bound (about 650 bytes each, measured; 1,000,000 is under 1 GB).
MAX_IN_FLIGHT = 1_000_000


@dataclass(frozen=True)
class WorkEstimate:
    """The estimate and its parts (units per step), each with the scenario field that scales it."""

    steps: int
    parts: dict  # name -> (units per step, field that scales it)
    in_flight: int = 0
    in_flight_field: str = "workload.prompts_per_step"

    @property
    def total(self) -> float:
        return self.steps * sum(u for u, _ in self.parts.values())

    def dominant_field(self) -> str:
        units, field = max(self.parts.values(), key=lambda p: p[0])
        return field


def estimate_work(setup, steps: int | None = None) -> WorkEstimate:
    from rlhfsim.sim.schedules import SCHEDULES

    sc = setup.scenario
    cls = SCHEDULES[sc.schedule.kind]
    B = setup.rollouts_per_step
    flight = cls.in_flight(sc.schedule, setup)
    n_fwd = (sum(r in setup.shapes for r in ("reward", "reference", "critic")) + (setup.rule_reward is not None)
             + sc.execution.old_log_prob)
    n_train = sum(r in setup.shapes for r in ("actor", "critic"))
    flight_field = cls.FLIGHT_FIELD if flight > 2 * B else "workload.prompts_per_step"
    parts = {
        "generation": (2.0 * flight, flight_field),
        "forward": (float(B * n_fwd), "workload.prompts_per_step"),
        "training": (float(sc.algorithm.ppo_epochs * B * n_train),
                     "algorithm.ppo_epochs" if sc.algorithm.ppo_epochs > 1 else "workload.prompts_per_step"),
        "schedule": (float(cls.work_per_step(sc.schedule, setup)), cls.WORK_FIELD),
    }
    return WorkEstimate(steps or sc.steps, parts, flight, cls.FLIGHT_FIELD if flight > B else "workload.prompts_per_step")


def check_work(setup, steps: int | None = None, max_work: float | None = DEFAULT_MAX_WORK) -> WorkEstimate:
    """Raise ScenarioError if the run's estimated work exceeds ``max_work`` (None or 0: no limit)."""
    est = estimate_work(setup, steps)
    if max_work and est.in_flight > MAX_IN_FLIGHT:
        raise ScenarioError(est.in_flight_field, (
            f"expected at most {MAX_IN_FLIGHT:,} rollouts in flight (a memory bound, about 650 bytes each), got "
            f"{est.in_flight:,}; lower {est.in_flight_field}, or pass --max-work 0 to lift every limit"))
    if max_work and est.total > max_work:
        field = est.dominant_field()
        per_step = ", ".join(f"{k} {u:,.0f}" for k, (u, _) in est.parts.items() if u)
        raise ScenarioError(field, (
            f"expected a run within the work limit ({max_work:,.0f} units), got an estimated {est.total:.3g} "
            f"({est.steps:,} steps x [{per_step}] per step); lower {field} or steps, or raise --max-work (0: no limit)"))
    return est

"""The one home of phase names: what the simulator records, in step order, and the names verl gives the
same work (``timing_s/*`` in its step metrics). Pure Python (no simpy, pydantic or plotly), so the
simulator, the run reports, the planner and ``calibrate/`` all import it.

A phase is the span of one kind of work in a step (first start to last end of its busy intervals).
Phases marked (opt-in) appear only when the scenario's ``execution`` block turns them on; a run without
them records exactly the phases it always did.
"""

from __future__ import annotations

PHASES: tuple[str, ...] = (
    "generate",       # rollout generation (the actor's engine)
    "reward",         # reward model forward pass, or a rule-based checker on CPU workers
    "old_log_prob",   # (opt-in) the actor's forward pass recomputing log-probs under the rollout policy
    "reference",      # the reference model's log-prob forward pass
    "critic_fwd",     # the critic's value forward pass
    "adv",            # (opt-in) advantage computation (GAE / group-normalized) on the driver
    "actor_train",    # PPO epochs of actor forward + backward + optimizer steps
    "critic_train",   # the same for the critic
    "weight_sync",    # the trained weights reach the generation engine
)

# verl's step metrics (``ray_trainer.py``: ``marked_timer("gen", ...)`` and so on) for each phase; the
# step itself is ``timing_s/step``. verl times reward scoring as ``timing_s/reward`` and the weight
# update of the rollout engine as ``timing_s/update_weights`` (older releases fold it into ``gen``).
VERL_NAMES: dict[str, str] = {
    "generate": "timing_s/gen",
    "reward": "timing_s/reward",
    "old_log_prob": "timing_s/old_log_prob",
    "reference": "timing_s/ref",
    "critic_fwd": "timing_s/values",
    "adv": "timing_s/adv",
    "actor_train": "timing_s/update_actor",
    "critic_train": "timing_s/update_critic",
    "weight_sync": "timing_s/update_weights",
}
VERL_STEP = "timing_s/step"

# Short descriptions (reports, the planner's one-line explanation).
DESCRIPTIONS: dict[str, str] = {
    "generate": "generation",
    "reward": "reward scoring",
    "old_log_prob": "the actor's old-log-prob pass",
    "reference": "the reference pass",
    "critic_fwd": "the critic forward pass",
    "adv": "advantage computation",
    "actor_train": "actor training",
    "critic_train": "critic training",
    "weight_sync": "weight sync",
}

assert set(VERL_NAMES) == set(PHASES) == set(DESCRIPTIONS)


def verl_timing(phases_s: dict[str, float], step_time_s: float) -> dict[str, float]:
    """Mean phase spans under verl's metric names, plus ``timing_s/step``. A phase the run did not record
    is left out (verl logs only the timers it ran)."""
    out = {VERL_NAMES[p]: float(phases_s[p]) for p in PHASES if p in phases_s}
    out[VERL_STEP] = float(step_time_s)
    return out

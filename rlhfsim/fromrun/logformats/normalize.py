"""One set of metric names over every framework and release, added beside the names the log has (nothing is
renamed away, so a fit or a reader can still ask for a framework's own name):

* verl 0.1 times its phases as ``timing/gen``, ``timing/ref``, ... (``ray_trainer.py``: ``metrics['timing/gen']``)
  and has no step timer: its timers are read as ``timing_s/*``, and ``timing_s/step`` is the sum of its phase timers
  (``gen``, ``ref``, ``values``, ``adv``, ``update_critic``, ``update_actor``; validation and checkpoint excluded),
  which leaves out only the driver's data metrics between them; the log says so in a note.
* OpenRLHF (``logformats.openrlhf``; its wandb or TensorBoard export as ``train/<name>``): ``timing/step_total``
  is ``timing_s/step``; ``rollout/response_length_mean`` (else ``response_length``) is ``response_length/mean``;
  ``rollout/truncated_rate`` (the share of responses cut at ``generate_max_len``) is ``response_length/clip_ratio``.
"""

from __future__ import annotations

from dataclasses import replace

from rlhfsim.contracts import VERL_STEP_KEY
from rlhfsim.fromrun.logformats import openrlhf
from rlhfsim.fromrun.logformats.base import LogRead, StepLine

V01_PHASES = ("gen", "ref", "values", "adv", "update_critic", "update_actor")
OPENRLHF_ALIASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (VERL_STEP_KEY, (openrlhf.STEP_KEY,)),
    ("response_length/mean", ("rollout/response_length_mean", "response_length")),
    ("response_length/clip_ratio", ("rollout/truncated_rate",)),
)
OPENRLHF_MARKS = (*openrlhf.PHASE_KEYS, openrlhf.STEP_KEY, "policy_loss", "actor_lr")


def _strip_train(metrics: dict) -> dict:
    return {(k[len("train/"):] if k.startswith("train/") else k): v for k, v in metrics.items()}


def framework_of(log: LogRead) -> str:
    """``openrlhf`` when the log's records carry OpenRLHF's metric names, else the reader's own guess."""
    if log.framework == "openrlhf":
        return "openrlhf"
    for s in log.steps[:50]:
        names = _strip_train(s.metrics)
        if any(k in names for k in OPENRLHF_MARKS) and not any(k.startswith("timing_s/") for k in names):
            return "openrlhf"
    return log.framework


def normalize(log: LogRead) -> LogRead:
    """``log`` with the names of the module docstring added to its records."""
    log.framework = framework_of(log)
    if log.framework == "openrlhf":
        steps = []
        for s in log.steps:
            names = _strip_train(s.metrics)
            extra = {}
            for ours, theirs in OPENRLHF_ALIASES:
                hit = next((names[t] for t in theirs if t in names), None)
                if hit is not None and ours not in s.metrics:
                    extra[ours] = hit
            steps.append(replace(s, metrics={**s.metrics, **extra}) if extra else s)
        log.steps = steps
        log.notes.append(f"{log.source}: OpenRLHF's names read as verl's ({', '.join(f'{t[0]} as {o}' for o, t in OPENRLHF_ALIASES)})")
        return log
    has_new = any(k.startswith("timing_s/") for s in log.steps for k in s.metrics)
    if not has_new and any("timing/gen" in s.metrics for s in log.steps):
        log.steps = [_v01(s) for s in log.steps]
        log.notes.append(f"{log.source}: verl 0.1 timer names (timing/*) read as timing_s/*; timing_s/step is the sum of "
                         f"the phase timers ({', '.join(V01_PHASES)}): verl 0.1 logs no step timer")
    return log


def _v01(s: StepLine) -> StepLine:
    m = dict(s.metrics)
    for k, v in s.metrics.items():
        if k.startswith("timing/"):
            m.setdefault("timing_s/" + k[len("timing/"):], v)
    phases = [m[f"timing_s/{p}"] for p in V01_PHASES if f"timing_s/{p}" in m]
    if phases and VERL_STEP_KEY not in m:
        m[VERL_STEP_KEY] = sum(phases)
    return replace(s, metrics=m)

"""The training framework of a from-run fit (``rlhfsim calibrate --from-run``): which importer reads its launch,
which of its log's timers are the measured phases, and which of the simulator's phases each timer spans.

verl (``rlhfsim.fromrun.fit``'s own spans): one ``timing_s/*`` timer per phase.

OpenRLHF (0.9.6 on, commit 4908e6ee: the ``Global step N: {...}`` line's timers, also in its wandb/TensorBoard logs
as ``train/timing/*``). What each covers, from ``openrlhf/trainer/ppo_trainer.py`` (``PPOTrainer.fit``,
``BasePPOTrainer.train_step``), ``ppo_utils/samples_generator.py`` and ``ppo_utils/experience_maker.py``:

* ``timing/generation``: ``SamplesGenerator.generate_samples``: waking the vLLM engines (``--vllm.enable_sleep``:
  their KV cache back), the rollouts on every engine, and, for a reward function or remote reward
  (``--reward.remote_url``, an agent), the reward: the rollout worker scores each response as it finishes
  (``openrlhf/utils/agent.py``), so it is inside this timer; then the engines sleep again.
  Simulator: ``generate`` (with its KV re-allocation), and ``reward`` when the reward is a rule.
* ``timing/make_experience``: ``RemoteExperienceMaker.make_experience_batch``: the forward passes of the reward
  model (a model reward only), the actor (its log-probs under the rollout policy), the critic (values) and the
  reference model, dispatched together to their Ray groups and gathered, then the KL and the advantages on the
  driver (``compute_advantages_and_returns``). Simulator: ``reward`` (a model), ``retokenize``, ``old_log_prob``,
  ``reference``, ``critic_fwd``, ``adv``.
* ``timing/ppo_train``: ``ppo_train``: the critic's and the actor's training (concurrently; one after the other with
  ``--ds.enable_sleep``, each reloading and offloading its states). Simulator: ``actor_train``, ``critic_train``.
* ``timing/broadcast``: ``broadcast_to_vllm``: the actor's weights to the vLLM engines (NCCL broadcast, or CUDA IPC
  when colocated). Simulator: ``weight_sync``.
* ``timing/step_total``: the sum of the four (the synchronous trainer), so the time between them (handing the
  experiences to the actor and critic groups, logging) is in no timer; the fit's step is the same sum.

Each timer is compared with the span of its simulator phases in a step (first start to last end of their busy
intervals, so phases that overlap are not counted twice), averaged over the steady steps as the simulator's own
phase spans are. Before 0.9.6 OpenRLHF logs no step time (0.7.0-0.9.5 print ``Experience making completed in
H:MM:SS``, whole seconds; 0.4-0.6 send ``perf/experience_maker/*`` to wandb only with ``--perf``): such a log has too
few timed steps to fit and is refused by the log reader.
"""

from __future__ import annotations

import statistics

from rlhfsim.contracts import VERL_STEP_KEY
from rlhfsim.errors import RlhfsimError

FRAMEWORKS = ("verl", "openrlhf")

# OpenRLHF timer -> the simulator phases it spans (module docstring); "reward" sits in generation for a rule reward
OPENRLHF_TIMERS: dict[str, tuple[str, ...]] = {
    "timing/generation": ("generate",),
    "timing/make_experience": ("retokenize", "reward", "old_log_prob", "reference", "critic_fwd", "adv"),
    "timing/ppo_train": ("actor_train", "critic_train"),
    "timing/broadcast": ("weight_sync",),
}
OPENRLHF_STEP = "timing/step_total"
LAUNCH_MARKERS = {"openrlhf": ("openrlhf.cli.train_ppo_ray", "train_ppo_ray"), "verl": ("verl.trainer.main_ppo",
                                                                                        "main_ppo")}
NAMES = {"verl": "verl", "openrlhf": "OpenRLHF"}


class FrameworkError(RlhfsimError):
    """A run whose framework cannot be told or is not the one given: one line."""


def detect(given: str | None, launch_text: str, log_framework: str, launch: str = "launch") -> str:
    """The run's framework: ``given`` (``--framework``), else the launch's (the trainer module it runs), else the
    log's (``LogRead.framework``). A launch of one framework with a log of the other is an error naming both."""
    if given is not None and given not in FRAMEWORKS:
        raise FrameworkError(f"--framework: expected one of {', '.join(FRAMEWORKS)}, got {given!r}")
    from_launch = next((fw for fw, marks in LAUNCH_MARKERS.items() if any(m in launch_text for m in marks)), None)
    if given is None and from_launch and log_framework in FRAMEWORKS and from_launch != log_framework:
        name = f"{'an' if log_framework == 'openrlhf' else 'a'} {NAMES[log_framework]}"
        raise FrameworkError(f"{launch}: expected {name} launch for {name} log, got a launch running "
                             f"{NAMES[from_launch]}'s trainer (pass --framework to say which)")
    return given or from_launch or (log_framework if log_framework in FRAMEWORKS else "verl")


def import_launch(framework: str, text: str, opts, source: str, is_yaml: bool):
    """The launch imported by its framework's importer (``rlhfsim import verl|openrlhf``)."""
    from rlhfsim.importers import IMPORTERS

    if framework != "verl" and opts.verl_version is not None:
        raise FrameworkError(f"--verl-version: expected only with a verl run, got it with an {NAMES[framework]} launch")
    return IMPORTERS[framework](text, opts, source, is_yaml)


def _plain(metrics: dict) -> dict:
    """A step's metrics with wandb/TensorBoard's ``train/`` prefix dropped (OpenRLHF logs ``train/timing/...``)."""
    return {**{k[len("train/"):]: v for k, v in metrics.items() if k.startswith("train/")}, **metrics}


def samples(framework: str, steady) -> dict[str, list[float]]:
    """The measured phases per kept step: verl's ``timing_s/*`` (``Steady.phase_samples``); OpenRLHF's four timers
    that every kept step logged, and ``timing_s/step`` (its ``timing/step_total``, read so by the log reader)."""
    if framework == "verl":
        return steady.phase_samples()
    rows = [_plain(s.metrics) for s in steady.kept]
    out = {k: [float(r[k]) for r in rows] for k in OPENRLHF_TIMERS if rows and all(k in r for r in rows)}
    if rows and all(VERL_STEP_KEY in r for r in rows):
        out[VERL_STEP_KEY] = [float(r[VERL_STEP_KEY]) for r in rows]
    return out


def logged_prompt_mean(framework: str, steady) -> float | None:
    """The mean prompt length of the kept steps: verl's ``prompt_length/mean``; OpenRLHF logs none, but its status
    carries ``total_length`` and ``response_length`` (means over the step's samples), whose difference is it."""
    if framework == "verl":
        return steady.mean("prompt_length/mean")
    rows = [_plain(s.metrics) for s in steady.kept]
    diffs = [r["total_length"] - r["response_length"] for r in rows if "total_length" in r and "response_length" in r]
    return statistics.fmean(diffs) if diffs and statistics.fmean(diffs) > 0 else None


def phase_groups(scenario) -> dict[str, tuple[str, ...]]:
    """OpenRLHF's timers -> the simulator phases each spans for this scenario: a rule reward (a reward function,
    a remote reward, an agent) is scored in the rollout worker, inside ``timing/generation``."""
    rule = scenario.models.reward.kind == "rule"
    out = {k: tuple(p for p in v if not (rule and p == "reward")) for k, v in OPENRLHF_TIMERS.items()}
    if rule:
        out["timing/generation"] = ("generate", "reward")
    return out


def spans(result, scenario) -> dict[str, float]:
    """OpenRLHF's timers as the simulation spends them: per steady step, the span of each timer's phases (first start
    to last end of their intervals), averaged; ``timing_s/step`` is their sum, as ``timing/step_total`` is."""
    groups = phase_groups(scenario)
    steady = [r.step for r in result.steps[result.summary["warmup_steps"]:]]
    bounds: dict[tuple[int, str], list[float]] = {}
    owner = {p: k for k, ps in groups.items() for p in ps}
    keep = set(steady)
    for iv in result.intervals:
        k = owner.get(iv.phase)
        if k is None or iv.step not in keep:
            continue
        b = bounds.setdefault((iv.step, k), [iv.start_s, iv.end_s])
        b[0], b[1] = min(b[0], iv.start_s), max(b[1], iv.end_s)
    out = {}
    for k in groups:
        per = [bounds[(s, k)][1] - bounds[(s, k)][0] if (s, k) in bounds else 0.0 for s in steady]
        if any((s, k) in bounds for s in steady):
            out[k] = statistics.fmean(per)
    out[VERL_STEP_KEY] = sum(out.values())
    return out

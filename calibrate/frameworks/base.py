"""What every framework adapter shares: the run it is asked for (``FrameworkSpec``, derived from a scenario)
and what it hands back, one ``FrameworkStep`` per optimizer step.

An adapter is one function ``run_<name>(spec) -> list[FrameworkStep]`` in its own module
(``calibrate.frameworks.trl``); it imports its framework lazily, so ``calibrate`` stays importable without
it. A step carries the framework's own wall time, the phase timers it could attribute (names in
``FRAMEWORK_PHASES``: ours where they mean the same thing, plus the framework's own extra passes) and every
rollout's prompt and response length, grouped by prompt, in the order the framework generated them.

This module needs neither torch nor the framework: the validation join and the tests import it freely.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhfsim.errors import ScenarioError
from rlhfsim.models.catalog import ModelShape

# Phases a framework step is cut into. generate, reward, reference and actor_train mean what they mean in
# the simulator (rlhfsim.contracts.PHASES); old_logprobs is the actor's own no-grad forward pass over
# the batch before training (RLOO always, GRPO only when generation and optimizer steps are misaligned);
# other is the rest of the framework's batch preparation (tokenizing, decoding completions to text,
# padding, advantages, metrics).
FRAMEWORK_PHASES = ("generate", "reward", "reference", "old_logprobs", "actor_train", "other")


@dataclass(frozen=True)
class RolloutLength:
    """One completion: which prompt (``prompt_id``, the dataset row), which of its group (``rollout``,
    0 .. group_size - 1), and its token counts (the response counts its EOS token when it has one)."""

    prompt_id: int
    rollout: int
    prompt_len: int
    response_len: int


@dataclass(frozen=True)
class FrameworkStep:
    """One optimizer step of a framework run. ``wall_s``: from the step's first micro-batch to its
    optimizer step's end (``on_step_begin`` to ``on_step_end`` for a transformers Trainer);
    ``framework_step_time_s``: the framework's own step metric when it logs one (TRL's ``step_time``
    wraps ``training_step`` only: the optimizer step and gradient clipping are outside it). ``detail_s``:
    timers inside the phases, for diagnosis (the adapter's docstring lists them)."""

    step: int
    wall_s: float
    framework_step_time_s: float | None
    phases_s: dict
    rollouts: tuple[RolloutLength, ...]
    detail_s: dict = field(default_factory=dict)  # finer timers inside phases (the adapter says which)
    framework_log: dict = field(default_factory=dict)  # the framework's own logged metrics of the step


@dataclass(frozen=True)
class FrameworkSpec:
    """The run an adapter is asked for, in the framework-neutral terms of a scenario (``spec_from_scenario``).

    ``prompt_lens``: the token count of every dataset prompt (``prompts_per_step`` x ``steps`` rows, each
    used once); ``mean_response_tokens``: the mean completion length the actor's EOS probability is set
    for (the actor then samples freely); ``rule_reward``: True for a rule-based reward function instead of
    the ``reward`` model."""

    name: str
    algorithm: str
    actor: ModelShape
    reference: ModelShape | None
    reward: ModelShape | None
    rule_reward: bool
    group_size: int
    prompts_per_step: int
    prompt_lens: tuple[int, ...]
    max_response_tokens: int
    mean_response_tokens: float
    steps: int
    dtype: str
    seed: int
    device: str = "cpu"
    threads: int | None = None
    log_path: str | None = None

    @property
    def rollouts_per_step(self) -> int:
        return self.prompts_per_step * self.group_size


def spec_from_scenario(sc, setup, device: str = "cpu", threads: int | None = None,
                       log_path: str | None = None) -> FrameworkSpec:
    """The framework run of a scenario; every mismatch with what a framework step is raises a
    ScenarioError naming the YAML path. A step is one generation of ``prompts_per_step`` x ``group_size``
    completions in one static batch and one optimizer step over all of them (TRL's default alignment,
    under which GRPO computes no old log-probs): ``algorithm.minibatch_size`` and ``generation.max_batch``
    must both equal the rollouts per step, ``ppo_epochs`` 1."""
    import numpy as np

    alg, w, g = sc.algorithm, sc.workload, sc.generation
    if alg.kind not in ("grpo", "rloo"):
        raise ScenarioError("algorithm.kind", f"expected grpo or rloo for a framework run (TRL has no PPO trainer), got {alg.kind!r}")
    if alg.group_size < 2:
        raise ScenarioError("algorithm.group_size", f"expected at least 2 (group-relative baselines need a group), got {alg.group_size}")
    n = w.prompts_per_step * alg.group_size
    if alg.ppo_epochs != 1:
        raise ScenarioError("algorithm.ppo_epochs", f"expected 1 (one optimizer step per generation), got {alg.ppo_epochs}")
    if alg.minibatch_size != n:
        raise ScenarioError("algorithm.minibatch_size", f"expected the {n} rollouts per step (one optimizer step per step), got {alg.minibatch_size}")
    if g.engine != "static" or g.max_batch != n:
        raise ScenarioError("generation", f"expected engine static with max_batch {n} (one generate() call per step), got engine {g.engine} with max_batch {g.max_batch}")
    if g.resolved_runtime != "hf_generate":
        raise ScenarioError("generation.runtime", f"expected hf_generate (TRL generates with transformers generate()), got {g.resolved_runtime!r}")
    if sc.schedule.kind != "sync":
        raise ScenarioError("schedule.kind", f"expected sync (TRL's trainers run the step in order), got {sc.schedule.kind!r}")
    if len(setup.pools) != 1 or setup.pools[0].gpus != 1:
        raise ScenarioError("placement", "expected every role colocated on one device for a framework run")
    m = sc.models
    if m.critic is not None:
        raise ScenarioError("models.critic", "expected no critic for grpo/rloo")
    if m.reference is not None and m.reference.model != m.actor.model:
        raise ScenarioError("models.reference.model", f"expected the actor's model {m.actor.model!r} (TRL builds the reference from the actor's checkpoint), got {m.reference.model!r}")
    rng = np.random.default_rng([sc.seed, 3])
    prompt_lens = tuple(int(x) for x in setup.prompt_sampler(rng, w.prompts_per_step * sc.steps))
    resp = setup.response_sampler(np.random.default_rng([sc.seed, 4]), 4096)
    return FrameworkSpec(
        name=sc.name, algorithm=alg.kind, actor=setup.shapes["actor"], reference=setup.shapes.get("reference"),
        reward=setup.shapes.get("reward"), rule_reward=setup.rule_reward is not None, group_size=alg.group_size,
        prompts_per_step=w.prompts_per_step, prompt_lens=prompt_lens, max_response_tokens=w.max_response_tokens,
        mean_response_tokens=float(np.mean(resp)), steps=sc.steps, dtype=m.actor.dtype, seed=sc.seed,
        device=device, threads=threads, log_path=log_path)

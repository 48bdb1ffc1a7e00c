"""A scenario as validate runs it: the executor's config (``ExecConfig``) from the scenario, with the
executor's own checks named by scenario path, the runtime the executor runs where the scenario names none,
and the rollouts drawn from the simulator's own seeded stream, so that both sides see the same lengths."""

from __future__ import annotations

from pathlib import Path

import click

from rlhfsim.errors import RlhfsimError, ScenarioError

EXECUTOR_RUNTIMES = ("kv_decoder", "hf_generate")  # generation runtimes calibrate.executor runs

def exec_config(sc, setup, device: str, steps: int, rollouts: list[tuple[int, int]], threads: int | None):
    """The executor's config for a scenario (schedules the executor runs: sync and fixed-knob oppo)."""
    from calibrate.executor import ExecConfig

    sched = sc.schedule
    intra = inter = False
    chunk, delta, keep_kv = 1, 0, True
    if sched.kind == "oppo":
        if sched.intra.adaptive is not None or sched.inter.adaptive is not None:
            raise ScenarioError("schedule", "expected fixed chunk size and delta for validation, got an adaptive block")
        if sched.intra.stream_reference_critic:
            raise ScenarioError("schedule.intra.stream_reference_critic", "expected false for validation (the executor streams to the reward model only), got true")
        intra = sched.intra.enabled and setup.rule_reward is None
        inter = sched.inter.enabled and sched.inter.delta > 0
        chunk, delta, keep_kv = sched.intra.chunk_tokens, sched.inter.delta if inter else 0, sched.inter.keep_kv
    elif sched.kind != "sync":
        raise ScenarioError("schedule.kind", f"expected sync or oppo for validation (the executor runs those), got {sched.kind!r}")
    runtime = sc.generation.resolved_runtime
    if runtime not in EXECUTOR_RUNTIMES:
        raise ScenarioError("generation.runtime", f"expected a runtime the executor runs ({', '.join(EXECUTOR_RUNTIMES)}; "
                            f"set it explicitly: the {sc.generation.engine} engine's default is {runtime}), got {runtime!r}")
    if setup.reward_max_tokens is not None:   # the simulator truncates as the frameworks do; the executor does not
        w = sc.workload
        raise ScenarioError("workload.max_response_tokens", (
            f"expected prompt + response within the reward model's {setup.reward_max_tokens} positions for validation "
            f"(the executor scores rows whole, it does not truncate them), got {w.max_prompt_tokens} + {w.max_response_tokens}"))
    if len(setup.pools) != 1 or setup.pools[0].gpus != 1:
        raise ScenarioError("placement", f"expected every role colocated on one device for validation, got {len(setup.pools)} pool(s) of {[p.gpus for p in setup.pools]} GPUs")
    m = sc.models
    cfg = ExecConfig(
        device=device, dtype=m.actor.dtype, actor=setup.shapes["actor"], critic=setup.shapes.get("critic"),
        reference=setup.shapes.get("reference"), reward=setup.shapes.get("reward"),
        rule_reward_s=setup.rule_reward.cpu_s_per_sample if setup.rule_reward else 0.0,
        algorithm=sc.algorithm.kind, group_size=sc.algorithm.group_size,
        prompts_per_step=sc.workload.prompts_per_step, ppo_epochs=sc.algorithm.ppo_epochs,
        minibatch_size=sc.algorithm.minibatch_size, engine=sc.generation.engine,
        max_batch=sc.generation.max_batch, schedule=sched.kind, intra=intra, chunk_tokens=chunk,
        inter=inter, delta=delta, keep_kv=keep_kv, steps=steps, rollouts=rollouts, seed=sc.seed,
        threads=threads, gen_runtime=runtime, reward_streaming=setup.reward_streaming, retokenize=setup.retokenize)
    check_exec_config(cfg)
    return cfg


# The scenario path behind each ExecConfig field exec_config sets from one (for the executor's own checks).
EXEC_PATHS = {"dtype": "models.actor.dtype", "algorithm": "algorithm.kind", "group_size": "algorithm.group_size",
              "prompts_per_step": "workload.prompts_per_step", "ppo_epochs": "algorithm.ppo_epochs",
              "minibatch_size": "algorithm.minibatch_size", "engine": "generation.engine",
              "max_batch": "generation.max_batch", "schedule": "schedule.kind", "chunk_tokens": "schedule.intra.chunk_tokens",
              "delta": "schedule.inter.delta", "keep_kv": "schedule.inter.keep_kv", "steps": "steps",
              "gen_runtime": "generation.runtime", "critic": "models.critic", "rule_reward_s": "models.reward.cpu_s_per_sample",
              "reward_streaming": "models.reward.streaming"}


def check_exec_config(cfg) -> None:
    """The executor's own checks of its config (``calibrate.executor.config.validate``), run now rather
    than when the executor starts (after any calibration), their ``ExecConfig.<field>`` named by the
    scenario path it comes from (``EXEC_PATHS``). The rollouts are drawn after (``prepare``): until then
    placeholders stand in for them (the executor checks the real ones when it starts)."""
    import dataclasses

    from calibrate.executor.config import validate as validate_exec

    try:
        validate_exec(dataclasses.replace(cfg, rollouts=cfg.rollouts or [(1, 1)] * cfg.rollouts_needed))
    except RlhfsimError as e:
        text = str(e)
        field, sep, rest = text.partition(": ")
        name = field.removeprefix("ExecConfig.")
        if not sep or not field.startswith("ExecConfig.") or name not in EXEC_PATHS:
            raise
        raise ScenarioError(EXEC_PATHS[name], rest.replace("gen_runtime", "generation.runtime")) from None


def executor_runtime(sc):
    """(the scenario validate runs, a note or None). A scenario that names no generation runtime, whose
    engine's default is one the executor does not run (``vllm`` for the continuous engine), is validated
    with the executor's runtime for that engine (``kv_decoder``): the executor runs it and the simulator
    prices it, and the note says so. A runtime the scenario names is kept (and refused by exec_config
    when the executor does not run it)."""
    from rlhfsim.costs.genruntimes import GEN_RUNTIMES
    from rlhfsim.sim.run import rebuild

    g = sc.generation
    if g.runtime is not None or g.resolved_runtime in EXECUTOR_RUNTIMES:
        return sc, None
    rt = next(r for r in EXECUTOR_RUNTIMES if GEN_RUNTIMES[r] in (g.engine, "any"))
    note = (f"{sc.name}: generation.runtime names none and the {g.engine} engine's default ({g.resolved_runtime}) is "
            f"not one the executor runs; validating with {rt}, measured and priced (name generation.runtime to choose)")
    return rebuild(sc, {"generation": {**g.model_dump(mode="json"), "runtime": rt}}), note


def draw_rollouts(setup, n: int) -> list[tuple[int, int]]:
    """The first n rollouts of the simulator's own stream for this scenario (same generator, same order)."""
    import numpy as np

    from rlhfsim.sim.rollouts import RolloutStream

    stream = RolloutStream(setup, np.random.default_rng([setup.scenario.seed, 0]))
    return [(r.prompt_len, r.response_len) for r in stream.take(n, 0)]


def prepare(path: Path, device: str, steps: int | None, threads: int | None, overrides: list | None = None):
    """Scenario, setup, the executor config and the shared rollout list of one validation scenario."""
    from rlhfsim.scenario import build_setup, load_scenario
    from rlhfsim.sim.run import rebuild

    sc = load_scenario(path, overrides=overrides)
    sc, note = executor_runtime(sc)
    if note:
        click.echo(f"note: {note}", err=True)
    if not sc.generation.sampling_logprobs:
        # the executor records every sampled token's log-prob (its PPO ratio's old log-probs), in every runtime
        sc = rebuild(sc, {"generation": {**sc.generation.model_dump(mode="json"), "sampling_logprobs": True}})
    if steps is not None:
        sc = rebuild(sc, {"steps": steps, "warmup_steps": min(sc.warmup_steps, steps - 1)})
    setup = build_setup(sc)
    if device == "cpu" and setup.gpu.kind != "cpu":
        raise ScenarioError("cluster.gpu", f"expected cpu for --device cpu validation, got {sc.cluster.gpu!r}")
    cfg = exec_config(sc, setup, device, sc.steps, [], threads)
    cfg.rollouts = draw_rollouts(setup, cfg.rollouts_needed + 8 * setup.rollouts_per_step)
    return sc, setup, cfg, cfg.rollouts

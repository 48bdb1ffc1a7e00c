"""verl's step mechanics as the scenario's ``execution`` block: the old-log-prob pass, advantages,
micro-batches (row counts or token budgets), sequence packing, gradient checkpointing, host offload, Ulysses
sequence parallelism and the hybrid engine's weight resharding.

The scenario has one micro-batch setting for every forward pass and one for training; verl has one per
model. The actor's (the rollout's for forward passes) is used, and a different value on another model is
listed as unmapped. verl's legacy global sizes (``ppo_micro_batch_size``, ``log_prob_micro_batch_size``)
are divided by the data-parallel world as verl divides them.
"""

from __future__ import annotations

from rlhfsim.importers.common import ImportError_

AR = "actor_rollout_ref"

# verl's defaults (ppo_trainer.yaml, main 2026-01) for the settings read here.
DEFAULTS: dict[str, object] = {
    f"{AR}.model.use_remove_padding": True,
    f"{AR}.model.enable_gradient_checkpointing": True,
    f"{AR}.actor.use_dynamic_bsz": False,
    f"{AR}.actor.ppo_max_token_len_per_gpu": 16384,
    f"{AR}.actor.ulysses_sequence_parallel_size": 1,
    f"{AR}.actor.fsdp_config.param_offload": False,
    f"{AR}.actor.fsdp_config.optimizer_offload": False,
    f"{AR}.ref.fsdp_config.param_offload": False,
    "critic.model.fsdp_config.param_offload": False,
    "critic.model.fsdp_config.optimizer_offload": False,
    "critic.ppo_max_token_len_per_gpu": 32768,
    f"{AR}.rollout.calculate_log_probs": True,
    "trainer.balance_batch": True,
}

# verl's advantage code by release (rlhfsim.costs.driver): GAE's masked reverse loop and masked_sum's torch.where
# came in v0.5.0 (core_algos.compute_gae_advantage_return, torch_functional.masked_sum); the rollout-correction
# metrics run on the adv timer when the rollout returns its log-probs, with the algorithm.rollout_correction config
# that v0.6.1 added to ppo_trainer.yaml (v0.7 taken: parse_version reads minor releases)
MASKED_GAE_FROM = (0, 5)
ROLLOUT_METRICS_FROM = (0, 7)
# trainer.balance_batch (ray_trainer._balance_batch) is in ppo_trainer.yaml from v0.3.0 (True), absent in v0.2
BALANCE_FROM = (0, 3)

MAPPED: dict[str, str] = {
    f"{AR}.actor.ppo_micro_batch_size_per_gpu": "execution.micro_batch.ppo_micro_batch_size_per_gpu",
    f"{AR}.actor.ppo_micro_batch_size": "execution.micro_batch.ppo_micro_batch_size_per_gpu (global size / GPUs)",
    f"{AR}.rollout.log_prob_micro_batch_size_per_gpu": "execution.micro_batch.log_prob_micro_batch_size_per_gpu",
    f"{AR}.rollout.log_prob_micro_batch_size": "execution.micro_batch.log_prob_micro_batch_size_per_gpu (global size / GPUs)",
    f"{AR}.actor.use_dynamic_bsz": "execution.micro_batch.use_dynamic_bsz",
    f"{AR}.actor.ppo_max_token_len_per_gpu": "execution.micro_batch.ppo_max_token_len_per_gpu",
    f"{AR}.rollout.log_prob_max_token_len_per_gpu": "execution.micro_batch.log_prob_max_token_len_per_gpu",
    f"{AR}.model.use_remove_padding": "execution.micro_batch.use_remove_padding",
    f"{AR}.model.enable_gradient_checkpointing": "execution.gradient_checkpointing",
    f"{AR}.actor.fsdp_config.param_offload": "execution.offload.actor.param and .grad (verl moves gradients with the parameters)",
    f"{AR}.actor.fsdp_config.grad_offload": "execution.offload.actor.grad",
    f"{AR}.actor.fsdp_config.optimizer_offload": "execution.offload.actor.optimizer",
    f"{AR}.actor.megatron.param_offload": "execution.offload.actor.param",
    f"{AR}.actor.megatron.grad_offload": "execution.offload.actor.grad",
    f"{AR}.actor.megatron.optimizer_offload": "execution.offload.actor.optimizer",
    f"{AR}.actor.optim.override_optimizer_config.optimizer_cpu_offload": (
        "execution.offload.actor.optimizer (Megatron's CPU optimizer: the state lives in host memory; with "
        "optimizer_offload_fraction 1, Megatron's default)"),
    f"{AR}.actor.optim.override_optimizer_config.optimizer_offload_fraction": (
        "execution.offload.actor.optimizer when 1 with optimizer_cpu_offload (a fraction below 1 keeps the state on the GPU)"),
    f"{AR}.ref.fsdp_config.param_offload": "execution.offload.reference.param",
    f"{AR}.ref.megatron.param_offload": "execution.offload.reference.param",
    "critic.model.fsdp_config.param_offload": "execution.offload.critic.param and .grad",
    "critic.model.fsdp_config.grad_offload": "execution.offload.critic.grad",
    "critic.model.fsdp_config.optimizer_offload": "execution.offload.critic.optimizer",
    f"{AR}.actor.ulysses_sequence_parallel_size": "execution.ulysses_sequence_parallel_size",
    "critic.model.use_remove_padding": "execution.micro_batch.critic_use_remove_padding",
    f"{AR}.ref.log_prob_micro_batch_size_per_gpu": "execution.micro_batch.ref_log_prob_micro_batch_size_per_gpu",
    f"{AR}.ref.log_prob_micro_batch_size": "execution.micro_batch.ref_log_prob_micro_batch_size_per_gpu (global size / GPUs)",
    "critic.ppo_micro_batch_size_per_gpu": "execution.micro_batch.critic_ppo_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size": "execution.micro_batch.critic_ppo_micro_batch_size_per_gpu (global size / GPUs)",
    "critic.forward_micro_batch_size_per_gpu": "execution.micro_batch.critic_forward_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size": "execution.micro_batch.critic_forward_micro_batch_size_per_gpu (global size / GPUs)",
    "critic.ppo_max_token_len_per_gpu": "execution.micro_batch.critic_ppo_max_token_len_per_gpu",
    f"{AR}.rollout.calculate_log_probs": "execution.advantage.rollout_metrics (verl >= 0.7 computes the rollout-"
                                          "correction metrics on the driver when the rollout returns log-probs)",
    "trainer.balance_batch": "execution.balance_batch (verl >= 0.3: rows spread over the data-parallel ranks by "
                             "sequence length)",
}

# Per-model settings the scenario holds once: mapped when equal to the value used, else unmapped.
SAME_AS = {
    f"{AR}.ref.log_prob_max_token_len_per_gpu": f"{AR}.rollout.log_prob_max_token_len_per_gpu",
    "critic.use_dynamic_bsz": f"{AR}.actor.use_dynamic_bsz",
    "critic.model.enable_gradient_checkpointing": f"{AR}.model.enable_gradient_checkpointing",
    f"{AR}.rollout.log_prob_use_dynamic_bsz": f"{AR}.actor.use_dynamic_bsz",
    f"{AR}.ref.log_prob_use_dynamic_bsz": f"{AR}.actor.use_dynamic_bsz",
    f"{AR}.ref.ulysses_sequence_parallel_size": f"{AR}.actor.ulysses_sequence_parallel_size",
    "critic.ulysses_sequence_parallel_size": f"{AR}.actor.ulysses_sequence_parallel_size",
}


def classify(key: str, seen: dict) -> tuple[str, str] | None:
    """(status, target) for an execution setting, or None for a key this module does not read."""
    if key in MAPPED:
        return "mapped", MAPPED[key]
    if key in SAME_AS:
        other = SAME_AS[key]
        if other in seen and seen[other] == seen[key] or other in DEFAULTS and other not in seen and str(DEFAULTS[other]) == seen[key]:
            return "mapped", f"{MAPPED.get(other, other)} (the scenario holds one value: the same as {other})"
        return "unmapped", f"the scenario holds one value for every model: {other}'s is used"
    return None


def _int(cfg: dict, key: str) -> int | None:
    v = cfg.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < 1:
        raise ImportError_(f"{key}: expected a whole number >= 1, got {v!r}")
    return int(v)


def _cpu_optimizer(cfg: dict, a: list[str]) -> bool:
    """Megatron's CPU optimizer (``optim.override_optimizer_config.optimizer_cpu_offload``): the whole optimizer state
    in host memory at ``optimizer_offload_fraction`` 1 (Megatron's default); a smaller fraction keeps it on the GPU here
    (said in the assumptions), since the scenario has no partial offload."""
    key = f"{AR}.actor.optim.override_optimizer_config."
    if not _flag(cfg, key + "optimizer_cpu_offload"):
        return False
    frac = cfg.get(key + "optimizer_offload_fraction", 1.0)
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac <= 1:
        raise ImportError_(f"{key}optimizer_offload_fraction: expected a number from 0 to 1, got {frac!r}")
    if frac < 1:
        a.append(f"optim.override_optimizer_config.optimizer_offload_fraction={frac}: partial CPU offload taken as none "
                 "(the optimizer state priced on the GPU)")
        return False
    a.append("Megatron's CPU optimizer (optimizer_cpu_offload): the optimizer state in host memory, priced as "
             "execution.offload.actor.optimizer (moved to and from the GPU; the CPU's Adam step itself is not priced)")
    return True


def _flag(cfg: dict, key: str) -> bool:
    v = cfg.get(key, DEFAULTS.get(key, False))
    if not isinstance(v, bool):
        raise ImportError_(f"{key}: expected True or False, got {v!r}")
    return v


def advantage(cfg: dict, version: tuple[int, int] | None, a: list[str]) -> dict:
    """``execution.advantage``: verl's advantage code on the driver as the release (None: the current one) has it."""
    masked = version is None or version >= MASKED_GAE_FROM
    metrics = _flag(cfg, f"{AR}.rollout.calculate_log_probs") and (version is None or version >= ROLLOUT_METRICS_FROM)
    a.append(f"advantages on the driver as verl {'>= 0.5' if masked else '<= 0.4'} computes them (GAE's "
             f"{'masked' if masked else 'plain'} reverse loop)" + (", with the rollout-correction metrics "
             "(rollout.calculate_log_probs)" if metrics else ""))
    return {"enabled": True, "gae_loop": "masked" if masked else "plain", "rollout_metrics": metrics}


def execution(cfg: dict, seen: dict, world: int, models: dict, assumptions: list[str],
              version: tuple[int, int] | None = None, hybrid: bool = True) -> dict:
    """The scenario's ``execution`` block from verl's settings (``cfg``: the launch over verl's defaults; ``version``:
    the release, None for the current one; ``hybrid``: the hybrid engine's resharding weight sync, else the async
    recipes' NCCL broadcast to a separate pool)."""
    a = assumptions
    mb: dict = {}
    sp = _int(cfg, f"{AR}.actor.ulysses_sequence_parallel_size")
    ranks = max(world // sp, 1)  # verl divides a global micro-batch size by the data-parallel ranks
    train = _int(cfg, f"{AR}.actor.ppo_micro_batch_size_per_gpu")
    if train is None and _int(cfg, f"{AR}.actor.ppo_micro_batch_size") is not None:
        train = max(_int(cfg, f"{AR}.actor.ppo_micro_batch_size") // ranks, 1)
    fwd = _int(cfg, f"{AR}.rollout.log_prob_micro_batch_size_per_gpu")
    if fwd is None and _int(cfg, f"{AR}.rollout.log_prob_micro_batch_size") is not None:
        fwd = max(_int(cfg, f"{AR}.rollout.log_prob_micro_batch_size") // ranks, 1)
    if train is not None:
        mb["ppo_micro_batch_size_per_gpu"] = train
    if fwd is not None:
        mb["log_prob_micro_batch_size_per_gpu"] = fwd
    if _flag(cfg, f"{AR}.actor.use_dynamic_bsz"):
        mb["use_dynamic_bsz"] = True
        mb["ppo_max_token_len_per_gpu"] = _int(cfg, f"{AR}.actor.ppo_max_token_len_per_gpu")
        fwd_tokens = _int(cfg, f"{AR}.rollout.log_prob_max_token_len_per_gpu")
        if fwd_tokens is not None:
            mb["log_prob_max_token_len_per_gpu"] = fwd_tokens
        if f"{AR}.actor.ppo_max_token_len_per_gpu" not in seen:
            a.append(f"use_dynamic_bsz without ppo_max_token_len_per_gpu: verl's default {DEFAULTS[f'{AR}.actor.ppo_max_token_len_per_gpu']}")
    # the reference's and the critic's own sizes (verl has one per model; the critic's values pass defaults to its
    # training size, as verl's critic.forward_micro_batch_size_per_gpu: ${critic.ppo_micro_batch_size_per_gpu})
    def per_gpu(key: str) -> int | None:
        v = _int(cfg, f"{key}_per_gpu")
        return v if v is not None or _int(cfg, key) is None else max(_int(cfg, key) // ranks, 1)
    if "reference" in models and per_gpu(f"{AR}.ref.log_prob_micro_batch_size") is not None:
        mb["ref_log_prob_micro_batch_size_per_gpu"] = per_gpu(f"{AR}.ref.log_prob_micro_batch_size")
    if "critic" in models:
        ctrain = per_gpu("critic.ppo_micro_batch_size")
        cfwd = per_gpu("critic.forward_micro_batch_size") or ctrain
        if ctrain is not None:
            mb["critic_ppo_micro_batch_size_per_gpu"] = ctrain
        if cfwd is not None:
            mb["critic_forward_micro_batch_size_per_gpu"] = cfwd
        if mb.get("use_dynamic_bsz"):  # critic.use_dynamic_bsz follows the actor's (SAME_AS)
            mb["critic_ppo_max_token_len_per_gpu"] = _int(cfg, "critic.ppo_max_token_len_per_gpu")
    mb["use_remove_padding"] = _flag(cfg, f"{AR}.model.use_remove_padding")
    # verl pads unpacked rows to the configured lengths: prompts left-padded to data.max_prompt_length by its
    # dataset, responses to the rollout's response_length
    mb["pad_to"] = "max_length"
    if "critic" in models and "critic.model.use_remove_padding" in cfg:
        mb["critic_use_remove_padding"] = _flag(cfg, "critic.model.use_remove_padding")
    ckpt = _flag(cfg, f"{AR}.model.enable_gradient_checkpointing")
    for key, what in ((f"{AR}.model.use_remove_padding", "packing"), (f"{AR}.model.enable_gradient_checkpointing", "checkpointing")):
        if key not in seen:
            a.append(f"{key.removeprefix(AR + '.')} not set: verl's current default {DEFAULTS[key]} ({what}; the 0.1/0.2 "
                     f"configs printed False)")

    actor_param = _flag(cfg, f"{AR}.actor.fsdp_config.param_offload") or _flag(cfg, f"{AR}.actor.megatron.param_offload")
    offload: dict = {"actor": {
        "param": actor_param,
        "grad": actor_param or _flag(cfg, f"{AR}.actor.fsdp_config.grad_offload") or _flag(cfg, f"{AR}.actor.megatron.grad_offload"),
        "optimizer": (_flag(cfg, f"{AR}.actor.fsdp_config.optimizer_offload") or _flag(cfg, f"{AR}.actor.megatron.optimizer_offload")
                      or _cpu_optimizer(cfg, a)),
    }}
    ref_param = _flag(cfg, f"{AR}.ref.fsdp_config.param_offload") or _flag(cfg, f"{AR}.ref.megatron.param_offload")
    if "reference" in models:
        offload["reference"] = {"param": ref_param}
    elif ref_param:
        a.append("ref.fsdp_config.param_offload set but no reference pass runs: ignored")
    if "critic" in models:
        cparam = _flag(cfg, "critic.model.fsdp_config.param_offload")
        offload["critic"] = {"param": cparam, "grad": cparam or _flag(cfg, "critic.model.fsdp_config.grad_offload"),
                             "optimizer": _flag(cfg, "critic.model.fsdp_config.optimizer_offload")}
    a.append("verl mechanics on (execution): "
             + ("the actor's old-log-prob pass every step (verl >= 0.3 times it as timing_s/old_log_prob)" if hybrid
                else "the old-log-prob pass as the async recipe sets it")
             + ", advantages on the driver (timing_s/adv), "
             + ("weight sync by resharding into the engine (the hybrid engine)" if hybrid
                else "weight sync by NCCL broadcast to the generation pool"))
    strategy = str(cfg.get(f"{AR}.actor.strategy", "fsdp"))
    a.append(f"actor.strategy {strategy}: " + ("parameters sharded by FSDP over each pool's GPUs (execution.sharding: "
             "fsdp: gathers and fp32 gradient reduce-scatters every micro-batch)" if strategy in ("fsdp", "fsdp2")
             else "no per-call parameter gathers (execution.sharding: none)") + "; every log-prob call computes the "
             "entropy too (execution.entropy, verl's dp_actor)")
    balance = _flag(cfg, "trainer.balance_batch") and (version is None or version >= BALANCE_FROM)
    if balance and "trainer.balance_batch" not in seen:
        a.append("trainer.balance_batch not set: True, verl's default from v0.3 (rows spread over the ranks by sequence "
                 "length: execution.balance_batch)")
    return {
        "sharding": "fsdp" if strategy in ("fsdp", "fsdp2") else "none",
        "balance_batch": balance,
        "entropy": True,
        "old_log_prob": True,
        "advantage": advantage(cfg, version, a),
        "micro_batch": mb,
        "gradient_checkpointing": ckpt,
        "offload": offload,
        "weight_sync": {"kind": "reshard" if hybrid else "nccl"},
        "ulysses_sequence_parallel_size": sp,
    }

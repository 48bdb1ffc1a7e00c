"""OpenRLHF's ``train_ppo_ray`` flags in both of their generations, read as one set of names.

OpenRLHF named its flags flat until v0.10.1 (``--pretrain``, ``--actor_num_gpus_per_node``, ``--vllm_num_engines``)
and renamed every one of them into dotted groups in v0.10.2 (commit ed62d0e2, 2026-04-19: ``--actor.model_name_or_path``,
``--actor.num_gpus_per_node``, ``--vllm.num_engines``, ``--ds.param_dtype``, ...). The importer reads a launch of
either generation under the flat names (``canonical``): ``DOTTED`` pairs each dotted flag with the flat flag it
replaced, paired in order from the two argument parsers (``openrlhf/cli/train_ppo_ray.py`` at ed62d0e2 and at its
parent, v0.10.1.post2). A dotted flag with no flat predecessor keeps its dotted name (``ref.offload``,
``actor.optim``, the per-model ``adam.*`` / ``muon.*`` optimizer groups). OpenRLHF's parser of each generation
refuses the other's names; a launch that mixes them is read as written, with a note (``generation``).

Within the flat generation three changes matter to the scenario (from the tags' parsers):

* dtype: ``--bf16`` (a flag, off by default: fp32 training) up to v0.9.1.post1; ``--param_dtype {bf16,fp16}`` (default
  bf16) from v0.9.2 (commit cd7a434f, 2026-01-06); ``--ds.param_dtype`` in the dotted generation;
* length caps: ``--prompt_max_len`` and ``--generate_max_len`` (default 1024 each) up to v0.9.7; from v0.9.8 (commit
  d0e088b6, 2026-03-24) ``--max_len`` (prompt + response, default 2048) and ``--max_new_tokens`` (default none: each
  response may run to ``max_len`` less its prompt; ``openrlhf/utils/agent.py``), dotted ``--data.max_len`` and
  ``--rollout.max_new_tokens``;
* ``--ref_reward_offload`` (reference and reward model) became ``--ref.offload`` and ``--reward.offload``.

``SINCE_V092`` lists the flat flags that first appear in v0.9.2 or later: a launch that uses one ran on a release
whose dtype defaults to bf16.
"""

from __future__ import annotations

# dotted flag (v0.10.2 on) -> the flat flag it replaced (v0.10.1.post2's parser, same position)
DOTTED: dict[str, str] = {
    "ref.num_nodes": "ref_num_nodes", "ref.num_gpus_per_node": "ref_num_gpus_per_node",
    "reward.num_nodes": "reward_num_nodes", "reward.num_gpus_per_node": "reward_num_gpus_per_node",
    "actor.num_nodes": "actor_num_nodes", "actor.num_gpus_per_node": "actor_num_gpus_per_node",
    "critic.num_nodes": "critic_num_nodes", "critic.num_gpus_per_node": "critic_num_gpus_per_node",
    "train.colocate_actor_ref": "colocate_actor_ref", "train.colocate_critic_reward": "colocate_critic_reward",
    "train.colocate_all": "colocate_all_models",
    "vllm.num_engines": "vllm_num_engines", "vllm.tensor_parallel_size": "vllm_tensor_parallel_size",
    "vllm.sync_backend": "vllm_sync_backend", "vllm.sync_with_ray": "vllm_sync_with_ray",
    "vllm.enable_prefix_caching": "enable_prefix_caching", "vllm.enforce_eager": "enforce_eager",
    "vllm.enable_sleep": "vllm_enable_sleep", "vllm.gpu_memory_utilization": "vllm_gpu_memory_utilization",
    "algo.advantage.is_correction_enable": "enable_vllm_is_correction",
    "algo.advantage.is_correction_threshold": "vllm_is_truncated_threshold",
    "algo.advantage.is_correction_type": "vllm_is_correction_type",
    "train.async_enable": "async_train", "train.async_queue_size": "async_queue_size",
    "train.partial_rollout_enable": "partial_rollout",
    "eval.steps": "eval_steps", "ckpt.save_steps": "save_steps", "logger.logging_steps": "logging_steps",
    "ckpt.path": "ckpt_path", "ckpt.save_hf": "save_hf_ckpt", "ckpt.disable_ds": "disable_ds_ckpt",
    "ckpt.max_num": "max_ckpt_num", "ckpt.max_mem": "max_ckpt_mem", "ckpt.load_enable": "load_checkpoint",
    "ckpt.best_metric_key": "best_metric_key", "ckpt.output_dir": "save_path",
    "ds.use_universal_ckpt": "use_ds_universal_ckpt", "ds.zero_stage": "zero_stage", "ds.deepcompile": "deepcompile",
    "ds.param_dtype": "param_dtype", "ds.zpg": "zpg", "ds.adam_offload": "adam_offload",
    "ds.attn_implementation": "attn_implementation", "ds.use_liger_kernel": "use_liger_kernel",
    "ds.grad_accum_dtype": "grad_accum_dtype", "ds.overlap_comm": "overlap_comm",
    "ds.enable_sleep": "deepspeed_enable_sleep", "ds.tensor_parallel_size": "ds_tensor_parallel_size",
    "ds.packing_samples": "packing_samples", "ds.load_in_4bit": "load_in_4bit", "ds.lora.rank": "lora_rank",
    "ds.lora.alpha": "lora_alpha", "ds.lora.target_modules": "target_modules", "ds.lora.dropout": "lora_dropout",
    "ds.ring_attn_size": "ring_attn_size", "ds.ring_attn_head_stride": "ring_head_stride",
    "ds.value_head_prefix": "value_head_prefix",
    "actor.gradient_checkpointing_enable": "gradient_checkpointing",
    "actor.gradient_checkpointing_reentrant": "gradient_checkpointing_use_reentrant",
    "train.enable_ema": "enable_ema", "train.ema_beta": "ema_beta",
    "data.disable_fast_tokenizer": "disable_fast_tokenizer", "data.dataloader_num_workers": "dataloader_num_workers",
    "train.dynamic_batch_enable": "use_dynamic_batch", "rollout.max_tokens_per_gpu": "rollout_max_tokens_per_gpu",
    "train.max_tokens_per_gpu": "train_max_tokens_per_gpu",
    "train.num_episodes": "num_episodes", "rollout.batch_size": "rollout_batch_size",
    "rollout.vllm_generate_batch_size": "vllm_generate_batch_size", "rollout.micro_batch_size": "micro_rollout_batch_size",
    "train.max_epochs": "max_epochs", "data.max_len": "max_len", "rollout.max_new_tokens": "max_new_tokens",
    "data.max_samples": "max_samples",
    "actor.eps_clip": "eps_clip", "actor.eps_clip_low_high": "eps_clip_low_high", "actor.dual_clip": "dual_clip",
    "critic.value_clip": "value_clip", "algo.advantage.lambd": "lambd", "algo.advantage.gamma": "gamma",
    "train.micro_batch_size": "micro_train_batch_size", "train.batch_size": "train_batch_size",
    "reward.normalize_enable": "normalize_reward", "rollout.top_p": "top_p", "rollout.temperature": "temperature",
    "train.seed": "seed", "train.full_determinism_enable": "full_determinism",
    "critic.freezing_steps": "freezing_actor_steps", "rollout.n_samples_per_prompt": "n_samples_per_prompt",
    "critic.save_value_network": "save_value_network",
    "algo.kl.target": "kl_target", "algo.kl.horizon": "kl_horizon", "algo.kl.init_coef": "init_kl_coef",
    "algo.kl.estimator": "kl_estimator", "algo.kl.use_loss": "use_kl_loss",
    "actor.policy_loss_type": "policy_loss_type", "actor.aux_loss_coef": "aux_loss_coef",
    "actor.entropy_coef": "entropy_loss_coef", "reward.clip_range": "reward_clip_range",
    "algo.advantage.estimator": "advantage_estimator", "algo.advantage.no_std_norm": "no_advantage_std_norm",
    "reward.overlong_buffer_len": "overlong_buffer_len", "reward.overlong_penalty_factor": "overlong_penalty_factor",
    "reward.stop_properly_penalty_coef": "stop_properly_penalty_coef",
    "actor.model_name_or_path": "pretrain", "reward.model_name_or_path": "reward_pretrain",
    "reward.remote_url": "remote_rm_url", "critic.model_name_or_path": "critic_pretrain",
    "train.agent_func_path": "agent_func_path",
    "data.prompt_dataset": "prompt_data", "data.prompt_probs": "prompt_data_probs", "data.prompt_split": "prompt_split",
    "eval.dataset": "eval_dataset", "eval.split": "eval_split", "eval.temperature": "eval_temperature",
    "eval.n_samples_per_prompt": "eval_n_samples_per_prompt",
    "data.input_key": "input_key", "data.label_key": "label_key", "data.input_template": "input_template",
    "data.apply_chat_template": "apply_chat_template",
    "logger.wandb.key": "use_wandb", "logger.wandb.org": "wandb_org", "logger.wandb.group": "wandb_group",
    "logger.wandb.project": "wandb_project", "logger.wandb.run_name": "wandb_run_name",
    "logger.tensorboard_dir": "use_tensorboard",
    "algo.dynamic_filtering_enable": "dynamic_filtering", "algo.dynamic_filtering_range": "dynamic_filtering_reward_range",
    "data.image_key": "image_key", "data.max_images_per_prompt": "max_images_per_prompt",
    "actor.freeze_visual_encoder": "freeze_visual_encoder",
    # one flat flag became two, and the learning rates moved under each model's optimizer group
    "ref.offload": "ref_offload", "reward.offload": "reward_offload",
    "actor.adam.lr": "actor_learning_rate", "critic.adam.lr": "critic_learning_rate",
}
DOTTED_GROUPS = ("actor.", "critic.", "ref.", "reward.", "vllm.", "rollout.", "train.", "data.", "ds.", "algo.",
                 "eval.", "ckpt.", "logger.")

# flat flags no dotted release has (removed on the way, or only in the flat parser's last form)
FLAT_ONLY = frozenset(v for v in DOTTED.values() if v not in ("ref_offload", "reward_offload")) | {
    "bf16", "prompt_max_len", "generate_max_len", "ref_reward_offload", "flash_attn", "actor_init_on_gpu",
    "max_norm", "l2", "ptx_coef", "lr_warmup_ratio", "lr_scheduler", "adam_betas", "perf", "disable_trace_cache",
    "pretrain_data", "pretrain_data_probs", "pretrain_split", "use_kl_estimator_k3", "torch_compile",
    "universal_ckpt", "use_icepop",
}

# flat flags that first appear in v0.9.2 or later (tags' parsers): their release trains in bf16 by default
SINCE_V092: dict[str, str] = {
    "param_dtype": "v0.9.2", "stop_properly_penalty_coef": "v0.9.2", "vllm_is_correction_type": "v0.9.3",
    "partial_rollout": "v0.9.7", "max_new_tokens": "v0.9.8", "best_metric_key": "v0.9.9",
    "dataloader_num_workers": "v0.9.10", "freeze_visual_encoder": "v0.10.0", "image_key": "v0.10.0",
    "max_images_per_prompt": "v0.10.0",
}

FLAT, DOTTED_GEN = "flat", "dotted"
GENERATION_TEXT = {FLAT: "flat flag names (OpenRLHF up to v0.10.1)",
                   DOTTED_GEN: "dotted flag names (OpenRLHF v0.10.2 on)"}


def is_dotted(name: str) -> bool:
    return name in DOTTED or name.startswith(DOTTED_GROUPS)


def canonical(name: str) -> str:
    """A flag's name as the importer keys it: a dotted flag's flat predecessor (``DOTTED``), else the name itself."""
    return DOTTED.get(name, name)


def generation(names: list[str]) -> tuple[str, str | None]:
    """(``flat`` or ``dotted``, a note or None): which generation a launch's flags (as written, no dashes) belong to.
    A launch that mixes a dotted flag with one only the flat parsers had is read as dotted, with a note naming both
    (OpenRLHF's own parser of either generation stops at the other's names)."""
    dotted = next((n for n in names if is_dotted(n)), None)
    flat = next((n for n in names if n in FLAT_ONLY), None)
    if dotted and flat:
        return DOTTED_GEN, (f"the launch mixes the flat --{flat} (OpenRLHF up to v0.10.1) with the dotted --{dotted} "
                            f"(v0.10.2 on), which no OpenRLHF release accepts together; read as written (the flat "
                            f"flag's dotted name: --{_dotted_name(flat)})")
    return (DOTTED_GEN if dotted else FLAT), None


def _dotted_name(flat: str) -> str:
    back = {v: k for k, v in DOTTED.items()}
    if flat in back:
        return back[flat]
    return {"bf16": "ds.param_dtype bf16", "prompt_max_len": "data.max_len (prompt + response)",
            "generate_max_len": "rollout.max_new_tokens", "ref_reward_offload": "ref.offload and --reward.offload"
            }.get(flat, "none: v0.10.2 dropped it")

#!/usr/bin/env bash
# verl's fully_async_policy recipe, published pair (docs/advance/fully_async.md, "Asynchronous Training on 7B Model",
# row "fully_async_policy, 32:32"; verl commit b178a3cd5; source data wandb.ai/hou-zg-meituan/fully-async-policy-colocate_async): H20,
# Qwen2.5-Math-7B, DAPO, vLLM + FSDP2, max response 28K (28,672) tokens, rollout.n 16, ppo_mini_batch_size 32. Published
# mean step: 189.26 s.
# Published settings used: colocate sync train_batch_size 512; fully_async total_rollout_steps 512 x 400,
# require_batches 4, trigger_parameter_sync_step 4, staleness_threshold 0.5, partial_rollout True (a sync period is
# 4 x 4 x 32 = 512 prompts, the colocated step's). Not published and taken from the recipe's script
# (verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_32_32.sh): prompts up to 2,048 tokens, rollout
# TP 4, Ulysses SP 4, fsdp_size 8, dynamic batch sizes, the reference offloaded, the actor not; the colocated
# baseline has no script of its own in verl and is assumed to run the same settings on the hybrid engine. Assumed
# at import: the mean response length (the importer's default, half the cap; pass --mean-response-len to try
# another). The scenario's async schedule bounds whole steps (max_staleness 1 for 0.5) and does not model the
# trainer's streaming start or partial rollouts: the importer lists both.
# Import: rlhfsim import verl scenarios/examples/async-pairs/fa-async-32-32.sh --gpu h20 -o scenarios/examples/async-pairs/fa-async-32-32.yaml
python3 -m verl.experimental.fully_async_policy.fully_async_main \
    data.max_prompt_length=2048 \
    data.max_response_length=28672 \
    data.train_batch_size=0 \
    actor_rollout_ref.rollout.n=16 \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    algorithm.kl_ctrl.kl_coef=0.0 \
    actor_rollout_ref.actor.strategy=fsdp2 \
    critic.strategy=fsdp2 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-7B \
    actor_rollout_ref.model.use_remove_padding=True \
    +actor_rollout_ref.model.override_config.max_position_embeddings=32768 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=61440 \
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=92160 \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=92160 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=4 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.80 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
    actor_rollout_ref.rollout.enable_chunked_prefill=True \
    actor_rollout_ref.rollout.max_num_batched_tokens=30720 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.top_p=1.0 \
    actor_rollout_ref.rollout.top_k=-1 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    actor_rollout_ref.ref.ulysses_sequence_parallel_size=4 \
    actor_rollout_ref.actor.fsdp_config.fsdp_size=8 \
    reward_model.reward_manager=dapo \
    trainer.save_freq=-1 \
    data.gen_batch_size=1 \
    actor_rollout_ref.hybrid_engine=False \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    trainer.nnodes=4 \
    trainer.n_gpus_per_node=8 \
    rollout.nnodes=4 \
    rollout.n_gpus_per_node=8 \
    rollout.total_rollout_steps=204800 \
    async_training.staleness_threshold=0.5 \
    async_training.trigger_parameter_sync_step=4 \
    async_training.require_batches=4 \
    async_training.partial_rollout=True \
    async_training.use_rollout_log_probs=True

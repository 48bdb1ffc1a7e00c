#!/usr/bin/env bash
# verl's one_step_off_policy recipe, published pair (docs/advance/one_step_off.md, "Experimental Results", table row
# "one-step-overlap async, VLLM+FSDP2"; verl commit b178a3cd5; source data wandb.ai/hou-zg-meituan/one-step-off-policy): 2 nodes of 8 H20,
# Qwen2.5-Math-7B, DAPO, vLLM + FSDP2, max response 20,480 tokens. Published mean step: 520 s.
# The doc gives only the hardware, model, algorithm, engines, response cap and the 4:12 split; every other setting is
# the recipe's own script for this run (verl/experimental/one_step_off_policy/shell/dapo_7b_math_fsdp2_4_12.sh: 512 prompts x 12
# responses, mini-batch 32, prompts up to 2,048 tokens, rollout TP 2, Ulysses SP 4, fsdp_size 2, dynamic batch sizes,
# the reference offloaded), with the script's 8K response cap set to the doc's 20,480 and its shell arithmetic
# written out. Not published and assumed at import: the mean response length (the importer's default, half the cap;
# pass --mean-response-len to try another). The doc's warning applies: the DAPO reward drops overlong responses
# (overlong buffer), which changes lengths, not the step's mechanics.
# Import: rlhfsim import verl scenarios/examples/async-pairs/osp-async-4-12.sh --gpu h20 -o scenarios/examples/async-pairs/osp-async-4-12.yaml
python3 -m verl.experimental.one_step_off_policy.main_ppo \
    data.max_prompt_length=2048 \
    data.max_response_length=20480 \
    data.train_batch_size=512 \
    actor_rollout_ref.rollout.n=12 \
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
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=45056 \
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=67584 \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=67584 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=4 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.80 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.enable_chunked_prefill=True \
    actor_rollout_ref.rollout.max_num_batched_tokens=22528 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.top_p=1.0 \
    actor_rollout_ref.rollout.top_k=-1 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    actor_rollout_ref.ref.ulysses_sequence_parallel_size=4 \
    actor_rollout_ref.actor.fsdp_config.fsdp_size=2 \
    reward_model.reward_manager=dapo \
    trainer.save_freq=-1 \
    actor_rollout_ref.hybrid_engine=False \
    trainer.nnodes=2 \
    trainer.n_gpus_per_node=6 \
    rollout.nnodes=2 \
    rollout.n_gpus_per_node=2

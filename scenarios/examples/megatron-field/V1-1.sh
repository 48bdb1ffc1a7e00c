#!/usr/bin/env bash
# V1-1 (megatron-field row; source V1): verl's one_step_off_policy recipe, the published "colocate sync, VLLM+Megatron"
# row: 2 nodes x 8 H20, Qwen2.5-Math-7B, DAPO, vLLM rollouts, max response 8,192 tokens (Megatron rows). Published
# mean step 699 s (gen 207, old_log_prob 119, update_actor 344; total 18h21m).
#   Table: https://github.com/volcengine/verl/blob/503ea75f533f715cf1667551bd375ec9b1e0d5fc/recipe/one_step_off_policy/README.md ("Experimental Results"; unchanged in docs/advance/one_step_off.md
#   at verl b178a3cd5); source data wandb.ai/hou-zg-meituan/one-step-off-policy (not reachable here).
#   Launch: the recipe's own script for this row, https://github.com/volcengine/verl/blob/503ea75f533f715cf1667551bd375ec9b1e0d5fc/recipe/one_step_off_policy/dapo_7b_math_megatron_colocate.sh
#   (committed with the table), run with its defaults (NNODES 2, NGPUS_PER_NODE 8) and python stubbed so that its shell
#   variables and arithmetic come out expanded; the command below is that output, every override as the script sets it.
# What is guessed (runs.yaml's header, B1-B6): the mean response length (not published) and the mean prompt length.
python3 -m verl.trainer.main_ppo \
    --config-path=config \
    --config-name=ppo_megatron_trainer.yaml \
    data.train_files=/root/verl/data/dapo-math-17k.parquet \
    data.val_files=/root/verl/data/aime-2024.parquet \
    data.prompt_key=prompt \
    data.truncation=left \
    data.max_prompt_length=2048 \
    data.max_response_length=8192 \
    data.train_batch_size=512 \
    actor_rollout_ref.rollout.n=16 \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    algorithm.kl_ctrl.kl_coef=0.0 \
    actor_rollout_ref.actor.strategy=megatron \
    critic.strategy=megatron \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.kl_loss_coef=0.0 \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.clip_ratio_c=10.0 \
    +actor_rollout_ref.model.override_config.max_position_embeddings=32768 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.model.path=/root/verl/models/Qwen2.5-Math-7B \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.optim.lr_warmup_steps=10 \
    actor_rollout_ref.actor.optim.weight_decay=0.1 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.megatron.param_offload=True \
    actor_rollout_ref.actor.megatron.optimizer_offload=True \
    actor_rollout_ref.actor.megatron.grad_offload=True \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.optim.clip_grad=1.0 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.80 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.enable_chunked_prefill=True \
    actor_rollout_ref.rollout.max_num_batched_tokens=10240 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.top_p=1.0 \
    actor_rollout_ref.rollout.top_k=-1 \
    actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \
    actor_rollout_ref.rollout.val_kwargs.top_p=0.7 \
    actor_rollout_ref.rollout.val_kwargs.top_k=-1 \
    actor_rollout_ref.rollout.val_kwargs.do_sample=True \
    actor_rollout_ref.rollout.val_kwargs.n=1 \
    actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2 \
    actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2 \
    actor_rollout_ref.ref.megatron.param_offload=True \
    reward_model.reward_manager=dapo \
    +reward_model.reward_kwargs.overlong_buffer_cfg.enable=True \
    +reward_model.reward_kwargs.overlong_buffer_cfg.len=4096 \
    +reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 \
    +reward_model.reward_kwargs.overlong_buffer_cfg.log=False \
    +reward_model.reward_kwargs.max_resp_len=8192 \
    trainer.logger=[console,tensorboard] \
    trainer.project_name=DAPO \
    trainer.experiment_name=DAPO-Qwen2.5-7b-MATH-0519a1-megatron-colocate \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=2 \
    trainer.val_before_train=True \
    trainer.test_freq=10 \
    trainer.save_freq=-1 \
    trainer.total_epochs=10 \
    trainer.total_training_steps=100 \
    trainer.default_local_dir=/root/verl/ckpts/DAPO/DAPO-Qwen2.5-7b-MATH-0519a1-megatron-colocate \
    trainer.resume_mode=auto \
    trainer.log_val_generations=10

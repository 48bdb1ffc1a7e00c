# Field run J4 (dev half): the same lab, node and launch as J1 (read its header: source, GPU, verl release) with
# Dr. GRPO's loss: run D_drgrpo (run uid D_drgrpo-20260911-183747), experiments/D_drgrpo/hydra_overrides.yaml at
# f02e7696 = J1's overrides plus, at the end, algorithm.norm_adv_by_std_in_grpo=False,
# actor.loss_agg_mode=seq-mean-token-sum-norm and actor.loss_scale_factor=8192 (Hydra keeps the later values);
# rollout_data_dir is its own. No cost difference in this model (advantage scaling and loss aggregation only).
# Measured step: mean timing_s/step over steps 2-14 (13 steps): the stored training_metrics.csv (at abd1d266) ends
#   at step 14 of the 20 the run made. Step 1 is the warm-up (reference pass 27.0 s); step 10's validation
#   (timing_s/testing 458.4 s) is outside the step timer. Mean phases: gen 41.60 + update_weights 4.04,
#   old_log_prob 9.21, ref 9.06, adv 0.12, update_actor 33.66. Lengths: response 1833.0 mean, 6562.4 max, clip
#   ratio 0.0084; prompt 159.2 (perf/total_num_tokens / 128 - response mean).
#   Selected values, training_metrics.csv (t_rollout = timing_s/gen, t_weight_sync = timing_s/update_weights):
#   step 2: response mean 1925.52, max 5661, gen 40.359, old_log_prob 9.596, ref 9.464, adv 0.140,
#     update_actor 34.795, update_weights 4.100, step 98.478, perf/total_num_tokens 265995, mfu 0.6676
#   step 14: response mean 2455.72, max 8192, gen 58.380, old_log_prob 12.264, ref 12.068, adv 0.127,
#     update_actor 44.597, update_weights 4.177, step 131.637, perf/total_num_tokens 335140, mfu 0.6687
#   The overrides name actor.loss_agg_mode (token-mean, then seq-mean-token-sum-norm) and
#   algorithm.norm_adv_by_std_in_grpo (True, then False) twice: Hydra keeps the last, which alone is written below.
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    algorithm.filter_groups.enable=False \
    data.train_files="['/root/autodl-tmp/rl_lab/data/dapo_math_17k/train.parquet']" \
    data.val_files="['/root/autodl-tmp/rl_lab/data/dapo_math_17k/val.parquet']" \
    data.train_batch_size=16 \
    data.max_prompt_length=2048 \
    data.max_response_length=8192 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    +data.apply_chat_template_kwargs.enable_thinking=False \
    actor_rollout_ref.model.path=/root/autodl-tmp/rl_lab/models/Qwen3-8B \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_epochs=1 \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.2 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.top_p=1.0 \
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768 \
    actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=32768 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    trainer.balance_batch=True \
    trainer.logger='["console","file"]' \
    trainer.project_name=qwen3_8b_grpo_dapo_lab \
    trainer.experiment_name=R1_grpo_baseline \
    trainer.n_gpus_per_node=4 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=10 \
    trainer.val_before_train=False \
    trainer.resume_mode=disable \
    trainer.total_epochs=1 \
    trainer.total_training_steps=20 \
    trainer.rollout_data_dir=/root/autodl-tmp/rl_lab/logs/D_drgrpo-20260911-183747/rollout_dump \
    ray_kwargs.ray_init.runtime_env.py_executable='uv -v run --frozen --all-packages --extra vllm --extra fsdp' \
    algorithm.norm_adv_by_std_in_grpo=False \
    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm \
    actor_rollout_ref.actor.loss_scale_factor=8192

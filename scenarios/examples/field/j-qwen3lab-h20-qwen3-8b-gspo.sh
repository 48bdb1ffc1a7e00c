# Field run J3 (dev half): the same lab, node and launch as J1 (read its header: source, GPU, verl release) with
# GSPO's sequence-level ratio: run B_gspo (run uid B_gspo-20260911-164853), experiments/B_gspo/hydra_overrides.yaml at
# f02e7696 = J1's overrides plus, at the end, actor.policy_loss.loss_mode=gspo and
# actor.loss_agg_mode=seq-mean-token-mean (Hydra keeps the later of the two loss_agg_mode values); rollout_data_dir is
# its own. No cost difference in this model (the loss is computed on the same tokens).
# Measured step: mean timing_s/step over steps 2-17 (16 steps): the stored training_metrics.csv (at 883941d6, the
#   version the index holds in full) ends at step 17 of the 20 the run made. Step 1 is the warm-up (reference pass
#   26.1 s); step 10's validation (timing_s/testing 456.4 s) is outside the step timer. Mean phases: gen 44.13 +
#   update_weights 4.09, old_log_prob 9.36, ref 9.18, adv 0.13, update_actor 34.16. Lengths: response 1847.9 mean,
#   7049.8 max, clip ratio 0.0083; prompt 160.3 (perf/total_num_tokens / 128 - response mean).
#   Selected values, training_metrics.csv (t_rollout = timing_s/gen, t_weight_sync = timing_s/update_weights):
#   step 2: response mean 1980.21, max 7124, gen 46.361, old_log_prob 9.930, ref 9.796, adv 0.129,
#     update_actor 36.254, update_weights 4.135, step 106.628, perf/total_num_tokens 272995, mfu 0.6597
#   step 17: response mean 2552.30, max 7880, gen 54.377, old_log_prob 12.702, ref 12.503, adv 0.129,
#     update_actor 46.624, update_weights 4.427, step 130.789, perf/total_num_tokens 349718, mfu 0.6646
#   The overrides name actor.loss_agg_mode twice (token-mean, then seq-mean-token-mean): Hydra keeps the last, which
#   alone is written below.
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    algorithm.norm_adv_by_std_in_grpo=True \
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
    trainer.rollout_data_dir=/root/autodl-tmp/rl_lab/logs/B_gspo-20260911-164853/rollout_dump \
    ray_kwargs.ray_init.runtime_env.py_executable='uv -v run --frozen --all-packages --extra vllm --extra fsdp' \
    actor_rollout_ref.actor.policy_loss.loss_mode=gspo \
    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean

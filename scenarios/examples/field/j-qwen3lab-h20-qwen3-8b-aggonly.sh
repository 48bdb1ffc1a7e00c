# Field run J6 (dev half): the same lab, node and launch as J1 (read its header: source, GPU, verl release) with
# GSPO's loss aggregation and GRPO's token ratio (the lab's control arm for J3): run C_aggonly (run uid
# C_aggonly-20260911-174244), experiments/C_aggonly/hydra_overrides.yaml at f02e7696 = J1's overrides plus, at the end,
# actor.loss_agg_mode=seq-mean-token-mean (Hydra keeps the later value); rollout_data_dir is its own. No cost
# difference in this model.
# Measured step: mean timing_s/step over steps 2-19 (18 steps): the stored training_metrics.csv (at 0dd767d7) ends
#   at step 19 of the 20 the run made. Step 1 is the warm-up (reference pass 25.6 s); step 10's validation
#   (timing_s/testing 501.7 s) is outside the step timer. Mean phases: gen 44.14 + update_weights 4.05,
#   old_log_prob 9.72, ref 9.57, adv 0.13, update_actor 35.47. Lengths: response 1929.3 mean, 6941.0 max, clip ratio
#   0.0087; prompt 160.7 (perf/total_num_tokens / 128 - response mean).
#   Selected values, training_metrics.csv (t_rollout = timing_s/gen, t_weight_sync = timing_s/update_weights):
#   step 2: response mean 2032.91, max 6259, gen 40.355, old_log_prob 10.087, ref 9.950, adv 0.120,
#     update_actor 36.939, update_weights 4.147, step 101.623, perf/total_num_tokens 279741, mfu 0.6641
#   step 19: response mean 2072.52, max 7342, gen 48.365, old_log_prob 10.443, ref 10.640, adv 0.149,
#     update_actor 37.918, update_weights 4.127, step 111.665, perf/total_num_tokens 287298, mfu 0.6659
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
    trainer.rollout_data_dir=/root/autodl-tmp/rl_lab/logs/C_aggonly-20260911-174244/rollout_dump \
    ray_kwargs.ray_init.runtime_env.py_executable='uv -v run --frozen --all-packages --extra vllm --extra fsdp' \
    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean

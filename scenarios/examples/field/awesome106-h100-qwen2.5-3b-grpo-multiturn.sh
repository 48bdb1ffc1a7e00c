# Field run F2: verl GRPO with SGLang multi-turn rollouts (GSM8K with a calculator tool), Qwen2.5-3B-Instruct,
# on 8 x H100.
# Source: https://github.com/zhaochenyang20/Awesome-ML-SYS-Tutorial/issues/106 (comment by lucenzhong,
#   2025-05-13: "Training GPUs: 8 * H100", running the veRL multi-turn GSM8K test of that tutorial).
# Launch: verl's examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn.sh as of verl commit e0d035cd4
#   (2025-04-30, headed "run on 8xH100"); its overrides are below. The log matches it: 435 steps in all
#   (7473 GSM8K prompts / 256 per step = 29 steps x 15 epochs) and validation at step 80 (test_freq=20).
#   The config file it names (gsm8k_multiturn_grpo: multi_turn.enable=True, max_turns 5) is not read by the importer.
# Timing quoted from the issue (tqdm's rate, a running average that includes a validation step every 20 steps):
#   Training Progress:  20%|█▉        | 85/435 [1:50:27<6:53:08, 70.82s/it]
#   Training Progress:  20%|██        | 88/435 [1:54:01<6:51:05, 71.08s/it]
# and from the step lines (both cut in the post before timing_s/update_actor and timing_s/step):
#   step:80 ... response_length/mean:326.241 - prompt_length/mean:363.992 - timing_s/gen:29.316 - timing_s/reward:1.036
#   step:83 ... response_length/mean:330.437 - prompt_length/mean:362.969 - timing_s/gen:29.641 - timing_s/reward:1.042
#     - timing_s/old_log_prob:6.569 - timing_s/ref:6.307
python3 -m verl.trainer.main_ppo \
    --config-path="$PROJECT_DIR/examples/sglang_multiturn/config" \
    --config-name='gsm8k_multiturn_grpo' \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=256 \
    data.max_prompt_length=1024 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    data.return_raw_chat=True \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.name=sglang_async \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
    actor_rollout_ref.rollout.n=16 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    algorithm.use_kl_in_reward=False \
    trainer.critic_warmup=0 \
    trainer.logger=['console','wandb'] \
    trainer.project_name='gsm8k_async_rl' \
    trainer.experiment_name='qwen2.5-3b_function_rm-gsm8k-async-sgl-multi-w-tool-verify-n16' \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=20 \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    actor_rollout_ref.rollout.multi_turn.tool_config_path="$PROJECT_DIR/examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml" \
    trainer.total_epochs=15

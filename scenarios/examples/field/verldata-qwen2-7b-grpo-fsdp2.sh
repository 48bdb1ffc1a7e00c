# Unscored field run U1 (the GPU is not stated): verl's own GRPO baseline, Qwen2-7B-Instruct on GSM8K, one node of
# 8 GPUs, FSDP2, vLLM rollouts at TP 2, 1024 prompts x 5 responses per step.
# Source: https://github.com/eric-haibin-lin/verl-data/blob/experiments/gsm8k/qwen2-7b-fsdp2.log, linked from verl's
#   docs/algo/baseline.md ("Qwen/Qwen2-7B-Instruct | GRPO (FSDP2) | 89.8"), which names the hardware only as
#   "NVIDIA GPU". The launch below is the log's own header (2025-05-01).
# Timing lines quoted from the log (steps 6-9, no validation on those steps):
#   step:6 ... response_length/mean:196.996 - prompt_length/mean:92.972 - timing_s/gen:42.981 - timing_s/reward:0.907
#     - timing_s/old_log_prob:25.190 - timing_s/ref:24.771 - timing_s/adv:0.152 - timing_s/update_actor:76.075 - timing_s/step:170.170
#   step:7 ... response_length/mean:195.138 - timing_s/gen:42.839 - timing_s/old_log_prob:25.437 - timing_s/ref:25.368
#     - timing_s/update_actor:76.747 - timing_s/step:171.527
#   step:8 ... response_length/mean:192.477 - timing_s/gen:41.857 - timing_s/old_log_prob:24.927 - timing_s/ref:24.530
#     - timing_s/update_actor:73.994 - timing_s/step:166.497
#   step:9 ... response_length/mean:190.144 - timing_s/gen:42.551 - timing_s/old_log_prob:24.934 - timing_s/ref:24.713
#     - timing_s/update_actor:73.945 - timing_s/step:167.295
MODEL_PATH=huggingface.co/Qwen/Qwen2-7B-Instruct
DATA_PATH=./
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$DATA_PATH/data/gsm8k/train.parquet \
    data.val_files=$DATA_PATH/data/gsm8k/test.parquet \
    data.train_batch_size=1024 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    actor_rollout_ref.model.path=$MODEL_PATH \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.model.enable_gradient_checkpointing=False \
    actor_rollout_ref.actor.fsdp_config.param_offload=True \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=True \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    actor_rollout_ref.ref.strategy=fsdp2 \
    algorithm.use_kl_in_reward=False \
    trainer.critic_warmup=0 \
    trainer.logger=['console','tensorboard'] \
    trainer.project_name='verl_grpo_example_gsm8k_record' \
    trainer.experiment_name='qwen2_7b_function_rm_re' \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_epochs=15 $@ > fsdp2_re.log 2>&1 &

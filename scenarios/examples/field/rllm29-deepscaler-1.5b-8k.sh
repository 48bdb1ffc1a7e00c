# Field runs F3 (8 x H200) and F4 (8 x A100): DeepScaleR's 8K-context GRPO stage, DeepSeek-R1-Distill-Qwen-1.5B,
# one node of 8 GPUs, vLLM rollouts, 128 prompts x 8 responses per step.
# Source: https://github.com/rllm-org/rllm/issues/29 ("Extremely Long Execution Time per Step", 2025-02-15):
#   "I am using 8x H200 GPUs ... each step is taking 396 seconds" (training set halved, train_batch_size as in the
#   script), and in a later comment: "I tried running experiments in an A100x8 setup under the environment you
#   described. The result was the same - 394 seconds per step. This is no different from the H100 or H200
#   environments."
# Launch: the 8K script the issue runs, scripts/deepscaler/train/deepscaler_1.5b_8k.sh of
#   https://github.com/agentica-project/deepscaler (copy read at uiuc-kang-lab/deepscaler f8b91f5; its header says
#   "Train over a single node, 8 A100-80GB GPUs"). Its overrides, with the script's MODEL_PATH default:
# Not in the post: the mean response length (the 8K stage caps responses at 8192 tokens); the importer's default
#   (half the cap) is used and named in the table.
MODEL_PATH="deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
uv run -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$HOME/rllm/data/deepscaler_train.parquet \
    data.val_files=$HOME/rllm/data/aime.parquet \
    data.train_batch_size=128 \
    data.val_batch_size=512 \
    data.max_prompt_length=1024 \
    data.max_response_length=8192 \
    actor_rollout_ref.model.path=$MODEL_PATH \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=1 \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.temperature=0.6 \
    actor_rollout_ref.rollout.val_temperature=0.6 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.85 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.n_val=8 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    algorithm.kl_ctrl.kl_coef=0.001 \
    trainer.critic_warmup=0 \
    trainer.logger=['console','wandb'] \
    trainer.project_name='deepscaler' \
    trainer.experiment_name='deepscaler-1.5b-8k' \
    +trainer.val_before_train=True \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=20 \
    trainer.test_freq=20 \
    trainer.default_hdfs_dir=null \
    trainer.total_epochs=30 "${@:1}"

# Field run F8: verl PPO (GAE), Qwen2-7B-Instruct actor and critic on GSM8K, 1024 prompts x 5 responses, vLLM TP 2,
# nothing offloaded, on 8 x H100 (80GB).
# Source: https://github.com/dingxianzhong/play-verl (commit 7716a61, 2025-05-05): the script
#   examples/tuning/qwen2_7b_gsm8k_8gpu_recommended.sh (below, verbatim; its header says "with 8xA100 (80GB)") and its
#   log logs/verl_qwen2_7b_recommended.log (70 steps). GPU: the README's "8x NVIDIA H100 (80GB)"; the logged
#   perf/mfu/actor (0.256 at step 3: 7.6e9 params x 6 x 1.506e6 tokens in 34.4 s on 8 GPUs is about 252 TFLOPS
#   a GPU) fits the H100's 989 TFLOPS peak and is impossible on an A100 (312).
# n=5 with GAE is PPO with groups of 5 samples per prompt (algorithm.group_size 5; it was restated
#   as 5120 prompts x 1, when the scenario had no PPO groups). vLLM's sharing of each prompt's prefill among its 5
#   samples is not priced (a small part of a 94-token prompt).
# Settings not in the script, read from the log's resolved config (verl ~0.3 defaults), also passed as set:
#   rollout.max_num_seqs=1024, critic.model.use_remove_padding=False (unmapped: the critic trained on padded rows),
#   rollout.enforce_eager=True and rollout.free_cache_engine=True (unmapped).
# Measured step: mean timing_s/step over steps 2-69 less the 13 validation steps (every 5th), 55 steps; lengths over
#   the same steps (response 187.9, prompt 93.6).
# Step line quoted from the log (selected metrics of step 3, in log order):
#   step:3 - global_seqlen/mean:188259.750 - perf/mfu/critic:0.089 - perf/mfu/actor:0.256
#   - response_length/mean:200.461 - prompt_length/mean:93.695 - timing_s/gen:26.911 - timing_s/reward:0.731
#   - timing_s/old_log_prob:6.683 - timing_s/ref:6.533 - timing_s/values:27.412 - timing_s/adv:0.213
#   - timing_s/update_critic:99.200 - timing_s/update_actor:34.411 - timing_s/step:202.181
#!/bin/bash
# PPO - Recommended Config for Qwen2-7B-Instruct on GSM8K with 8×A100 (80GB)
# WandB: https://wandb.ai/your_name/verl_ppo_qwen2_7b_gsm8k

set -x

unset VLLM_ATTENTION_BACKEND
export VLLM_USE_MODE=V1
export PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False

python3 -m verl.trainer.main_ppo \
  data.train_files=$HOME/data/gsm8k/train.parquet \
  data.val_files=$HOME/data/gsm8k/test.parquet \
  data.train_batch_size=1024 \
  data.val_batch_size=1312 \
  data.max_prompt_length=512 \
  data.max_response_length=1024 \
  actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct \
  +actor_rollout_ref.model.dtype=bfloat16 \
  actor_rollout_ref.model.use_remove_padding=True \
  actor_rollout_ref.model.enable_gradient_checkpointing=True \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.actor.use_dynamic_bsz=True \
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=12000 \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.fsdp_config.param_offload=False \
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
  actor_rollout_ref.rollout.n=5 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.ref.fsdp_config.param_offload=False \
  critic.model.path=Qwen/Qwen2-7B-Instruct \
  critic.model.enable_gradient_checkpointing=True \
  critic.ppo_micro_batch_size_per_gpu=1 \
  critic.model.fsdp_config.param_offload=False \
  critic.model.fsdp_config.optimizer_offload=False \
  algorithm.kl_ctrl.kl_coef=0.001 \
  trainer.critic_warmup=0 \
  trainer.logger='[console, wandb]' \
  trainer.project_name=verl_qwen2_7b_gsm8k \
  trainer.experiment_name=ppo_qwen2_7b_recommended \
  trainer.val_before_train=False \
  trainer.n_gpus_per_node=8 \
  trainer.nnodes=1 \
  trainer.save_freq=-1 \
  trainer.test_freq=5 \
  trainer.total_epochs=10 "$@" | tee verl_qwen2_7b_recommended.log

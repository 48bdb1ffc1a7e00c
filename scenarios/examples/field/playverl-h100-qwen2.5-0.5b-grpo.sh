# Field run F5: verl GRPO, Qwen2.5-0.5B-Instruct on GSM8K, 256 prompts x 2 responses, vLLM TP 1, on 8 x H100 (80GB).
# Source: https://github.com/dingxianzhong/play-verl (commit 7716a61, 2025-05-05): the script
#   examples/tuning/run_demo_qwen2.5b_grpo_8gpu.sh (below, verbatim) and its log logs/verl_grpo_qwen2.5b_8gpu.log
#   (435 steps; the log opens with verl's resolved config). The README states "GPUs: 8x NVIDIA H100 (80GB)",
#   "Inference: vLLM 0.8.3"; an earlier commit of the README, the script's experiment_name (grpo_qwen2.5b_a100x8)
#   and the other scripts' headers say 8 x A100-80GB. The log's perf/mfu/actor (0.069 at step 3) is verl's
#   6 x params x tokens estimate over update_actor's time divided by the promised peak of the device verl detects:
#   it comes out near 0.069 with the H100's 989 TFLOPS and near 0.2 with the A100's 312, so the H100 is taken.
# Settings not in the script, read from the log's resolved config (verl ~0.3 defaults), passed as set: in runs.yaml:
#   rollout.max_num_seqs=1024 (the importer's default is 256), rollout.enforce_eager=True and
#   rollout.free_cache_engine=True (both listed unmapped: vLLM without CUDA graphs, KV cache freed each step).
# Measured step: mean timing_s/step over steps 2-434 less the 28 validation steps (every 15th), 405 steps; the mean
#   lengths over the same steps (response 141.2, prompt 103.6: responses shorten from 186 to about 140 as it trains).
# Step line quoted from the log (selected metrics of step 3, in log order):
#   step:3 - global_seqlen/mean:18558.500 - perf/mfu/actor:0.069 - response_length/mean:185.754
#   - prompt_length/mean:104.223 - timing_s/gen:5.798 - timing_s/reward:0.074 - timing_s/old_log_prob:0.368
#   - timing_s/ref:0.208 - timing_s/adv:0.013 - timing_s/update_actor:1.061 - timing_s/step:7.527
#!/bin/bash
set -x

export VLLM_ATTENTION_BACKEND=XFORMERS

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    data.train_batch_size=256 \
    data.val_batch_size=256 \
    data.max_prompt_length=512 \
    data.max_response_length=192 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    +actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8000 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=2 \
    actor_rollout_ref.ref.fsdp_config.param_offload=False \
    algorithm.kl_ctrl.kl_coef=0.001 \
    trainer.critic_warmup=0 \
    trainer.logger="[console, wandb]" \
    trainer.project_name=verl_grpo_qwen2.5b_gsm8k \
    trainer.experiment_name=grpo_qwen2.5b_a100x8 \
    trainer.val_before_train=False \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=15 \
    trainer.total_epochs=15 \
    "$@" | tee verl_grpo_qwen2.5b_8gpu.log

# Field run F6: verl PPO (GAE, a critic of the same shape), Qwen2.5-0.5B-Instruct on GSM8K, 2048 prompts,
# vLLM TP 1, no reference policy (no KL loss, no KL in the reward), on 8 x H100 (80GB).
# Source: https://github.com/dingxianzhong/play-verl (commit 7716a61, 2025-05-05): the script
#   examples/tuning/run_demo_qwen2.5b_ppo_8gpu.sh (below, verbatim) and its log logs/verl_ppo_qwen2.5b_8gpu.log
#   (45 steps). GPU: as for F5 (README "8x NVIDIA H100 (80GB)"; experiment_name ppo_qwen2.5b_a100x8; the logged
#   perf/mfu/actor 0.026 fits the H100's promised peak, not the A100's).
# Settings not in the script, read from the log's resolved config (verl ~0.3 defaults), passed as set: in runs.yaml:
#   model.use_remove_padding=False (the importer's default is True: this run trained actor and critic on padded
#   rows), rollout.max_num_seqs=1024, rollout.enforce_eager=True and rollout.free_cache_engine=True (unmapped).
# Measured step: mean timing_s/step over steps 2-44 less steps 10, 20, 30, 40 (validation and checkpoint), 39 steps;
#   lengths over the same steps (response 197.8, prompt 103.6). tqdm's rate at step 44: 44.02s/it (a running
#   average with the slow first step and the validation steps in it).
# Step line quoted from the log (selected metrics of step 3, in log order):
#   step:3 - global_seqlen/mean:86307.500 - perf/mfu/critic:0.026 - perf/mfu/actor:0.026 - response_length/mean:233.450
#   - prompt_length/mean:103.688 - timing_s/gen:9.804 - timing_s/reward:0.306 - timing_s/old_log_prob:2.229
#   - timing_s/values:3.400 - timing_s/adv:0.030 - timing_s/update_critic:13.081 - timing_s/update_actor:13.175
#   - timing_s/step:42.051
#!/bin/bash
set -x

export VLLM_ATTENTION_BACKEND=XFORMERS
PYTHONUNBUFFERED=1 python3 -m verl.trainer.main_ppo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    data.train_batch_size=2048 \
    data.max_prompt_length=512 \
    data.max_response_length=256 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=512 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    critic.optim.lr=1e-5 \
    critic.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    critic.ppo_micro_batch_size_per_gpu=4 \
    algorithm.kl_ctrl.kl_coef=0.001 \
    trainer.logger="[console, wandb]" \
    trainer.project_name="verl_ppo_qwen2.5_8gpu" \
    trainer.experiment_name="ppo_qwen2.5b_a100x8" \
    trainer.val_before_train=False \
    trainer.default_hdfs_dir=null \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=10 \
    trainer.test_freq=10 \
    trainer.total_epochs=15 \
    2>&1 | tee verl_ppo_qwen2.5b_8gpu.log

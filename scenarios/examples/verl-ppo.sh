#!/usr/bin/env bash
# A verl PPO launch (GAE with a critic): Qwen2.5-0.5B-Instruct actor and critic on GSM8K with a rule
# reward, 256 prompts per step, one node of 8 GPUs, vLLM rollouts at TP 1, synchronous and colocated
# (verl's hybrid engine), KL penalty in the reward (so the reference policy runs). Import it with
#   rlhfsim import verl scenarios/examples/verl-ppo.sh --gpu a100-80gb -o scenarios/examples/verl-ppo.yaml
set -x
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=gae \
    algorithm.use_kl_in_reward=True \
    algorithm.kl_ctrl.kl_coef=0.001 \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    data.train_batch_size=256 \
    data.max_prompt_length=512 \
    data.max_response_length=512 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
    critic.optim.lr=1e-5 \
    critic.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    critic.ppo_micro_batch_size_per_gpu=4 \
    trainer.logger=['console'] \
    trainer.project_name=verl_ppo_example_gsm8k \
    trainer.experiment_name=qwen2.5_0.5b_ppo \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.test_freq=10 \
    trainer.total_epochs=15 $@ 2>&1 | tee verl_ppo.log

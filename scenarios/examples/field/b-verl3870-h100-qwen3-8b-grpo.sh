# Field run B1 (test half): verl GRPO, Qwen3-8B on GSM8K, one node of 8 x H100, FSDP actor and reference, vLLM rollouts
# at TP 2, 1024 prompts x 5 responses per step (verl's examples/grpo_trainer/run_qwen3-8b.sh).
# Source: https://github.com/verl-project/verl/pull/3870 ("[fsdp] feat: Enable torch.compile on FSDP wrapped models",
#   StrongerXi, 2025-10-23). The description states "on 8xH100 with a bunch of determinism settings" and posts a table
#   for "qwen3-8b GRPO" (the "eager" column is stock verl; the "compiled" column is the PR's change and is not used):
#       rollout (vllm) 74.5s | old_log_prob (fsdp fwd) 28.9s | frozen log_prob (fsdp fwd) 29.3s |
#       update_actor (fsdp fwd+bwd) 111.3s | total step 245.5s | throughput (tokens/s) 2457
# Launch (guessed): the post names no script; this is the only Qwen3-8B GRPO example in verl at the PR's base
#   (verl main 62221fa13 of 2025-10-23, after v0.6.0), examples/grpo_trainer/run_qwen3-8b.sh, verbatim below:
#   https://github.com/verl-project/verl/blob/62221fa13ee922727e0da61771c33590c5f17560/examples/grpo_trainer/run_qwen3-8b.sh
#   Its phases match the table (rollout, old_log_prob, a reference pass, update_actor; no critic). "A bunch of
#   determinism settings" are not named; they may slow every phase and are not modelled.
# Lengths (derived, not logged): verl's perf/throughput is total_num_tokens / (timing_s/step x n_gpus), so the step
#   moved 2457 x 245.5 x 8 = 4.83e6 tokens over 1024 x 5 = 5120 sequences: 942.5 tokens a sequence. The mean prompt
#   is guessed at 83 tokens (GSM8K with Qwen3's chat template, which adds no default system prompt: the 103.6 that
#   F5 logged with Qwen2.5's template less its ~21-token system prompt), leaving a mean response of 860 of the
#   1024-token cap (Qwen3 thinks by default, so many responses run to the cap).
# measured_step_s: 245.5, the table's "total step" for eager (how many steps it averages is not stated).
# Tested successfully on the hiyouga/verl:ngc-th2.6.0-cu126-vllm0.8.4-flashinfer0.2.2-cxx11abi0 image.
# It outperforms the Qwen2 7B base model by two percentage points on the test set of GSM8K.

set -x

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    data.train_batch_size=1024 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    actor_rollout_ref.model.path=Qwen/Qwen3-8B \
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
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    algorithm.use_kl_in_reward=False \
    trainer.critic_warmup=0 \
    trainer.logger='["console","wandb"]' \
    trainer.project_name='verl_grpo_example_gsm8k' \
    trainer.experiment_name='qwen3_8b_function_rm' \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_epochs=15 $@

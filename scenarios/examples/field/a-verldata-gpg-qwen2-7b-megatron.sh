# Unscored field run A2 (test half; the GPU is not stated): verl's GPG baseline (critic-free, priced as GRPO),
# Qwen2-7B-Instruct on GSM8K, one node of 8 GPUs, Megatron actor at TP 2 x PP 2 (the reference likewise), vLLM rollouts
# at TP 2, 1024 prompts x 5 responses per step, no reference pass (use_kl_loss=False, use_kl_in_reward=False).
# Source: https://github.com/diqiuzhuanzhuan/verldata/blob/42e31cd07ea08b66e709a74e9aed2bd740589c34/run_logs/qwen2-7b_math_megatron.log
#   (linked from verl's docs/algo/baseline.md, "Qwen/Qwen2-7B-Instruct | GRPO (Megatron)", hardware "NVIDIA GPU"); the
#   FSDP sibling of the same repository is runs.yaml's U2. The launch below is the log's own `set -x` line
#   (2025-06-19: verl 0.4, between v0.4.0 of 2025-06-06 and v0.4.1 of 2025-06-26), shell quoting restored; the script
#   builds train_files from gsm8k and math and then overrides it with gsm8k alone (as the log shows).
# The GPU, and what the log settles: perf/mfu/actor 0.21-0.24 with perf/total_num_tokens ~1.35e6 a step and
#   timing_s/update_actor ~110 s on 8 GPUs is 6 x 7.6e9 x 1.35e6 / 110 / 8 = ~70 TFLOP/s a GPU, which verl's flops
#   table (verl/utils/flops_counter.py at v0.4: A100 and A800 312e12, H100/H800/H200 989e12, H20 148e12) turns into
#   0.22 only against 312: an A100 or A800. This log has no memory line, so the card's memory is not settled here.
#   (The FSDP sibling U2, a day earlier in the same repository, settles it for its own machine: verl >= 0.3 keeps vLLM's
#   weights and KV cache in a CuMemAllocator pool that torch goes on counting while vLLM sleeps, so
#   perf/max_memory_allocated_gb = the pool (~gpu_memory_utilization x the card) + the training peak, which must fit
#   the card: U2's peak 76.7 GiB with utilization 0.6 needs a card of 76.7/1.6 = 48 to 76.7/0.6 = 128 GiB, i.e. 80 GB,
#   not 40 GB.) Predicted on a100-80gb and a100-40gb (the A800 differs only in NVLink, 400 GB/s instead of 600).
# Measured step: mean timing_s/step over steps 2-104 less every 5th (validation, test_freq=5; the checkpoints every 20
#   fall on them): 83 steps, 209.43 s; gen 45.72 (of it generate_sequences 36.06 and reshard 3.10), reward 1.18,
#   old_log_prob 52.21, adv 0.18, update_actor 109.91. Lengths over the same steps: response 159.9 mean,
#   response_length/max 1009.2 mean (cap 1024), clip ratio 0.001; prompt 93.6.
#   step:2 - ... response_length/mean:181.924 - prompt_length/mean:92.534 - timing_s/gen:50.878 - timing_s/reward:1.248
#     - timing_s/old_log_prob:53.377 - timing_s/adv:0.182 - timing_s/update_actor:112.319 - timing_s/step:218.277
# Listed as unmapped by the importer: use_gpg_loss, save_freq, test_freq (the actor's and reference's PP 2 import as
#   execution.megatron.actor.pp; no reference pass runs). Overrides (`set`): none.
python3 -m verl.trainer.main_ppo --config-path=config --config-name=ppo_megatron_trainer.yaml \
    algorithm.adv_estimator=gpg \
    data.train_files="['/root/data/gsm8k/train.parquet']" \
    data.val_files="['/root/data/gsm8k/test.parquet']" \
    data.train_batch_size=1024 \
    data.max_prompt_length=1024 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    actor_rollout_ref.model.path=/workspace/verl/Qwen/Qwen2-7B-Instruct \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \
    actor_rollout_ref.actor.use_gpg_loss=True \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2 \
    actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2 \
    algorithm.use_kl_in_reward=False \
    trainer.critic_warmup=0 \
    'trainer.logger=[console,wandb]' \
    trainer.project_name=verl_gpg_example_gsm8k_math \
    trainer.experiment_name=qwen2_7b_megatron \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_epochs=15

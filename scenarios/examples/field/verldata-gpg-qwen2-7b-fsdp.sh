# Unscored field run U2 (the GPU is not stated): verl's GPG baseline (critic-free, priced as GRPO), Qwen2-7B-Instruct on
# GSM8K + MATH, one node of 8 GPUs, FSDP, vLLM rollouts at TP 2, 1024 prompts x 5 responses per step, no reference
# pass (use_kl_loss=False, use_kl_in_reward=False).
# Source: https://github.com/diqiuzhuanzhuan/verldata/blob/42e31cd07ea08b66e709a74e9aed2bd740589c34/run_logs/qwen2-7b_math.log,
#   linked from verl's docs/algo/baseline.md ("Qwen/Qwen2-7B-Instruct | GPG | 88"), which names the hardware only as
#   "NVIDIA GPU"; the repository's README says nothing more. The launch below is the log's own `set -x` header
#   (2025-06-18: verl between v0.4.0 of 2025-06-06 and v0.4.1 of 2025-06-26), shell quoting restored.
# What the log says about the GPU, and why it stays unscored: perf/max_memory_reserved_gb is 99.244 (GiB, from step 1
#   on), more than an 80 GB A100/H100 or a 96 GB H20 (95.6 GiB as torch reports it) can hold; perf/mfu/actor 0.25-0.27
#   with about 1.94e6 tokens a step (perf/total_num_tokens) and 6 x 7.6e9 x tokens in ~134 s on 8 GPUs is ~82 TFLOP/s a
#   GPU, which verl's flops table would turn into 0.27 only against a ~310 TFLOP/s peak (A100-class). The two disagree,
#   so no GPU is inferred; runs.yaml predicts it on h200 (the catalogued NVIDIA GPU its memory fits) for reference only.
# Timing lines quoted from the log (steps 2-4; steps 5, 10, 15, ... validate, test_freq=5):
#   step:2 ... response_length/mean:280.789 - prompt_length/mean:97.947 - timing_s/gen:69.534 - timing_s/reward:1.184
#     - timing_s/old_log_prob:32.910 - timing_s/adv:0.179 - timing_s/update_actor:134.132 - timing_s/step:238.206
#   step:3 ... response_length/mean:270.865 - timing_s/gen:68.459 - timing_s/old_log_prob:32.640 - timing_s/update_actor:132.768
#     - timing_s/step:235.568
#   step:4 ... response_length/mean:245.652 - timing_s/gen:62.913 - timing_s/old_log_prob:32.201 - timing_s/update_actor:130.166
#     - timing_s/step:227.157
# Overrides in runs.yaml (`set`), each read from the log's resolved config (verl 0.4 defaults the script leaves out):
#   rollout.max_num_seqs=1024 (the importer's default is 256), rollout.enforce_eager=True, rollout.free_cache_engine=True.
# Listed as unmapped by the importer: actor.use_gpg_loss (the GPG loss, not recognised; its arithmetic costs what the
#   clip loss costs), trainer.save_freq, trainer.test_freq and rollout.free_cache_engine.
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=gpg \
    data.train_files="['/data/share8/ml/data/gsm8k/train.parquet', '/data/share8/ml/data/math/train.parquet']" \
    data.val_files="['/data/share8/ml/data/gsm8k/test.parquet', '/data/share8/ml/data/math/test.parquet']" \
    data.train_batch_size=1024 \
    data.max_prompt_length=1024 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    actor_rollout_ref.model.path=/data/share/ml/.cache/huggingface/hub/models--Qwen--Qwen2-7B-Instruct/snapshots/f2826a00ceef68f0f2b946d945ecc0477ce4450c \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.use_gpg_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    algorithm.use_kl_in_reward=False \
    trainer.critic_warmup=0 \
    'trainer.logger=[console,wandb]' \
    trainer.project_name=verl_gpg_example_gsm8k_math \
    trainer.experiment_name=qwen2_7b_function_rm \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_epochs=15

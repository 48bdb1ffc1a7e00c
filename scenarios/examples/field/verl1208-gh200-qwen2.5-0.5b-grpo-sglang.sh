# Field run F1: verl GRPO, Qwen2.5-0.5B-Instruct, SGLang rollouts, on GH200 (one node of 4).
# Source: https://github.com/verl-project/verl/issues/1208 ("veRL-SGLang slower than expected (GH200)",
#   verl 0.3.0.post1, sglang 0.4.5.post3, vllm 0.8.3; the reporter calls the SGLang run "significantly slower"
#   than the same launch with actor_rollout_ref.rollout.name=vllm, whose times are not posted).
# Overrides quoted in #1208 (up to the model path) and, for the same reporter's GH200 launch, in
#   https://github.com/verl-project/verl/issues/1368 (up to log_prob_micro_batch_size_per_gpu=40).
# Inferred, not quoted (marked "# inferred" in the list below):
#   - actor_rollout_ref.rollout.n=5 and trainer.n_gpus_per_node=4: the posted step line has
#     global_seqlen/mean 547190.5 = 1024 prompts x n x (102.5 + 325.0 mean tokens) / GPUs, which is n=5 on 4 GPUs
#     (GH200 nodes carry 4 GPUs);
#   - rollout TP 2, gpu_memory_utilization 0.6, ref micro-batch 40 with ref param offload: verl 0.3's
#     examples/grpo_trainer/run_qwen2-7b.sh, which the quoted overrides follow line for line.
# Timing line quoted from #1208 (step 2):
#   response_length/mean:324.958 - prompt_length/mean:102.534 - timing_s/gen:74.020 - timing_s/old_log_prob:3.566
#   - timing_s/ref:3.420 - timing_s/adv:1.167 - timing_s/update_actor:14.302 - timing_s/step:96.551
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$(pwd)/data/train.parquet \
    data.val_files=$(pwd)/data/test.parquet \
    data.train_batch_size=1024 \
    data.max_prompt_length=1024 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40 \
    actor_rollout_ref.rollout.name=sglang \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    algorithm.use_kl_in_reward=False \
    trainer.n_gpus_per_node=4 \
    trainer.nnodes=1

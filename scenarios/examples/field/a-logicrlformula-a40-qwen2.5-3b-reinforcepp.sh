# Field run A1 (test half): verl (Logic-RL's fork, verl v0.1-era) REINFORCE++ (critic-free), Qwen2.5-3B-Instruct on
# Knights-and-Knaves logic puzzles, one node of 8 x NVIDIA A40, FSDP actor, reference offloaded, vLLM rollouts at TP 2,
# 8 prompts x 8 responses per step (64 sequences), responses capped at 4096 tokens.
# Source: https://github.com/zhiyuanhubj/logic-rl-formula at commit 6eacbf2 (2025-03-02), which commits its W&B run
#   folders; this run is wandb/run-20250302_114336-m950nfkl:
#   files/output.log (the console: 9 step lines with timings), logs/debug.log (the resolved config, wandb.init's
#   `config:` line) and files/wandb-metadata.json, whose machine record says
#     "gpu": "NVIDIA A40", "gpu_count": 8, "memoryTotal": "48305799168"   (the GPU as the machine itself reported it)
#   The script that ran it is the repository's curriculm_final_logic.sh (stage 1 of its curriculum, ppl=1); the launch
#   below is written from the resolved config in debug.log (every setting that differs from verl's defaults, and the
#   ones rlhfsim reads), not copied from the script.
# Not modelled / guessed: the data (kk/1: 2-person puzzles; prompts 201 tokens mean) and the reward (a rule-based
#   parser, fast: reward time is inside verl 0.1's step, not logged apart); verl_version 0.1 (the fork's config has
#   actor.fsdp_config.grad_offload and global micro batch sizes, which verl dropped in 0.2): vLLM 0.6.3, engine V0
#   (the script exports VLLM_ATTENTION_BACKEND=XFORMERS). In verl 0.1 the old log-probs are computed inside
#   generate_sequences, so timing_s/gen holds rollout + old log-prob; there is no old_log_prob phase.
# Measured step: mean timing_s/step over steps 2-9 (8 steps; step 1 is the warm-up; no validation in them, test_freq
#   10; the log ends before step 10): 33.736 s; gen 29.579, ref 0.896, adv 0.235, update_actor 3.016. Lengths over the
#   same steps: response 416.9 mean, response_length/max 1009.4 mean (662-1471), clip ratio 0; prompt 201.2.
#   Step lines quoted (selected metrics, log order):
#   step:6 - response_length/mean:428.234 - response_length/max:1471.000 - prompt_length/mean:201.875
#     - timing_s/gen:41.042 - timing_s/ref:0.890 - timing_s/adv:0.225 - timing_s/update_actor:3.043 - timing_s/step:45.207
#   step:9 - response_length/mean:377.094 - response_length/max:662.000 - prompt_length/mean:200.500
#     - timing_s/gen:20.230 - timing_s/ref:0.884 - timing_s/adv:0.250 - timing_s/update_actor:2.915 - timing_s/step:24.287
# Overrides in runs-a.yaml (`set`): actor.ppo_mini_batch_size=8. The config's 256 (prompts) exceeds the 8-prompt batch,
#   which the importer refuses; verl 0.1 scaled it by n and split each GPU's 8 samples into minibatches of 256, i.e. one
#   minibatch a step, which is what 8 (the whole batch) means. enforce_eager and max_num_seqs are below as the resolved
#   config gives them.
export VLLM_ATTENTION_BACKEND=XFORMERS
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=reinforce_plus_plus \
    data.train_files=./data/kk/1/train.parquet \
    data.val_files=./data/kk/3/test.parquet \
    data.train_batch_size=8 \
    data.val_batch_size=8 \
    data.max_prompt_length=512 \
    data.max_response_length=4096 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr=5e-7 \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size=64 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0.001 \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.temperature=0.7 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.enforce_eager=True \
    actor_rollout_ref.rollout.free_cache_engine=True \
    actor_rollout_ref.rollout.max_num_batched_tokens=8192 \
    actor_rollout_ref.rollout.max_num_seqs=1024 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size=160 \
    actor_rollout_ref.ref.log_prob_micro_batch_size=160 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    algorithm.kl_ctrl.kl_coef=0.001 \
    trainer.critic_warmup=0 \
    trainer.logger=['console','wandb'] \
    trainer.project_name=meta-reasoning \
    trainer.experiment_name=RF++-Qwen-3B-curriculum-formula-nus-1 \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=60 \
    trainer.test_freq=10 \
    trainer.total_epochs=5

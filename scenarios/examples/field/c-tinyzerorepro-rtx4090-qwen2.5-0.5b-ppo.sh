# Field run C1 (dev half): TinyZero (verl v0.1-era fork) PPO with a critic (GAE), Qwen2.5-0.5B base on the Countdown
# task, one NVIDIA GeForce RTX 4090 (24 GB), FSDP actor, reference and critic on the same card, vLLM rollouts at TP 1,
# 32 prompts x 1 response per step, responses capped at 256 tokens.
# Source: https://github.com/Westwood-Lin/TinyZero-Reproduction (Yalin Feng, 2025-08-10/11):
#   part-of-logs.md at e5bca7c (the same file as TinyZero-Reproduction/part-of-logs.md at 9244ccb, the commit titled
#   "try to run in on 4090"): the console of one run (main_task pid=19799), steps 383-399 whole, then step 400's
#   validation and a checkpoint that failed (disk full). The write-up `复现 TinyZero.md` (9173c7f) says the card:
#   "显卡 5090：32GB；后面换了 4090 24G；原因：CUDA适配问题" (an RTX 5090 first, then a 4090 24G, because of CUDA support);
#   the 5090 run stopped at start-up (sm_120 not supported by torch 2.4), and the logs' container is another one
#   (autodl-container-db1b4a84a7 vs 5776409e39); the OOM messages of the same session read "GPU 0 has a total
#   capacity of 23.55 GiB" (a 24 GB card). TinyZero's verl logs mfu/actor 0.000, so the MFU cannot check the card.
# Launch: the overrides Hydra printed for this very run (pid 19799) when step 400's checkpoint failed, quoted in
#   TinyZero-Reproduction/tinyZero-copilot.md at 9244ccb (line 1852), written out below in that order; settings not
#   in them are TinyZero's defaults (verl/trainer/config/ppo_trainer.yaml), as the config dump of the same checkout's
#   first run prints them (`复现 TinyZero.md`): rollout.enforce_eager True, free_cache_engine True, max_num_seqs 1024,
#   max_num_batched_tokens 8192, use_remove_padding False, actor gradient checkpointing off, n 1, vLLM 0.6.3 (V0).
#   The overrides name ref.log_prob_micro_batch_size twice (2, then 4): Hydra keeps the last, 4.
# Overrides in runs-c.yaml (`set`): actor.ppo_mini_batch_size=32 and critic.ppo_mini_batch_size=32. The launch's 128
#   exceeds the 32-prompt batch; TinyZero's verl (0.1) splits each step's batch into minibatches of 128, so one
#   minibatch of 32 a step, which is what 32 says (helper A's run A1 reads Logic-RL's fork the same way). Also
#   rollout.max_num_seqs=1024, enforce_eager=True, free_cache_engine=True from the defaults above.
# Measured step: mean timing_s/step over steps 383-399 (17 steps, all the whole step lines; no validation or
#   checkpoint among them: test_freq and save_freq are 100): 5.618 s; gen 1.975 (in verl 0.1 it holds the old
#   log-prob pass too), ref 0.505, values 0.222, adv 0.039, update_critic 1.207, update_actor 1.666. Lengths over the
#   same steps: response 34.9 mean, response_length/max 37.5 mean (37-39), clip ratio 0; prompt 143.9 (32 sequences a
#   step: global_seqlen/mean 5721 = 32 x 178.8).
#   Step lines quoted (selected metrics, log order):
#   step:390 - response_length/mean:34.781 - response_length/max:37.000 - prompt_length/mean:143.781
#     - timing_s/gen:1.950 - timing_s/ref:0.498 - timing_s/values:0.218 - timing_s/adv:0.040
#     - timing_s/update_critic:1.172 - timing_s/update_actor:1.691 - timing_s/step:5.574
#   step:399 - response_length/mean:34.812 - response_length/max:37.000 - prompt_length/mean:143.781
#     - timing_s/gen:1.929 - timing_s/ref:0.497 - timing_s/values:0.216 - timing_s/adv:0.040
#     - timing_s/update_critic:1.214 - timing_s/update_actor:1.662 - timing_s/step:5.563
# Not modelled: the reward (TinyZero's countdown rule, inside the step, not timed apart).
python3 -m verl.trainer.main_ppo \
    data.train_files=/root/TinyZero/dataset/train.parquet \
    data.val_files=/root/TinyZero/dataset/test.parquet \
    data.train_batch_size=32 \
    data.val_batch_size=1312 \
    data.max_prompt_length=256 \
    data.max_response_length=256 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \
    actor_rollout_ref.actor.ppo_micro_batch_size=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size=4 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.35 \
    actor_rollout_ref.ref.log_prob_micro_batch_size=4 \
    critic.model.enable_gradient_checkpointing=True \
    critic.optim.lr=1e-5 \
    critic.model.path=Qwen/Qwen2.5-0.5B \
    critic.ppo_micro_batch_size=8 \
    algorithm.kl_ctrl.kl_coef=0.001 \
    trainer.logger=[console] \
    +trainer.val_before_train=False \
    trainer.default_hdfs_dir=null \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.save_freq=100 \
    trainer.test_freq=100 \
    trainer.project_name=TinyZero \
    trainer.experiment_name=countdown-qwen2.5-0.5b \
    trainer.total_epochs=15 2>&1 | tee verl_demo.log

# Field runs C2 and C3 (test half): TinyZero (verl v0.1-era) PPO with a critic (GAE), Qwen2.5-3B base on Countdown
# (Countdown-Tasks-3to4), one node's 4 x NVIDIA L40S, FSDP actor, reference and critic colocated, vLLM rollouts at TP 2,
# 256 prompts x 1 response per step, responses capped at 1024 tokens, 15 epochs (~1920 steps).
# Source: https://github.com/Limpidjunewind/tinyzero-experiments (Jingwen Li, 2026-03/04):
#   reports/experiment_report_reward.md at e77e713 (added by 07e010a, 2026-04-23), section 3's configuration table:
#     "硬件 | 4 × NVIDIA L40S (46GB)", train_batch_size 256, max_response_length 1024, 15 epochs (~1920 steps),
#     "三组实验使用完全相同的训练配置，唯一变量是 reward function" (the three runs share every setting but the reward);
#   section 4.1 and 4.5: the mean time of each phase "从 wandb 提取" (taken from the runs' W&B histories, whole runs):
#     phase (s)       v2 (C2)   v3 (C3)
#     Rollout 生成      30.4      13.5     -> timing_s/gen (in verl 0.1 it holds the old log-prob pass too)
#     Actor 更新        10.1       8.3     -> update_actor
#     Critic 更新       17.8      17.9     -> update_critic
#     Ref Policy        2.0       1.5     -> ref
#     Value 估计        4.5       4.6     -> values
#     总计             64.8      45.8     ("每步平均耗时 ~65s / ~46s"; training took ~35.3 h / ~26.5 h)
#   and the lengths from the same W&B histories: response_length/mean 284 (v2) and 158 (v3); the median over steps of
#   response_length/max 1024 (v2: at the cap) and 220 (v3).
# Launch: the repository's reward_study/scripts/run_v2_no_proximity.sh at 665a43d (2026-04-26), whose header says it is
#   the v2 run "with proximity_score = 0 (everything else identical)"; its overrides are verbatim below (the sibling
#   scripts run_v3_random.sh, run_v4a.sh, ... differ only in the entry module, experiment name and GPUs). The module is
#   each run's own: C2 ran verl.trainer.main_ppo_v2 (TinyZero's main_ppo with countdown_v2's continuous outcome
#   reward), C3 verl.trainer.main_ppo_v3 (the same plus a small process reward model scoring each <think> step, on the
#   CPU, PRM_WEIGHT 0.1). Both ran at once on one 8-GPU L40S machine, each on 4 of its GPUs.
# Guessed: the mean prompt, 144 tokens (not in the report: helper B2's run C1 logs 143.9 for the same Countdown
#   prompts under TinyZero's base-model template); the clip ratio (not given: C2's longest response sits at the cap in
#   most steps, so some responses were cut). TinyZero's defaults (verl/trainer/config/ppo_trainer.yaml at its HEAD)
#   for what the script leaves out, passed as `set` in runs-c.yaml: rollout.max_num_seqs 1024, enforce_eager True,
#   free_cache_engine True, the critic's use_dynamic_bsz (the actor's: True), ppo_max_token_len_per_gpu 32768 and
#   use_remove_padding False, the log-prob passes' log_prob_use_dynamic_bsz (the actor's: True); and
#   algorithm.use_kl_in_reward=True, which is what verl 0.1 did (its trainer always runs the reference policy and puts
#   the KL penalty, kl_ctrl.kl_coef 0.001, into the reward unless actor.use_kl_loss is set).
# Measured step: the sum of the five phase means above, the report's own total (64.8 s and 45.8 s). Not in it: the
#   adv phase (the reward function and GAE; for C3 it holds the CPU PRM), validation (test_freq 50) and checkpoints
#   (save_freq 400), so the report's total is a mean steady step less the reward. The means cover whole runs (their
#   first steps and the response length's drift with training included).
source activate verl 2>/dev/null || conda activate verl

export CUDA_VISIBLE_DEVICES=4,5,6,7
export N_GPUS=4
export BASE_MODEL=/data/fangda/models/Qwen2.5-3B
export DATA_DIR=/data/fangda/data/countdown
export ROLLOUT_TP_SIZE=2
export EXPERIMENT_NAME=countdown-qwen2.5-3b-v2-no-proximity
export VLLM_ATTENTION_BACKEND=XFORMERS
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

cd /data/fangda/tinyzero

python3 -m verl.trainer.main_ppo_v2_no_proximity \
data.train_files=$DATA_DIR/train.parquet \
data.val_files=$DATA_DIR/test.parquet \
data.train_batch_size=256 \
data.val_batch_size=512 \
data.max_prompt_length=256 \
data.max_response_length=1024 \
actor_rollout_ref.model.path=$BASE_MODEL \
actor_rollout_ref.model.use_remove_padding=True \
actor_rollout_ref.model.enable_gradient_checkpointing=True \
actor_rollout_ref.actor.use_dynamic_bsz=True \
actor_rollout_ref.actor.optim.lr=1e-6 \
actor_rollout_ref.actor.ppo_mini_batch_size=64 \
actor_rollout_ref.actor.ppo_micro_batch_size=4 \
actor_rollout_ref.rollout.log_prob_micro_batch_size=4 \
actor_rollout_ref.rollout.tensor_model_parallel_size=$ROLLOUT_TP_SIZE \
actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
actor_rollout_ref.ref.log_prob_micro_batch_size=4 \
critic.optim.lr=1e-5 \
critic.model.path=$BASE_MODEL \
critic.ppo_micro_batch_size=4 \
critic.model.enable_gradient_checkpointing=True \
algorithm.kl_ctrl.kl_coef=0.001 \
trainer.logger=['wandb'] \
+trainer.val_before_train=False \
trainer.default_hdfs_dir=null \
trainer.n_gpus_per_node=$N_GPUS \
trainer.nnodes=1 \
trainer.save_freq=400 \
trainer.test_freq=50 \
trainer.project_name=TinyZero \
trainer.experiment_name=$EXPERIMENT_NAME \
trainer.total_epochs=15 2>&1 | tee /data/fangda/tinyzero/experiments/v6_proximity_ablation/train_v2_no_proximity.log

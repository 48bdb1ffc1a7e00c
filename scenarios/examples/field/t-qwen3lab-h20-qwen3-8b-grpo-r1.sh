# Field run T1 (dev half): verl 0.9 GRPO, Qwen3-8B (thinking off) on DAPO-Math-17k, 4 x NVIDIA H20 (96 GB) on one
# AutoDL node: the lab's first baseline run, a day before J1, with J1's launch (read J1's header,
# j-qwen3lab-h20-qwen3-8b-grpo.sh: source, GPU, verl release, what verl 0.9's defaults give).
# Source: https://github.com/terrense/qwen3-8b-grpo-dapo-lab, run R1_grpo_baseline (run uid
#   R1_grpo_baseline-20260910-134534): experiments/R1_grpo_baseline/launch_overrides.json at cae4bca9 ("source":
#   "actual shell xtrace in trainer.log": the overrides below, in that order; command.txt at b013f884 runs the lab's
#   scripts/training/run_r1_grpo_baseline.sh, the script every later run of the lab calls), RUN_REPORT.md at cae4bca9
#   ("COMPLETED", 20 optimizer updates, 36.4 min, "VeRL commit 1252cc71", started 2026-09-10T13:45:35),
#   metrics/training_metrics.csv at cae4bca9 (20 rows, transcribed into logs/t-qwen3lab-r1-grpo-metrics.jsonl.gz:
#   logs/PROVENANCE.md). Its resolved_config.yaml is a placeholder ("Full resolved config was not captured by the
#   launcher"); the overrides are J1's but for trainer.rollout_data_dir, and the later runs' resolved configs (J1,
#   T2) show what verl 1252cc71 resolves them to. The JSON writes the chat-template key without its leading '+';
#   the script passes it with one (E_drgrpo_scaled's hydra_overrides.yaml, the same script), as below.
# GPU: the run's own nvidia-smi snapshot (incidents/INC-20260910-140540-RESPONSE_LENGTH_MEAN_ROBUST_Z/nvidia_smi.txt
#   at 630c3b4e, 2026-09-10 14:05:40): "NVIDIA H20 ... 97871MiB" x 4 (Bus-Id 23, 33, 63, 83: the same four as
#   run A_grpo's snapshot (J1, 2026-09-11 16:30:58) and T2's), vLLM TP workers and ray::WorkerDict on each. The
#   logged MFU (0.647-0.667) divides by verl's 148e12 H20 figure, as J1's does.
# Measured step: mean timing_s/step over steps 2-20 (19 steps; step 1 is the warm-up: reference pass 29.8 s against
#   6-11 s after). Validation (test_freq 10) is outside the step timer: steps 10 and 20 log timing_s/testing 80.8
#   and 86.8 s apart, and their timing_s/step equals the sum of their phases within 0.03 s, as every other step's
#   does (without them: 87.767 s over 17 steps). No checkpoints (save_freq -1).
#   Mean phases over the same steps: gen 37.31 + update_weights 4.11, old_log_prob 8.49, ref 8.33, adv 0.14,
#   update_actor 30.89. Lengths: response_length/mean 1673.9, response_length/max 5972.5 (3820-8192), clip ratio
#   0.0021 (the CSV's cap_hit_rate: 1 or 3 of 128 responses at the 8192 cap on steps 5, 14, 20, none on the others);
#   prompt 156.7 (total_num_tokens / 128 - response mean).
#   Selected values, training_metrics.csv (t_rollout = timing_s/gen, t_weight_sync = timing_s/update_weights):
#   step 2: response mean 1643.75, max 5426, gen 34.357, old_log_prob 8.386, ref 8.265, adv 0.125,
#     update_actor 30.351, update_weights 4.213, step 85.722, total_num_tokens 230736, mfu 0.6596
#   step 19: response mean 2147.10, max 7810, gen 50.372, old_log_prob 10.739, ref 10.586, adv 0.133,
#     update_actor 39.263, update_weights 4.219, step 115.334, total_num_tokens 294965, mfu 0.6616
# Guessed: nothing in the launch (the run's own overrides). Not modelled: trainer.balance_batch, the agent loop's
#   per-request host work.
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    algorithm.norm_adv_by_std_in_grpo=True \
    algorithm.filter_groups.enable=False \
    data.train_files="['/root/autodl-tmp/rl_lab/data/dapo_math_17k/train.parquet']" \
    data.val_files="['/root/autodl-tmp/rl_lab/data/dapo_math_17k/val.parquet']" \
    data.train_batch_size=16 \
    data.max_prompt_length=2048 \
    data.max_response_length=8192 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    +data.apply_chat_template_kwargs.enable_thinking=False \
    actor_rollout_ref.model.path=/root/autodl-tmp/rl_lab/models/Qwen3-8B \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_epochs=1 \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.2 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.top_p=1.0 \
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768 \
    actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=32768 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    trainer.balance_batch=True \
    trainer.logger='["console","file"]' \
    trainer.project_name=qwen3_8b_grpo_dapo_lab \
    trainer.experiment_name=R1_grpo_baseline \
    trainer.n_gpus_per_node=4 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=10 \
    trainer.val_before_train=False \
    trainer.resume_mode=disable \
    trainer.total_epochs=1 \
    trainer.total_training_steps=20 \
    trainer.rollout_data_dir=/root/autodl-tmp/rl_lab/logs/R1_grpo_baseline-20260910-134534/rollout_dump \
    ray_kwargs.ray_init.runtime_env.py_executable='uv -v run --frozen --all-packages --extra vllm --extra fsdp'

# Field run T2 (dev half): the same lab, node and launch as J1 (read its header, j-qwen3lab-h20-qwen3-8b-grpo.sh:
# source, GPU, verl release) with Dr. GRPO's loss at a smaller loss scale: run E_drgrpo_scaled (run uid
# E_drgrpo_scaled-20260911-193309), the run after J4 (D_drgrpo) on the same day.
# Source: https://github.com/terrense/qwen3-8b-grpo-dapo-lab: experiments/E_drgrpo_scaled/hydra_overrides.yaml at
#   8a24f89f = J1's overrides plus, at the end, algorithm.norm_adv_by_std_in_grpo=False,
#   actor.loss_agg_mode=seq-mean-token-sum-norm and actor.loss_scale_factor=1900 (command.txt at dafa5583 passes these
#   three to the lab's run_r1_grpo_baseline.sh; Hydra keeps the later values, which alone are written below);
#   resolved_config.yaml at 56ec6025 (loss_agg_mode seq-mean-token-sum-norm, loss_scale_factor 1900; rollout: vllm,
#   mode async, enforce_eager false, max_num_seqs 256, max_num_batched_tokens 8192, chunked prefill and prefix
#   caching on, free_cache_engine true, TP 2, gpu_memory_utilization 0.6: verl 0.9's defaults, as J1's);
#   RUN_REPORT.md at 56ec6025 ("COMPLETED", 20 optimizer updates, 52.7 min, "VeRL commit 1252cc71");
#   metrics/training_metrics.csv at 56ec6025 (20 rows; its version at f02e7696 holds the header alone), transcribed
#   into logs/t-qwen3lab-e-drgrpo-scaled-metrics.jsonl.gz (logs/PROVENANCE.md). rollout_data_dir is its own. No
#   cost difference from J1 in this model (advantage scaling and loss aggregation only).
# GPU: the run's own nvidia-smi snapshot (incidents/INC-20260911-194954-T_ROLLOUT_ROBUST_Z/nvidia_smi.txt at b96b65c1,
#   2026-09-11 19:49:54): "NVIDIA H20 ... 97871MiB" x 4, the vLLM TP workers on each; docs/hardware_environment.md
#   names the same node (J1's header). The logged MFU (0.624-0.666) divides by verl's 148e12 H20 figure.
# Measured step: mean timing_s/step over steps 2-20 (19 steps; step 1 is the warm-up: reference pass 26.3 s against
#   8-11 s after). Validation (test_freq 10) is outside the step timer: steps 10 and 20 log timing_s/testing 464.5
#   and 459.4 s apart, and their timing_s/step equals the sum of their phases within 0.03 s, as every other step's
#   does (without them: 100.795 s over 17 steps). No checkpoints (save_freq -1).
#   Mean phases over the same steps: gen 44.58 + update_weights 4.07, old_log_prob 9.38, ref 9.21, adv 0.15,
#   update_actor 34.31. Lengths: response_length/mean 1849.7, response_length/max 7252.1 (4477-8192), clip ratio
#   0.0041 (this CSV leaves cap_hit_rate empty: the share of responses at the batch's widest length,
#   response_width_hit_fraction, on the 8 steps whose widest response is the 8192 cap, 0 on the others); prompt 159.8
#   (total_num_tokens / 128 - response mean).
#   Selected values, training_metrics.csv (t_rollout = timing_s/gen, t_weight_sync = timing_s/update_weights):
#   step 2: response mean 2044.83, max 7109, gen 44.357, old_log_prob 10.220, ref 10.072, adv 0.134,
#     update_actor 37.327, update_weights 4.187, step 106.327, total_num_tokens 281266, mfu 0.6603
#   step 19: response mean 1901.11, max 7695, gen 48.361, old_log_prob 9.732, ref 9.521, adv 0.135,
#     update_actor 34.995, update_weights 4.128, step 106.895, total_num_tokens 265358, mfu 0.6645
#   The overrides name actor.loss_agg_mode (token-mean, then seq-mean-token-sum-norm) and
#   algorithm.norm_adv_by_std_in_grpo (True, then False) twice: Hydra keeps the last, which alone is written below.
# Guessed: nothing in the launch. Not modelled: trainer.balance_batch, the agent loop's per-request host work.
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
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
    trainer.rollout_data_dir=/root/autodl-tmp/rl_lab/logs/E_drgrpo_scaled-20260911-193309/rollout_dump \
    ray_kwargs.ray_init.runtime_env.py_executable='uv -v run --frozen --all-packages --extra vllm --extra fsdp' \
    algorithm.norm_adv_by_std_in_grpo=False \
    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm \
    actor_rollout_ref.actor.loss_scale_factor=1900

# Field run J1 (dev half): verl 0.9 GRPO, Qwen3-8B (thinking off) on DAPO-Math-17k, 4 x NVIDIA H20 (96 GB) on one
# AutoDL node, FSDP actor (reference offloaded), vLLM async server rollouts at TP 2, 16 prompts x 8 responses per step,
# responses capped at 8192 tokens, 20 steps.
# Source: https://github.com/terrense/qwen3-8b-grpo-dapo-lab (a personal GRPO/GSPO/DAPO lab, 2026-09), run A_grpo
#   (run uid A_grpo-20260911-155511): experiments/A_grpo/hydra_overrides.yaml at f02e7696 (the overrides below, in
#   that order), resolved_config.yaml and metrics/training_metrics.csv at 317ffd86, metrics/verl_file_logger.jsonl
#   at 317ffd86 (verl's own file logger), RUN_REPORT.md at 317ffd86 ("VeRL commit 1252cc71", 20 optimizer updates,
#   53.6 min with two validations). The repository has no snapshot to fetch: every file was read through the code
#   index (read_file), and the per-step metrics committed in logs/j-qwen3lab-a-grpo-metrics.jsonl.gz were transcribed
#   from training_metrics.csv (logs/PROVENANCE.md says which columns).
# GPU: docs/hardware_environment.md at 5a19365e: "Model | NVIDIA H20 | Count | 4 | VRAM per GPU | 97871 MiB"
#   (the lab's preflight of 2026-09-10: "Single AutoDL node", NV18 NVLink mesh). The log agrees: perf/mfu/actor
#   0.66 is 6 x N x perf/total_num_tokens / (update_actor x 4 GPUs x 148e12), verl's figure for the H20 (6 x 8.19e9 x
#   261953 / (34.51 s x 4 x 148e12) = 0.63, the attention FLOPs verl adds making up the rest).
# verl release: 0.9 (commit 1252cc71 of 2026-09; the resolved config's max_num_seqs 256 is v0.9.0's default, verl
#   d908005). The resolved config agrees with verl 0.9's defaults on everything the importer reads by release:
#   rollout.mode async (agent loop, vLLM AsyncLLM servers), enforce_eager False, max_num_seqs 256,
#   max_num_batched_tokens 8192 with chunked prefill and prefix caching on, free_cache_engine True; nothing is set.
# Measured step: mean timing_s/step over steps 2-20 (19 steps; step 1 is the warm-up: its reference pass took 26.2 s
#   against 8-12 s after). Validation (test_freq 10) is not inside this verl's step timer: steps 10 and 20 log
#   timing_s/testing 497.7 and 498.7 s apart and their timing_s/step equals the sum of their phases, as every other
#   step's does, so they stay in the mean (without them: 99.72 s over 17 steps). No checkpoints (save_freq -1).
#   Mean phases over the same steps: gen 43.00 + update_weights 4.04, old_log_prob 9.61, ref 9.42, adv 0.12,
#   update_actor 34.97 (the reward is scored inside the agent loop, in gen: training_metrics.csv's t_reward is empty).
#   Lengths over the same steps: response_length/mean 1904.7, response_length/max 6768.2 (4409-8192), clip ratio
#   0.0095 (1 or 3 of 128 responses at the cap); prompt 159.8 (perf/total_num_tokens / 128 - response mean: exact
#   where the JSONL gives prompt_length/mean, steps 1-3: 164.5, 152.5625, 218.8125).
#   Selected values, training_metrics.csv (t_rollout = timing_s/gen, t_weight_sync = timing_s/update_weights):
#   step 2: response mean 1893.95, max 5810, gen 38.365, old_log_prob 9.507, ref 9.413, adv 0.119,
#     update_actor 34.511, update_weights 3.980, step 95.922, perf/total_num_tokens 261953, mfu 0.6628
#   step 19: response mean 1957.61, max 7536, gen 46.371, old_log_prob 9.883, ref 9.741, adv 0.147,
#     update_actor 35.940, update_weights 4.080, step 106.187, perf/total_num_tokens 272590, mfu 0.6647
# The two overrides that end the list (hydra_overrides.yaml writes the last one over two lines) are kept as the run
#   gave them. Guessed: nothing in the launch (the run's own overrides; the rest is verl 0.9's defaults, which the resolved config
#   confirms for the settings read here). Not modelled: trainer.balance_batch, the agent loop's per-request host work.
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
    trainer.rollout_data_dir=/root/autodl-tmp/rl_lab/logs/A_grpo-20260911-155511/rollout_dump \
    ray_kwargs.ray_init.runtime_env.py_executable='uv -v run --frozen --all-packages --extra vllm --extra fsdp'

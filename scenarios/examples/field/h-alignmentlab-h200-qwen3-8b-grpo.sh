#!/usr/bin/env bash
# Field run H1 (helper H): AlignmentLab's full-scale GRPO run q3-8b_grpo-gt_math5h200_kl01c, OpenRLHF 0.10.4 (dotted
# flags), Qwen3-8B on 5 x H200 (4 training GPUs for actor + reference, 1 vLLM engine), 2026-07-18.
# Source: github.com/Arush777/AlignmentLab (Apache-2.0) at 59225c9e85383903dd4e5f0e2b676d0329041672:
#   docs/h200_gt_kl01_status.md   the run: 5 x H200 (GPUs 3-6 train, 7 vLLM), config, TensorBoard snapshot after 30
#                                 steps: "Mean step time ~318 s/step (train/timing/step_total last ~= 337 s)",
#                                 train/response_length ~872 (step 1) -> ~899 (step 30)
#   configs/grpo/q3-8b_grpo_math_5gpu_h200_kl01.yaml   the recipe (unchanged from the run's start to that commit)
#   src/rl/train_grpo.py build_argv()                  how the recipe becomes OpenRLHF flags (ngpu=5, not colocated:
#                                 train_gpus 4 + num_engines 1; --data.max_len = prompt_max_len 4096 + response 8192)
# The command below is what build_argv() assembles for that config (paths shortened; no wandb flags: the status page
# reads TensorBoard). Guessed, not stated: the policy started from an SFT checkpoint of Qwen3-8B
# (Arushhh/alab-q3-8b_sft_tulu_0705, a local path on the host): Qwen/Qwen3-8B is written here, the same shape.
# Not a log: the step time is one summary number of the framework's own step timer (runs-h.yaml says which).
python -m openrlhf.cli.train_ppo_ray \
  --actor.model_name_or_path Qwen/Qwen3-8B \
  --actor.num_nodes 1 --actor.num_gpus_per_node 4 \
  --ref.num_nodes 1 --ref.num_gpus_per_node 4 \
  --vllm.num_engines 1 --vllm.tensor_parallel_size 1 --vllm.gpu_memory_utilization 0.85 \
  --algo.advantage.estimator group_norm --algo.kl.init_coef 0.1 --algo.kl.estimator k3 \
  --rollout.n_samples_per_prompt 8 --rollout.batch_size 128 --rollout.micro_batch_size 8 \
  --rollout.max_new_tokens 8192 --rollout.temperature 1.0 --rollout.top_p 1.0 \
  --train.batch_size 128 --train.micro_batch_size 2 --train.num_episodes 1 --train.max_epochs 1 \
  --train.max_tokens_per_gpu 16384 --train.seed 42 \
  --data.max_len 12288 --data.prompt_dataset data/processed/rlvr_math.jsonl --data.input_key prompt \
  --data.label_key answer --data.max_samples 100000 \
  --ds.zero_stage 3 --ds.param_dtype bf16 --actor.adam.lr 1e-06 \
  --reward.remote_url src/rl/reward.py \
  --ckpt.output_dir scratch/ckpt/q3-8b_grpo-gt_math5h200_kl01c --ckpt.path scratch/ckpt/q3-8b_grpo-gt_math5h200_kl01c/ckpt \
  --ckpt.save_steps -1 --ckpt.max_num 1 \
  --logger.tensorboard_dir results/runs/q3-8b_grpo-gt_math5h200_kl01c/tb --logger.logging_steps 1 \
  --data.apply_chat_template --algo.kl.use_loss --train.colocate_actor_ref --ds.packing_samples \
  --actor.gradient_checkpointing_enable --ckpt.save_hf

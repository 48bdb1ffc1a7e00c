"""OpenRLHF launches as scenarios: ``python3 -m openrlhf.cli.train_ppo_ray --flag value ...`` (in a shell
script, often behind ``ray job submit ... --``, or as bare arguments).

OpenRLHF places each model on its own Ray actor group unless told to colocate: the actor, critic,
reference and reward models on ``--{role}_num_nodes x --{role}_num_gpus_per_node`` GPUs, and
``--vllm_num_engines`` vLLM engines of ``--vllm_tensor_parallel_size`` GPUs for generation. The
scenario is a ``pools`` placement with one pool per group (``--colocate_actor_ref`` and
``--colocate_critic_reward`` merge two groups into one pool), or ``colocated`` with
``--colocate_all_models`` (the hybrid engine). The step is synchronous (``sync``).

Flags are read under their long-standing names (``--pretrain``, ``--rollout_batch_size``); the dotted
names of newer releases (``--actor.model_name_or_path``, ``--rollout.batch_size``) are read as aliases.
"""

from __future__ import annotations

import math

from rlhfsim.importers.common import (
    ImportError_, ImportOptions, ImportResult, Setting, classify_by_patterns, launch_tokens, model_ref, parse_scalar,
    prompt_length, response_length, setting_bool, setting_int, unresolved,
)

MARKERS = ("openrlhf.cli.train_ppo_ray", "train_ppo_ray")

ALIASES = {
    "actor.model_name_or_path": "pretrain", "critic.model_name_or_path": "critic_pretrain",
    "reward.model_name_or_path": "reward_pretrain", "reward.remote_url": "remote_rm_url",
    "vllm.num_engines": "vllm_num_engines", "vllm.tensor_parallel_size": "vllm_tensor_parallel_size",
    "vllm.gpu_memory_utilization": "vllm_gpu_memory_utilization", "train.colocate_actor_ref": "colocate_actor_ref",
    "train.colocate_critic_reward": "colocate_critic_reward", "train.colocate_all": "colocate_all_models",
    "rollout.batch_size": "rollout_batch_size", "rollout.n_samples_per_prompt": "n_samples_per_prompt",
    "train.batch_size": "train_batch_size", "train.micro_batch_size": "micro_train_batch_size",
    "rollout.micro_batch_size": "micro_rollout_batch_size", "train.max_epochs": "max_epochs",
    "rollout.max_new_tokens": "generate_max_len", "algo.advantage.estimator": "advantage_estimator",
    "algo.kl.init_coef": "init_kl_coef", "ds.zero_stage": "zero_stage", "ds.adam_offload": "adam_offload",
    "actor.gradient_checkpointing_enable": "gradient_checkpointing", "ds.packing_samples": "packing_samples",
    "ds.lora.rank": "lora_rank", "vllm.enforce_eager": "enforce_eager", "train.num_episodes": "num_episodes",
    "train.dynamic_batch_enable": "use_dynamic_batch", "train.async_enable": "async_train",
    **{f"{r}.{k}": f"{r}_{k}" for r in ("actor", "critic", "ref", "reward") for k in ("num_nodes", "num_gpus_per_node")},
}

DEFAULTS: dict[str, object] = {
    "actor_num_nodes": 1, "actor_num_gpus_per_node": 8, "critic_num_nodes": 1, "critic_num_gpus_per_node": 8,
    "ref_num_nodes": 1, "ref_num_gpus_per_node": 8, "reward_num_nodes": 1, "reward_num_gpus_per_node": 8,
    "vllm_num_engines": None, "vllm_tensor_parallel_size": 1, "vllm_gpu_memory_utilization": 0.95,
    "colocate_actor_ref": False, "colocate_critic_reward": False, "colocate_all_models": False,
    "rollout_batch_size": 1024, "n_samples_per_prompt": 1, "train_batch_size": 128, "max_epochs": 1,
    "prompt_max_len": 1024, "generate_max_len": 1024, "advantage_estimator": "gae", "init_kl_coef": 0.01,
    "bf16": False, "micro_train_batch_size": 1, "micro_rollout_batch_size": 1, "packing_samples": False,
    "use_dynamic_batch": False, "gradient_checkpointing": False, "adam_offload": False, "ref_reward_offload": False,
    "enforce_eager": False,
}
DEFAULTS_RELEASE = "OpenRLHF train_ppo_ray.py argument defaults"

MAPPED = {
    "pretrain": "models.actor.model (and models.reference.model)",
    "critic_pretrain": "models.critic.model",
    "reward_pretrain": "models.reward.model",
    "remote_rm_url": "models.reward: kind rule (a remote reward service, priced as a rule)",
    "rollout_batch_size": "workload.prompts_per_step",
    "n_samples_per_prompt": "algorithm.group_size",
    "train_batch_size": "algorithm.minibatch_size",
    "max_epochs": "algorithm.ppo_epochs",
    "prompt_max_len": "workload.max_prompt_tokens",
    "generate_max_len": "workload.max_response_tokens",
    "advantage_estimator": "algorithm.kind",
    "init_kl_coef": "models.reference (OpenRLHF builds the reference model when the KL coefficient is > 0)",
    "vllm_num_engines": "placement: the generation pool (engines x TP GPUs)",
    "vllm_tensor_parallel_size": "placement.tp.rollout",
    "vllm_gpu_memory_utilization": "generation.kv_cache_fraction",
    "colocate_actor_ref": "placement: actor and reference share a pool",
    "colocate_critic_reward": "placement: critic and reward share a pool",
    "colocate_all_models": "placement: colocated",
    "bf16": "models.*.dtype",
    "enforce_eager": "generation.runtime (vllm_eager: vLLM without CUDA graphs)",
    "micro_train_batch_size": "execution.micro_batch.ppo_micro_batch_size_per_gpu",
    "micro_rollout_batch_size": "execution.micro_batch.log_prob_micro_batch_size_per_gpu",
    "packing_samples": "execution.micro_batch.use_remove_padding",
    "zero_stage": "execution.sharding (3: fsdp, ZeRO-3's per-call parameter gathers; 0-2: none)",
    "use_dynamic_batch": "execution.micro_batch.use_dynamic_bsz",
    "max_tokens_per_gpu": "execution.micro_batch.ppo_max_token_len_per_gpu",
    "gradient_checkpointing": "execution.gradient_checkpointing",
    "adam_offload": "execution.offload.actor.optimizer (and the critic's)",
    "ref_reward_offload": "execution.offload.reference.param",
    **{f"{r}_{k}": f"placement: the {r} pool" for r in ("actor", "critic", "ref", "reward")
       for k in ("num_nodes", "num_gpus_per_node")},
}

NO_COST = [
    (r"learning_rate|lr_warmup|l2|adam_betas|max_norm|lr_scheduler|min_lr", "optimizer hyper-parameter"),
    (r"eps_clip|value_clip|gamma|lambd|kl_target|kl_horizon|kl_estimator|use_kl_loss|normalize_reward|"
     r"reward_clip|entropy|aux_loss|dual_clip|policy_loss|overlong|stop_properly_penalty", "loss hyper-parameter"),
    (r"temperature|top_p|top_k", "sampling (it changes lengths, which are given separately)"),
    (r"prompt_data|prompt_split|input_key|label_key|input_template|apply_chat_template|max_samples|dataset|"
     r"eval_|tokenizer|disable_fast_tokenizer|label", "data loading"),
    (r"save_path|ckpt|save_steps|logging_steps|eval_steps|use_wandb|wandb|tensorboard|load_checkpoint|"
     r"max_ckpt|save_hf|num_episodes|seed|full_determinism|use_tensorboard", "run bookkeeping"),
    (r"^flash_attn$|attn_implementation", "attention kernel (the profile prices flash attention)"),
    (r"value_head_prefix|local_rank|^zpg$|grad_accum_dtype|vllm_sync_backend|vllm_sync_with_ray|"
     r"freezing_actor_steps|freezing_steps", "start-up or bookkeeping"),
]

UNMAPPED = [
    (r"offload", "host offload of another kind (not read)"),
    (r"lora", "LoRA adapters (not modelled)"),
    (r"enable_sleep", "engine sleep between phases (not modelled)"),
    (r"enable_prefix_caching|vllm_generate_batch_size", "engine batching detail (not modelled)"),
    (r"async_train|partial_rollout", "asynchronous training (import as sync; set schedule.kind: async by hand)"),
    (r"ring_attn|tensor_parallel_size", "training-side parallelism (not modelled)"),
    (r"agent_func_path", "agent rollouts (not modelled)"),
    (r"enable_ema|load_in_4bit|deepcompile|use_liger_kernel|overlap_comm", "training-engine option (not modelled)"),
]


def read_flags(text: str) -> list[tuple[str, str]]:
    """(flag name without dashes, raw value) in launch order; a flag with no value is ``True``."""
    toks = launch_tokens(text, MARKERS, "OpenRLHF launch")
    out, i = [], 0
    while i < len(toks):
        t = toks[i]
        if not t.startswith("--"):
            raise ImportError_(f"OpenRLHF launch: expected --flag [value], got {t!r}")
        name, eq, val = t[2:].partition("=")
        if not eq:
            vals = []
            while i + 1 < len(toks) and not toks[i + 1].startswith("--"):
                vals.append(toks[i + 1])
                i += 1
            val = " ".join(vals) if vals else "True"
        out.append((ALIASES.get(name, name), val))
        i += 1
    return out


def classify(key: str) -> tuple[str, str]:
    if key in MAPPED:
        return "mapped", MAPPED[key]
    return classify_by_patterns(key, UNMAPPED, NO_COST)


def import_openrlhf(text: str, opts: ImportOptions, source: str = "launch", is_yaml: bool = False) -> ImportResult:
    """Read an OpenRLHF ``train_ppo_ray`` launch into a scenario mapping with its settings record."""
    if is_yaml:
        raise ImportError_("OpenRLHF launch: expected a command line (OpenRLHF has no YAML config), got a YAML file")
    pairs = read_flags(text)
    for s in opts.sets:
        k, eq, v = s.partition("=")
        if not eq:
            raise ImportError_(f"--set: expected flag=value, got {s!r}")
        pairs.append((ALIASES.get(k.lstrip("-"), k.lstrip("-")), v))
    res = ImportResult("openrlhf", source, {})
    cfg = dict(DEFAULTS)
    seen: dict[str, str] = {}
    for k, v in pairs:
        seen[k] = v
    for k, v in seen.items():
        status, target = classify(k)
        res.settings.append(Setting(k, v, status, target))
        if status == "mapped":
            var = unresolved(v)
            if var:
                raise ImportError_(f"--{k}: expected a value, got the unset shell variable {var} "
                                   f"(define it in the script or pass --set {k}=VALUE)")
            cfg[k] = parse_scalar(v)
    left = sorted(k for k in DEFAULTS if k not in seen)
    res.assumptions.append(f"OpenRLHF defaults ({DEFAULTS_RELEASE}) for flags the launch leaves out: "
                           + ", ".join(f"{k}={DEFAULTS[k]}" for k in left))
    res.scenario = _build(cfg, seen, opts, res)
    return res


def _int(cfg: dict, key: str, lo: int = 1) -> int:
    return setting_int(cfg, key, f"--{key}", lo)


def _flag(cfg: dict, key: str) -> bool:
    return setting_bool(cfg, key, f"--{key}", "a flag without a value")


def _build(cfg: dict, seen: dict, opts: ImportOptions, res: ImportResult) -> dict:
    a = res.assumptions
    est = str(cfg["advantage_estimator"])
    kinds = {"gae": "ppo", "group_norm": "grpo", "dr_grpo": "grpo", "rloo": "rloo", "reinforce": "grpo",
             "reinforce_baseline": "grpo"}
    if est not in kinds:
        raise ImportError_(f"--advantage_estimator: expected one of {', '.join(kinds)}, got {est!r}")
    kind = kinds[est]
    if est in ("reinforce", "reinforce_baseline", "dr_grpo"):
        a.append(f"advantage_estimator={est} priced as grpo (critic-free)")
    n = _int(cfg, "n_samples_per_prompt")
    if "pretrain" not in cfg:
        raise ImportError_("--pretrain: expected the actor's model, got nothing (the launch must set it)")
    actor, how = model_ref("--pretrain", str(cfg["pretrain"]))
    a.append(f"actor shape: {how}")
    if not _flag(cfg, "bf16"):
        raise ImportError_("--bf16: expected it set (rlhfsim prices bf16 training; OpenRLHF without --bf16 trains in fp32 "
                           "under DeepSpeed, not modelled)")
    dtype = "bfloat16"
    models: dict = {"actor": {"model": actor, "dtype": dtype}}
    roles = ["actor"]
    if kind == "ppo":
        critic, _ = model_ref("--critic_pretrain", str(cfg["critic_pretrain"])) if "critic_pretrain" in cfg else (actor, "")
        if "critic_pretrain" not in cfg:
            a.append("critic_pretrain not set: the critic is the actor's model (OpenRLHF's default)")
        models["critic"] = {"model": critic, "dtype": dtype}
        roles.append("critic")
    kl = cfg["init_kl_coef"]
    if isinstance(kl, bool) or not isinstance(kl, (int, float)):
        raise ImportError_(f"--init_kl_coef: expected a number, got {kl!r}")
    if kl > 0:
        models["reference"] = {"model": actor, "dtype": dtype}
        roles.append("reference")
    if "remote_rm_url" in cfg:
        models["reward"] = {"kind": "rule"}
        a.append("remote reward service: priced as the rule reward's defaults (1 ms per response, 8 workers)")
    elif "reward_pretrain" in cfg:
        rm, _ = model_ref("--reward_pretrain", str(cfg["reward_pretrain"]))
        models["reward"] = {"kind": "model", "model": rm, "dtype": dtype}
        roles.append("reward")
    else:
        raise ImportError_("--reward_pretrain: expected a reward model or --remote_rm_url, got neither")

    tp_roll = _int(cfg, "vllm_tensor_parallel_size")
    placement, total = _placement(cfg, roles, tp_roll, a)
    if opts.gpu is None:
        raise ImportError_("--gpu: expected the GPU the run used (an OpenRLHF launch does not name it), got nothing")
    per_node = opts.gpus_per_node or 8
    nodes = max(math.ceil(total / per_node), 1)
    prompts = _int(cfg, "rollout_batch_size")
    mini = _int(cfg, "train_batch_size")
    if mini > prompts * n:
        raise ImportError_(f"--train_batch_size: expected at most rollout_batch_size x n_samples_per_prompt ({prompts * n}), got {mini}")
    max_prompt, max_resp = _int(cfg, "prompt_max_len"), _int(cfg, "generate_max_len")
    a.append("vLLM engines batch at most 256 sequences each (vLLM's max_num_seqs default)")
    scenario = {
        "name": opts.name or "openrlhf-import",
        "description": f"Imported from an OpenRLHF launch ({res.source}); see the header for unmapped settings and assumptions.",
        "models": models,
        "cluster": {"gpu": opts.gpu, "nodes": nodes, "gpus_per_node": per_node},
        "placement": placement,
        "algorithm": {"kind": kind, "group_size": n, "ppo_epochs": _int(cfg, "max_epochs"), "minibatch_size": mini},
        "workload": {
            "prompts_per_step": prompts,
            "prompt_length": prompt_length(opts.mean_prompt_len, max_prompt, a, "prompt_max_len", opts.prompt_source),
            "response_length": response_length(opts.mean_response_len, max_resp, a, "generate_max_len", prompts * n,
                                               opts.max_response_len_logged, opts.clip_ratio, opts.lengths_source),
            "max_prompt_tokens": max_prompt,
            "max_response_tokens": max_resp,
        },
        "generation": {"engine": "continuous", "runtime": "vllm_eager" if _flag(cfg, "enforce_eager") else "vllm",
                       "max_batch": 256},
        "schedule": {"kind": "sync"},
        "steps": opts.steps,
        "warmup_steps": 1 if opts.steps > 1 else 0,
        "seed": 0,
    }
    util = cfg["vllm_gpu_memory_utilization"]
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 < util <= 1:
        raise ImportError_(f"--vllm_gpu_memory_utilization: expected a fraction in (0, 1], got {util!r}")
    from rlhfsim.importers.verl import kv_fraction

    if opts.execution:
        scenario["execution"] = _execution(cfg, models, placement["kind"] == "colocated", a)
    scenario["generation"]["kv_cache_fraction"] = kv_fraction(scenario, float(util), a)
    return scenario


def _execution(cfg: dict, models: dict, colocated: bool, a: list[str]) -> dict:
    """OpenRLHF's step mechanics: the actor's log-prob pass in make_experience, advantages, micro-batches
    (its micro sizes are per GPU), packing, checkpointing, Adam and reference offload, and the weight sync
    (a broadcast to the vLLM engines; resharding into them under --colocate_all_models)."""
    mb = {"ppo_micro_batch_size_per_gpu": _int(cfg, "micro_train_batch_size"),
          "log_prob_micro_batch_size_per_gpu": _int(cfg, "micro_rollout_batch_size"),
          "use_remove_padding": _flag(cfg, "packing_samples")}
    if _flag(cfg, "use_dynamic_batch"):
        if "max_tokens_per_gpu" not in cfg:
            raise ImportError_("--max_tokens_per_gpu: expected a token budget with --use_dynamic_batch, got none")
        mb.update(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=_int(cfg, "max_tokens_per_gpu"))
    adam = _flag(cfg, "adam_offload")
    offload: dict = {"actor": {"param": False, "grad": False, "optimizer": adam}}
    if "critic" in models:
        offload["critic"] = {"param": False, "grad": False, "optimizer": adam}
    if "reference" in models:
        offload["reference"] = {"param": _flag(cfg, "ref_reward_offload")}
    a.append("OpenRLHF mechanics on (execution): the actor's log-prob pass in make_experience, advantages on the "
             "driver, weight sync " + ("by resharding into the colocated engines" if colocated else "by broadcast to the vLLM engines"))
    zero = _int(cfg, "zero_stage", lo=0) if "zero_stage" in cfg else 2
    if "zero_stage" not in cfg:
        a.append("--zero_stage not set: OpenRLHF's default 2 (optimizer state and gradients sharded, parameters whole: "
                 "no per-call gathers)")
    return {"sharding": "fsdp" if zero == 3 else "none", "old_log_prob": True, "advantage": {"enabled": True}, "micro_batch": mb,
            "gradient_checkpointing": _flag(cfg, "gradient_checkpointing"), "offload": offload,
            "weight_sync": {"kind": "reshard" if colocated else "copy"}}


def _placement(cfg: dict, roles: list[str], tp_roll: int, a: list[str]) -> tuple[dict, int]:
    """The placement and the GPUs it uses."""
    def gpus(r):
        return _int(cfg, f"{r}_num_nodes") * _int(cfg, f"{r}_num_gpus_per_node")

    actor_gpus = gpus("actor")
    if _flag(cfg, "colocate_all_models"):
        return {"kind": "colocated", "tp": {"rollout": tp_roll}}, actor_gpus
    engines = cfg["vllm_num_engines"]
    if engines is None or engines == 0:
        raise ImportError_("--vllm_num_engines: expected vLLM engines (OpenRLHF without vLLM generates with HF, not modelled "
                           "for OpenRLHF), got none")
    engines = _int(cfg, "vllm_num_engines")
    pools = [{"name": "actor", "gpus": actor_gpus, "roles": ["actor"]}]
    if "reference" in roles:
        if _flag(cfg, "colocate_actor_ref"):
            pools[0]["roles"].append("reference")
        else:
            pools.append({"name": "reference", "gpus": gpus("ref"), "roles": ["reference"]})
    critic_pool = None
    if "critic" in roles:
        critic_pool = {"name": "critic", "gpus": gpus("critic"), "roles": ["critic"]}
        pools.append(critic_pool)
    if "reward" in roles:
        if _flag(cfg, "colocate_critic_reward") and critic_pool is not None:
            critic_pool["roles"].append("reward")
        else:
            pools.append({"name": "reward", "gpus": gpus("reward"), "roles": ["reward"]})
    pools.append({"name": "vllm", "gpus": engines * tp_roll, "roles": ["rollout"]})
    total = sum(p["gpus"] for p in pools)
    listed = ", ".join(f"{p['name']} {p['gpus']}" for p in pools)
    a.append(f"one pool per OpenRLHF actor group: {listed} GPUs ({total} in all, laid out in that order)")
    return {"kind": "pools", "pools": pools, "tp": {"rollout": tp_roll}}, total

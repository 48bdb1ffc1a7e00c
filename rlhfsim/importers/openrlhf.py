"""OpenRLHF launches as scenarios: ``python3 -m openrlhf.cli.train_ppo_ray --flag value ...`` (in a shell
script, often behind ``ray job submit ... --``, or as bare arguments).

OpenRLHF places each model on its own Ray actor group unless told to colocate: the actor, critic,
reference and reward models on ``--{role}_num_nodes x --{role}_num_gpus_per_node`` GPUs, and
``--vllm_num_engines`` vLLM engines of ``--vllm_tensor_parallel_size`` GPUs for generation. The
scenario is a ``pools`` placement with one pool per group (``--colocate_actor_ref`` and
``--colocate_critic_reward`` merge two groups into one pool), or ``colocated`` with
``--colocate_all_models`` (the hybrid engine). The step is synchronous (``sync``).

Both flag generations are read: the flat names up to v0.10.1 (``--pretrain``, ``--rollout_batch_size``) and the
dotted names from v0.10.2 on (``--actor.model_name_or_path``, ``--rollout.batch_size``); the dotted ones are keyed by
the flat name they replaced (``rlhfsim.importers.openrlhf_flags``), and errors name the flag as the launch wrote it.
What changed between releases and matters here: the dtype (``--bf16`` up to v0.9.1, ``--param_dtype`` defaulting to
bf16 from v0.9.2) and the length caps (``--prompt_max_len``/``--generate_max_len`` up to v0.9.7, ``--max_len`` and
``--max_new_tokens`` from v0.9.8).
"""

from __future__ import annotations

import math

from rlhfsim.importers import openrlhf_flags as FL
from rlhfsim.importers.common import (
    ImportError_, ImportOptions, ImportResult, Setting, classify_by_patterns, launch_tokens, model_ref, parse_scalar,
    prompt_length, response_length, setting_bool, setting_int, unresolved,
)

MARKERS = ("openrlhf.cli.train_ppo_ray", "train_ppo_ray")

DEFAULTS: dict[str, object] = {
    "actor_num_nodes": 1, "actor_num_gpus_per_node": 8, "critic_num_nodes": 1, "critic_num_gpus_per_node": 8,
    "ref_num_nodes": 1, "ref_num_gpus_per_node": 8, "reward_num_nodes": 1, "reward_num_gpus_per_node": 8,
    "vllm_num_engines": None, "vllm_tensor_parallel_size": 1, "vllm_gpu_memory_utilization": 0.95,
    "colocate_actor_ref": False, "colocate_critic_reward": False, "colocate_all_models": False,
    "rollout_batch_size": 1024, "n_samples_per_prompt": 1, "train_batch_size": 128, "max_epochs": 1,
    "advantage_estimator": "gae", "init_kl_coef": 0.01,
    "micro_train_batch_size": 1, "micro_rollout_batch_size": 1, "packing_samples": False,
    "use_dynamic_batch": False, "train_max_tokens_per_gpu": 16192, "gradient_checkpointing": False,
    "adam_offload": False, "enforce_eager": False,
}
GENERATION_DEFAULTS = {FL.FLAT: {"ref_reward_offload": False}, FL.DOTTED_GEN: {"ref_offload": False}}
# what the launch's release line decides (openrlhf_flags): the dtype flag and the length caps
DTYPE_DEFAULTS = {"bf16": {"bf16": False}, "param_dtype": {"param_dtype": "bf16"}}
LENGTH_DEFAULTS = {"split": {"prompt_max_len": 1024, "generate_max_len": 1024},
                   "total": {"max_len": 2048, "max_new_tokens": None}}
DEFAULTS_RELEASE = "OpenRLHF train_ppo_ray.py argument defaults"

MAPPED = {
    "pretrain": "models.actor.model (and models.reference.model)",
    "critic_pretrain": "models.critic.model",
    "reward_pretrain": "models.reward.model",
    "remote_rm_url": "models.reward: kind rule (a reward function or remote service, priced as a rule)",
    "rollout_batch_size": "workload.prompts_per_step",
    "n_samples_per_prompt": "algorithm.group_size",
    "train_batch_size": "algorithm.minibatch_size",
    "max_epochs": "algorithm.ppo_epochs",
    "prompt_max_len": "workload.max_prompt_tokens",
    "generate_max_len": "workload.max_response_tokens",
    "max_len": "workload caps: max_prompt_tokens + max_response_tokens (v0.9.8 on)",
    "max_new_tokens": "workload.max_response_tokens (v0.9.8 on)",
    "advantage_estimator": "algorithm.kind",
    "init_kl_coef": "models.reference (OpenRLHF builds the reference model when the KL coefficient is > 0)",
    "vllm_num_engines": "placement: the generation pool (engines x TP GPUs)",
    "vllm_tensor_parallel_size": "placement.tp.rollout",
    "vllm_gpu_memory_utilization": "generation.kv_cache_fraction",
    "colocate_actor_ref": "placement: actor and reference share a pool",
    "colocate_critic_reward": "placement: critic and reward share a pool",
    "colocate_all_models": "placement: colocated",
    "bf16": "models.*.dtype",
    "param_dtype": "models.*.dtype",
    "enforce_eager": "generation.runtime (vllm_eager: vLLM without CUDA graphs)",
    "micro_train_batch_size": "execution.micro_batch.ppo_micro_batch_size_per_gpu",
    "micro_rollout_batch_size": "execution.micro_batch.log_prob_micro_batch_size_per_gpu",
    "packing_samples": "execution.micro_batch.use_remove_padding",
    "zero_stage": "execution.sharding (3: fsdp, ZeRO-3's per-call parameter gathers; 0-2: none)",
    "use_dynamic_batch": "execution.micro_batch.use_dynamic_bsz",
    "train_max_tokens_per_gpu": "execution.micro_batch.ppo_max_token_len_per_gpu",
    "gradient_checkpointing": "execution.gradient_checkpointing",
    "adam_offload": "execution.offload.actor.optimizer (and the critic's)",
    "ref_reward_offload": "execution.offload.reference.param",
    "ref_offload": "execution.offload.reference.param",
    **{f"{r}_{k}": f"placement: the {r} pool" for r in ("actor", "critic", "ref", "reward")
       for k in ("num_nodes", "num_gpus_per_node")},
}

NO_COST = [
    (r"learning_rate|lr_warmup|l2|adam_betas|max_norm|lr_scheduler|min_lr|\.adam\.|\.muon\.", "optimizer hyper-parameter"),
    (r"eps_clip|value_clip|gamma|lambd|kl_target|kl_horizon|kl_estimator|use_kl_loss|normalize_reward|"
     r"reward_clip|entropy|aux_loss|dual_clip|policy_loss|overlong|stop_properly_penalty|no_advantage_std_norm|"
     r"is_correction|is_truncated", "loss hyper-parameter"),
    (r"temperature|top_p|top_k", "sampling (it changes lengths, which are given separately)"),
    (r"prompt_data|prompt_split|input_key|label_key|input_template|apply_chat_template|max_samples|dataset|"
     r"eval_|tokenizer|disable_fast_tokenizer|label|image_key|dataloader_num_workers", "data loading"),
    (r"save_path|ckpt|save_steps|logging_steps|eval_steps|use_wandb|wandb|tensorboard|load_checkpoint|"
     r"max_ckpt|save_hf|num_episodes|seed|full_determinism|use_tensorboard|best_metric_key|save_value_network",
     "run bookkeeping"),
    (r"^flash_attn$|attn_implementation", "attention kernel (the profile prices flash attention)"),
    (r"value_head_prefix|local_rank|^zpg$|grad_accum_dtype|vllm_sync_backend|vllm_sync_with_ray|"
     r"freezing_actor_steps|freezing_steps", "start-up or bookkeeping"),
]

UNMAPPED = [
    (r"offload", "host offload of another kind (not read)"),
    (r"lora", "LoRA adapters (not modelled)"),
    (r"enable_sleep", "engine sleep between phases (not modelled)"),
    (r"enable_prefix_caching|vllm_generate_batch_size|rollout_max_tokens_per_gpu",
     "engine or forward batching detail (not modelled)"),
    (r"async_train|async_queue_size|partial_rollout", "asynchronous training (import as sync; set schedule.kind: async by hand)"),
    (r"ring_attn|ring_head_stride|tensor_parallel_size", "training-side parallelism (not modelled)"),
    (r"agent_func_path", "agent rollouts (not modelled)"),
    (r"dynamic_filtering", "dynamic filtering (generation refilled past filtered prompts; not modelled)"),
    (r"\.optim$", "optimizer choice (Adam is priced; Muon not modelled)"),
    (r"enable_ema|ema_beta|load_in_4bit|deepcompile|use_liger_kernel|overlap_comm|experts_implementation|"
     r"gradient_checkpointing_use_reentrant|freeze_visual_encoder|max_images_per_prompt",
     "training-engine option (not modelled)"),
]


def read_flags(text: str) -> list[tuple[str, str, str]]:
    """(flag as written without dashes, its canonical name (``openrlhf_flags.canonical``), raw value) in launch
    order; a flag with no value is ``True``."""
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
        out.append((name, FL.canonical(name), val))
        i += 1
    return out


def classify(key: str) -> tuple[str, str]:
    if key in MAPPED:
        return "mapped", MAPPED[key]
    return classify_by_patterns(key, UNMAPPED, NO_COST)


def import_openrlhf(text: str, opts: ImportOptions, source: str = "launch", is_yaml: bool = False) -> ImportResult:
    """Read an OpenRLHF ``train_ppo_ray`` launch of either flag generation into a scenario mapping with its
    settings record (settings keyed by their flat names: ``openrlhf_flags``)."""
    if is_yaml:
        raise ImportError_("OpenRLHF launch: expected a command line (OpenRLHF has no YAML config), got a YAML file")
    flags = read_flags(text)
    gen, mixed = FL.generation([w for w, _, _ in flags])
    for s in opts.sets:
        k, eq, v = s.partition("=")
        if not eq:
            raise ImportError_(f"--set: expected flag=value, got {s!r}")
        flags.append((k.lstrip("-"), FL.canonical(k.lstrip("-")), v))
    res = ImportResult("openrlhf", source, {})
    seen: dict[str, str] = {}
    written: dict[str, str] = {}
    for w, k, v in flags:
        seen[k], written[k] = v, w
    f = Flags(gen, written)
    a = res.assumptions
    a.append(f"OpenRLHF launch read by its {FL.GENERATION_TEXT[gen]}")
    if mixed:
        a.append(mixed)
    lengths = _length_style(gen, seen)
    defaults = {**DEFAULTS, **GENERATION_DEFAULTS[gen], **DTYPE_DEFAULTS["param_dtype" if gen == FL.DOTTED_GEN or "param_dtype" in seen else "bf16"],
                **LENGTH_DEFAULTS[lengths]}
    cfg = dict(defaults)
    for k, v in seen.items():
        status, target = classify(k)
        res.settings.append(Setting(k, v, status, target + (f" (written --{written[k]})" if written[k] != k else "")))
        if status == "mapped":
            var = unresolved(v)
            if var:
                raise ImportError_(f"{f.name(k)}: expected a value, got the unset shell variable {var} "
                                   f"(define it in the script or pass --set {written[k]}=VALUE)")
            cfg[k] = parse_scalar(v)
    left = sorted(k for k in defaults if k not in seen)
    a.append(f"OpenRLHF defaults ({DEFAULTS_RELEASE}) for flags the launch leaves out: "
             + ", ".join(f"{f.name(k)[2:]}={defaults[k]}" for k in left))
    f.cfg = cfg
    res.scenario = _build(f, lengths, seen, opts, res)
    return res


class Flags:
    """A launch's flag values under their canonical names (``cfg``), read and checked by name; errors name a
    flag as the launch wrote it (else as its generation names it)."""

    def __init__(self, gen: str, written: dict[str, str]):
        self.gen, self.written, self.cfg = gen, written, {}
        self._dotted = {v: k for k, v in FL.DOTTED.items()}

    def name(self, key: str) -> str:
        if key in self.written:
            return "--" + self.written[key]
        return "--" + (self._dotted.get(key, key) if self.gen == FL.DOTTED_GEN else key)

    def int(self, key: str, lo: int = 1) -> int:
        return setting_int(self.cfg, key, self.name(key), lo)

    def flag(self, key: str) -> bool:
        """A flag's value; one its generation does not have (``ref_offload`` in a flat launch) is off."""
        if key not in self.cfg:
            return False
        return setting_bool(self.cfg, key, self.name(key), "a flag without a value")

    def __contains__(self, key: str) -> bool:
        return key in self.cfg

    def __getitem__(self, key: str):
        return self.cfg[key]


def _length_style(gen: str, seen: dict) -> str:
    """``split``: ``--prompt_max_len`` and ``--generate_max_len`` (up to v0.9.7); ``total``: ``--max_len`` (prompt +
    response) and ``--max_new_tokens`` (v0.9.8 on, and the dotted generation). Up to v0.9.7 ``--max_len`` was a
    deprecated total read only by the engine, so it decides alone only when neither split cap is given."""
    if "prompt_max_len" in seen or "generate_max_len" in seen:
        return "split"
    if gen == FL.DOTTED_GEN or "max_new_tokens" in seen or "max_len" in seen:
        return "total"
    return "split"


def _caps(f: Flags, lengths: str, opts: ImportOptions, a: list[str]) -> tuple[int, int, str, str]:
    """(prompt cap, response cap, and the flags each comes from) in tokens."""
    if lengths == "split":
        if "max_len" in f.written:
            a.append(f"{f.name('max_len')} (before v0.9.8 a deprecated total read by the engine only) not read: "
                     f"the caps are {f.name('prompt_max_len')} and {f.name('generate_max_len')}")
        return f.int("prompt_max_len"), f.int("generate_max_len"), f.name("prompt_max_len")[2:], \
            f.name("generate_max_len")[2:]
    total, new = f.int("max_len"), f["max_new_tokens"]
    tn, nn = f.name("max_len")[2:], f.name("max_new_tokens")[2:]
    if new is not None:
        resp = f.int("max_new_tokens")
        if resp >= total:
            raise ImportError_(f"{f.name('max_new_tokens')}: expected fewer tokens than {f.name('max_len')} ({total}: "
                               f"prompt + response), got {resp}")
        a.append(f"prompt cap {total - resp} tokens: {tn}={total} less {nn}={resp} (OpenRLHF cuts a longer prompt "
                 f"from the left)")
        return total - resp, resp, f"{tn} less {nn}", nn
    if opts.mean_prompt_len is not None and 0 < opts.mean_prompt_len < total:
        prompt = min(total - 1, math.ceil(1.5 * opts.mean_prompt_len))
        how = f"1.5 x the mean prompt {opts.mean_prompt_len:g}: prompts are priced with sd a quarter of the mean"
    else:
        prompt = total // 2
        how = "half of it: no mean prompt length given (--mean-prompt-len or --log)"
    a.append(f"{nn} not set: each response may run to {tn}={total} less its prompt (OpenRLHF v0.9.8 on); priced as "
             f"a prompt cap of {prompt} ({how}) and a response cap of {total - prompt}")
    return prompt, total - prompt, f"the prompt's share of {tn}", f"{tn} less the prompt cap"


def _dtype(f: Flags, seen: dict, a: list[str]) -> str:
    """The training dtype: ``--param_dtype`` / ``--ds.param_dtype`` (bf16 or fp16, default bf16 from v0.9.2), else
    ``--bf16`` (up to v0.9.1, without it fp32: refused)."""
    if "param_dtype" in seen or (f.gen == FL.DOTTED_GEN and "bf16" not in seen):
        v = f["param_dtype"]
        if v not in ("bf16", "fp16"):
            raise ImportError_(f"{f.name('param_dtype')}: expected bf16 or fp16, got {v!r}")
        if "param_dtype" not in seen:
            a.append(f"{f.name('param_dtype')} not set: OpenRLHF's default bf16")
        return {"bf16": "bfloat16", "fp16": "float16"}[v]
    if f.flag("bf16"):
        return "bfloat16"
    later = sorted((k for k in seen if k in FL.SINCE_V092), key=lambda k: FL.SINCE_V092[k])
    if later:
        a.append(f"no --bf16 or --param_dtype: bf16, OpenRLHF's default from v0.9.2 (the launch's {f.name(later[-1])} "
                 f"appeared in {FL.SINCE_V092[later[-1]]})")
        return "bfloat16"
    raise ImportError_("--bf16: expected it set (rlhfsim prices bf16 training; OpenRLHF up to v0.9.1 without --bf16 "
                       "trains in fp32 under DeepSpeed, not modelled; from v0.9.2 bf16 is the default: for such a launch "
                       "pass --set param_dtype=bf16)")


def _build(f: Flags, lengths: str, seen: dict, opts: ImportOptions, res: ImportResult) -> dict:
    a = res.assumptions
    est = str(f["advantage_estimator"])
    kinds = {"gae": "ppo", "group_norm": "grpo", "dr_grpo": "grpo", "rloo": "rloo", "reinforce": "grpo",
             "reinforce_baseline": "grpo"}
    if est not in kinds:
        raise ImportError_(f"{f.name('advantage_estimator')}: expected one of {', '.join(kinds)}, got {est!r}")
    kind = kinds[est]
    if est in ("reinforce", "reinforce_baseline", "dr_grpo"):
        a.append(f"advantage_estimator={est} priced as grpo (critic-free)")
    n = f.int("n_samples_per_prompt")
    if "pretrain" not in f:
        raise ImportError_(f"{f.name('pretrain')}: expected the actor's model, got nothing (the launch must set it)")
    actor, how = model_ref(f.name("pretrain"), str(f["pretrain"]))
    a.append(f"actor shape: {how}")
    dtype = _dtype(f, seen, a)
    models: dict = {"actor": {"model": actor, "dtype": dtype}}
    roles = ["actor"]
    reward_path = str(f["reward_pretrain"]) if "reward_pretrain" in f else None
    if reward_path and "," in reward_path:
        a.append(f"{f.name('reward_pretrain')[2:]} names {reward_path.count(',') + 1} reward models: priced as one, "
                 f"the first")
        reward_path = reward_path.split(",")[0]
    remote = "remote_rm_url" in f or "agent_func_path" in f
    if kind == "ppo":
        if "critic_pretrain" in f:
            critic, _ = model_ref(f.name("critic_pretrain"), str(f["critic_pretrain"]))
        elif reward_path and not remote:
            critic, _ = model_ref(f.name("reward_pretrain"), reward_path)
            a.append(f"{f.name('critic_pretrain')[2:]} not set: the critic is the reward model's shape (OpenRLHF's "
                     f"default with a reward model: train_ppo_ray.py sets it to the reward model's path)")
        else:
            critic = actor
            a.append(f"{f.name('critic_pretrain')[2:]} not set: the critic is the actor's model (OpenRLHF's default "
                     f"with a reward function)")
        models["critic"] = {"model": critic, "dtype": dtype}
        roles.append("critic")
    kl = f["init_kl_coef"]
    if isinstance(kl, bool) or not isinstance(kl, (int, float)):
        raise ImportError_(f"{f.name('init_kl_coef')}: expected a number, got {kl!r}")
    if kl > 0:
        models["reference"] = {"model": actor, "dtype": dtype}
        roles.append("reference")
    if remote:
        models["reward"] = {"kind": "rule"}
        a.append(("reward function or remote reward service" if "remote_rm_url" in f else "the agent's reward")
                 + ": priced as the rule reward's defaults (1 ms per response, 8 workers)")
    elif reward_path:
        rm, _ = model_ref(f.name("reward_pretrain"), reward_path)
        models["reward"] = {"kind": "model", "model": rm, "dtype": dtype}
        roles.append("reward")
    else:
        raise ImportError_(f"{f.name('reward_pretrain')}: expected a reward model or {f.name('remote_rm_url')}, "
                           f"got neither")

    tp_roll = f.int("vllm_tensor_parallel_size")
    placement, total = _placement(f, roles, tp_roll, a)
    if opts.gpu is None:
        raise ImportError_("--gpu: expected the GPU the run used (an OpenRLHF launch does not name it), got nothing")
    per_node = opts.gpus_per_node or 8
    nodes = max(math.ceil(total / per_node), 1)
    prompts = f.int("rollout_batch_size")
    mini = f.int("train_batch_size")
    if mini > prompts * n:
        raise ImportError_(f"{f.name('train_batch_size')}: expected at most {f.name('rollout_batch_size')[2:]} x "
                           f"{f.name('n_samples_per_prompt')[2:]} ({prompts * n}), got {mini}")
    max_prompt, max_resp, prompt_key, resp_key = _caps(f, lengths, opts, a)
    a.append("vLLM engines batch at most 256 sequences each (vLLM's max_num_seqs default)")
    scenario = {
        "name": opts.name or "openrlhf-import",
        "description": f"Imported from an OpenRLHF launch ({res.source}); see the header for unmapped settings and assumptions.",
        "models": models,
        "cluster": {"gpu": opts.gpu, "nodes": nodes, "gpus_per_node": per_node},
        "placement": placement,
        "algorithm": {"kind": kind, "group_size": n, "ppo_epochs": f.int("max_epochs"), "minibatch_size": mini},
        "workload": {
            "prompts_per_step": prompts,
            "prompt_length": prompt_length(opts.mean_prompt_len, max_prompt, a, prompt_key, opts.prompt_source),
            "response_length": response_length(opts.mean_response_len, max_resp, a, resp_key, prompts * n,
                                               opts.max_response_len_logged, opts.clip_ratio, opts.lengths_source),
            "max_prompt_tokens": max_prompt,
            "max_response_tokens": max_resp,
        },
        "generation": {"engine": "continuous", "runtime": "vllm_eager" if f.flag("enforce_eager") else "vllm",
                       "max_batch": 256},
        "schedule": {"kind": "sync"},
        "steps": opts.steps,
        "warmup_steps": 1 if opts.steps > 1 else 0,
        "seed": 0,
    }
    util = f["vllm_gpu_memory_utilization"]
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 < util <= 1:
        raise ImportError_(f"{f.name('vllm_gpu_memory_utilization')}: expected a fraction in (0, 1], got {util!r}")
    from rlhfsim.importers.verl import kv_fraction

    if opts.execution:
        scenario["execution"] = _execution(f, models, placement["kind"] == "colocated", a)
    scenario["generation"]["kv_cache_fraction"] = kv_fraction(scenario, float(util), a)
    return scenario


def _execution(f: Flags, models: dict, colocated: bool, a: list[str]) -> dict:
    """OpenRLHF's step mechanics: the actor's log-prob pass in make_experience, advantages, micro-batches
    (its micro sizes are per GPU), packing, checkpointing, Adam and reference offload, and the weight sync
    (a broadcast to the vLLM engines; resharding into them under --colocate_all_models)."""
    mb = {"ppo_micro_batch_size_per_gpu": f.int("micro_train_batch_size"),
          "log_prob_micro_batch_size_per_gpu": f.int("micro_rollout_batch_size"),
          "use_remove_padding": f.flag("packing_samples")}
    if f.flag("use_dynamic_batch"):
        mb.update(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=f.int("train_max_tokens_per_gpu"))
        if not mb["use_remove_padding"]:
            mb["use_remove_padding"] = True
            a.append(f"{f.name('use_dynamic_batch')} turns on {f.name('packing_samples')} (train_ppo_ray.py does)")
    adam = f.flag("adam_offload")
    offload: dict = {"actor": {"param": False, "grad": False, "optimizer": adam}}
    if "critic" in models:
        offload["critic"] = {"param": False, "grad": False, "optimizer": adam}
    if "reference" in models:
        offload["reference"] = {"param": f.flag("ref_reward_offload") or f.flag("ref_offload")}
    a.append("OpenRLHF mechanics on (execution): the actor's log-prob pass in make_experience, advantages on the "
             "driver, weight sync " + ("by resharding into the colocated engines" if colocated else "by broadcast to the vLLM engines"))
    zero = f.int("zero_stage", lo=0) if "zero_stage" in f else 2
    if "zero_stage" not in f:
        a.append(f"{f.name('zero_stage')} not set: OpenRLHF's default 2 (optimizer state and gradients sharded, "
                 f"parameters whole: no per-call gathers)")
    return {"sharding": "fsdp" if zero == 3 else "none", "old_log_prob": True, "advantage": {"enabled": True}, "micro_batch": mb,
            "gradient_checkpointing": f.flag("gradient_checkpointing"), "offload": offload,
            "weight_sync": {"kind": "reshard" if colocated else "copy"}}


def _placement(f: Flags, roles: list[str], tp_roll: int, a: list[str]) -> tuple[dict, int]:
    """The placement and the GPUs it uses."""
    def gpus(r):
        return f.int(f"{r}_num_nodes") * f.int(f"{r}_num_gpus_per_node")

    actor_gpus = gpus("actor")
    if f.flag("colocate_all_models"):
        return {"kind": "colocated", "tp": {"rollout": tp_roll}}, actor_gpus
    engines = f["vllm_num_engines"]
    if engines is None or engines == 0:
        raise ImportError_(f"{f.name('vllm_num_engines')}: expected vLLM engines (OpenRLHF without vLLM generates with "
                           f"HF, not modelled for OpenRLHF), got none")
    engines = f.int("vllm_num_engines")
    pools = [{"name": "actor", "gpus": actor_gpus, "roles": ["actor"]}]
    if "reference" in roles:
        if f.flag("colocate_actor_ref"):
            pools[0]["roles"].append("reference")
        else:
            pools.append({"name": "reference", "gpus": gpus("ref"), "roles": ["reference"]})
    critic_pool = None
    if "critic" in roles:
        critic_pool = {"name": "critic", "gpus": gpus("critic"), "roles": ["critic"]}
        pools.append(critic_pool)
    if "reward" in roles:
        if f.flag("colocate_critic_reward") and critic_pool is not None:
            critic_pool["roles"].append("reward")
        else:
            pools.append({"name": "reward", "gpus": gpus("reward"), "roles": ["reward"]})
    pools.append({"name": "vllm", "gpus": engines * tp_roll, "roles": ["rollout"]})
    total = sum(p["gpus"] for p in pools)
    listed = ", ".join(f"{p['name']} {p['gpus']}" for p in pools)
    a.append(f"one pool per OpenRLHF actor group: {listed} GPUs ({total} in all, laid out in that order)")
    return {"kind": "pools", "pools": pools, "tp": {"rollout": tp_roll}}, total

"""verl launches as scenarios: ``python3 -m verl.trainer.main_ppo key=value ...`` (Hydra overrides, in a
shell script or as bare arguments) or a verl YAML config.

verl's default step is synchronous and colocated (the hybrid engine: generation, the reference and
critic passes and training take turns on every GPU), which is the scenario's ``sync`` schedule with a
``colocated`` placement. A setting the launch leaves out takes verl's default from its
``verl/trainer/config/ppo_trainer.yaml`` (``DEFAULTS`` below; the release is named in the assumptions).

Every override is classified (see ``rlhfsim.importers.common``): the ones below in ``MAPPED`` set a
scenario field; ``NO_COST`` patterns are recognised and cost nothing here; ``UNMAPPED`` patterns are
recognised and can change the step time but have no scenario field; anything else is ``unmapped`` as
not recognised.
"""

from __future__ import annotations

import re
import shlex

import yaml

from rlhfsim.errors import ScenarioError
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.importers import verl_async, verl_execution
from rlhfsim.importers.common import (
    ImportError_, ImportOptions, ImportResult, Setting, classify_by_patterns, launch_tokens, logical_lines, model_ref,
    parse_scalar, prompt_length, response_length, setting_bool, setting_int, unresolved,
)

MARKERS = ("verl.trainer.main_ppo", "main_ppo", "verl.trainer", *verl_async.MARKERS)
AR = "actor_rollout_ref"

# verl's defaults for the settings the importer reads (ppo_trainer.yaml, verl 0.7 / main as of 2026-01).
DEFAULTS: dict[str, object] = {
    "algorithm.adv_estimator": "gae",
    "algorithm.use_kl_in_reward": False,
    "data.train_batch_size": 1024,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    f"{AR}.actor.ppo_mini_batch_size": 256,
    f"{AR}.actor.ppo_epochs": 1,
    f"{AR}.actor.use_kl_loss": False,
    f"{AR}.actor.strategy": "fsdp",
    f"{AR}.actor.megatron.tensor_model_parallel_size": 1,
    f"{AR}.rollout.n": 1,
    f"{AR}.rollout.name": "vllm",
    f"{AR}.rollout.tensor_model_parallel_size": 2,
    f"{AR}.rollout.gpu_memory_utilization": 0.5,
    f"{AR}.rollout.max_num_seqs": 256,
    f"{AR}.rollout.max_num_batched_tokens": 8192,
    f"{AR}.rollout.enable_chunked_prefill": True,
    f"{AR}.rollout.enable_prefix_caching": True,
    f"{AR}.rollout.mode": "async",
    f"{AR}.rollout.dtype": "bfloat16",
    f"{AR}.rollout.enforce_eager": False,
    f"{AR}.rollout.free_cache_engine": True,
    f"{AR}.hybrid_engine": True,
    "critic.megatron.tensor_model_parallel_size": 1,
    "reward_model.enable": False,
    "reward_model.enable_resource_pool": False,
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 8,
}
DEFAULTS_RELEASE = "ppo_trainer.yaml, main 2026-01"

# Settings that set a scenario field (the conversion is in ``_build``).
MAPPED: dict[str, str] = {
    "algorithm.adv_estimator": "algorithm.kind (gae: ppo with a critic; grpo/rloo and other critic-free estimators: grpo/rloo)",
    "algorithm.use_kl_in_reward": "models.reference (verl runs the reference policy when a KL term is used)",
    f"{AR}.actor.use_kl_loss": "models.reference (verl runs the reference policy when a KL term is used)",
    "data.train_batch_size": "workload.prompts_per_step",
    "data.max_prompt_length": "workload.max_prompt_tokens",
    "data.max_response_length": "workload.max_response_tokens",
    f"{AR}.rollout.response_length": "workload.max_response_tokens",
    f"{AR}.rollout.prompt_length": "workload.max_prompt_tokens",
    f"{AR}.rollout.n": "algorithm.group_size",
    f"{AR}.model.path": "models.actor.model (and models.reference.model)",
    "critic.model.path": "models.critic.model",
    "reward_model.enable": "models.reward (kind: model when true, else kind: rule)",
    "reward_model.model.path": "models.reward.model",
    "reward_model.enable_resource_pool": "placement (the reward model on its own pool)",
    "reward_model.n_gpus_per_node": "placement pool of the reward model",
    "reward_model.nnodes": "placement pool of the reward model",
    f"{AR}.actor.ppo_mini_batch_size": "algorithm.minibatch_size (x rollout.n: verl counts it in prompts)",
    f"{AR}.actor.ppo_epochs": "algorithm.ppo_epochs",
    "critic.ppo_epochs": "algorithm.ppo_epochs (must equal the actor's)",
    "critic.ppo_mini_batch_size": "algorithm.minibatch_size (must equal the actor's)",
    "trainer.n_gpus_per_node": "cluster.gpus_per_node",
    "trainer.nnodes": "cluster.nodes",
    f"{AR}.hybrid_engine": "placement: colocated",
    f"{AR}.rollout.tensor_model_parallel_size": "placement.tp.rollout",
    f"{AR}.rollout.expert_parallel_size": "generation.parallel.ep (verl requires tensor_model_parallel_size x "
                                          "data_parallel_size)",
    f"{AR}.rollout.data_parallel_size": "generation.parallel.dp_attention (data-parallel attention ranks of an "
                                        "expert-parallel engine; without EP the replicas are pool GPUs / TP already)",
    f"{AR}.rollout.engine_kwargs.sglang.enable_dp_attention": "generation.parallel.dp_attention (SGLang)",
    f"{AR}.rollout.engine_kwargs.sglang.ep_num_redundant_experts": "generation.parallel.redundant_experts (SGLang)",
    f"{AR}.rollout.engine_kwargs.sglang.enable_two_batch_overlap": "generation.parallel.two_batch_overlap (SGLang)",
    f"{AR}.rollout.engine_kwargs.vllm.num_redundant_experts": "generation.parallel.redundant_experts (vLLM EPLB)",
    f"{AR}.rollout.engine_kwargs.vllm.enable_dbo": "generation.parallel.two_batch_overlap (vLLM dual-batch overlap)",
    f"{AR}.actor.megatron.tensor_model_parallel_size": "placement.tp.actor and placement.tp.reference",
    f"{AR}.ref.megatron.tensor_model_parallel_size": "placement.tp.reference",
    "critic.megatron.tensor_model_parallel_size": "placement.tp.critic",
    f"{AR}.rollout.name": "generation.engine and generation.runtime",
    f"{AR}.rollout.max_num_seqs": "generation.max_batch (vLLM's max_num_seqs; SGLang's max_running_requests from verl 0.6)",
    f"{AR}.rollout.max_num_batched_tokens": "generation.max_num_batched_tokens (vLLM's per-step token budget)",
    f"{AR}.rollout.enable_chunked_prefill": "generation.chunked_prefill (vLLM V0; V1 always chunks)",
    f"{AR}.rollout.enable_prefix_caching": "generation.prefix_caching (a prompt's samples share its prefill; verl 0.3-0.5 "
                                           "hard-coded it on)",
    f"{AR}.rollout.mode": "generation.dispatch (sync: whole prompts per engine; async: each sample to a server) and "
                          "generation.runtime (the async server is vLLM's V1 AsyncLLM)",
    f"{AR}.rollout.enforce_eager": "generation.runtime (True with vLLM: vllm_eager, vLLM without CUDA graphs)",
    f"{AR}.rollout.free_cache_engine": "execution.weight_sync.engine_sleep (vLLM's sleep and wake_up, verl >= 0.3)",
    f"{AR}.rollout.gpu_memory_utilization": "generation.kv_cache_fraction (vLLM's share of the whole GPU, turned into the share of what the resident models leave)",
    f"{AR}.rollout.dtype": "models.*.dtype",
    f"{AR}.actor.strategy": "placement.tp (megatron reads its tensor-parallel degrees; fsdp/fsdp2 shard data-parallel)",
}
# Megatron's degrees beside TP (strategy megatron): verl's key -> execution.megatron.ROLE field. The reference takes
# the actor's where the launch leaves its own out (verl's ppo_megatron_trainer.yaml interpolates them so).
MEGATRON_DEGREES = {"pipeline_model_parallel_size": "pp", "virtual_pipeline_model_parallel_size": "vpp",
                    "context_parallel_size": "cp", "expert_model_parallel_size": "ep"}
# Megatron's settings that are unset unless the launch sets them (Megatron-core's defaults: expert tensor parallelism
# = tp, an even pipeline): verl's key under ROLE's megatron prefix -> execution.megatron.ROLE field.
MEGATRON_OPTIONAL = {"expert_tensor_parallel_size": "etp",
                     "override_transformer_config.num_layers_in_first_pipeline_stage": "first_stage_layers",
                     "override_transformer_config.num_layers_in_last_pipeline_stage": "last_stage_layers"}
MEGATRON_PREFIX = {"actor": f"{AR}.actor.megatron", "reference": f"{AR}.ref.megatron", "critic": "critic.megatron"}
MAPPED.update({f"{MEGATRON_PREFIX[role]}.{k}": f"execution.megatron.{role}.{f}"
               + (" (and the reference's, unless set)" if role == "actor" else "")
               for role in MEGATRON_PREFIX for k, f in {**MEGATRON_DEGREES, **MEGATRON_OPTIONAL}.items()})

# (pattern, reason): recognised, costs nothing in this model.
NO_COST: list[tuple[str, str]] = [
    (r"(^|\.)optim\.|\.lr$|_lr$|lr_warmup|warmup_style|weight_decay|\.betas", "optimizer hyper-parameter"),
    (r"clip_ratio|cliprange|grad_clip|clip_grad|entropy_coeff|kl_loss_coef|kl_loss_type|kl_ctrl|kl_penalty|"
     r"\.gamma$|\.lam$|loss_agg_mode|norm_adv_by_std_in_grpo|policy_loss|loss_mode|loss_scale_factor|kl_coef",
     "loss hyper-parameter"),
    (r"temperature|top_p|top_k|do_sample|ignore_eos", "sampling (it changes lengths, which are given separately)"),
    (r"^data\.(train_files|val_files|prompt_key|reward_fn_key|filter_overlong_prompts.*|truncation|shuffle|seed|"
     r"dataloader_num_workers|return_raw_chat|return_raw_input_ids|return_full_prompt|val_batch_size|image_key|"
     r"custom_cls.*|tokenizer|train_max_samples|val_max_samples|apply_chat_template_kwargs.*|trust_remote_code)$",
     "data loading"),
    (r"^trainer\.(logger|project_name|experiment_name|default_local_dir|default_hdfs_dir|resume_mode|resume_from_path|"
     r"val_before_train|val_only|total_epochs|total_training_steps|log_val_generations|rollout_data_dir|"
     r"validation_data_dir|max_actor_ckpt_to_keep|max_critic_ckpt_to_keep|del_local_ckpt_after_load|"
     r"ray_wait_register_center_timeout|device|use_legacy_worker_impl|esi_redundant_time)$", "run bookkeeping"),
    (r"^ray_init\.|^ray_kwargs\.|^hydra\.|^global_profiler\.|\.profiler\.|^trainer\.npu_profile", "launcher or profiler"),
    (r"^custom_reward_function\.|reward_manager|^reward_model\.reward_kwargs|launch_reward_fn_async",
     "reward function (priced as the rule reward's CPU cost)"),
    (r"val_kwargs\.|n_val$|val_temperature$|^trainer\.val_", "validation sampling (not part of a training step)"),
    (r"(^|\.)model\.(external_lib|override_config.*|trust_remote_code|custom_chat_template|tokenizer_path|use_shm|"
     r"hf_config_path)$", "model loading"),
    (r"checkpoint\.|\.seed$|full_determinism|data_loader_seed|\.shuffle$", "run bookkeeping"),
    (r"^critic\.model\.tokenizer_path$|^critic\.optim|^critic\.grad_clip", "optimizer hyper-parameter"),
    (r"\.load_format$|\.layered_summon$|skip_tokenizer_init|disable_log_stats|\.trace\.", "engine start-up"),
    (r"^trainer\.critic_warmup$", "critic warm-up steps (0 after the first steps)"),
    (r"^algorithm\.rollout_correction|rollout_is|rollout_rs", "off-policy correction weights (elementwise)"),
    (r"nccl_timeout|wrap_policy|use_orig_params|fsdp_size$|forward_prefetch|reshard_after_forward|model_dtype|"
     r"mixed_precision", "FSDP wrapping detail"),
]

# (pattern, what it does): recognised, can change the step time, no scenario field (yet).
# The first five catch what rlhfsim.importers.verl_execution does not read (another model's copy of a setting).
UNMAPPED: list[tuple[str, str]] = [
    (r"micro_batch_size", "micro-batch size of a model the scenario does not size separately"),
    (r"use_dynamic_bsz|max_token_len_per_gpu", "token budget of a model the scenario does not size separately"),
    (r"use_remove_padding", "packing of a model the scenario does not set separately"),
    (r"enable_gradient_checkpointing", "checkpointing of a model the scenario does not set separately"),
    (r"param_offload|optimizer_offload|grad_offload|offload_policy", "offload of a model the scenario does not set separately"),
    (r"enable_activation_offload", "activation offload (no scenario field)"),
    (r"ulysses_sequence_parallel_size", "sequence parallelism of a model the scenario does not set separately"),
    (r"lora_rank|lora_alpha|target_modules", "LoRA adapters train far fewer weights (not modelled)"),
    (r"^trainer\.test_freq$", "validation every N steps adds its time to those steps (not simulated; compare steps without it)"),
    (r"^trainer\.save_freq$", "checkpoint saves add their time to those steps (not simulated)"),
    (r"use_fused_kernels|use_liger|use_torch_compile|entropy_from_logits_with_chunking|entropy_checkpointing",
     "kernel choice (the profile prices one implementation)"),
    (r"megatron\.(pipeline_model_parallel_size|virtual_pipeline|context_parallel|expert)",
     "Megatron parallelism of a model the scenario does not set separately"),
    (r"megatron\.sequence_parallel", "Megatron's sequence parallelism (taken as on: the expert all-to-all splits tokens "
     "over TP)"),
    (r"rollout\.pipeline_model_parallel_size", "engine pipeline parallelism (not modelled)"),
    (r"rollout\.(engine_kwargs\.\w+\.|)(enable_expert_parallel|all2all_backend|moe_a2a_backend|deepep_mode|enable_eplb)$",
     "expert-parallel backend choice (generation.parallel.ep sets EP; the all-to-all is priced as DeepEP's "
     "low-latency kernels send it)"),
    (r"multi_turn|agent\.|tool_config", "multi-turn / agent rollouts (not modelled)"),
    (r"^algorithm\.use_pf_ppo|^algorithm\.pf_ppo", "prioritized replay (not modelled)"),
    (r"critic\.ppo_epochs|critic\.ppo_mini_batch_size", "critic epochs/minibatch differing from the actor's (one value in the scenario)"),
]

# rollout.name -> (generation.engine, generation.runtime); sglang_async is verl 0.3's multi-turn SGLang engine.
ENGINES = {"vllm": ("continuous", "vllm"), "sglang": ("continuous", "sglang"), "sglang_async": ("continuous", "sglang"),
           "hf": ("static", "hf_generate")}
STANDARD_CONFIGS = ("ppo_trainer", "ppo_megatron_trainer")

# Defaults that changed between verl releases: setting -> (first release with the current default, the
# default before it, why). rollout.enforce_eager became False on 2025-08-08 (verl #2956, "enable vllm cuda
# graph in default"), first released in v0.6.0; v0.1-v0.5 printed True.
VERSIONED: dict[str, tuple[tuple[int, int], object, str]] = {
    f"{AR}.rollout.enforce_eager": ((0, 6), True, "verl #2956 (2025-08-08) made CUDA graphs the default in v0.6.0"),
    f"{AR}.rollout.max_num_seqs": ((0, 9), 1024, "ppo_trainer.yaml / rollout.yaml said 1024 from v0.2 to v0.8; 256 "
                                   "since verl d908005 (2026-08-04), first released in v0.9.0"),
    f"{AR}.rollout.mode": ((0, 7), "sync", "verl #4106 (2025-11-18) made the async server mode the default, first "
                           "released in v0.7.0; async exists from v0.4.1"),
    f"{AR}.rollout.calculate_log_probs": ((0, 9), False, "rollout.yaml said False through v0.8.0 and True in v0.9.0"),
}

# SGLang's own limits where verl passes none (verl < 0.6 builds its engine with mem_fraction_static alone; 0.6 passes
# max_running_requests = max_num_seqs): SGLang 0.4's chunked_prefill_size (8192 tokens on a GPU of 25 GB or more, 2048
# below), its prefill steps separate from decode steps (enable_mixed_chunk off), and its max_running_requests derived
# from the KV pool (ModelRunner: min(max(tokens / context_len x 512, 2048), 4096), then at most tokens / 2).
SGLANG_OWN_LIMITS_BEFORE = (0, 6)
SGLANG_CHUNK = {True: 8192, False: 2048}   # chunked_prefill_size by GPU memory >= 25 GB

# The vLLM engine a verl launch ran (``rlhfsim.costs.genruntimes``: vllm/vllm_eager are V1, vllm_v0/vllm_v0_eager V0).
# verl 0.2 pinned vLLM <= 0.6.3 (V0 only; verl's docs for vLLM 0.7 say to export VLLM_USE_V1=1 for V1); verl 0.3-0.5
# pinned vLLM 0.8.x (setup.py: vllm<=0.8.2, <=0.8.5), whose default engine is V1 unless the launch sets
# VLLM_USE_V1=0 or an attention backend V1 lacks (VLLM_ATTENTION_BACKEND=XFORMERS, which verl's examples exported
# until verl's docs for vLLM 0.8 said to remove it: vLLM's V1 oracle then falls back to V0); later releases run V1.
V1_FROM = (0, 3)
V0_RUNTIME = {"vllm": "vllm_v0", "vllm_eager": "vllm_v0_eager"}
# Attention backends vLLM 0.8-0.9's V1 engine accepts (vllm/engine/arg_utils.py, _is_v1_supported_oracle): any other
# value of VLLM_ATTENTION_BACKEND falls back to V0.
V1_BACKENDS = ("FLASH_ATTN", "FLASH_ATTN_VLLM_V1", "FLASHINFER", "FLASHINFER_VLLM_V1", "TRITON_ATTN_VLLM_V1",
               "TRITON_MLA", "FLASHMLA", "PALLAS", "PALLAS_VLLM_V1", "ROCM_AITER_MLA")


def launch_env(text: str) -> dict[str, str]:
    """The ``VLLM_*`` environment variables a launch script sets: ``export NAME=value`` / ``NAME=value`` lines and
    assignments in front of the command (``VLLM_USE_V1=1 python3 -m ...``); the last one of each name wins."""
    env: dict[str, str] = {}
    for line in logical_lines(text):
        try:
            toks = shlex.split(line, comments=True)
        except ValueError:
            continue
        if toks[:1] == ["export"]:
            toks = toks[1:]
        for t in toks:
            m = re.fullmatch(r"(VLLM_\w+)=(.*)", t)
            if not m:
                break   # assignments come first on a line: the command begins here
            env[m.group(1)] = m.group(2)
    return env


def vllm_engine(runtime: str, env: dict[str, str], version: str | None, a: list[str]) -> str:
    """``runtime`` (vllm or vllm_eager, V1) or its V0 twin, as the launch's environment and verl release choose
    (``V1_FROM``, ``V1_BACKENDS``), saying why in the assumptions."""
    v = parse_version(version) if version is not None else None
    use = env.get("VLLM_USE_V1")
    backend = env.get("VLLM_ATTENTION_BACKEND")
    if use in ("0", "1"):
        why, v1 = f"the launch sets VLLM_USE_V1={use}", use == "1"
    elif backend is not None and backend not in V1_BACKENDS and (v is None or v < (0, 6)):
        why, v1 = (f"the launch sets VLLM_ATTENTION_BACKEND={backend}, which vLLM 0.8's V1 engine lacks: it falls back "
                   f"to V0"), False
    elif v is None:
        why, v1 = "no --verl-version: vLLM's V1 engine, the default of the vLLM that verl >= 0.3 pins", True
    elif v < V1_FROM:
        why, v1 = f"verl {version} pins vLLM <= 0.6.3 (V0 only)", False
    else:
        why, v1 = f"verl {version} pins vLLM >= 0.8, whose default engine is V1", True
    out = runtime if v1 else V0_RUNTIME[runtime]
    a.append(f"vLLM engine {'V1' if v1 else 'V0'} ({why}): generation.runtime {out}")
    return out


def parse_version(text: str) -> tuple[int, int]:
    """``0.4``, ``v0.5.0``, ``0.3.0.post1`` -> (major, minor)."""
    m = re.fullmatch(r"v?(\d+)\.(\d+)(\.[0-9A-Za-z.+-]*)?", str(text).strip())
    if not m:
        raise ImportError_(f"--verl-version: expected a release such as 0.4 or v0.5.0, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def versioned_defaults(cfg: dict, seen: dict, version: str | None, a: list[str]) -> None:
    """Put the defaults of the launch's verl release (``--verl-version``) into ``cfg`` for the ``VERSIONED``
    settings the launch leaves out, saying which default each unset one took."""
    v = parse_version(version) if version is not None else None
    for key, (since, before, why) in VERSIONED.items():
        if key in seen:
            continue
        short = key.removeprefix(AR + ".")
        if v is None:
            a.append(f"{short} not set: verl's current default {cfg[key]} ({why}; before it the default was {before}: "
                     f"pass --verl-version for an older release)")
        elif v < since:
            cfg[key] = before
            a.append(f"{short} not set: {before}, the default of verl {version} ({why})")
        else:
            a.append(f"{short} not set: {cfg[key]}, the default of verl {version}")

CRITIC_FREE = {"grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "opo", "gpg",
               "grpo_passk", "rloo_vectorized", "grpo_vectorized", "optimal_token_baseline", "drgrpo"}


def read_overrides(text: str, is_yaml: bool) -> list[tuple[str, str]]:
    """(key, raw value) pairs in launch order. YAML: the config's leaves as dotted keys (interpolations
    ``${...}`` are verl's own defaults and are skipped)."""
    if is_yaml:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ImportError_(f"verl config: expected valid YAML, got {str(e).splitlines()[0]}") from None
        if not isinstance(doc, dict):
            raise ImportError_(f"verl config: expected a mapping at the top level, got {type(doc).__name__}")
        out: list[tuple[str, str]] = []
        _flatten(doc, "", out)
        return out
    pairs = []
    toks = launch_tokens(text, MARKERS, "verl launch")
    i = 0
    while i < len(toks):
        t = toks[i]
        if t in ("--config-path", "--config-name", "--config-dir", "-cp", "-cn"):
            val = toks[i + 1] if i + 1 < len(toks) else ""
            pairs.append((t.lstrip("-"), val))
            i += 2
            continue
        if t.startswith("--config-"):
            k, _, v = t.partition("=")
            pairs.append((k.lstrip("-"), v))
        elif "=" in t and not t.startswith("-"):
            k, _, v = t.partition("=")
            pairs.append((k.lstrip("+"), v))
        elif not any(mk in text for mk in MARKERS):
            raise ImportError_(_not_a_launch(text))
        else:
            raise ImportError_(f"verl launch: expected Hydra overrides key=value after {MARKERS[0]}, got "
                               + (f"the option {t!r}" if t.startswith("-") else repr(t)))
        i += 1
    return pairs


def _not_a_launch(text: str) -> str:
    """What a verl launch is, for text that holds none (no command runs verl's trainer, and it is not the bare
    overrides either): real launches start with python3 too, so the message names the trainer, not the word."""
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
    return (f"verl launch: expected a command running {MARKERS[0]} (python3 -m {MARKERS[0]} key=value ...), its "
            f"Hydra overrides alone (key=value ...) or a verl YAML config (.yaml); got {first[:80]!r}, which runs no "
            f"verl trainer")


def _flatten(node, prefix: str, out: list) -> None:
    for k, v in node.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            _flatten(v, key + ".", out)
        elif isinstance(v, str) and "${" in v:
            continue
        else:
            out.append((key, v if isinstance(v, str) else yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()))


def classify(key: str, seen: dict | None = None, recipe: str | None = None) -> tuple[str, str]:
    """(status, target or reason) of one verl key (``seen``: the launch's settings, for per-model copies; ``recipe``:
    the async recipe the launch runs, ``verl_async.recipe``)."""
    if recipe is not None and key in verl_async.RECIPE_MAPPED:
        return "mapped", verl_async.RECIPE_MAPPED[key]
    if key in MAPPED:
        return "mapped", MAPPED[key]
    hit = verl_async.classify(key) or verl_execution.classify(key, seen or {})
    if hit is not None:
        return hit
    if key.startswith("~"):
        return "unmapped", "removes a config entry (not interpreted)"
    if key in ("config-path", "config-dir"):
        return "no_cost", "where Hydra finds the config"
    if key == "config-name":
        return "mapped", ("the base config (ppo_trainer; ppo_megatron_trainer: Megatron strategy; the async recipes' "
                          "one_step_off_ppo_trainer and fully_async_ppo_trainer: separate pools)")
    return classify_by_patterns(key, UNMAPPED, NO_COST)


def import_verl(text: str, opts: ImportOptions, source: str = "launch", is_yaml: bool = False) -> ImportResult:
    """Read a verl launch (or config) into a scenario mapping with its settings record."""
    pairs = read_overrides(text, is_yaml)
    for s in opts.sets:
        k, eq, v = s.partition("=")
        if not eq:
            raise ImportError_(f"--set: expected key=value, got {s!r}")
        pairs.append((k.lstrip("+"), v))
    res = ImportResult("verl", source, {})
    seen: dict[str, str] = {k: str(v) for k, v in pairs}
    recipe = verl_async.recipe(text, seen)
    cfg = {**DEFAULTS, **verl_execution.DEFAULTS}
    if recipe is not None:
        # the recipes' configs: separate pools, the engine kept awake (free_cache_engine False: the NCCL sync needs it)
        cfg.update({**verl_async.DEFAULTS, f"{AR}.hybrid_engine": False, f"{AR}.rollout.free_cache_engine": False,
                    f"{AR}.rollout.calculate_log_probs": True})
    for k, v in seen.items():
        status, target = classify(k, seen, recipe)
        res.settings.append(Setting(k, v, status, target))
        if status == "mapped":
            var = unresolved(v)
            if var:
                raise ImportError_(f"{k}: expected a value, got the unset shell variable {var} "
                                   f"(define it in the script or pass --set {k}=VALUE)")
            cfg[k] = parse_scalar(v)
    base = str(cfg.get("config-name", "ppo_trainer")).removesuffix(".yaml")
    if base.endswith("megatron_trainer"):
        cfg[f"{AR}.actor.strategy"] = "megatron"
    if base not in STANDARD_CONFIGS and base not in verl_async.CONFIGS:
        res.settings = [s for s in res.settings if s.key != "config-name"]
        res.settings.append(Setting("config-name", base, "unmapped", "a config file of its own: only the launch's overrides are "
                                    "read, not that file's settings (the rest take verl's defaults)"))
    left = sorted(k for k in DEFAULTS if k not in seen and k not in VERSIONED and not k.startswith(("critic.", "reward_model.")))
    res.assumptions.append(f"verl's defaults ({DEFAULTS_RELEASE}) for settings the launch leaves out: "
                           + ", ".join(f"{k.removeprefix(AR + '.')}={cfg[k]}" for k in left))
    res.scenario = _build(cfg, seen, opts, res, {} if is_yaml else launch_env(text), recipe)
    return res


def _int(cfg: dict, key: str, lo: int = 1) -> int:
    return setting_int(cfg, key, key, lo)


def _bool(cfg: dict, key: str) -> bool:
    return setting_bool(cfg, key, key, "True or False")


def _build(cfg: dict, seen: dict, opts: ImportOptions, res: ImportResult, env: dict[str, str],
           recipe: str | None = None) -> dict:
    a = res.assumptions
    est = str(cfg["algorithm.adv_estimator"])
    if est == "gae":
        kind = "ppo"
    elif est in ("grpo", "rloo"):
        kind = est
    elif est in CRITIC_FREE:
        kind = "grpo"
        a.append(f"algorithm.adv_estimator={est} priced as grpo (critic-free; the advantage arithmetic costs nothing here)")
    else:
        raise ImportError_(f"algorithm.adv_estimator: expected gae, grpo, rloo or another verl estimator "
                           f"({', '.join(sorted(CRITIC_FREE))}), got {est!r}")
    n = _int(cfg, f"{AR}.rollout.n")
    if f"{AR}.model.path" not in cfg:
        raise ImportError_(f"{AR}.model.path: expected the actor's model, got nothing (the launch must set it)")
    actor, how = model_ref(f"{AR}.model.path", str(cfg[f"{AR}.model.path"]))
    a.append(f"actor shape: {how}")
    dtype = str(cfg[f"{AR}.rollout.dtype"])
    dtype = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}.get(dtype, dtype)
    if dtype not in ("bfloat16", "float16", "float32"):
        raise ImportError_(f"{AR}.rollout.dtype: expected bfloat16, float16 or float32, got {dtype!r}")
    models: dict = {"actor": {"model": actor, "dtype": dtype}}
    if kind == "ppo":
        if "critic.model.path" in cfg:
            critic, how = model_ref("critic.model.path", str(cfg["critic.model.path"]))
        else:
            critic, how = actor, "the actor's"
            a.append("critic.model.path not set: the critic takes the actor's shape")
        models["critic"] = {"model": critic, "dtype": dtype}
    kl_loss, kl_reward = _bool(cfg, f"{AR}.actor.use_kl_loss"), _bool(cfg, "algorithm.use_kl_in_reward")
    if kl_loss or kl_reward:
        models["reference"] = {"model": actor, "dtype": dtype}
    else:
        a.append("no reference pass: neither actor.use_kl_loss nor algorithm.use_kl_in_reward is set "
                 "(verl releases before 0.3 ran the reference policy always)")
    rm_pool = None
    if _bool(cfg, "reward_model.enable"):
        if "reward_model.model.path" not in cfg:
            raise ImportError_("reward_model.model.path: expected the reward model with reward_model.enable=True, got nothing")
        rm, _ = model_ref("reward_model.model.path", str(cfg["reward_model.model.path"]))
        models["reward"] = {"kind": "model", "model": rm, "dtype": dtype}
        if _bool(cfg, "reward_model.enable_resource_pool"):
            rm_pool = _int(cfg, "reward_model.n_gpus_per_node") * _int(cfg, "reward_model.nnodes") if (
                "reward_model.n_gpus_per_node" in cfg and "reward_model.nnodes" in cfg) else None
            if rm_pool is None:
                raise ImportError_("reward_model.n_gpus_per_node: expected it and reward_model.nnodes with enable_resource_pool=True")
    else:
        models["reward"] = {"kind": "rule"}
        a.append("reward: a function on the driver, priced as the rule reward's defaults (1 ms per response, 8 workers)")

    nodes, per_node = _int(cfg, "trainer.nnodes"), _int(cfg, "trainer.n_gpus_per_node")
    if opts.gpu is None:
        raise ImportError_("--gpu: expected the GPU the run used (a verl launch does not name it), got nothing")
    cluster = {"gpu": opts.gpu, "nodes": nodes, "gpus_per_node": per_node}
    if recipe is None and not _bool(cfg, f"{AR}.hybrid_engine"):
        raise ImportError_(f"{AR}.hybrid_engine: expected True (main_ppo runs the hybrid engine; the async recipes "
                           "one_step_off_policy and fully_async_policy run separate pools), got False")
    if recipe is not None and _bool(cfg, f"{AR}.hybrid_engine"):
        raise ImportError_(f"{AR}.hybrid_engine: expected False (verl's {recipe} recipe runs generation on a pool of "
                           "its own), got True")
    strategy = str(cfg[f"{AR}.actor.strategy"])
    tp: dict = {"rollout": _int(cfg, f"{AR}.rollout.tensor_model_parallel_size")}
    if strategy == "megatron":
        tp["actor"] = _int(cfg, f"{AR}.actor.megatron.tensor_model_parallel_size")
        tp["reference"] = _int(cfg, f"{AR}.ref.megatron.tensor_model_parallel_size") if (
            f"{AR}.ref.megatron.tensor_model_parallel_size" in cfg) else tp["actor"]
        if kind == "ppo":
            tp["critic"] = _int(cfg, "critic.megatron.tensor_model_parallel_size")
    elif strategy not in ("fsdp", "fsdp2"):
        raise ImportError_(f"{AR}.actor.strategy: expected fsdp, fsdp2 or megatron, got {strategy!r}")
    total = nodes * per_node
    if rm_pool is not None:
        if rm_pool >= total:
            raise ImportError_(f"reward_model.n_gpus_per_node: expected fewer than the {total} GPUs in total, got a pool of {rm_pool}")
        placement = {"kind": "dedicated_reward", "reward_gpus": rm_pool, "tp": tp}
        a.append(f"the reward model's resource pool ({rm_pool} GPUs) is carved out of trainer.nnodes x n_gpus_per_node")
    else:
        placement = {"kind": "colocated", "tp": tp}
    pools = None
    if recipe is not None:
        if rm_pool is not None:
            raise ImportError_(f"reward_model.enable_resource_pool: expected False with verl's {recipe} recipe (a third "
                               "pool is not read), got True")
        pools = verl_async.pools_and_schedule(recipe, cfg, seen, ["actor", *(r for r in models if r != "actor" and (
            r != "reward" or models[r].get("kind") == "model"))], tp, opts.gpus_per_node, a)
        placement, total = pools["placement"], pools["training_gpus"]
        cluster.update(nodes=pools["nodes"], gpus_per_node=pools["gpus_per_node"])

    name = str(cfg[f"{AR}.rollout.name"])
    engine = ENGINES.get(name)
    if engine is None:
        raise ImportError_(f"{AR}.rollout.name: expected one of {', '.join(ENGINES)}, got {name!r}")
    if f"{AR}.rollout.name" not in seen:
        a.append("rollout.name not set: vllm")
    versioned_defaults(cfg, seen, opts.verl_version, a)
    runtime = engine[1]
    if _bool(cfg, f"{AR}.rollout.enforce_eager"):
        if runtime == "vllm":
            runtime = "vllm_eager"
        else:
            a.append(f"rollout.enforce_eager=True has no effect on a {name} rollout (verl passes it to vLLM only)")
    mode = str(cfg[f"{AR}.rollout.mode"])
    if mode not in ("sync", "async"):
        raise ImportError_(f"{AR}.rollout.mode: expected sync or async, got {mode!r}")
    if runtime in V0_RUNTIME and mode == "async":
        a.append("rollout.mode=async: verl's async server is vLLM's V1 AsyncLLM (generation.runtime "
                 f"{runtime}); each sample is a request of its own, dealt to the servers in turn (generation.dispatch: "
                 "rows); the agent loop's host work per request (tokenizing, an RPC, asyncio) is not priced")
    elif runtime in V0_RUNTIME:
        runtime = vllm_engine(runtime, env, opts.verl_version, a)

    prompts = pools["prompts_per_step"] if pools and pools["prompts_per_step"] else _int(cfg, "data.train_batch_size")
    max_prompt = _int(cfg, f"{AR}.rollout.prompt_length" if f"{AR}.rollout.prompt_length" in seen else "data.max_prompt_length")
    max_resp = _int(cfg, f"{AR}.rollout.response_length" if f"{AR}.rollout.response_length" in seen else "data.max_response_length")
    mini = _int(cfg, f"{AR}.actor.ppo_mini_batch_size")
    for k in ("critic.ppo_mini_batch_size", "critic.ppo_epochs"):
        actor_k = f"{AR}.actor.{k.split('.')[1]}"
        if k in seen and cfg[k] != cfg[actor_k]:
            raise ImportError_(f"{k}: expected the actor's value ({cfg[actor_k]}; the scenario has one), got {cfg[k]}")
    if mini > prompts:
        raise ImportError_(f"{AR}.actor.ppo_mini_batch_size: expected at most data.train_batch_size ({prompts}), got {mini}")

    scenario = {
        "name": opts.name or str(seen.get("trainer.experiment_name", "verl-import")),
        "description": f"Imported from a verl launch ({res.source}); see the header for unmapped settings and assumptions.",
        "models": models,
        "cluster": cluster,
        "placement": placement,
        "algorithm": {"kind": kind, "group_size": n, "ppo_epochs": _int(cfg, f"{AR}.actor.ppo_epochs"),
                      "minibatch_size": mini * n},
        "workload": {
            "prompts_per_step": prompts,
            "prompt_length": prompt_length(opts.mean_prompt_len, max_prompt, a, "data.max_prompt_length",
                                           opts.prompt_source),
            "response_length": response_length(opts.mean_response_len, max_resp, a, "data.max_response_length",
                                               prompts * n, opts.max_response_len_logged, opts.clip_ratio,
                                               opts.lengths_source),
            "max_prompt_tokens": max_prompt,
            "max_response_tokens": max_resp,
        },
        "generation": {"engine": engine[0], "runtime": runtime, "max_batch": _int(cfg, f"{AR}.rollout.max_num_seqs"),
                       **_step_budget(cfg, runtime, opts, a), **_sharing(cfg, runtime, mode, opts, a)},
        "schedule": pools["schedule"] if pools else {"kind": "sync"},
        "steps": opts.steps,
        "warmup_steps": 1 if opts.steps > 1 else 0,
        "seed": 0,
    }
    util = cfg[f"{AR}.rollout.gpu_memory_utilization"]
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 < util <= 1:
        raise ImportError_(f"{AR}.rollout.gpu_memory_utilization: expected a fraction in (0, 1], got {util!r}")
    megatron = _megatron(cfg, models, a) if strategy == "megatron" else {}
    if opts.execution:
        # verl divides a global micro-batch size by the data-parallel ranks: under Megatron, GPUs / (tp x pp x cp)
        lay = megatron.get("actor", {})
        world = total // (tp["actor"] * lay.get("pp", 1) * lay.get("cp", 1)) if strategy == "megatron" else total
        scenario["execution"] = verl_execution.execution(
            cfg, seen, world, models, a, parse_version(opts.verl_version) if opts.verl_version is not None else None,
            hybrid=pools is None)
        if pools is not None:
            scenario["execution"]["old_log_prob"] = pools["old_log_prob"]
        # verl >= 0.3 puts vLLM (>= 0.7) to sleep around training (level 1: its weights offloaded to host memory)
        # and wakes it before the next rollout; verl 0.2's patched vLLM freed the weights with no host copy
        old = opts.verl_version is not None and parse_version(opts.verl_version) < (0, 3)
        if _bool(cfg, f"{AR}.rollout.free_cache_engine") and runtime.startswith("vllm") and not old:
            scenario["execution"]["weight_sync"]["engine_sleep"] = True
            a.append("rollout.free_cache_engine with vLLM: the engine sleeps around training (weights to host memory "
                     "and back: execution.weight_sync.engine_sleep)")
    if megatron:
        scenario.setdefault("execution", {})["megatron"] = megatron
    gen_par = _rollout_parallel(cfg, tp["rollout"], name, a)
    if gen_par:
        scenario["generation"]["parallel"] = gen_par
    try:
        scenario["generation"]["kv_cache_fraction"] = kv_fraction(scenario, float(util), a, runtime, opts.verl_version)
        if runtime == "sglang" and _sglang_own_limits(opts):
            scenario["generation"]["max_batch"] = sglang_max_running(scenario, a)
    except ScenarioError as e:
        raise ImportError_(f"{SCENARIO_TO_VERL.get(e.path, 'the imported scenario')} (scenario {e.path}): {e.message}") from None
    return scenario


def _rollout_parallel(cfg: dict, tp: int, name: str, a: list[str]) -> dict:
    """``generation.parallel`` from verl's rollout degrees: {} without expert parallelism (the engine as before).
    verl builds an engine of tensor_model_parallel_size x data_parallel_size GPUs and requires expert_parallel_size to
    equal it; vLLM then runs attention data-parallel over the DP ranks (its DP with enable_expert_parallel), SGLang
    where engine_kwargs.sglang.enable_dp_attention says so."""
    def opt(key, default=None):
        v = cfg.get(f"{AR}.{key}", default)
        return None if v is None or str(v).lower() in ("null", "none", "~") else v

    def whole(key, default: int, lo: int = 1) -> int:   # a whole number >= lo, else the launch's one-line error
        v = opt(key)
        return default if v is None else _int({f"{AR}.{key}": v}, f"{AR}.{key}", lo)

    ep, dp = whole("rollout.expert_parallel_size", 1), whole("rollout.data_parallel_size", 1)
    if ep <= 1:
        if dp > 1:
            a.append(f"rollout.data_parallel_size={dp} without expert parallelism: each DP rank a replica of its own "
                     "(generation replicas = pool GPUs / TP, as without it)")
        return {}
    if ep != tp * dp:
        raise ImportError_(f"{AR}.rollout.expert_parallel_size: expected tensor_model_parallel_size x "
                           f"data_parallel_size ({tp} x {dp} = {tp * dp}; verl's rollout config asserts it), got {ep}")
    out: dict = {"ep": ep}
    if dp > 1:
        sglang_dp = opt("rollout.engine_kwargs.sglang.enable_dp_attention")
        if name.startswith("sglang") and sglang_dp is not None and str(sglang_dp).lower() == "false":
            raise ImportError_(f"{AR}.rollout.engine_kwargs.sglang.enable_dp_attention: expected True with "
                               f"data_parallel_size {dp} and expert parallelism (attention over ep GPUs without it is "
                               "not modelled), got False")
        out["dp_attention"] = True
        if name.startswith("sglang") and sglang_dp is None:
            a.append("rollout.engine_kwargs.sglang.enable_dp_attention not set with expert parallelism over DP ranks: "
                     "taken as on (the experts span the DP ranks only with it)")
        a.append(f"rollout EP {ep} = TP {tp} x DP {dp}: {dp} data-parallel attention ranks per engine, each a replica "
                 "with its own batch and KV cache, stepping together through the expert all-to-alls")
    redundant = whole("rollout.engine_kwargs.sglang.ep_num_redundant_experts" if name.startswith("sglang") else
                      "rollout.engine_kwargs.vllm.num_redundant_experts", 0, lo=0)
    if redundant > 0:
        out["redundant_experts"] = redundant
    tbo = opt("rollout.engine_kwargs.sglang.enable_two_batch_overlap") if name.startswith("sglang") else \
        opt("rollout.engine_kwargs.vllm.enable_dbo")
    if tbo is not None and str(tbo).lower() == "true":
        out["two_batch_overlap"] = True
    return out


def _megatron(cfg: dict, models: dict, a: list[str]) -> dict:
    """``execution.megatron`` from verl's Megatron degrees (``MEGATRON_DEGREES``) of each trained or forward-only model
    the scenario has: {} where every degree is 1 (nothing beside TP)."""
    out: dict = {}
    actor: dict = {}
    for role, prefix in MEGATRON_PREFIX.items():
        if role != "actor" and role not in models:
            continue
        got = {}
        for key, field in MEGATRON_DEGREES.items():
            k = f"{prefix}.{key}"
            v = cfg.get(k)
            if v is None or str(v).lower() in ("null", "none", "~"):
                got[field] = actor.get(field, 1) if role == "reference" else 1
            else:
                got[field] = _int(cfg, k)
        for key, field in MEGATRON_OPTIONAL.items():   # only where set (the reference: the actor's unless its own)
            v = cfg.get(f"{prefix}.{key}")
            if v is not None and str(v).lower() not in ("null", "none", "~"):
                got[field] = _int(cfg, f"{prefix}.{key}")
            elif role == "reference" and field in actor:
                got[field] = actor[field]
        if role == "actor":
            actor = got
        if any(v != 1 for v in got.values()):
            out[role] = got
    if out:
        a.append("strategy megatron: " + "; ".join(f"{r} " + " ".join(f"{f} {v}" for f, v in d.items() if v != 1)
                                                   for r, d in out.items())
                 + " (execution.megatron: the pipeline bubble, stage-to-stage sends, context ring and expert all-to-all "
                 "priced in training and forward passes)")
    return out


def _sglang_own_limits(opts: ImportOptions) -> bool:
    """Does verl leave SGLang's step budget and running limit to SGLang (verl < 0.6; unknown release: yes)?"""
    return opts.verl_version is None or parse_version(opts.verl_version) < SGLANG_OWN_LIMITS_BEFORE


def _step_budget(cfg: dict, runtime: str, opts: ImportOptions, a: list[str]) -> dict:
    """generation.max_num_batched_tokens and chunked_prefill of the continuous engine: vLLM's max_num_batched_tokens;
    chunked steps on V1 (always) and on V0 with enable_chunked_prefill; SGLang's own chunked_prefill_size before verl
    0.6 (``SGLANG_OWN_LIMITS_BEFORE``), with prefill steps of their own (SGLang mixes no decode into them)."""
    if runtime == "hf_generate":
        return {}
    budget = _int(cfg, f"{AR}.rollout.max_num_batched_tokens")
    if runtime == "sglang":
        if _sglang_own_limits(opts):
            big = get_gpu(opts.gpu).mem_bytes >= 25e9
            budget = SGLANG_CHUNK[big]
            a.append(f"SGLang before verl 0.6: its own chunked_prefill_size {budget} (GPU memory {'>=' if big else '<'} "
                     f"25 GB) and max_running_requests (from its KV pool; rollout.max_num_seqs and "
                     f"max_num_batched_tokens are not passed to it)")
        return {"max_num_batched_tokens": budget, "chunked_prefill": False}
    v0 = runtime.startswith("vllm_v0")
    chunked = _bool(cfg, f"{AR}.rollout.enable_chunked_prefill") if v0 else True
    if not v0 and not _bool(cfg, f"{AR}.rollout.enable_chunked_prefill"):
        a.append("rollout.enable_chunked_prefill=False has no effect on vLLM's V1 engine, whose steps always mix "
                 "prefill chunks and decodes")
    return {"max_num_batched_tokens": budget, "chunked_prefill": chunked}


def _sharing(cfg: dict, runtime: str, mode: str, opts: ImportOptions, a: list[str]) -> dict:
    """generation.prefix_caching and dispatch of the continuous engine. A prompt's samples share its prefill: SGLang's
    radix cache (on by default); vLLM's prefix caching (verl 0.3-0.5 pass enable_prefix_caching=True whatever the
    config says; from 0.6 the config's, default True), and on V0 the n samples of SamplingParams(n) fork from one
    prefill. The synchronous rollout hands each engine whole prompts (dispatch: prompts); the async server mode each
    sample to a server in turn (dispatch: rows: a prompt's samples mostly on different servers)."""
    if runtime == "hf_generate":
        return {}
    key = f"{AR}.rollout.enable_prefix_caching"
    v = parse_version(opts.verl_version) if opts.verl_version is not None else None
    share = True
    if runtime in ("vllm", "vllm_eager") and (v is None or v >= (0, 6)):
        share = _bool(cfg, key)
    elif key in cfg and not _bool(cfg, key):
        a.append(f"rollout.enable_prefix_caching=False is not passed to the engine by verl {opts.verl_version} "
                 f"({'SGLang keeps its radix cache' if runtime == 'sglang' else 'vLLM gets True; V0 forks the samples of a prompt from one prefill'})")
    return {"prefix_caching": share, "dispatch": "prompts" if mode == "sync" else "rows"}


def sglang_max_running(scenario: dict, assumptions: list[str]) -> int:
    """SGLang's max_running_requests when none is passed (``SGLANG_OWN_LIMITS_BEFORE``): from the KV pool of a
    replica, T tokens, and the model's context length C: min(min(max(T / C x 512, 2048), 4096), T // 2)."""
    from rlhfsim.scenario.checks import build_setup
    from rlhfsim.scenario.loader import load_scenario

    setup = build_setup(load_scenario(scenario, check=False))
    tokens = setup.kv_capacity_tokens
    ctx = setup.shapes["actor"].max_positions
    out = max(min(min(max(int(tokens / ctx * 512), 2048), 4096), tokens // 2), 1)
    assumptions.append(f"SGLang's max_running_requests: {out} (a KV pool of {tokens} tokens per replica, context length "
                       f"{ctx}): generation.max_batch")
    return out


# The launch setting behind a scenario path that the scenario checks reject (tensor-parallel degrees, memory).
SCENARIO_TO_VERL = {
    "placement.tp.rollout": f"{AR}.rollout.tensor_model_parallel_size",
    "generation.parallel.ep": f"{AR}.rollout.expert_parallel_size",
    "placement.tp.actor": f"{AR}.actor.megatron.tensor_model_parallel_size / trainer.n_gpus_per_node",
    "placement.tp.reference": f"{AR}.ref.megatron.tensor_model_parallel_size / trainer.n_gpus_per_node",
    "placement.tp.critic": "critic.megatron.tensor_model_parallel_size / trainer.n_gpus_per_node",
    "placement.reward_gpus": "reward_model.n_gpus_per_node",
    **{f"execution.megatron.{role}{sub}": f"{MEGATRON_PREFIX[role]}.*" for role in MEGATRON_PREFIX
       for sub in ("", ".pp", ".vpp", ".ep", ".etp", ".first_stage_layers", ".last_stage_layers")},
    "execution.micro_batch.ppo_max_token_len_per_gpu": f"{AR}.actor.ppo_max_token_len_per_gpu",
}


# vLLM's profile run (V0 ``determine_num_available_blocks``, V1 ``determine_available_memory``) takes the peak of a
# dummy step of max_num_batched_tokens tokens over max_num_seqs rows out of the KV cache: the sampler's logits of every
# row (bf16 from the head, a float32 copy, float32 probabilities: about 10 bytes per logit, ``PROFILE_LOGIT_BYTES``) and
# the MLP's gate and up projections of every token (2 x intermediate / TP values in the model's dtype). CUDA graphs are
# captured after the KV cache is allocated (out of the 1 - gpu_memory_utilization left), so they take none of it.
PROFILE_LOGIT_BYTES = 10


def engine_weights(setup) -> float:
    """The generation engine's weights per GPU: W / tp, or under expert parallelism 1/tp of the dense weights and its
    (E + R) / ep whole experts (``genparallel.engine_weight_bytes``)."""
    from rlhfsim.costs.genparallel import engine_weight_bytes
    from rlhfsim.models.catalog import DTYPE_BYTES

    shape, b, tp = setup.shapes["rollout"], DTYPE_BYTES[setup.dtypes["rollout"]], setup.tp["rollout"]
    if setup.gen_parallel is not None:
        return engine_weight_bytes(shape, b, setup.gen_parallel)
    return shape.params("lm") * b / tp


def profile_peak_bytes(gen: dict, shape, dtype: str, tp: int, runtime: str) -> float:
    """The peak of vLLM's profile run per GPU (``PROFILE_LOGIT_BYTES``): max_num_seqs rows' logits and the MLP of
    max_num_batched_tokens tokens; 0 for another engine."""
    from rlhfsim.models.catalog import DTYPE_BYTES

    if not runtime.startswith("vllm"):
        return 0.0
    tokens = gen.get("max_num_batched_tokens") or 0
    return gen["max_batch"] * shape.vocab * PROFILE_LOGIT_BYTES + tokens * 2 * shape.intermediate / tp * DTYPE_BYTES[dtype]


def kv_fraction(scenario: dict, util: float, assumptions: list[str], runtime: str = "vllm",
                version: str | None = None) -> float:
    """The scenario's ``kv_cache_fraction`` (the KV cache's share of what the resident models leave, M - resident,
    M the GPU memory and resident the simulator's own per-GPU accounting of the pool) from ``gpu_memory_utilization``
    u, as each engine reads u:

        vLLM >= 0.7 (verl >= 0.3):  KV = u M - W / tp - A       u is its share of the whole GPU (weights, activations,
                                                                KV); A the profile run's peak (``PROFILE_LOGIT_BYTES``)
        vLLM 0.6 (verl 0.2):        KV = u (M - resident - W / tp - A)   verl's patched worker: u x the memory free
                                                                after the other models (verl's docs of 0.2-0.5)
        SGLang:                     KV = u M - W / tp           mem_fraction_static: weights and the KV pool

    clipped to [0.01, 1] of M - resident."""
    from rlhfsim.scenario.checks import build_setup
    from rlhfsim.scenario.loader import load_scenario

    probe = {**scenario, "generation": {**scenario["generation"], "kv_cache_fraction": 1.0}}
    setup = build_setup(load_scenario(probe, check=False))
    mem = setup.gpu.mem_bytes
    resident = setup.resident_bytes[setup.role_pool["rollout"]]
    shape, dtype, tp = setup.shapes["rollout"], setup.dtypes["rollout"], setup.tp["rollout"]
    weights = engine_weights(setup)
    peak = profile_peak_bytes(scenario["generation"], shape, dtype, tp, runtime)
    old = version is not None and parse_version(version) < V1_FROM and runtime.startswith("vllm")
    if old:
        kv = util * (mem - resident - weights - peak)
        how = (f"gpu_memory_utilization={util:g} of the {(mem - resident - weights - peak) / 1e9:.1f} GB free after the "
               f"resident models, {weights / 1e9:.1f} GB of engine weights and a {peak / 1e9:.1f} GB profile peak per GPU "
               f"(verl {version}'s vLLM)")
    else:
        kv = util * mem - weights - peak
        how = (f"gpu_memory_utilization={util:g} of {mem / 1e9:.0f} GB less {weights / 1e9:.1f} GB of engine weights"
               + (f" and a {peak / 1e9:.1f} GB profile-run peak (the sampler's logits of max_num_seqs rows, the MLP of "
                  f"max_num_batched_tokens tokens)" if peak else "") + " per GPU")
    out = round(min(max(kv / max(mem - resident, 1.0), 0.01), 1.0), 4)
    assumptions.append(f"KV cache: {how} = kv_cache_fraction {out} of the {max(mem - resident, 0) / 1e9:.1f} GB the "
                       f"resident models leave")
    return out

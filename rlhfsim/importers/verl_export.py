"""A scenario written back as a verl launch: the Hydra overrides of every setting the verl importer maps, and
the import options (GPU, mean lengths) a launch does not carry. Importing the result gives the same scenario
(the round trip the tests check), so the mapping in ``rlhfsim.importers.verl`` is invertible where it claims
to be.

Only scenarios a verl launch can express are accepted: sync schedule, colocated or dedicated-reward placement,
the continuous engine with vllm/vllm_eager/sglang or the static engine with hf_generate, lognormal response lengths of
the importer's log-sd, normal prompt lengths.
"""

from __future__ import annotations

import math

from rlhfsim.importers.common import RESPONSE_LOG_SD, ImportError_, ImportOptions
from rlhfsim.importers.verl import MEGATRON_DEGREES, MEGATRON_OPTIONAL, MEGATRON_PREFIX

AR = "actor_rollout_ref"
RUNTIME_NAME = {"vllm": "vllm", "vllm_eager": "vllm", "sglang": "sglang", "hf_generate": "hf"}
# vLLM's V0 engine has no verl setting: a launch's environment (VLLM_USE_V1=0, VLLM_ATTENTION_BACKEND) or the verl
# release chooses it (rlhfsim.importers.verl.vllm_engine), so a V0 scenario is not written back as overrides.


def _require(cond: bool, path: str, what: str) -> None:
    if not cond:
        raise ImportError_(f"{path}: expected {what} to write a verl launch")


def export_verl(sc: dict) -> tuple[list[str], ImportOptions]:
    """(overrides, options) for a scenario mapping such as ``import_verl(...).scenario``."""
    alg, w, gen, cl = sc["algorithm"], sc["workload"], sc["generation"], sc["cluster"]
    pl, models = sc["placement"], sc["models"]
    _require(sc.get("schedule", {"kind": "sync"})["kind"] == "sync", "schedule.kind", "sync")
    _require(pl["kind"] in ("colocated", "dedicated_reward"), "placement.kind", "colocated or dedicated_reward")
    _require(w["response_length"]["kind"] == "lognormal", "workload.response_length.kind", "lognormal")
    _require(w["prompt_length"]["kind"] == "normal", "workload.prompt_length.kind", "normal")
    _require(gen["runtime"] in RUNTIME_NAME, "generation.runtime", f"one of {', '.join(RUNTIME_NAME)} (vLLM's V0 "
             f"engine is chosen by a launch's environment, not by an override)")
    _require(gen["runtime"] not in ("vllm", "vllm_eager") or gen.get("chunked_prefill", True),
             "generation.chunked_prefill", "true with vLLM's V1 engine (its steps always mix prefill chunks and decodes)")
    n = alg["group_size"]
    est = {"ppo": "gae", "grpo": "grpo", "rloo": "rloo"}[alg["kind"]]
    o = [f"algorithm.adv_estimator={est}",
         f"data.train_batch_size={w['prompts_per_step']}",
         f"data.max_prompt_length={w['max_prompt_tokens']}",
         f"data.max_response_length={w['max_response_tokens']}",
         f"{AR}.model.path={models['actor']['model']}",
         f"{AR}.rollout.dtype={models['actor']['dtype']}",
         f"{AR}.rollout.n={n}",
         f"{AR}.actor.ppo_mini_batch_size={alg['minibatch_size'] // n}",
         f"{AR}.actor.ppo_epochs={alg['ppo_epochs']}",
         f"{AR}.actor.use_kl_loss={'reference' in models}",
         "algorithm.use_kl_in_reward=False",
         f"{AR}.rollout.name={RUNTIME_NAME[gen['runtime']]}",
         f"{AR}.rollout.enforce_eager={gen['runtime'] == 'vllm_eager'}",
         f"{AR}.rollout.max_num_seqs={gen['max_batch']}",
         *([f"{AR}.rollout.max_num_batched_tokens={gen['max_num_batched_tokens']}"]
           if gen.get("max_num_batched_tokens") is not None and gen["runtime"] != "sglang" else []),
         *([f"{AR}.rollout.mode={'sync' if gen.get('dispatch') == 'prompts' else 'async'}",
            f"{AR}.rollout.enable_prefix_caching={gen.get('prefix_caching', False)}"]
           if gen["runtime"] != "hf_generate" else []),
         f"{AR}.rollout.tensor_model_parallel_size={pl['tp']['rollout']}",
         f"trainer.n_gpus_per_node={cl['gpus_per_node']}",
         f"trainer.nnodes={cl['nodes']}",
         f"trainer.experiment_name={sc['name']}"]
    _require(alg["minibatch_size"] % n == 0, "algorithm.minibatch_size", f"a multiple of group_size {n}")
    if "critic" in models:
        o.append(f"critic.model.path={models['critic']['model']}")
    if models["reward"]["kind"] == "model":
        o += ["reward_model.enable=True", f"reward_model.model.path={models['reward']['model']}"]
        if pl["kind"] == "dedicated_reward":
            o += ["reward_model.enable_resource_pool=True", f"reward_model.n_gpus_per_node={pl['reward_gpus']}",
                  "reward_model.nnodes=1"]
    if "actor" in pl["tp"]:
        o += ["--config-name=ppo_megatron_trainer", f"{AR}.actor.megatron.tensor_model_parallel_size={pl['tp']['actor']}",
              f"{AR}.ref.megatron.tensor_model_parallel_size={pl['tp'].get('reference', pl['tp']['actor'])}"]
        if "critic" in pl["tp"]:
            o.append(f"critic.megatron.tensor_model_parallel_size={pl['tp']['critic']}")
        for role, degrees in sc.get("execution", {}).get("megatron", {}).items():   # pp, vpp, cp, ep (verl.MEGATRON_DEGREES)
            o += [f"{MEGATRON_PREFIX[role]}.{key}={degrees[field]}" for key, field in MEGATRON_DEGREES.items()
                  if field in degrees]
            # Hydra's + for the keys verl's config does not list (override_transformer_config's)
            o += [f"{'+' if key.startswith('override_') else ''}{MEGATRON_PREFIX[role]}.{key}={degrees[field]}"
                  for key, field in MEGATRON_OPTIONAL.items() if degrees.get(field) is not None]
    par = gen.get("parallel") or {}
    if par.get("ep", 1) > 1:   # verl's rollout degrees (verl._rollout_parallel reads them back)
        sg = gen["runtime"] == "sglang"
        o += [f"{AR}.rollout.expert_parallel_size={par['ep']}",
              f"{AR}.rollout.data_parallel_size={par['ep'] // pl['tp']['rollout'] if par.get('dp_attention') else 1}"]
        if par.get("redundant_experts"):
            o.append(f"+{AR}.rollout.engine_kwargs.{'sglang.ep_' if sg else 'vllm.'}num_redundant_experts="
                     f"{par['redundant_experts']}")
        if par.get("two_batch_overlap"):
            o.append(f"+{AR}.rollout.engine_kwargs.{'sglang.enable_two_batch_overlap' if sg else 'vllm.enable_dbo'}=True")
    if "execution" in sc:
        o += _execution(sc["execution"])
    o.append(f"{AR}.rollout.gpu_memory_utilization={_utilization(sc)!r}")
    resp = w["response_length"]
    opts = ImportOptions(gpu=cl["gpu"], mean_response_len=resp["median"] * math.exp(RESPONSE_LOG_SD ** 2 / 2),
                         mean_prompt_len=w["prompt_length"]["mean"], steps=sc["steps"], execution="execution" in sc)
    return o, opts


def _execution(ex: dict) -> list[str]:
    mb, off = ex["micro_batch"], ex["offload"]
    o = [f"{AR}.model.use_remove_padding={mb['use_remove_padding']}",
         f"{AR}.actor.ulysses_sequence_parallel_size={ex['ulysses_sequence_parallel_size']}",
         f"{AR}.model.enable_gradient_checkpointing={ex['gradient_checkpointing']}",
         f"{AR}.actor.fsdp_config.param_offload={off['actor']['param']}",
         f"{AR}.actor.fsdp_config.grad_offload={off['actor']['grad']}",
         f"{AR}.actor.fsdp_config.optimizer_offload={off['actor']['optimizer']}"]
    for key, field in (("actor.ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size_per_gpu"),
                       ("rollout.log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size_per_gpu"),
                       ("rollout.log_prob_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu")):
        if mb.get(field) is not None:
            o.append(f"{AR}.{key}={mb[field]}")
    if mb.get("use_dynamic_bsz"):
        o += [f"{AR}.actor.use_dynamic_bsz=True", f"{AR}.actor.ppo_max_token_len_per_gpu={mb['ppo_max_token_len_per_gpu']}"]
    for key, field in ((f"{AR}.ref.log_prob_micro_batch_size_per_gpu", "ref_log_prob_micro_batch_size_per_gpu"),
                       ("critic.ppo_micro_batch_size_per_gpu", "critic_ppo_micro_batch_size_per_gpu"),
                       ("critic.forward_micro_batch_size_per_gpu", "critic_forward_micro_batch_size_per_gpu"),
                       ("critic.ppo_max_token_len_per_gpu", "critic_ppo_max_token_len_per_gpu"),
                       ("critic.model.use_remove_padding", "critic_use_remove_padding")):
        if mb.get(field) is not None:
            o.append(f"{key}={mb[field]}")
    if "reference" in off:
        o.append(f"{AR}.ref.fsdp_config.param_offload={off['reference']['param']}")
    if "critic" in off:
        o += [f"critic.model.fsdp_config.param_offload={off['critic']['param']}",
              f"critic.model.fsdp_config.grad_offload={off['critic']['grad']}",
              f"critic.model.fsdp_config.optimizer_offload={off['critic']['optimizer']}"]
    return o


def _utilization(sc: dict) -> float:
    """The gpu_memory_utilization that ``kv_fraction`` turns into the scenario's kv_cache_fraction (its inverse)."""
    from rlhfsim.scenario.checks import build_setup
    from rlhfsim.scenario.loader import load_scenario

    from rlhfsim.importers.verl import engine_weights, profile_peak_bytes

    setup = build_setup(load_scenario(sc, check=False))
    mem = setup.gpu.mem_bytes
    resident = setup.resident_bytes[setup.role_pool["rollout"]]
    shape, dtype, tp = setup.shapes["rollout"], setup.dtypes["rollout"], setup.tp["rollout"]
    weights = engine_weights(setup)
    peak = profile_peak_bytes(sc["generation"], shape, dtype, tp, sc["generation"]["runtime"])
    frac = sc["generation"]["kv_cache_fraction"]
    return round((frac * max(mem - resident, 1.0) + weights + peak) / mem, 6)

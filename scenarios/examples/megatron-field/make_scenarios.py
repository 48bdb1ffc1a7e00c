"""Write one scenario per row of runs.yaml (<id>.yaml beside it), from the row's published fields and the assumptions
stated in runs.yaml's header (A1-A9); a row with a ``launch`` (sources V1-V3) is the published launch beside it,
imported with ``rlhfsim import verl`` (assumptions B1-B7); Relax rows (R1) follow C1-C8, RLinf rows (I1) D1-D6 and AReaL
rows (A1) E1-E9. Rerun after editing a row:

    PYTHONPATH=$PWD python scenarios/examples/megatron-field/make_scenarios.py
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
LOG_SD = 0.5  # A2
Z99 = 2.3263478740408408


def clipped_mean(median: float, cap: float) -> float:
    """E[min(X, cap)] for X lognormal with this median and log-sd LOG_SD."""
    mu, s = math.log(median), LOG_SD
    phi = lambda z: 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))  # noqa: E731
    return (math.exp(mu + s * s / 2) * phi((math.log(cap) - mu - s * s) / s)
            + cap * (1.0 - phi((math.log(cap) - mu) / s)))


def median_for(mean: float, cap: float) -> float:
    """The lognormal median whose clipped mean is ``mean`` (bisection on the log of the median)."""
    lo, hi = math.log(1.0), math.log(100.0 * cap)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if clipped_mean(math.exp(mid), cap) < mean else (lo, mid)
    return math.exp(0.5 * (lo + hi))


def scenario(row: dict, prompt_mean: int) -> dict:
    tp, cp, ep, pp = row["train"]
    cap = row["tmax"] - prompt_mean
    median = median_for(row["avg_seq"] - prompt_mean, cap)
    off = row["policy"] != "on-policy"
    gpn = row["gpus_per_node"]
    if off:
        placement = {"kind": "pools", "tp": {"actor": tp, "reference": tp, "rollout": row["gen_tp"]}, "pools": [
            {"name": "train", "gpus": row["gpus"] - row["gen_gpus"], "roles": ["actor", "reference"]},
            {"name": "rollout", "gpus": row["gen_gpus"], "roles": ["rollout"]}]}
        # A5: NeMo RL's collector (prompt groups under a semaphore) and the recipes' in-flight weight updates
        schedule = {"kind": "async", "max_staleness": int(row["policy"].split("-")[0]), "generator": "groups",
                    "in_flight_weight_updates": True}
    else:
        placement = {"kind": "colocated", "tp": {"actor": tp, "reference": tp, "rollout": row["gen_tp"]}}
        schedule = {"kind": "sync"}
    lay = {"pp": pp, "cp": cp, "ep": ep}
    if ep > 1:   # A7: expert_tensor_parallel_size 1, grpo_math_1B.yaml's megatron_cfg (no recipe changes it)
        lay["etp"] = 1
    if row.get("stages"):   # A7: the recipe's uneven pipeline (Megatron's num_layers_in_first/last_pipeline_stage)
        lay["first_stage_layers"], lay["last_stage_layers"] = row["stages"]
    if row.get("packing", True):
        micro = {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": row["tmax"] * row["mbs"],
                 "log_prob_max_token_len_per_gpu": row["tmax"] * row["logprob_mbs"], "use_remove_padding": True}
    else:
        micro = {"ppo_micro_batch_size_per_gpu": row["mbs"], "log_prob_micro_batch_size_per_gpu": row["logprob_mbs"],
                 "use_remove_padding": False}
    from rlhfsim.importers.verl import kv_fraction

    sc = {
        "name": f"megatron_field_{row['id'].lower().replace('-', '_')}",
        "description": f"{row['id']}: NeMo RL {row['source']} {row['recipe']} ({row['model']}, {row['gpus']} x {row['gpu']}, "
                       f"{row['policy']} GRPO); published step {row['measured_step_s']} s.",
        "models": {"actor": {"model": row["model"], "dtype": "bfloat16"},
                   "reference": {"model": row["model"], "dtype": "bfloat16"}, "reward": {"kind": "rule"}},
        "cluster": {"gpu": row["gpu"], "nodes": row["gpus"] // gpn, "gpus_per_node": gpn},
        "placement": placement,
        "algorithm": {"kind": "grpo", "group_size": row["generations"], "ppo_epochs": 1, "minibatch_size": row["tgbs"]},
        "workload": {"prompts_per_step": row["prompts"],
                     "prompt_length": {"kind": "normal", "mean": float(prompt_mean), "std": 32.0},
                     "response_length": {"kind": "lognormal", "median": round(median, 1),
                                         "p99": round(median * math.exp(Z99 * LOG_SD), 1)},
                     "max_prompt_tokens": 2 * prompt_mean, "max_response_tokens": cap},
        "generation": {"engine": "continuous", "runtime": "vllm", "max_batch": 1024, "max_num_batched_tokens": 16384,
                       "chunked_prefill": True, "prefix_caching": True, "dispatch": "rows",
                       "kv_cache_fraction": row["gpu_mem_util"]},
        "schedule": schedule,
        "steps": 6 if off else 4,
        "warmup_steps": 2 if off else 1,
        "seed": 0,
        "execution": {"sharding": "none", "old_log_prob": True, "micro_batch": micro,
                      "gradient_checkpointing": bool(row["act_ckpt"]),
                      "megatron": {"actor": lay, "reference": lay},
                      "weight_sync": {"kind": "nccl", "packed": True} if off else {"kind": "reshard"}},
    }
    if not off:   # A9: NeMo RL's colocated step (vLLM sleep level 1 and wake; the Megatron worker's host swap)
        sc["execution"]["weight_sync"]["engine_sleep"] = True
        sc["execution"]["offload"] = {"megatron_swap": True}
    # A3: vLLM's gpu_memory_utilization is its share of the whole card (NeMo RL offloads Megatron before vLLM wakes):
    # the KV cache is u M less the engine's weights and its profile run's peak, as the verl importer reads vLLM >= 0.7.
    sc["generation"]["kv_cache_fraction"] = kv_fraction(sc, row["gpu_mem_util"], [], runtime="vllm")
    return sc


def relax_scenario(row: dict) -> dict:
    """A Relax row (source R1; assumptions C1-C8 in runs.yaml's header): Megatron training and SGLang generation
    colocated on one pool, on-policy. SGLang's KV pool and running limit are read as the verl importer reads an SGLang
    engine that is given only mem_fraction_static (C4)."""
    from rlhfsim.importers.verl import kv_fraction, sglang_max_running

    tp, cp, ep, pp = row["train"]
    cap = row["max_response"]
    median = median_for(row["mean_response_len"], cap)
    # ETP 1 as published (the header's quoted layout): the experts' own mesh, Megatron's MoE parallel folding.
    lay = {"pp": pp, "cp": cp, "ep": ep, "etp": 1}
    sc = {
        "name": f"megatron_field_{row['id'].lower().replace('-', '_')}",
        "description": f"{row['id']}: Relax (source {row['source']}), {row['model']} on {row['gpus']} x {row['gpu']}, "
                       f"colocated GRPO; published mean step {row['measured_step_s']} s.",
        "models": {"actor": {"model": row["model"], "dtype": "bfloat16"},
                   "reference": {"model": row["model"], "dtype": "bfloat16"}, "reward": {"kind": "rule"}},
        "cluster": {"gpu": row["gpu"], "nodes": row["gpus"] // row["gpus_per_node"],
                    "gpus_per_node": row["gpus_per_node"]},
        "placement": {"kind": "colocated", "tp": {"actor": tp, "reference": tp, "rollout": row["gen_tp"]}},
        "algorithm": {"kind": "grpo", "group_size": row["generations"], "ppo_epochs": 1, "minibatch_size": row["gbs"]},
        "workload": {"prompts_per_step": row["prompts"],
                     "prompt_length": {"kind": "normal", "mean": float(row["mean_prompt_len"]),
                                       "std": row["mean_prompt_len"] / 4},
                     "response_length": {"kind": "lognormal", "median": round(median, 1),
                                         "p99": round(median * math.exp(Z99 * LOG_SD), 1)},
                     "max_prompt_tokens": 2048, "max_response_tokens": cap},
        "generation": {"engine": "continuous", "runtime": "sglang", "max_batch": 1, "max_num_batched_tokens": 8192,
                       "chunked_prefill": True, "prefix_caching": True, "dispatch": "rows", "kv_cache_fraction": 1.0},
        "schedule": {"kind": "sync"},
        "steps": 4,
        "warmup_steps": 1,
        "seed": 0,
        "execution": {"sharding": "none", "old_log_prob": True,
                      "micro_batch": {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": row["max_tokens_per_gpu"],
                                      "log_prob_max_token_len_per_gpu": row["logprob_max_tokens_per_gpu"],
                                      "use_remove_padding": True},
                      "gradient_checkpointing": True,
                      "offload": {"actor": {"param": True, "grad": True, "optimizer": True},
                                  "reference": {"param": True}},
                      "megatron": {"actor": lay, "reference": lay},
                      "weight_sync": {"kind": "reshard"}},
    }
    notes: list[str] = []
    sc["generation"]["kv_cache_fraction"] = kv_fraction(sc, row["mem_fraction"], notes, runtime="sglang")
    sc["generation"]["max_batch"] = sglang_max_running(sc, notes)
    return sc


def sglang_scenario(row: dict) -> dict:
    """An RLinf row (source I1; assumptions D1-D6) or an AReaL row (source A1; E1-E9): Megatron training and SGLang
    generation. RLinf's is colocated and on-policy, the training state offloaded while SGLang generates; AReaL's runs
    generation and training on two pools (``gen_gpus`` of them generate), at eta 0 (``on-policy``: one after the other) or
    k steps off-policy. SGLang's KV pool and running limit are read from ``mem_fraction`` as the verl importer reads an
    SGLang engine (C4)."""
    from rlhfsim.importers.verl import kv_fraction, sglang_max_running

    tp, cp, ep, pp = row["train"]
    cap = row["max_response"]
    median = median_for(row["mean_response_len"], cap)
    lay = {"pp": pp, "cp": cp, "ep": ep}
    samples = row["prompts"] * row["generations"]
    on = row["policy"] == "on-policy"
    rlinf = row["framework"] == "rlinf"
    if rlinf:  # D1, D3: colocated; one sequence a micro-batch
        placement = {"kind": "colocated", "tp": {"actor": tp, "rollout": row["gen_tp"]}}
        micro = {"ppo_micro_batch_size_per_gpu": 1, "log_prob_micro_batch_size_per_gpu": 1, "use_remove_padding": True}
        offload = {"actor": {"param": True, "grad": True, "optimizer": True}}
        sync = "reshard"
    else:  # E4-E6: two pools; token-budget micro-batches
        placement = {"kind": "pools", "tp": {"actor": tp, "rollout": row["gen_tp"]}, "pools": [
            {"name": "train", "gpus": row["gpus"] - row["gen_gpus"], "roles": ["actor"]},
            {"name": "rollout", "gpus": row["gen_gpus"], "roles": ["rollout"]}]}
        micro = {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": row["max_tokens_per_mb"],
                 "log_prob_max_token_len_per_gpu": row["max_tokens_per_mb"], "use_remove_padding": True}
        offload = {}
        sync = "nccl"
    schedule = {"kind": "sync"} if on else {"kind": "async", "max_staleness": int(row["policy"].split("-")[0])}
    sc = {
        "name": f"megatron_field_{row['id'].lower().replace('-', '_')}",
        "description": f"{row['id']}: {'RLinf' if rlinf else 'AReaL'} (source {row['source']}), {row['model']} on "
                       f"{row['gpus']} x {row.get('card', row['gpu'])}, {row['policy']} GRPO; published mean step "
                       f"{row['measured_step_s']} s.",
        "models": {"actor": {"model": row["model"], "dtype": "bfloat16"}, "reward": {"kind": "rule"}},
        "cluster": {"gpu": row["gpu"], "nodes": row["gpus"] // row["gpus_per_node"],
                    "gpus_per_node": row["gpus_per_node"]},
        "placement": placement,
        "algorithm": {"kind": "grpo", "group_size": row["generations"], "ppo_epochs": 1,
                      "minibatch_size": samples // row["minibatches"]},
        "workload": {"prompts_per_step": row["prompts"],
                     "prompt_length": {"kind": "normal", "mean": float(row["mean_prompt_len"]),
                                       "std": row["mean_prompt_len"] / 4},
                     "response_length": {"kind": "lognormal", "median": round(median, 1),
                                         "p99": round(median * math.exp(Z99 * LOG_SD), 1)},
                     "max_prompt_tokens": row["max_prompt"], "max_response_tokens": cap},
        "generation": {"engine": "continuous", "runtime": "sglang", "max_batch": 1, "max_num_batched_tokens": 8192,
                       "chunked_prefill": True, "prefix_caching": True, "dispatch": "rows", "kv_cache_fraction": 1.0},
        "schedule": schedule,
        "steps": 4 if on else 10,
        "warmup_steps": 1 if on else 5,
        "seed": 0,
        "execution": {"sharding": "none", "old_log_prob": True, "micro_batch": micro,
                      "gradient_checkpointing": True, "offload": offload,
                      "megatron": {"actor": lay}, "weight_sync": {"kind": sync}},
    }
    notes: list[str] = []
    sc["generation"]["kv_cache_fraction"] = kv_fraction(sc, row["mem_fraction"], notes, runtime="sglang")
    sc["generation"]["max_batch"] = sglang_max_running(sc, notes)
    return sc


def import_row(row: dict, steps: int = 4):
    """A launch row (B1): the published launch beside runs.yaml imported as the field table imports one, at the row's
    GPU, verl release and assumed mean lengths (B2, B3). Raises the importer's error where the launch cannot be
    expressed (a refusal, e.g. B6)."""
    from rlhfsim.importers import IMPORTERS, ImportOptions

    opts = ImportOptions(gpu=row["gpu"], gpus_per_node=row["gpus_per_node"], verl_version=str(row["verl_version"]),
                         mean_response_len=float(row["mean_response_len"]),
                         mean_prompt_len=float(row["mean_prompt_len"]), steps=steps, name=f"megatron_field_{row['id']}")
    launch = HERE / row["launch"]
    return IMPORTERS["verl"](launch.read_text(), opts, str(launch.relative_to(HERE.parents[2])))


def main() -> None:
    from rlhfsim.errors import RlhfsimError
    from rlhfsim.importers import render_yaml

    doc = yaml.safe_load((HERE / "runs.yaml").read_text())
    for row in doc["runs"]:
        if row.get("framework") == "relax":
            head = (f"# {row['id']}: written by make_scenarios.py from runs.yaml (source {row['source']}, the quoted launch "
                    f"settings and the assumptions C1-C8 in its header).\n# Published: {row['measured_step_s']} s a step "
                    f"(mean of 200); mean response {row['mean_response_len']} tokens (C2).\n")
            try:
                sc = relax_scenario(row)
            except RlhfsimError as err:
                print(f"{row['id']}: not written, the scenario checks refuse it: {err}")
                continue
            (HERE / f"{row['id']}.yaml").write_text(head + yaml.safe_dump(sc, sort_keys=False, width=120))
            continue
        if row.get("framework") in ("rlinf", "areal"):
            head = (f"# {row['id']}: written by make_scenarios.py from runs.yaml (source {row['source']}, the published "
                    f"fields and the assumptions {'D1-D6' if row['framework'] == 'rlinf' else 'E1-E9'} in its header).\n"
                    f"# Published: {row['measured_step_s']} s a step (mean); mean response {row['mean_response_len']} "
                    f"tokens.\n")
            try:
                sc = sglang_scenario(row)
            except RlhfsimError as err:
                print(f"{row['id']}: not written, the scenario checks refuse it: {err}")
                continue
            (HERE / f"{row['id']}.yaml").write_text(head + yaml.safe_dump(sc, sort_keys=False, width=120))
            continue
        if "launch" in row:
            try:
                (HERE / f"{row['id']}.yaml").write_text(render_yaml(import_row(row)))
            except RlhfsimError as err:
                print(f"{row['id']}: not written, the importer refuses {row['launch']}: {err}")
            continue
        sc = scenario(row, doc["prompt_mean"])
        head = (f"# {row['id']}: written by make_scenarios.py from runs.yaml (source, published fields and the "
                f"assumptions A1-A9 in its header).\n# Recipe: examples/configs/recipes/llm/performance/{row['recipe']}"
                f".yaml at the source's commit.\n# Published: {row['measured_step_s']} s a step; G-Average Seq "
                f"len {row['avg_seq']}.\n")
        (HERE / f"{row['id']}.yaml").write_text(head + yaml.safe_dump(sc, sort_keys=False, width=120))


if __name__ == "__main__":
    main()

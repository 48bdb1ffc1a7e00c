"""Write one scenario per row of runs.yaml (<id>.yaml beside it), from the row's published fields and the assumptions
stated in runs.yaml's header (A1-A8). Rerun after editing a row:

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
    if row.get("packing", True):
        micro = {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": row["tmax"] * row["mbs"],
                 "log_prob_max_token_len_per_gpu": row["tmax"] * row["logprob_mbs"], "use_remove_padding": True}
    else:
        micro = {"ppo_micro_batch_size_per_gpu": row["mbs"], "log_prob_micro_batch_size_per_gpu": row["logprob_mbs"],
                 "use_remove_padding": False}
    return {
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
                      "weight_sync": {"kind": "nccl" if off else "reshard"}},
    }


def main() -> None:
    doc = yaml.safe_load((HERE / "runs.yaml").read_text())
    for row in doc["runs"]:
        sc = scenario(row, doc["prompt_mean"])
        head = (f"# {row['id']}: written by make_scenarios.py from runs.yaml (source, published fields and the "
                f"assumptions A1-A8 in its header).\n# Recipe: examples/configs/recipes/llm/performance/{row['recipe']}"
                f".yaml at the source's commit.\n# Published: {row['measured_step_s']} s a step; G-Average Seq "
                f"len {row['avg_seq']}.\n")
        (HERE / f"{row['id']}.yaml").write_text(head + yaml.safe_dump(sc, sort_keys=False, width=120))


if __name__ == "__main__":
    main()

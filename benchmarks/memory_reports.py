"""The parallelism search's memory estimate (rlhfsim.plan.memory) on public out-of-memory reports: a check, not a fit
(nothing in the estimate was set from them).

    python benchmarks/memory_reports.py

Each report gives the model, the GPU and (some of) the layout; what a report does not give is said beside it. The
estimate is the training rank's peak; a report that ran out of memory elsewhere (generation, the checkpoint load) is
a miss the estimate cannot see, and is named as such.

The other side: the published NeMo RL runs of scenarios/examples/megatron-field/ ran, so the estimate should keep
every one of their layouts (the actor's, at the scenario's token budget per micro-batch); a layout it would prune is a
false prune.
"""

from __future__ import annotations

import sys

from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import load_model
from rlhfsim.plan import memory as mem

REPORTS = [
    {"id": "verl#2935", "url": "https://github.com/verl-project/verl/issues/2935",
     "model": "qwen3-30b-a3b", "gpu": "a100-80gb", "gpus": 32, "layout": (4, 1, 1, 1, 32), "tokens": 32_000,
     "checkpointing": False,
     "etp": 1,
     "given": "Qwen3-30B-A3B GRPO, 4 x 8 A100 80 GB, TP 4, EP 32 (expert TP 1), PP 1, CP 1, 'sequence length 32,000', "
              "param/grad/optimizer offload on",
     "guessed": "one micro-batch of 32,000 tokens (dynamic batch size at the sequence length); activation "
                "checkpointing off (not in the launch shown)"},
    {"id": "verl#388", "url": "https://github.com/verl-project/verl/issues/388",
     "model": "qwen2.5-32b", "gpu": "h100-sxm", "gpus": 32, "layout": (1, 1, 1, 1, 1), "tokens": 4 * 2048,
     "checkpointing": True,
     "given": "Qwen2.5-32B PPO (actor and critic), Megatron backend, 4 x 8 H800 (80 GB; priced as the H100's 80 GB), "
              "gradient checkpointing, ppo_micro_batch_size_per_gpu 4, prompt 1024 + response 1024",
     "guessed": "TP 1, PP 1 (verl's Megatron defaults at the time; the launch shown ends before any megatron.* "
                "setting)"},
]


def published() -> tuple[int, list[str]]:
    """(layouts checked, the false prunes) over the megatron-field scenarios."""
    from pathlib import Path

    from rlhfsim.scenario.loader import load_scenario

    root = Path(__file__).resolve().parents[1] / "scenarios/examples/megatron-field"
    n, bad = 0, []
    for f in sorted(root.glob("N*.yaml")):
        sc = load_scenario(f, check=False)
        m = load_model(sc.models.actor.model, "model", None)
        pl, a, mb = sc.placement, sc.execution.megatron.actor, sc.execution.micro_batch
        train = sc.cluster.nodes * sc.cluster.gpus_per_node
        if pl.kind == "pools":
            train = next(p.gpus for p in pl.pools if "actor" in p.roles)
        lay = mem.RankLayout(pl.tp.actor, a.pp, a.vpp, a.cp, a.ep, train, a.etp, a.first_stage_layers, a.last_stage_layers)
        tokens = (mb.ppo_max_token_len_per_gpu * a.cp if mb.use_dynamic_bsz else
                  (mb.ppo_micro_batch_size_per_gpu or 1) * (sc.workload.max_prompt_tokens + sc.workload.max_response_tokens))
        est = mem.training_rank(m, sc.models.actor.dtype, lay, tokens, sc.execution.gradient_checkpointing)
        gpu = get_gpu(sc.cluster.gpu)
        n += 1
        if est.total > gpu.mem_bytes:
            bad.append(f"{f.stem} ({m.name}, {train} x {gpu.name}, TP {lay.tp} PP {lay.pp} CP {lay.cp} EP {lay.ep}, "
                       f"{tokens} tokens a micro-batch): {est.describe()} of {gpu.mem_bytes / mem.GIB:.0f} GiB")
    return n, bad


def main() -> int:
    for r in REPORTS:
        m = load_model(r["model"], "model", None)
        gpu = get_gpu(r["gpu"])
        tp, pp, vpp, cp, ep = r["layout"]
        lay = mem.RankLayout(tp, pp, vpp, cp, ep, r["gpus"], r.get("etp"))
        est = mem.training_rank(m, "bfloat16", lay, r["tokens"], r["checkpointing"])
        verdict = "would prune it (agrees: OOM)" if est.total > gpu.mem_bytes else "would keep it (MISS: it ran out)"
        print(f"{r['id']} ({r['url']})\n  given: {r['given']}\n  guessed: {r['guessed']}\n"
              f"  estimate: {est.describe()} of {gpu.mem_bytes / mem.GIB:.0f} GiB: {verdict}")
    n, bad = published()
    print(f"published layouts that ran (scenarios/examples/megatron-field): {n - len(bad)} of {n} kept; false prunes: "
          f"{len(bad)}")
    for b in bad:
        print(f"  {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

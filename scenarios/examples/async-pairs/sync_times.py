"""verl's published weight-sync times between separate pools (docs/advance/fully_async.md, "checkpoint-engine Ablation
Experiment": H20, Megatron training, total sync time per step, per-tensor and with checkpoint-engine) beside the
simulator's ``nccl`` weight sync (``CostModel.nccl_sync_parts``: gather on the training pool, pool_weight_transfer,
load), priced with the GPU's bundled profile. Assumed (not published): the rollout TP (4, 4, 8) and pools laid out in
order on 8-GPU nodes (4 + 4 in one node; 16 + 16 and 64 + 64 across nodes). Nothing is fitted to these times.

    PYTHONPATH=$PWD python scenarios/examples/async-pairs/sync_times.py
"""

from __future__ import annotations

from rlhfsim.costs.model import CostModel
from rlhfsim.hardware.catalog import GPUS
from rlhfsim.models.catalog import CATALOG

# (model, trainer ranks, rollout ranks, assumed rollout TP, published s per-tensor, published s checkpoint-engine)
PUBLISHED = [("qwen2.5-7b", 4, 4, 4, 0.12, 0.02), ("qwen3-30b-a3b", 16, 16, 4, 15.76, 4.38),
             ("qwen3-235b-a22b", 64, 64, 8, 58.57, 23.70)]
PER_NODE = 8


def main() -> None:
    gpu = GPUS["h20"]
    cost = CostModel.load(gpu)
    print(f"profile {cost.name}; H20 links: {gpu.intra_node_bw / 1e9:.0f} GB/s in a node, "
          f"{gpu.inter_node_bw / 1e9:.0f} GB/s between nodes")
    print("| model | trainer:rollout ranks | gather s | pool_weight_transfer s | load s | predicted s | "
          "published per-tensor s | published checkpoint-engine s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, train, gen, tp, per_tensor, engine in PUBLISHED:
        parts = cost.nccl_sync_parts(CATALOG[name], "bfloat16", train, train > PER_NODE, tp, train + gen > PER_NODE)
        print(f"| {name} | {train}:{gen} | {parts['gather_s']:.3f} | {parts['broadcast_s']:.3f} | "
              f"{parts['load_s']:.3f} | {sum(parts.values()):.2f} | {per_tensor} | {engine} |")


if __name__ == "__main__":
    main()

"""Megatron-Bridge's published MoE pre-training throughputs (pretrain.yaml) beside the simulator's price of the same
training step: the check of how an MoE model's training call is priced on GPUs.

Each row is one optimizer step of Megatron's pipeline at the row's layout, priced with the predictors the simulator's
actor_train phase calls (``rlhfsim.sim.stages.train``): per data-parallel pipeline, gbs / (mbs x dp) micro-batches of
mbs sequences of seq tokens (expert tensor parallelism pretrain.yaml's ``etp``), each a training call (``price.train_call`` with the row's ``parallel.Layout``: the
last stage's layers, pp_p2p, cp_comm, ep_alltoall) plus the framework's host time per piece, the 1F1B bubble
(``parallel.bubble_s``) and the optimizer step (``price.optimizer_step``: the gradient all-reduces over the dense and
expert data-parallel groups, AdamW on the stage's shard). The GPU's bundled profile prices it (the simulator's
default). The experts are balanced (u = 1): the source force-balances them. Rows marked ``tokendrop`` (25.09) dropped
tokens past a capacity the page does not state: printed, left out of the medians. Predicted tokens/s/GPU = gbs x seq / (step
x gpus). Nothing is fitted to the published numbers; they are the check.

    PYTHONPATH=$PWD python scenarios/examples/megatron-field/pretrain.py [--terms]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import yaml

from rlhfsim.costs import parallel, price
from rlhfsim.costs.model import CostModel
from rlhfsim.costs.terms import FRAMEWORK_PIECE, OPTIMIZER, PIPELINE_BUBBLE, add_terms
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import load_model

HERE = Path(__file__).resolve().parent
GPUS_PER_NODE = {"h100-sxm": 8, "b200": 8, "gb200": 4}   # DGX H100/B200 nodes; a GB200 NVL72 compute tray


def step(row: dict, costs: dict, etp: int | None = None) -> tuple[float, dict]:
    """(seconds, seconds by term) of one optimizer step of ``row`` on one pipeline, as the actor_train phase prices it."""
    gpu = get_gpu(row["gpu"])
    cost = costs.get(row["gpu"]) or costs.setdefault(row["gpu"], CostModel.load(gpu))
    m = replace(load_model(row["model"]), expert_imbalance=1.0)
    node = GPUS_PER_NODE[row["gpu"]]
    lay = parallel.Layout(row["tp"], row["pp"], row["vp"] or 1, row["cp"], row["ep"], row["gpus"],
                          gpu.link_domain(node), row["gpus"] > node, etp)
    setup = SimpleNamespace(scenario=SimpleNamespace(execution=SimpleNamespace(entropy=False,
                                                                              gradient_checkpointing=False)),
                            shapes={"actor": m}, dtypes={"actor": row["dtype"]}, head=lambda role: "lm")
    micro = row["gbs"] // (row["mbs"] * lay.dp)
    n_tokens = row["mbs"] * row["seq"]
    call = price.train_call(cost, setup, "actor", n_tokens, row["mbs"], tp=lay.tp, sp=lay.cp,
                            inter_node=lay.spans_nodes, layout=lay)
    per_piece = price.piece_s(cost, True)
    calls = micro * (call.total_s + per_piece)
    bubble = parallel.bubble_s(calls, micro, lay.pp, lay.vpp)
    opt = price.optimizer_step(cost, setup, "actor", lay.tp, lay.dp, lay.spans_nodes, 0, lay)
    terms: dict = {}
    add_terms(terms, {k: v * micro for k, v in call.terms().items()})
    add_terms(terms, {FRAMEWORK_PIECE: per_piece * micro, PIPELINE_BUBBLE: bubble, OPTIMIZER: opt.total_s})
    return calls + bubble + opt.total_s, terms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--terms", action="store_true", help="print each row's step seconds by cost term")
    args = ap.parse_args()
    doc = yaml.safe_load((HERE / "pretrain.yaml").read_text())
    costs: dict = {}
    errs: dict[str, float] = {}
    print(f"source: {doc['source']}\n")
    print("| id | model | GPUs | precision | TP,PP,VP,EP | mbs x seq, gbs | published tok/s/GPU | predicted | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in doc["rows"]:
        t, terms = step(r, costs, doc.get("etp"))
        pred = r["gbs"] * r["seq"] / (t * r["gpus"])
        errs[r["id"]] = pred / r["tokens_per_s_gpu"] - 1
        drop = " (tokendrop)" if r.get("tokendrop") else ""
        print(f"| {r['id']}{drop} | {r['model']} | {r['gpus']} x {r['gpu']} | {r['precision']} | "
              f"{r['tp']},{r['pp']},{r['vp'] or 1},{r['ep']} | {r['mbs']} x {r['seq']}, {r['gbs']} | "
              f"{r['tokens_per_s_gpu']} | {pred:.0f} | {errs[r['id']]:+.0%} |")
        if args.terms:
            print("|  | " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(terms.items(), key=lambda kv: -kv[1])
                                     if v > 1e-3) + f" (step {t:.2f} s) |||||||")
    rows = [r for r in doc["rows"] if not r.get("tokendrop")]   # token-dropping rows: printed, not in the median
    print(f"\nmedian |error| over {len(rows)} dropless rows: {statistics.median(abs(errs[r['id']]) for r in rows):.0%}")
    for label, keep in (("BF16", lambda r: r["dtype"] == "bfloat16"), ("FP8", lambda r: r["dtype"] == "float8")):
        sub = [abs(errs[r["id"]]) for r in rows if keep(r)]
        print(f"  {label}: {statistics.median(sub):.0%} over {len(sub)} rows")
    for gpu in dict.fromkeys(r["gpu"] for r in rows):
        sub = [errs[r["id"]] for r in rows if r["gpu"] == gpu]
        print(f"  {gpu}: median error {statistics.median(sub):+.0%} over {len(sub)} rows")


if __name__ == "__main__":
    main()

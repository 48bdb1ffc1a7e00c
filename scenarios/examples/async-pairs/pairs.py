"""verl's published on-policy -> off-policy pairs (one_step_off and fully_async docs), predicted beside published.

Each pair is two launches in this folder (their headers say what is published and what is assumed); each is imported
with ``rlhfsim import verl`` (``--gpu h20``) at an assumed mean response length, since the docs publish none: half the
response cap (the importer's default) and a quarter of it, to show how much the predicted speedup rests on that
assumption. Both are simulated with the GPU's bundled profile (the simulator's default). Nothing here is fitted to the
published step times; they are the check.

    PYTHONPATH=$PWD python scenarios/examples/async-pairs/pairs.py [--steps 4] [--fracs 0.5,0.25]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlhfsim.importers import IMPORTERS, ImportOptions
from rlhfsim.scenario.loader import load_scenario
from rlhfsim.sim.run import simulate

HERE = Path(__file__).resolve().parent

# (on-policy launch, off-policy launch, published on-policy step s, published off-policy step s, where published)
PAIRS = [
    ("osp-colocate-16", "osp-async-4-12", 749.0, 520.0, "one_step_off.md, VLLM+FSDP2, 16 H20"),
    ("fa-colocate-32", "fa-async-16-16", 790.10, 294.77, "fully_async.md, 32 H20"),
    ("fa-colocate-64", "fa-async-32-32", 365.28, 189.26, "fully_async.md, 64 H20"),
    ("fa-colocate-128", "fa-async-64-64", 356.30, 150.63, "fully_async.md, 128 H20"),
]


def predict(name: str, frac: float, steps: int) -> dict:
    """Import ``name``.sh at a mean response length of ``frac`` x the cap and simulate it: step time and staleness."""
    text = (HERE / f"{name}.sh").read_text()
    cap = IMPORTERS["verl"](text, ImportOptions(gpu="h20", steps=steps), name).scenario["workload"]["max_response_tokens"]
    res = IMPORTERS["verl"](text, ImportOptions(gpu="h20", steps=steps, mean_response_len=frac * cap), name)
    summ = simulate(load_scenario(res.scenario), max_work=0).summary
    st = summ["schedule_stats"]
    return {"step_s": summ["step_time_s"], "staleness_mean": st["staleness_mean"], "staleness_max": st["staleness_max"],
            "mean_response": frac * cap}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--fracs", default="0.5,0.25", help="mean response length as fractions of the cap")
    args = ap.parse_args()
    print("| pair | mean response (tokens) | published on -> off (s) | published speedup | predicted on -> off (s) "
          "| predicted speedup | speedup error | staleness reached (mean / max) |")
    print("|---|---|---|---|---|---|---|---|")
    for frac in (float(x) for x in args.fracs.split(",")):
        for on, off, pub_on, pub_off, where in PAIRS:
            a, b = predict(on, frac, args.steps), predict(off, frac, args.steps)
            pub, pred = pub_on / pub_off, a["step_s"] / b["step_s"]
            print(f"| {where} | {b['mean_response']:.0f} | {pub_on:.0f} -> {pub_off:.0f} | {pub:.2f}x | "
                  f"{a['step_s']:.0f} -> {b['step_s']:.0f} | {pred:.2f}x | {pred / pub - 1:+.0%} | "
                  f"{b['staleness_mean']:.2f} / {b['staleness_max']} |")


if __name__ == "__main__":
    main()

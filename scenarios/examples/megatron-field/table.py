"""Published Megatron step times (runs.yaml: NeMo RL's, verl's, Relax's, RLinf's and AReaL's) beside the simulator's prediction: the check of issue 55.

Each row of runs.yaml has a scenario <id>.yaml beside it (written by make_scenarios.py from the row and the
assumptions A1-A9 stated in runs.yaml's header; a row with a ``launch`` is imported from that launch here, as
make_scenarios.py imports it, under B1-B7); this script simulates each with the GPU's bundled profile (the
simulator's default, as scenarios/examples/async-pairs/pairs.py does) and prints measured | predicted | error per
row, the median |error| over the rows the simulator can express (all, by source and by GPU), and the on-policy ->
off-policy speedup of each
published pair. A row the simulator refuses (a layout it cannot express) is printed with the refusal and left out of
the median. Nothing here is fitted to the published times; they are the check.

    PYTHONPATH=$PWD python scenarios/examples/megatron-field/table.py [--only N6-H7,N5-H1]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import yaml

from rlhfsim.errors import RlhfsimError
from rlhfsim.scenario.loader import load_scenario
from rlhfsim.sim.run import simulate

from make_scenarios import import_row, relax_scenario, sglang_scenario  # this folder's (run as a script, the folder is on the path)

HERE = Path(__file__).resolve().parent


def load_runs() -> dict:
    """runs.yaml as a dict: sources, pairs, prompt_mean and the rows."""
    return yaml.safe_load((HERE / "runs.yaml").read_text())


def predict(row: dict) -> tuple[float | None, str]:
    """Simulate one row's scenario: (step seconds, ""), or (None, the refusal)."""
    try:
        if row.get("framework") == "relax":
            scenario = relax_scenario(row)
        elif row.get("framework") in ("rlinf", "areal"):
            scenario = sglang_scenario(row)
        else:
            scenario = import_row(row).scenario if "launch" in row else HERE / f"{row['id']}.yaml"
        summary = simulate(load_scenario(scenario), max_work=0).summary
    except RlhfsimError as err:
        return None, str(err)
    return summary["step_time_s"], ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated row ids (default: every row)")
    args = ap.parse_args()
    doc = load_runs()
    only = {x for x in args.only.split(",") if x}
    rows = [r for r in doc["runs"] if not only or r["id"] in only]
    pred: dict[str, float] = {}
    print("| id | model | GPUs | policy | train [TP,CP,EP,PP] / gen TP | measured step (s) | predicted (s) | error |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        step, why = predict(r)
        lay = f"{r['train']} / {r['gen_tp']}" + (f", {r['gen_gpus']} gen GPUs" if r["gen_gpus"] else "")
        gpu = f"{r['card']} (as {r['gpu']})" if "card" in r else r["gpu"]
        head = f"| {r['id']} | {r['model']} | {r['gpus']} x {gpu} | {r['policy']} | {lay} | {r['measured_step_s']} |"
        if step is None:
            print(f"{head} not simulated | {why} |", flush=True)
            continue
        pred[r["id"]] = step
        print(f"{head} {step:.1f} | {step / r['measured_step_s'] - 1:+.0%} |", flush=True)
    errs = {i: abs(pred[i] / r["measured_step_s"] - 1) for r in rows for i in [r["id"]] if i in pred}
    if errs:
        print(f"\nmedian |step error| over {len(errs)} of {len(rows)} rows: {statistics.median(errs.values()):.0%}")
        for src in dict.fromkeys(r["source"] for r in rows):
            sub = [errs[r["id"]] for r in rows if r["source"] == src and r["id"] in errs]
            if sub:
                print(f"  source {src}: {statistics.median(sub):.0%} over {len(sub)} rows")
        for gpu in sorted({r["gpu"] for r in rows}):
            sub = [errs[r["id"]] for r in rows if r["gpu"] == gpu and r["id"] in errs]
            if sub:
                print(f"  {gpu}: {statistics.median(sub):.0%} over {len(sub)} rows")
    measured = {r["id"]: r["measured_step_s"] for r in doc["runs"]}
    print("\n| pair (on -> off) | published speedup | predicted speedup | speedup error |")
    print("|---|---|---|---|")
    for on, off in doc["pairs"]:
        pub = measured[on] / measured[off]
        if on in pred and off in pred:
            got = pred[on] / pred[off]
            print(f"| {on} -> {off} | {pub:.2f}x | {got:.2f}x | {got / pub - 1:+.0%} |")
        elif not only:
            print(f"| {on} -> {off} | {pub:.2f}x | not simulated | - |")


if __name__ == "__main__":
    main()

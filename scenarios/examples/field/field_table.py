"""Measured against predicted for the public runs in runs.yaml (docs/validation.md, "Public runs").

Each launch is imported with `rlhfsim import verl` (the GPU, the logged mean lengths and the verl release the run
used passed as options, and a run's `set` list, when it has one, as `--set`: settings its launch file's header
explains; nothing else), simulated with the bundled profile, and its steady-state mean step time set beside the
measured one:
error_pct = 100 x (predicted - measured) / measured. Run from the repository root:

    python scenarios/examples/field/field_table.py [--json]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import yaml

from rlhfsim.contracts import VERL_PHASE_KEYS
from rlhfsim.importers import ImportOptions, import_verl
from rlhfsim.scenario.loader import load_scenario
from rlhfsim.sim.run import simulate

HERE = Path(__file__).resolve().parent


def predict(run: dict, gpu: str, execution: bool = True) -> dict:
    launch = HERE / run["launch"]
    opts = ImportOptions(gpu=gpu, mean_response_len=run.get("mean_response_len"),
                         mean_prompt_len=run.get("mean_prompt_len"), steps=4, name=run["id"], execution=execution,
                         verl_version=run.get("verl_version"), sets=tuple(run.get("set", ())))
    res = import_verl(launch.read_text(), opts, str(launch.relative_to(HERE.parents[2])))
    summary = simulate(load_scenario(res.scenario, base_dir=HERE)).summary
    phases = {VERL_PHASE_KEYS[p].removeprefix("timing_s/"): round(v, 2) for p, v in summary["phases_s"].items()}
    pred = summary["step_time_s"]
    meas = run["measured_step_s"]
    return {"id": run["id"], "gpu": gpu, "execution": execution, "source": run["source"], "measured_step_s": meas,
            "predicted_step_s": round(pred, 2), "error_pct": round(100 * (pred - meas) / meas, 1),
            "measured_phases_s": run.get("measured_phases_s", {}), "predicted_phases_s": phases,
            "unmapped": [f"{s.key}={s.value}" for s in res.by_status("unmapped")]}


def main() -> None:
    """Both tables: the scenario's execution block off (the simulator's plain step) and on (verl's mechanics)."""
    doc = yaml.safe_load((HERE / "runs.yaml").read_text())
    out = {}
    for execution in (False, True):
        rows = [predict(r, r["gpu"], execution) for r in doc["runs"]]
        extra = [predict(r, g, execution) for r in doc.get("unscored", []) for g in r["gpus"]]
        out["with_execution" if execution else "without_execution"] = {
            "scored": rows, "unscored": extra,
            "median_abs_error_pct": statistics.median(abs(r["error_pct"]) for r in rows)}
    if "--json" in sys.argv:
        print(json.dumps(out, indent=1))
        return
    for label, table in out.items():
        print(f"== {label.replace('_', ' ')}")
        for r in table["scored"] + table["unscored"]:
            tag = "" if r in table["scored"] else "  (unscored: GPU not stated)"
            print(f"{r['id']:3} {r['gpu']:10} measured {r['measured_step_s']:8.2f} s  predicted {r['predicted_step_s']:8.2f} s  "
                  f"error {r['error_pct']:+7.1f}%{tag}")
            print(f"    measured phases  {r['measured_phases_s']}")
            print(f"    predicted phases {r['predicted_phases_s']}")
        print(f"median |error| over {len(table['scored'])} scored runs: {table['median_abs_error_pct']:.1f}%")


if __name__ == "__main__":
    main()

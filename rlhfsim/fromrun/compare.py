"""A what-if beside the run it came from: the run as measured, as fitted, and the what-if scenario simulated with
the same overlay, phase by phase in verl's names.

    python -m rlhfsim.fromrun.compare OVERLAY.json WHATIF/scenario.yaml [--run ID] [--format table|json]

OVERLAY is what ``rlhfsim calibrate --from-run`` wrote; WHATIF is the run's launch imported again with the change
(``rlhfsim import verl LAUNCH --set ... -o WHATIF``). The what-if is simulated under the overlay (its fitted
terms over its base); a verl release that times the weight sync inside ``timing_s/gen`` gets the what-if's weight
sync folded in the same way, so the three columns measure the same spans. change_pct = 100 x (what-if - fitted)
/ fitted: the change the fitted simulator predicts for the run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from rlhfsim.errors import RlhfsimError


def side_by_side(overlay_path: str, scenario_path: str, run_id: str | None = None) -> dict:
    """The measured, fitted and what-if phases (seconds) of one of the overlay's runs (module docstring)."""
    from rlhfsim.contracts import VERL_PHASE_KEYS, VERL_STEP_KEY
    from rlhfsim.costs.profile import load_profile
    from rlhfsim.scenario.loader import load_scenario
    from rlhfsim.sim.run import simulate

    prof = load_profile(overlay_path)
    runs = (prof.get("from_run") or {}).get("runs") or []
    if not runs:
        raise RlhfsimError(f"{overlay_path}: expected a from-run overlay (a from_run.runs section), got none")
    run = next((r for r in runs if run_id in (None, r["id"])), None)
    if run is None:
        raise RlhfsimError(f"--run: expected one of {', '.join(r['id'] for r in runs)}, got {run_id!r}")
    summary = simulate(load_scenario(Path(scenario_path)), profile=overlay_path).summary
    whatif = {VERL_PHASE_KEYS[p]: float(v) for p, v in summary["phases_s"].items()}
    upd = VERL_PHASE_KEYS["weight_sync"]
    if run["weight_sync_in_gen"] and upd in whatif:
        whatif[VERL_PHASE_KEYS["generate"]] = whatif.get(VERL_PHASE_KEYS["generate"], 0.0) + whatif.pop(upd)
    whatif[VERL_STEP_KEY] = float(summary["step_time_s"])
    keys = list(dict.fromkeys([*run["measured_s"], *whatif]))
    rows = [{"phase": k, "measured_s": run["measured_s"].get(k), "fitted_s": run["fitted_s"].get(k),
             "whatif_s": whatif.get(k),
             "change_pct": (round(100 * (whatif[k] - run["fitted_s"][k]) / run["fitted_s"][k], 1)
                            if run["fitted_s"].get(k) and k in whatif else None)} for k in keys]
    return {"run": run["id"], "overlay": overlay_path, "whatif": scenario_path, "rows": rows}


@click.command()
@click.argument("overlay", type=click.Path(dir_okay=False))
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--run", "run_id", help="Which of the overlay's runs (default: the first).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def main(overlay, scenario, run_id, fmt):
    """The run as measured, as fitted, and the what-if SCENARIO under the same OVERLAY."""
    try:
        out = side_by_side(overlay, scenario, run_id)
    except RlhfsimError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    if fmt == "json":
        click.echo(json.dumps(out))
        return
    click.echo(f"run {out['run']}: measured | fitted ({out['overlay']}) | what-if ({out['whatif']})")

    def f(v):
        return f"{v:10.3f}" if v is not None else f"{'-':>10}"

    for r in out["rows"]:
        ch = f"{r['change_pct']:+7.1f}%" if r["change_pct"] is not None else ""
        click.echo(f"  {r['phase']:26} {f(r['measured_s'])} {f(r['fitted_s'])} {f(r['whatif_s'])}  {ch}")


if __name__ == "__main__":
    main()

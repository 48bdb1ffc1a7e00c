"""A what-if scenario beside the run it came from: the run as measured, as fitted, and the what-if scenario
simulated with the same overlay, phase by phase in verl's names.

    python -m rlhfsim.fromrun.compare OVERLAY.json WHATIF/scenario.yaml [--run ID] [--format table|json]

``rlhfsim whatif OVERLAY --set ...`` does the same from the overlay alone (it rebuilds the run, applies the change
and gives each what-if number an interval); this takes a scenario you built yourself (``rlhfsim import verl LAUNCH
--set ... -o WHATIF``). Both price it the same way (``rlhfsim.fromrun.whatif``): under the overlay (its fitted
terms over its base) with the fitted response-length shape carried by the same rule (``shape_for_scenario``: the
importer's block for the logged mean counts as unchanged lengths; another lognormal's mean is re-derived with the
fitted log-sd), and in the spans the run's verl release timed (the weight sync inside ``timing_s/gen``, the reward
inside ``timing_s/adv``, as the fit compared them). The fitted column is the run rebuilt from the overlay and
simulated now; change_pct = 100 x (what-if - fitted) / fitted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from rlhfsim.errors import RlhfsimError


def side_by_side(overlay_path: str, scenario_path: str, run_id: str | None = None) -> dict:
    """The measured, fitted and what-if phases (seconds) of one of the overlay's runs (module docstring)."""
    from rlhfsim.costs.profile import load_profile
    from rlhfsim.fromrun.whatif import Built, _simulate, _spans, build, runs_of, shape_for_scenario
    from rlhfsim.hardware.catalog import get_gpu
    from rlhfsim.scenario.loader import load_scenario

    prof = load_profile(overlay_path)
    rec = runs_of(prof, overlay_path, run_id)[0]
    fitted = _spans(_simulate(build(rec, Path(overlay_path)), prof), rec)
    sc, notes = shape_for_scenario(rec, load_scenario(Path(scenario_path)))
    whatif = _spans(_simulate(Built(sc, get_gpu(sc.cluster.gpu)), prof), rec)
    keys = list(dict.fromkeys([*rec["measured_s"], *whatif]))
    rows = [{"phase": k, "measured_s": rec["measured_s"].get(k), "fitted_s": fitted.get(k), "whatif_s": whatif.get(k),
             "change_pct": (round(100 * (whatif[k] - fitted[k]) / fitted[k], 1) if fitted.get(k) and k in whatif else None)}
            for k in keys]
    return {"run": rec["id"], "overlay": overlay_path, "whatif": scenario_path, "notes": notes, "rows": rows}


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
    for n in out["notes"]:
        click.echo(f"  note: {n}")

    def f(v):
        return f"{v:10.3f}" if v is not None else f"{'-':>10}"

    for r in out["rows"]:
        ch = f"{r['change_pct']:+7.1f}%" if r["change_pct"] is not None else ""
        click.echo(f"  {r['phase']:26} {f(r['measured_s'])} {f(r['fitted_s'])} {f(r['whatif_s'])}  {ch}")


if __name__ == "__main__":
    main()

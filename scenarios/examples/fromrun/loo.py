"""Leave-one-run-out check of ``rlhfsim calibrate --from-run`` within a group of public runs that share a machine
and a framework release (issue 49): for each run of the group, fit an overlay on the others' logs
(``rlhfsim.fromrun``; the bundled ``default`` profile as base) and predict the held-out run from its own launch
(with the mean lengths of its own steady steps, as ``field_table.py`` does); then

    error_pct = 100 x (predicted - measured) / measured

per run for ``timing_s/step`` and for every logged phase the simulator prices, and their medians of |error|
over the held-out runs. The base profile's errors (nothing fitted) and the in-sample fit on all runs are shown
beside them. Each run's launch, GPU, verl release and ``set`` list come from ../field/runs.yaml; its log is named
in groups.yaml here, or else its own ``log:`` in the runs file. Runs come from runs.yaml and every runs-*.yaml beside
it (``field_table.load_runs``); a group may hold dev-half runs only (``field_table.half``: nothing of the test half
is ever fitted). The "setting changed" check of the issue needs two runs that differ in one setting: the
script counts the settings each pair of the group's launches differs in and reports the closest pair.

Run from the repository root (1-3 minutes for qwen3-lab, 5-13 for play-verl, on two shared cores); with every
group, the medians over all their held-out runs close the output:

    python scenarios/examples/fromrun/loo.py [--json] [--group NAME] [--lengths logged|mean] [--bins N]
        [--prior X] [--weighting equal|share]

``--lengths mean`` gives each run only its logged mean response length (the importer's assumed shape, as
field_table.py does); ``logged`` (default) also matches the shape to the log's longest and clipped responses
(rlhfsim.fromrun.lengths). ``--bins N`` fits each of the other runs as up to N bins of its steady steps cut by their
longest response (``rlhfsim.fromrun.fit.prepare_units``); the held-out run is predicted whole either way. ``--prior``
and ``--weighting`` are the fit's (``rlhfsim calibrate --from-run``'s) options.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from itertools import combinations
from pathlib import Path

import yaml

from rlhfsim.contracts import VERL_STEP_KEY
from rlhfsim.costs.profile import load_profile
from rlhfsim.fromrun.fit import RunSpec, fit, predict, prepare, prepare_units

HERE = Path(__file__).resolve().parent
FIELD = HERE.parent / "field"
sys.path.insert(0, str(FIELD))
from field_table import half, load_runs  # noqa: E402  (the field table's runs files and split, one home)


def specs(group: dict, lengths: str = "logged") -> list[RunSpec]:
    doc = load_runs()
    field = {r["id"]: r for r in doc["runs"] + doc["unscored"]}
    out = []
    for g in group["runs"]:
        r = field.get(g["id"])
        if r is None:
            sys.exit(f"groups.yaml: {group['name']}.runs: expected run ids of the runs files, got {g['id']!r}")
        if half(r["source_group"]) != "dev":
            sys.exit(f"groups.yaml: {group['name']}.runs.{g['id']}: expected a dev-half run (the test half is never "
                     f"fitted), got one of the test half ({r['source_group']})")
        log = HERE / g["log"] if g.get("log") else (FIELD / r["log"] if r.get("log") else None)
        if log is None:
            sys.exit(f"groups.yaml: {group['name']}.runs.{g['id']}: expected a log (here or in its runs file), got none")
        gpu = r.get("gpu") or g.get("gpu")
        if gpu is None:
            sys.exit(f"groups.yaml: {group['name']}.runs.{g['id']}: expected the run's GPU (stated), got none")
        out.append(RunSpec(g["id"], FIELD / r["launch"], log, gpu, tuple(r.get("set", ())),
                           r.get("verl_version"), lengths=lengths))
    return out


def errors(run, pred: dict) -> dict:
    return {k: round(100 * (pred[k] - m) / m, 1) for k, m in run.measured.items() if k in pred and m > 0}


def medians(rows: list[dict]) -> dict:
    by: dict[str, list[float]] = {}
    for r in rows:
        for k, e in r.items():
            by.setdefault(k, []).append(abs(e))
    return {k: round(statistics.median(v), 1) for k, v in sorted(by.items())}


def differing_settings(a: RunSpec, b: RunSpec) -> list[str]:
    """The launch settings (after ``set``) two runs differ in, as ``rlhfsim import verl`` reads them."""
    from rlhfsim.importers import ImportOptions, import_verl

    def settings(s: RunSpec) -> dict:
        res = import_verl(s.launch.read_text(), ImportOptions(gpu=s.gpu, sets=s.sets, verl_version=s.verl_version))
        return {x.key: str(x.value) for x in res.settings if not x.key.startswith("trainer.")
                and not x.key.startswith(("data.train_files", "data.val_files"))}

    sa, sb = settings(a), settings(b)
    return sorted(k for k in set(sa) | set(sb) if sa.get(k) != sb.get(k))


def loo(group: dict, lengths: str = "logged", n_bins: int = 1, **fit_kw) -> dict:
    t0 = time.perf_counter()
    base = load_profile("default")
    sp = specs(group, lengths)
    runs = [prepare(s) for s in sp]
    units = [prepare_units(s, n_bins) for s in sp]     # what is fitted: each run whole, or its steps in bins
    rows = []
    for i, held in enumerate(runs):
        t = time.perf_counter()
        res = fit([u for j, us in enumerate(units) if j != i for u in us], base, **fit_kw)
        pred, bpred = predict(held, res["profile"]), predict(held, base)
        rows.append({"held_out": held.spec.id, "fit_s": round(time.perf_counter() - t, 1),
                     "measured_s": {k: round(v, 3) for k, v in held.measured.items()},
                     "predicted_s": {k: round(v, 3) for k, v in pred.items() if k in held.measured},
                     "error_pct": errors(held, pred), "base_error_pct": errors(held, bpred),
                     "terms": {t["path"]: t["fitted"] for t in res["terms"]}, "warnings": res["warnings"]})
    full = fit([u for us in units for u in us], base, **fit_kw)
    in_sample = [{k: round(100 * (p[k] - m) / m, 1) for k, m in r.measured.items() if k in p and m > 0}
                 for r in runs for p in [predict(r, full["profile"])]]
    pairs = sorted((len(d), a.spec.id, b.spec.id, d) for a, b in combinations(runs, 2)
                   for d in [differing_settings(a.spec, b.spec)])
    return {"group": group["name"], "source": group["source"], "lengths": lengths, "runs": [r.spec.id for r in runs], "loo": rows,
            "loo_median_abs_error_pct": medians([r["error_pct"] for r in rows]),
            "base_median_abs_error_pct": medians([r["base_error_pct"] for r in rows]),
            "in_sample_median_abs_error_pct": medians(in_sample), "bins": n_bins,
            "closest_pair": {"runs": pairs[0][1:3], "n_settings": pairs[0][0], "settings": pairs[0][3]},
            "seconds": round(time.perf_counter() - t0, 1)}


def show(out: dict) -> None:
    print(f"== group {out['group']} ({out['source']}): runs {', '.join(out['runs'])}; response lengths: {out['lengths']}"
          + (f"; each run's steps fitted in up to {out['bins']} bins" if out["bins"] > 1 else ""))
    for r in out["loo"]:
        e, b = r["error_pct"], r["base_error_pct"]
        print(f"{r['held_out']}: step measured {r['measured_s'][VERL_STEP_KEY]:.2f} s, LOO predicted "
              f"{r['predicted_s'][VERL_STEP_KEY]:.2f} s ({e[VERL_STEP_KEY]:+.1f}%; base profile {b[VERL_STEP_KEY]:+.1f}%); "
              f"fit on the others {r['fit_s']} s")
        print("    phase error % (LOO | base): " + ", ".join(
            f"{k.removeprefix('timing_s/')} {e[k]:+.1f} | {b.get(k, float('nan')):+.1f}" for k in e if k != VERL_STEP_KEY))
        for w in r["warnings"]:
            print(f"    warning: {w}")
    for label, key in (("LOO", "loo_median_abs_error_pct"), ("base profile", "base_median_abs_error_pct"),
                       ("in-sample (all runs fitted)", "in_sample_median_abs_error_pct")):
        med = out[key]
        print(f"{label}: median |step error| {med.get(VERL_STEP_KEY)}%; per phase "
              + ", ".join(f"{k.removeprefix('timing_s/')} {v}%" for k, v in med.items() if k != VERL_STEP_KEY))
    cp = out["closest_pair"]
    print(f"setting-changed check: the closest pair, {' and '.join(cp['runs'])}, differs in {cp['n_settings']} settings "
          f"({', '.join(cp['settings'][:8])}{', ...' if cp['n_settings'] > 8 else ''}): "
          + ("a one-setting sibling" if cp["n_settings"] == 1 else "no pair with one setting changed in this group"))
    print(f"({out['seconds']} s)")


def main() -> None:
    groups = yaml.safe_load((HERE / "groups.yaml").read_text())["groups"]
    name = sys.argv[sys.argv.index("--group") + 1] if "--group" in sys.argv else None
    chosen = [g for g in groups if name in (None, g["name"])]
    if not chosen:
        sys.exit(f"--group: expected one of {', '.join(g['name'] for g in groups)}, got {name!r}")
    lengths = sys.argv[sys.argv.index("--lengths") + 1] if "--lengths" in sys.argv else "logged"
    kw = {"weighting": sys.argv[sys.argv.index("--weighting") + 1] if "--weighting" in sys.argv else "equal",
          "prior": float(sys.argv[sys.argv.index("--prior") + 1]) if "--prior" in sys.argv else 0.0}
    n_bins = int(sys.argv[sys.argv.index("--bins") + 1]) if "--bins" in sys.argv else 1
    outs = [loo(g, lengths, n_bins, **kw) for g in chosen]
    overall = {"groups": [o["group"] for o in outs],
               "loo_median_abs_error_pct": medians([r["error_pct"] for o in outs for r in o["loo"]]),
               "base_median_abs_error_pct": medians([r["base_error_pct"] for o in outs for r in o["loo"]])}
    if "--json" in sys.argv:
        print(json.dumps(outs + ([{"overall": overall}] if len(outs) > 1 else []), indent=1))
        return
    for o in outs:
        show(o)
    if len(outs) > 1:
        for label, key in (("LOO", "loo_median_abs_error_pct"), ("base profile", "base_median_abs_error_pct")):
            med = overall[key]
            print(f"overall ({len(outs)} groups), {label}: median |step error| {med.get(VERL_STEP_KEY)}%; per phase "
                  + ", ".join(f"{k.removeprefix('timing_s/')} {v}%" for k, v in med.items() if k != VERL_STEP_KEY))


if __name__ == "__main__":
    main()

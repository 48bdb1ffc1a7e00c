"""Measured against predicted for the public runs in runs.yaml (docs/accuracy.md, "GPU: public runs").

Each launch is imported with `rlhfsim import verl` (the GPU, the logged mean lengths, the logged longest response and
clip ratio where the log gives them, and the verl release the run used passed as options, and a run's `set` list, when it has one, as `--set`: settings its launch file's header
explains; nothing else), simulated with the bundled profile, and its steady-state mean step time set beside the
measured one:
error_pct = 100 x (predicted - measured) / measured, per run and per logged phase. Every run sits in the dev or the
test half by its source (``half``; the rule is fixed in runs.yaml's header): tune and diagnose on the dev half only.
Run from the repository root:

    python scenarios/examples/field/field_table.py [--json] [--half dev|test|all] [--coverage] [--profile NAME]
        (default: the dev half, the half to tune on; the bundled default profile)
    python scenarios/examples/field/field_table.py --write-model-error rlhfsim/profiles/model-error/field-dev.json

The bundled GPU profiles' fit to the public logs (``rlhfsim.fromrun.pool``; docs/accuracy.md, "GPU: public runs"):

    python scenarios/examples/field/field_table.py --loso [--json] [--coverage] [--write-model-error PATH]
        every scored run (both halves) predicted with the profiles fitted to the dev half's logs less the run's own
        source (a test-half run: the dev half's fit), beside the GPU's bundled prior and ``default``; --coverage: each
        run's 90% interval from the other sources' dev-half LOSO residuals, how many hold and how wide (beside the
        narrowest interval of one width holding 90% and 80% of them, placed with hindsight); PATH gets the dev half's
        residuals (rlhfsim/profiles/model-error/field-loso.json, read by rlhfsim.sim.uncertainty)
    python scenarios/examples/field/field_table.py --loso --rows-from LOSO.json [--json] [--write-model-error PATH]
        the same from the rows an earlier `--loso --json > LOSO.json` printed: the interval's coverage (and PATH)
        without refitting, for work on the interval alone
    python scenarios/examples/field/field_table.py --write-profiles
        the fit of every dev-half log written into rlhfsim/profiles/ (public.json, the GPU families' profiles)
    fit options of both (FIT_DEFAULTS otherwise): --prior X, --weighting equal|share, --drop-confounded,
        --pooling family|reference
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import statistics
import sys
from pathlib import Path

import yaml

from rlhfsim.contracts import VERL_PHASE_KEYS
from rlhfsim.importers import IMPORTERS, ImportOptions
from rlhfsim.scenario.loader import load_scenario
from rlhfsim.sim.modelerror import loso_coverage
from rlhfsim.sim.run import simulate

HERE = Path(__file__).resolve().parent
SPLIT_SALT = "rlhfsim field split 2026-12-07|"


def half(source_group: str) -> str:
    """The run's half, from its source alone: the parity of sha256(salt + source_group)'s first byte."""
    return "dev" if hashlib.sha256((SPLIT_SALT + source_group).encode()).digest()[0] % 2 == 0 else "test"


def phase_errors(measured: dict, predicted: dict) -> dict:
    """Percent error of every phase the run logged and the simulator prices (the reward phase included)."""
    return {k: round(100 * (predicted[k] - v) / v, 1) for k, v in measured.items() if k in predicted and v > 0}


def predict(run: dict, gpu: str, execution: bool = True, profile: str | None = None) -> dict:
    """One run imported and simulated; ``profile``: None for the bundled default, ``auto`` for the GPU's own."""
    launch = HERE / run["launch"]
    opts = ImportOptions(gpu=gpu, mean_response_len=run.get("mean_response_len"),
                         mean_prompt_len=run.get("mean_prompt_len"), steps=4, name=run["id"], execution=execution,
                         verl_version=run.get("verl_version"), sets=tuple(run.get("set", ())),
                         gpus_per_node=run.get("gpus_per_node"),  # OpenRLHF only (its launch sizes groups)
                         # the logged length tail (rlhfsim.workload.shape), where the run's log gives it
                         max_response_len_logged=run.get("max_response_len_logged"), clip_ratio=run.get("clip_ratio"))
    framework = run.get("framework", "verl")  # an OpenRLHF launch says `framework: openrlhf`
    if framework not in IMPORTERS:
        sys.exit(f"runs.yaml: {run['id']}.framework: expected one of {sorted(IMPORTERS)}, got {framework!r}")
    res = IMPORTERS[framework](launch.read_text(), opts, str(launch.relative_to(HERE.parents[2])))
    sc = load_scenario(res.scenario, base_dir=HERE)
    summary = simulate(sc, profile=profile).summary
    phases = {VERL_PHASE_KEYS[p].removeprefix("timing_s/"): v for p, v in summary["phases_s"].items()}
    # verl times the hybrid engine's weight update inside gen (its sharding manager wraps generate_sequences)
    phases["gen"] = phases.get("gen", 0.0) + phases.pop("update_weights", 0.0)
    measured = run.get("measured_phases_s", {})
    if framework == "verl" and "gen" in measured and "old_log_prob" not in measured and "old_log_prob" in phases:
        # verl before v0.2 computes the old log-probs inside generate_sequences: its gen holds them, as the from-run
        # fit reads such a log (rlhfsim.fromrun.fit.OLD_LOG_PROB_IN_GEN)
        phases["gen"] += phases.pop("old_log_prob")
    phases = {k: round(v, 2) for k, v in phases.items()}
    pred = summary["step_time_s"]
    meas = run["measured_step_s"]
    return {"id": run["id"], "half": half(run["source_group"]), "gpu": gpu, "execution": execution, "source": run["source"], "measured_step_s": meas,
            "predicted_step_s": round(pred, 2), "error_pct": round(100 * (pred - meas) / meas, 1),
            "measured_phases_s": run.get("measured_phases_s", {}), "predicted_phases_s": phases,
            "phase_error_pct": phase_errors(run.get("measured_phases_s", {}), phases),
            "unmapped": [f"{s.key}={s.value}" for s in res.by_status("unmapped")]}


FORWARD_ONLY = ("old_log_prob", "ref", "values")


def summarize(rows: list[dict]) -> dict:
    """Median and max |step error|, the forward-only phases' median |error| and each phase's median |error|."""
    if not rows:
        return {"runs": 0}
    errs = [abs(r["error_pct"]) for r in rows]
    by_phase: dict[str, list[float]] = {}
    for r in rows:
        for k, e in r["phase_error_pct"].items():
            by_phase.setdefault(k, []).append(abs(e))
    fwd = [e for k in FORWARD_ONLY for e in by_phase.get(k, [])]
    return {"runs": len(rows), "median_abs_error_pct": round(statistics.median(errs), 1),
            "max_abs_error_pct": round(max(errs), 1),
            **({"interval_coverage": f"{sum(r['inside'] for r in rows)}/{len(rows)}",
                "interval_median_width": round(statistics.median(r["interval_width"] or math.inf for r in rows), 2)}
               if "inside" in rows[0] else {}),
            "forward_only_median_abs_error_pct": round(statistics.median(fwd), 1) if fwd else None,
            "phase_median_abs_error_pct": {k: round(statistics.median(v), 1) for k, v in sorted(by_phase.items())}}


def table(doc: dict, execution: bool, halves: tuple[str, ...], coverage: bool = False,
          profile: str | None = None) -> dict:
    """Every scored run of the chosen halves predicted, with a summary per half; unscored runs on each GPU.
    ``coverage``: each scored run's 90% interval too, from the model error of the dev half's runs of other sources
    (its own source left out: ``rlhfsim.sim.modelerror.loso_coverage``), how many hold the measure and how wide."""
    rows = [predict(r, r["gpu"], execution, profile) for r in doc["runs"] if half(r["source_group"]) in halves]
    if coverage:
        groups = {r["id"]: r["source_group"] for r in doc["runs"]}
        dev = {r["id"] for r in rows if r["half"] == "dev"}   # records from the dev half only, as every fit
        by_id = {c["id"]: c for c in loso_coverage(rows, groups, record_runs=dev).get("rows", [])}
        none = {"interval_90_s": None, "inside": False, "width": None}   # too few other runs: no interval, not held
        rows = [{**r, "interval_90_s": c["interval_90_s"], "inside": c["inside"], "interval_width": c["width"]}
                for r in rows for c in [by_id.get(r["id"], none)]]
    extra = [predict(r, g, execution, profile=profile) for r in doc.get("unscored", []) for g in r["gpus"]
             if half(r["source_group"]) in halves]
    return {"scored": rows, "unscored": extra,
            "halves": {h: summarize([r for r in rows if r["half"] == h]) for h in halves}}


def write_model_error(doc: dict, path: Path) -> dict:
    """The dev half's model error (rlhfsim.sim.uncertainty): per simulator phase and for the step, the root mean
    square of ln(predicted / measured) over the dev runs with the execution block (as ``rlhfsim import`` predicts)."""
    rows = [predict(r, r["gpu"], True) for r in doc["runs"] if half(r["source_group"]) == "dev"]
    by_verl = {v.removeprefix("timing_s/"): k for k, v in VERL_PHASE_KEYS.items()}
    logs: dict[str, list[float]] = {}
    for r in rows:
        for ph, e in r["phase_error_pct"].items():
            if ph in by_verl and e > -100:
                logs.setdefault(by_verl[ph], []).append(math.log1p(e / 100))
    rms = lambda xs: math.sqrt(sum(x * x for x in xs) / len(xs))  # noqa: E731
    out = {"source": "python scenarios/examples/field/field_table.py --write-model-error: the public field table's "
                     "dev half (scenarios/examples/field/runs.yaml), predicted with the execution block on the "
                     "bundled profiles; sigma = RMS of ln(predicted / measured)",
           "date": datetime.date.today().isoformat(), "runs": [r["id"] for r in rows],
           "step_sigma": round(rms([math.log1p(r["error_pct"] / 100) for r in rows]), 4),
           "phase_sigma": {ph: round(rms(v), 4) for ph, v in sorted(logs.items())},
           "phase_runs": {ph: len(v) for ph, v in sorted(logs.items())}}
    path.write_text(json.dumps(out, indent=1) + "\n")
    return out


def load_runs() -> dict:
    """runs.yaml and every runs-*.yaml beside it (the same layout: ``runs`` and ``unscored`` lists), as one document;
    a run id given twice is an error naming both files."""
    doc: dict = {"runs": [], "unscored": []}
    seen: dict[str, str] = {}
    for f in [HERE / "runs.yaml", *sorted(HERE.glob("runs-*.yaml"))]:
        part = yaml.safe_load(f.read_text()) or {}
        for key in ("runs", "unscored"):
            for r in part.get(key) or []:
                if r["id"] in seen:
                    sys.exit(f"{f.name}: {key}.{r['id']}: expected a run id not used before, got one {seen[r['id']]} has")
                seen[r["id"]] = f.name
                doc[key].append(r)
    return doc


# -- leave-one-source-out: the bundled profiles' pooled fit (rlhfsim.fromrun.pool), each run's source held out ----

# The pooled fit's options, chosen on the dev half's leave-one-source-out errors alone (docs/notebook.md, 2026-12-07,
# issue 53): a prior of 1 (each term a factor of 2 from its prior costs as much as a residual of ln 2), phases weighed
# by their share of the step, no term left out as confounded (the prior shares what the logs cannot tell apart), and
# the device terms pooled over every GPU at the reference GPU (rlhfsim.fromrun.pool.POOLINGS: dev LOSO 10.0% against
# 10.2% per family, a tie that the fewer terms, each from more runs and sources, decide).
FIT_DEFAULTS = {"prior": 1.0, "weighting": "share", "keep_confounded": True, "pooling": "reference"}


def pool_runs(doc: dict, halves: tuple[str, ...] = ("dev",)) -> list:
    """The runs of ``halves`` with a ``log:`` (a path relative to the runs file, as ``launch:``), as the pooled fit
    takes them. Only dev-half logs are ever fitted (runs.yaml's header)."""
    from rlhfsim.fromrun.fit import RunSpec
    from rlhfsim.fromrun.pool import PoolRun

    out = []
    for r in doc["runs"]:
        if r.get("log") and half(r["source_group"]) in halves:
            if r.get("framework", "verl") != "verl":
                continue   # the from-run fit reads verl launches only
            spec = RunSpec(r["id"], HERE / r["launch"], HERE / r["log"], r["gpu"], tuple(r.get("set", ())),
                           r.get("verl_version"))
            out.append(PoolRun(r["id"], r["source_group"], spec))
    return out


def _profile_file(tmp: Path, name: str, profile: dict) -> str:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps({k: v for k, v in profile.items() if not k.startswith("_")}))
    return str(path)


def loso(doc: dict, execution: bool = True, prior: float = FIT_DEFAULTS["prior"],
         weighting: str = FIT_DEFAULTS["weighting"], keep_confounded: bool = FIT_DEFAULTS["keep_confounded"],
         pooling: str = FIT_DEFAULTS["pooling"], coverage: bool = False) -> dict:
    """Every scored run (both halves) predicted with the pooled profiles fitted to the dev half's logs less its own
    source (a test-half run: the dev half's fit, its source never in it), beside the bundled ``default`` and each
    GPU's own bundled prior (``--profile auto`` before any log was fitted). Fits with the same runs are shared."""
    import tempfile
    import time

    from rlhfsim.fromrun.pool import SimCache, base_for, family, fit_pool, prepare_units

    t0 = time.perf_counter()
    units = prepare_units(pool_runs(doc))
    cache, fits, folds = SimCache(), {}, {}
    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        for r in doc["runs"]:
            h = half(r["source_group"])
            mine = [u for u in units if h == "test" or u.run.source_group != r["source_group"]]
            key = tuple(sorted({u.run.id for u in mine}))
            if key not in fits:
                t = time.perf_counter()
                fits[key] = fit_pool(mine, cache, prior=prior, weighting=weighting,
                                     keep_confounded=keep_confounded, pooling=pooling) if mine else None
                folds[key] = {"fitted_on": list(key), "seconds": round(time.perf_counter() - t, 1),
                              "terms": ({f"{p['path']}@{p['scope']}": p["fitted"] for p in fits[key].terms}
                                        if fits[key] else {})}
            f, fam = fits[key], family(r["gpu"])
            prof = f.profile(fam) if f is not None else base_for(fam)
            row = predict(r, r["gpu"], execution, profile=_profile_file(tmp, f"{r['id']}-loso", prof))
            prior_row = predict(r, r["gpu"], execution, profile=_profile_file(tmp, f"{r['id']}-prior", base_for(fam)))
            default_row = predict(r, r["gpu"], execution, profile="default")   # the datasheet-derived profile by name
            rows.append({**row, "fitted_on": list(key), "prior_error_pct": prior_row["error_pct"],
                         "prior_phase_error_pct": prior_row["phase_error_pct"],
                         "default_error_pct": default_row["error_pct"],
                         "default_phase_error_pct": default_row["phase_error_pct"]})
    summ = {h: loso_summary([r for r in rows if h in ("all", r["half"])]) for h in ("dev", "test", "all")}
    out = {"rows": rows, "summary": summ, "folds": list(folds.values()), "simulations": cache.simulations,
           "seconds": round(time.perf_counter() - t0, 1),
           "options": {"prior": prior, "weighting": weighting, "keep_confounded": keep_confounded, "pooling": pooling}}
    if coverage:
        out["coverage"] = loso_interval(doc, rows)
    return out


def loso_interval(doc: dict, rows: list[dict]) -> dict:
    """Each LOSO row's 90% interval (``rlhfsim.sim.modelerror.loso_coverage``: the record of the dev half's LOSO
    residuals of every *other* source, the run's own left out, so a run is never widened by its own error), whether it
    holds the measured step and how wide it is (high / low): over the dev half, the test half and both."""
    from rlhfsim.sim.modelerror import hindsight_width

    groups = {r["id"]: r["source_group"] for r in doc["runs"]}
    dev = {r["id"] for r in rows if r["half"] == "dev"}
    cov = loso_coverage(rows, groups, record_runs=dev)
    by_id = {c["id"]: c for c in cov.get("rows", [])}
    out = {"rows": cov.get("rows", []), "phase_coverage": cov.get("phase_coverage", {})}
    for h in ("dev", "test", "all"):
        ids = [r["id"] for r in rows if h in ("all", r["half"])]
        got = [by_id[i] for i in ids if i in by_id]
        res = [math.log(r["predicted_step_s"] / r["measured_step_s"]) for r in rows if h in ("all", r["half"])]
        floor = {f"{s:.0%}": round(w, 3) for s in (0.9, 0.8) for w in [hindsight_width(res, s)] if w is not None}
        out[h] = {"runs": len(ids), "with_interval": len(got), "inside": sum(c["inside"] for c in got),
                  "coverage": round(sum(c["inside"] for c in got) / len(ids), 3) if ids else None,
                  "median_width": round(statistics.median(c["width"] for c in got), 3) if got else None,
                  "hindsight_width": floor}
    return out


def loso_summary(rows: list[dict]) -> dict:
    """Median and max |step error|, runs beyond 60%, and each phase's median |error|: LOSO, the GPU's bundled prior
    and ``default`` side by side."""
    if not rows:
        return {"runs": 0}

    def of(step_key: str, phase_key: str) -> dict:
        errs = [abs(r[step_key]) for r in rows]
        by: dict[str, list[float]] = {}
        for r in rows:
            for k, e in r[phase_key].items():
                by.setdefault(k, []).append(abs(e))
        return {"median_abs_error_pct": round(statistics.median(errs), 1), "max_abs_error_pct": round(max(errs), 1),
                "beyond_60pct": sum(e > 60 for e in errs),
                "phase_median_abs_error_pct": {k: round(statistics.median(v), 1) for k, v in sorted(by.items())}}

    return {"runs": len(rows), "loso": of("error_pct", "phase_error_pct"),
            "prior": of("prior_error_pct", "prior_phase_error_pct"),
            "default": of("default_error_pct", "default_phase_error_pct")}


def show_loso(out: dict) -> None:
    print("leave-one-source-out: each run predicted with the pooled profiles fitted to the dev half's logs less its "
          "own source (a test-half run: the whole dev half's fit)")
    for r in out["rows"]:
        print(f"{r['id']:4} {r['half']:4} {r['gpu']:10} measured {r['measured_step_s']:8.2f} s  LOSO {r['predicted_step_s']:8.2f} s"
              f"  error {r['error_pct']:+7.1f}%  (GPU prior {r['prior_error_pct']:+.1f}%, default {r['default_error_pct']:+.1f}%)"
              f"  fitted on {', '.join(r['fitted_on']) or 'no log'}")
        if r["phase_error_pct"]:
            print(f"    phase error % LOSO {r['phase_error_pct']}")
            print(f"    phase error % prior {r['prior_phase_error_pct']}")
    for h, s in out["summary"].items():
        if not s["runs"]:
            continue
        for label in ("loso", "prior", "default"):
            x = s[label]
            print(f"{h:4} {label:7} {s['runs']:2} runs: median |step error| {x['median_abs_error_pct']:5.1f}%, max "
                  f"{x['max_abs_error_pct']:5.1f}%, beyond 60%: {x['beyond_60pct']}; per phase {x['phase_median_abs_error_pct']}")
    for f in out["folds"]:
        print(f"fold fitted on {', '.join(f['fitted_on']) or 'nothing'} ({f['seconds']} s): "
              + ", ".join(f"{k} {v:.4g}" for k, v in f["terms"].items()))
    if "coverage" in out:
        for h in ("dev", "test", "all"):
            c = out["coverage"][h]
            print(f"{h:4} 90% interval (its source's record left out) holds {c['inside']} of {c['runs']} runs "
                  f"({c['with_interval']} with an interval), median width x{c['median_width']}; the narrowest "
                  f"interval of one width holding 90% (80%) of them, placed with hindsight: "
                  f"x{c['hindsight_width'].get('90%')} (x{c['hindsight_width'].get('80%')})")
        print(f"     per phase: {out['coverage']['phase_coverage']}")
    print(f"({out['seconds']} s, {out['simulations']} simulations, options {out['options']})")


def fit_options() -> dict:
    """--prior X (rows keeping each term near its prior: rlhfsim.fromrun.pool.prior_rows), --weighting equal|share,
    --drop-confounded (a term confounded with one before it is left out, as calibrate --from-run does; needed with
    --prior 0) and --pooling family|reference (rlhfsim.fromrun.pool.POOLINGS: the device terms per GPU family, or one
    set at the reference GPU carried to every GPU); ``FIT_DEFAULTS`` otherwise."""
    from rlhfsim.fromrun.pool import POOLINGS

    pooling = sys.argv[sys.argv.index("--pooling") + 1] if "--pooling" in sys.argv else FIT_DEFAULTS["pooling"]
    if pooling not in POOLINGS:
        sys.exit(f"--pooling: expected one of {', '.join(POOLINGS)}, got {pooling!r}")
    weighting = sys.argv[sys.argv.index("--weighting") + 1] if "--weighting" in sys.argv else FIT_DEFAULTS["weighting"]
    if weighting not in ("equal", "share"):
        sys.exit(f"--weighting: expected equal or share, got {weighting!r}")
    return {"prior": float(sys.argv[sys.argv.index("--prior") + 1]) if "--prior" in sys.argv else FIT_DEFAULTS["prior"],
            "weighting": weighting,
            "keep_confounded": FIT_DEFAULTS["keep_confounded"] and "--drop-confounded" not in sys.argv,
            "pooling": pooling}


def write_loso_error(doc: dict, out: dict, path: Path) -> dict:
    """The model-error file of the leave-one-source-out rows (``rlhfsim.sim.modelerror.model_error_doc``: each run's
    residual ln(predicted / measured) of the step and of every logged phase, the per-phase bias, sigma and runs that
    ``rlhfsim.sim.uncertainty`` widens a GPU prediction with). The record is the dev half's runs only, as every fit
    of the table; the test half's LOSO summary rides along under ``test_half`` and is read by nothing."""
    from rlhfsim.sim.modelerror import model_error_doc

    groups = {r["id"]: r["source_group"] for r in doc["runs"]}
    dev = [r for r in out["rows"] if r["half"] == "dev"]
    me = model_error_doc(dev, groups, "python scenarios/examples/field/field_table.py --loso --write-model-error: the "
                         "field table's dev half, each run predicted with the bundled profiles' pooled fit of the public "
                         "logs refitted without its own source (rlhfsim.fromrun.pool)",
                         "leave-one-source-out", datetime.date.today().isoformat())
    me["profiles"] = "the bundled GPU profiles fitted to the public logs (public.json and the GPU families' profiles)"
    me["fit_options"] = out["options"]
    me["test_half"] = out["summary"]["test"]
    path.write_text(json.dumps(me, indent=1) + "\n")
    return me


def loso_main(doc: dict) -> None:
    if "--rows-from" in sys.argv:
        # the rows of an earlier `--loso --json` (its predictions, each run's source held out): the interval's coverage
        # alone, in a second instead of the refits' minutes
        path = Path(sys.argv[sys.argv.index("--rows-from") + 1])
        try:
            out = json.loads(path.read_text())
            out["rows"], out["summary"], out["folds"], out["options"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"--rows-from: expected the JSON that `--loso --json` printed, got {path} ({exc})", file=sys.stderr)
            sys.exit(2)
        out["coverage"] = loso_interval(doc, out["rows"])
    else:
        out = loso(doc, **fit_options(), coverage="--coverage" in sys.argv)
    if "--write-model-error" in sys.argv:
        out["model_error_file"] = write_loso_error(doc, out, Path(sys.argv[sys.argv.index("--write-model-error") + 1]))
    if "--json" in sys.argv:
        print(json.dumps(out, indent=1))
    else:
        show_loso(out)


def write_profiles(doc: dict, prior: float = FIT_DEFAULTS["prior"], weighting: str = FIT_DEFAULTS["weighting"],
                   keep_confounded: bool = FIT_DEFAULTS["keep_confounded"], pooling: str = FIT_DEFAULTS["pooling"]) -> dict:
    """The pooled fit of every dev-half log written into the bundled profiles (rlhfsim.fromrun.bundle)."""
    import time

    from rlhfsim.fromrun.bundle import write_bundled
    from rlhfsim.fromrun.pool import fit_pool, prepare_units

    t0 = time.perf_counter()
    fit = fit_pool(prepare_units(pool_runs(doc)), prior=prior, weighting=weighting, keep_confounded=keep_confounded,
                   pooling=pooling)
    cmd = "python scenarios/examples/field/field_table.py --write-profiles" \
        + (f" --prior {prior:g}" if prior != FIT_DEFAULTS["prior"] else "") \
        + (f" --weighting {weighting}" if weighting != FIT_DEFAULTS["weighting"] else "") \
        + (" --drop-confounded" if not keep_confounded else "") \
        + (f" --pooling {pooling}" if pooling != FIT_DEFAULTS["pooling"] else "")
    paths = write_bundled(fit, cmd, datetime.date.today().isoformat(), root=HERE.parents[2])
    return {"written": [str(p.relative_to(HERE.parents[2])) for p in paths], "runs": fit.runs,
            "terms": [{k: t[k] for k in ("term", "path", "scope", "prior", "fitted", "at_bound")} for t in fit.terms],
            "not_identified": fit.unidentified, "tails": fit.tails, "rms_log_residual": round(fit.rms_log_residual, 4),
            "evaluations": fit.evaluations, "simulations": fit.simulations, "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    """Both tables: the scenario's execution block off (the simulator's plain step) and on (verl's mechanics)."""
    doc = load_runs()
    if "--loso" in sys.argv:
        loso_main(doc)
        return
    if "--write-profiles" in sys.argv:
        print(json.dumps(write_profiles(doc, **fit_options()), indent=1))
        return
    if "--write-model-error" in sys.argv:
        path = Path(sys.argv[sys.argv.index("--write-model-error") + 1])
        print(json.dumps(write_model_error(doc, path), indent=1))
        return
    if "--profile" in sys.argv:
        profile = sys.argv[sys.argv.index("--profile") + 1]
    else:
        profile = None
    choice = sys.argv[sys.argv.index("--half") + 1] if "--half" in sys.argv else "dev"
    if choice not in ("dev", "test", "all"):
        sys.exit(f"--half: expected dev, test or all, got {choice!r}")
    halves = ("dev", "test") if choice == "all" else (choice,)
    coverage = "--coverage" in sys.argv
    out = {("with_execution" if e else "without_execution"): table(doc, e, halves, coverage and e, profile)
           for e in (False, True)}
    if "--json" in sys.argv:
        print(json.dumps(out, indent=1))
        return
    for label, tab in out.items():
        print(f"== {label.replace('_', ' ')}")
        for r in tab["scored"] + tab["unscored"]:
            tag = "" if r in tab["scored"] else "  (unscored: GPU not stated)"
            band = f"  90% [{r['interval_90_s'][0]:.2f}, {r['interval_90_s'][1]:.2f}]" if r.get("interval_90_s") else ""
            print(f"{r['id']:4} {r['half']:4} {r['gpu']:10} measured {r['measured_step_s']:8.2f} s  predicted "
                  f"{r['predicted_step_s']:8.2f} s  error {r['error_pct']:+7.1f}%{band}{tag}")
            print(f"    measured phases  {r['measured_phases_s']}")
            print(f"    predicted phases {r['predicted_phases_s']}")
            if r["phase_error_pct"]:
                print(f"    phase error %    {r['phase_error_pct']}")
        for h, summ in tab["halves"].items():
            if summ["runs"]:
                cov = (f", 90% interval holds {summ['interval_coverage']} (median width x{summ['interval_median_width']})"
                       if "interval_coverage" in summ else "")
                print(f"{h}: {summ['runs']} runs{cov}, median |step error| {summ['median_abs_error_pct']:.1f}%, max "
                      f"{summ['max_abs_error_pct']:.1f}%, forward-only phases {summ['forward_only_median_abs_error_pct']}%; "
                      f"per phase {summ['phase_median_abs_error_pct']}")


if __name__ == "__main__":
    main()

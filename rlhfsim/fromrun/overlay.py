"""The profile overlay a from-run fit writes, and the library entry of ``rlhfsim calibrate --from-run``.

An overlay is a profile that extends its base (``"extends": NAME-or-PATH``, resolved by
``rlhfsim.costs.profile.load_profile``) and sets only the fitted terms, so ``simulate --profile overlay.json``
and ``plan`` price with the run's own fitted terms and the base's everything else. Its ``from_run`` section
records the fit: each term with base and fitted values, its 90% intervals and the logged phases (with their log
lines) that determined it; the terms left unidentified and why; every run's steady and skipped steps and its
phases as measured, as the base profile predicts them and as fitted; and the one-line guard-rail warnings.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
from pathlib import Path

from rlhfsim.costs.profile import SCHEMA_VERSION, load_profile
from rlhfsim.fromrun.fit import RunSpec, fit, prepare


def overlay_doc(result: dict, base_ref: str, base: dict, name: str, gpu: str, command: str, out_dir: Path) -> dict:
    """The overlay JSON of a fit (module docstring), ``extends`` written relative to ``out_dir`` for a path."""
    from rlhfsim.fromrun.fit import priced
    from rlhfsim.hardware.catalog import get_gpu, stack_factor

    changed: dict = {}

    def put(path: str, value: float) -> None:
        *parents, key = path.split(".")
        node = changed
        for k in parents:
            node = node.setdefault(k, {})
        node[key] = value

    # the efficiencies every operation is priced with on this GPU (simulate's stack rate, fit.priced): the
    # overlay names the GPU, which ends the scaling where it is loaded, so it carries the scaled values
    gpu_spec = get_gpu(gpu)
    scaled = priced(result["profile"], gpu_spec)["operations"]
    for op, entry in scaled.items():
        if entry.get("compute_eff") != base["operations"].get(op, {}).get("compute_eff"):
            put(f"operations.{op}.compute_eff", entry["compute_eff"])
    fitted_ops = set()
    for t in result["terms"]:
        put(t["path"], t["fitted"])
        if t["path"].startswith("operations."):
            fitted_ops.add(t["path"].split(".")[1])
    for op, entry in changed.get("operations", {}).items():
        entry["source"] = "fitted-from-run" if op in fitted_ops else \
            f"{base['operations'][op].get('source', 'base')}: compute x{stack_factor(gpu_spec.name):.2f}, {gpu_spec.name}'s stack"
        # the base's own uncertainty draws describe the old values: without them, draws use the prior
        for k in ("samples", "covariance"):
            if base["operations"][op].get(k) is not None:
                entry[k] = None
    p = Path(base_ref)
    extends = base_ref if not (p.suffix == ".json" or os.sep in base_ref) else os.path.relpath(p.resolve(), out_dir.resolve())
    doc = {"schema_version": SCHEMA_VERSION, "name": name, "gpu": gpu, "extends": extends,
           "provenance": {"source": "fitted-from-run", "date": _dt.date.today().isoformat(), "command": command,
                          "base": str(base.get("_path", base_ref))},
           "operations": {}, **changed}
    doc["from_run"] = {k: result[k] for k in ("terms", "unidentified", "warnings", "runs", "rms_log_residual",
                                               "evaluations", "options", "spread")}
    return doc


def whatif_command(rec: dict, overlay_path: str, n_runs: int = 1) -> str:
    """The command that simulates a run "with this changed" under the overlay (``rlhfsim whatif``, which rebuilds
    the run as fitted, lengths' shape included, and applies CHANGE: a launch setting or a scenario path)."""
    run = f" --run {shlex.quote(rec['id'])}" if n_runs > 1 else ""
    return f"rlhfsim whatif {shlex.quote(overlay_path)}{run} --set CHANGE"


def calibrate_from_runs(specs: list[RunSpec], base_ref: str, out: Path, name: str | None, command: str,
                        **fit_kw) -> dict:
    """Prepare and fit the runs, write the overlay to ``out`` (a .json path, or a directory for profile.json)."""
    base = load_profile(base_ref)
    runs = [prepare(s) for s in specs]
    result = fit(runs, base, **fit_kw)
    path = out if out.suffix == ".json" else out / "profile.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = overlay_doc(result, base_ref, base, name or f"fromrun-{specs[0].id}", specs[0].gpu, command, path.parent)
    for rec in doc["from_run"]["runs"]:
        rec["whatif_command"] = whatif_command(rec, str(path), len(doc["from_run"]["runs"]))
    path.write_text(json.dumps(doc, indent=1) + "\n")
    load_profile(str(path))   # what was written loads (extends resolved, merged profile valid)
    return {"path": str(path), "doc": doc}

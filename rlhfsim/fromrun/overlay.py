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
    changed: dict = {}
    for t in result["terms"]:
        *parents, key = t["path"].split(".")
        node = changed
        for k in parents:
            node = node.setdefault(k, {})
        node[key] = t["fitted"]
    for op, entry in changed.get("operations", {}).items():
        entry["source"] = "fitted-from-run"
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
                                               "evaluations", "options")}
    return doc


def whatif_command(rec: dict, overlay_path: str) -> str:
    """The commands that simulate a run "with this changed" under the overlay: its launch imported again with the
    lengths and settings it was fitted with (CHANGE: the user's --set), and the fitted response shape set."""
    q = shlex.quote
    sets = "".join(f" --set {q(s)}" for s in rec["sets"])
    ver = f" --verl-version {q(rec['verl_version'])}" if rec["verl_version"] else ""
    shape = (rec["lengths"].get("response_shape") or {}).get("block")
    after = "".join(f" --set workload.response_length.{k}={shape[k]}" for k in ("median", "p99")) if shape else ""
    return (f"rlhfsim import verl {q(rec['launch'])} --gpu {rec['gpu']}{ver} --mean-prompt-len {rec['lengths']['prompt']:.1f} "
            f"--mean-response-len {rec['lengths']['response']:.1f}{sets} --set CHANGE -o WHATIF && rlhfsim simulate "
            f"WHATIF/scenario.yaml --profile {q(overlay_path)}{after} --names verl")


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
        rec["whatif_command"] = whatif_command(rec, str(path))
    path.write_text(json.dumps(doc, indent=1) + "\n")
    load_profile(str(path))   # what was written loads (extends resolved, merged profile valid)
    return {"path": str(path), "doc": doc}

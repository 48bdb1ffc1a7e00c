"""The pooled fit of the public logs (``rlhfsim.fromrun.pool``) written into the bundled GPU profiles, each fitted
term with the runs and logs it came from, and read back for ``rlhfsim runtimes``.

Where each term goes (``write_bundled``):

* a ``host`` term (one value for every GPU) into ``public.json`` (``gpu: any``, extends ``default``): the layer every
  GPU profile of the package extends, and the profile a GPU without one of its own is priced with
  (``rlhfsim.costs.profile.default_profile_for``);
* a ``device`` term fitted per GPU family (``pool.POOLINGS``: ``family``) into its family's profile (``h100-sxm.json``
  for H100 SXM, H200 and GH200; ``a100-80gb.json`` for the A100s; a GPU of its own family, e.g. ``h20.json``, created
  when its logs identify a device term and removed when a rewrite leaves it none), which then extends ``public``, the
  value stated for the profile's GPU; one
  fitted over every GPU (``reference``) into ``public.json``, stated for the reference GPU (``gpu: any``, an H100 SXM)
  like every efficiency there. Either way a profile priced on another GPU carries its compute efficiencies there
  (``rlhfsim.costs.model.with_stack_rate``), and a family profile inherits public's carried to its GPU
  (``rlhfsim.costs.profile.extend``).

Each file records its fitted terms under ``from_logs``, keyed by profile path (so the layers merge):
``{"term", "scope", "value", "prior", "prior_in_file", "runs", "sources", "held_out_checked" (determined by two
sources or more, so a leave-one-source-out fold still fits it), "determined_by": [{"run", "source", "log", "share",
"phases"}], "at_bound"}``, and under ``provenance.from_logs`` the command, the date, the runs fitted and the terms no
log identified (those keep their prior: the datasheet-derived value of ``default``, or a measured one where the
prior was measured; ``prior`` is stated as the value is, for the file's GPU). ``prior_in_file`` lets a rewrite, and a
later fit (``pool.base_for``, ``take_back`` on every layer), take back what an earlier one wrote: a term the file had
no value of its own for is removed, so it inherits again whatever the layers below say now.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlhfsim.costs.profile import BUNDLED_DIR, DEFAULT_PROFILE, GPU_PROFILES
from rlhfsim.fromrun import terms as T
from rlhfsim.fromrun.pool import PoolFit, take_back

PUBLIC = "public"


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def _has_own(doc: dict, path: str) -> bool:
    node = doc
    for k in path.split("."):
        if not isinstance(node, dict) or k not in node:
            return False
        node = node[k]
    return True


def public_skeleton() -> dict:
    return {"schema_version": 1, "extends": DEFAULT_PROFILE, "name": PUBLIC, "gpu": "any", "dtype": "bfloat16",
            "device": {"kind": "any", "name": "the bundled default's datasheet numbers with the host and software terms "
                                             "fitted to every public log of the field table's dev half"},
            "provenance": {"source": "fitted-from-public-logs",
                           "inherited": "every term no log identified from the bundled default profile (extends), "
                                        "with its own provenance"}}


def family_skeleton(fam: str) -> dict:
    """The profile of a GPU family that had none: the public layer with this family's device terms over it
    (``rlhfsim.costs.profile.default_profile_for`` finds a profile named after the GPU)."""
    return {"schema_version": 1, "extends": PUBLIC, "name": fam, "gpu": fam, "dtype": "bfloat16",
            "device": {"kind": "cuda", "name": f"{fam}: the bundled default's datasheet-derived terms with this GPU's "
                                                f"device terms fitted to its public logs"},
            "provenance": {"source": "fitted-from-public-logs",
                           "inherited": "every term no log of this GPU identified from public (extends), with its own "
                                        "provenance"}}


def write_bundled(fit: PoolFit, command: str, date: str, profiles_dir: Path = BUNDLED_DIR,
                  root: Path | None = None) -> list[Path]:
    """Write ``fit`` into ``public.json`` and the families' profiles (module docstring); returns the files written.
    Log paths are written relative to ``root`` (the repository) where they lie under it. A family with no bundled
    profile of its own is an error: its device terms would have nowhere to go."""
    def rel(log: str) -> str:
        p = Path(log).resolve()
        return str(p.relative_to(root.resolve())) if root is not None and p.is_relative_to(root.resolve()) else log

    scopes: dict[str, list[int]] = {}
    for j, p in enumerate(fit.params):
        scopes.setdefault(p.scope, []).append(j)
    targets = {"all": profiles_dir / f"{PUBLIC}.json"}
    for fam in sorted(set(fit.bases) | set(GPU_PROFILES.values())):   # every family profile extends public
        path = profiles_dir / f"{fam}.json"
        if path.is_file() or fam in scopes:     # a family with device terms and no profile yet gets one
            targets[fam] = path
    unidentified: dict[str, list[dict]] = {}
    for u in fit.unidentified:
        unidentified.setdefault(u["scope"], []).append(u)
    written = []
    for scope, path in targets.items():
        doc = take_back(_read(path)) if path.is_file() else public_skeleton() if scope == "all" else family_skeleton(scope)
        if scope != "all" and not scopes.get(scope) and doc == family_skeleton(scope):
            # a family profile an earlier fit created, with no device term of its own now (pooled at the reference
            # GPU instead): gone, so the family is priced from public, as a GPU without a profile is
            if path.is_file():
                path.unlink()
            continue
        if scope != "all":
            doc["extends"] = PUBLIC
            doc.setdefault("provenance", {})["extends_public"] = (
                "extends public (the host and software terms fitted to every public log, over the bundled default), "
                "not default directly: what this file does not set comes from there")
        recs = {}
        for j in scopes.get(scope, []):
            p, t = fit.params[j], fit.terms[j]
            sources = sorted({d["source"] for d in t["determined_by"]})
            rec = {"term": p.term.name, "meaning": p.term.meaning, "sources": sources,
                   "held_out_checked": len(sources) >= 2,
                   "scope": (f"GPU family {scope}" if scope != "all" else "every GPU (host and software)"
                             if p.term.pooled == "host" else
                             f"every GPU, stated for {t['stated_for']} and carried to each (catalog.carried_compute_eff)"
                             if p.path.endswith(".compute_eff") else "every GPU, the same fraction"),
                   "value": t["fitted"], "prior": t["prior"], "prior_in_file": _has_own(doc, p.path),
                   "runs": t["moves_runs"], "at_bound": t["at_bound"],
                   "determined_by": [{**d, "log": rel(d["log"])} for d in t["determined_by"]]}
            recs[p.path] = rec
            doc = T.with_values(doc, {p.path: t["fitted"]})
        doc["from_logs"] = recs
        # keyed by the file, so the layers' records merge (public's and the family's) instead of replacing each other
        doc.setdefault("provenance", {})["from_logs"] = {doc["name"]: {
            "command": command, "date": date, "runs": fit.runs,
            "logs": sorted({rel(u["log"]) for u in fit.units}),
            "not_identified": [f"{u['term']} ({u['path']}): {u['why']}" for u in unidentified.get(scope, [])]}}
        path.write_text(json.dumps(doc, indent=1) + "\n")
        written.append(path)
    return written


def provenance_lines(profile: dict) -> list[str]:
    """``rlhfsim runtimes``' lines for a profile's terms fitted to public logs: each term's value, prior, scope and
    the runs and logs that determined it; then the terms no log identified (they keep their prior)."""
    out = []
    for path, rec in sorted((profile.get("from_logs") or {}).items(), key=lambda kv: kv[1]["term"]):
        one = "" if rec.get("held_out_checked", True) or not rec["determined_by"] else " [one source: not checked held out]"
        by = ", ".join(f"{d['run']} {100 * d['share']:.0f}%" + (f" ({'/'.join(k.removeprefix('timing_s/') for k in d['phases'][:3])})"
                                                              if d["phases"] else "")
                       for d in rec["determined_by"]) or "held at a bound by " + ", ".join(rec["runs"])
        out.append(f"  {rec['term']} = {rec['value']:.4g} (prior {rec['prior']:.4g}) at {path}; {rec['scope']}; "
                   f"from {by}{' [at its bound]' if rec['at_bound'] else ''}{one}")
    logs: dict[str, set[str]] = {}
    for rec in (profile.get("from_logs") or {}).values():
        for d in rec["determined_by"]:
            logs.setdefault(d["log"], set()).add(d["run"])
    for log, runs in sorted(logs.items()):
        out.append(f"  log of {', '.join(sorted(runs))}: {log}")
    for name, prov in sorted(((profile.get("provenance") or {}).get("from_logs") or {}).items()):
        out.append(f"  {name}: fitted {prov.get('date')} by `{prov.get('command')}` on runs {', '.join(prov.get('runs', []))}")
        for line in prov.get("not_identified", []):
            out.append(f"    prior kept (no log identifies it): {line}")
    return out

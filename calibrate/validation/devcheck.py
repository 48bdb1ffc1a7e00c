"""The device check of a validation on CPU: the state probes taken around the real steps against each
profile's own (``calibrate.measuring.devstate``), per scenario where the scenarios ran one after another, and a
scenario's result marked inconclusive when the machine ran at other rates than its profile priced."""

from __future__ import annotations

import statistics


def device_checks(refs: list[str], probes: list[dict]) -> dict:
    """``device_check`` of a validation on CPU: the device state probes taken before and after the real
    steps (``calibrate.measuring.devstate``) and, per distinct profile, its comparison with them."""
    from calibrate.measuring.devstate import compare
    from rlhfsim.costs.profile import load_profile

    per = [{"ref": ref, **compare(load_profile(ref), probes)} for ref in dict.fromkeys(refs)]
    return {"probes": probes, "profiles": per, "warnings": [w for c in per for w in c["warnings"]]}


def mark_inconclusive(doc: dict, refs: list[list[str]], tolerance: float) -> None:
    """A scenario's error measures its profile only when the steps ran on the machine the profile priced:
    its row gets ``conclusive: false`` and ``inconclusive_reason`` when the device check (``device_check``:
    the state probes around the steps against the profile's own, ``calibrate.measuring.devstate.compare``) found
    another CPU model, or a rate of this machine that moved by more than ``tolerance`` (now / then; the
    scenario's own ``device_ratios`` when it has them, else the run's). A run whose memory rates read
    0.57-0.84x its cached calibration's turned a -23% error into +9% after recalibrating in the same
    window (issue 48): such an error describes the machine's state, not the model. ``refs``: per profile
    block (the document's, then ``other_profiles``), the profile reference of each scenario. Each block
    gets ``inconclusive_scenarios`` and the median |error| over its conclusive scenarios."""
    checks = {c["ref"]: c for c in doc["device_check"]["profiles"]}
    for block, block_refs in zip([doc, *doc["other_profiles"]], refs):
        for s, ref in zip(block["scenarios"], block_refs):
            c = checks[ref]
            ratios = s.get("device_ratios") or c["ratios"]
            moved = {k: r for k, r in ratios.items() if abs(r - 1) > tolerance}
            reasons = []
            if c["same_cpu_model"] is False:
                reasons.append(f"profile measured on {c['profile_cpu_model']!r}, this machine is {c['local_cpu_model']!r}")
            if moved:
                reasons.append("this machine's rates now / the profile's: " + ", ".join(f"{k} x{r:.2f}" for k, r in moved.items())
                               + f" (beyond {tolerance:.0%}; recalibrate in this state: --recalibrate)")
            s["conclusive"] = not reasons
            s["inconclusive_reason"] = "; ".join(reasons) or None
        errs = [abs(s["error_pct"]) for s in block["scenarios"] if s["conclusive"] and s["error_pct"] is not None]
        block["inconclusive_scenarios"] = sum(not s["conclusive"] for s in block["scenarios"])
        block["median_abs_error_pct_conclusive"] = statistics.median(errs) if errs else None


def scenario_device_ratios(doc: dict, profile_of, around: list[list[dict]]) -> None:
    """One scenario after another: each scenario's ``device_ratios``, the device check of its profile
    against the probes taken just before and just after its own steps (``around``: per scenario, a pair
    per visit, their medians), so a scenario measured in a slow minute of a shared machine says so next to its error.
    The probe takes 0.15 s: a burst, not the minute's average."""
    from calibrate.measuring.devstate import compare
    from rlhfsim.costs.profile import load_profile

    loaded: dict[str, dict] = {}
    for block in [doc, *doc["other_profiles"]]:
        name = block["profile"]
        for j, s in enumerate(block["scenarios"]):
            ref = profile_of(name, j)
            prof = loaded.setdefault(ref, load_profile(ref))
            s["device_ratios"] = compare(prof, list(around[j]))["ratios"]   # medians over its visits' probes

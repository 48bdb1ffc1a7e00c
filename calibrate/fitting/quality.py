"""A calibration's quality verdict, written into the profile as ``quality`` and printed as warnings.

A profile is ``status: "poor"`` (and every reason is a line in ``warnings``) when any measured operation's
held-out error exceeds ``HELDOUT_LIMIT`` (k-fold) or ``BY_MODEL_LIMIT`` (leave one model out), when an
operation's fit is underdetermined (fewer points than parameters + 2), or when more than
``CONTENDED_LIMIT`` of the points were kept while other processes competed for the CPU (``contended``,
``calibrate.running.session``) or the load average exceeded the calibration's threads at its start or end.
Otherwise ``status: "ok"``. A poor profile is still written (its points are real), with the warning,
so that it is never used unknowingly.
"""

from __future__ import annotations

HELDOUT_LIMIT = 0.25        # 25% mean held-out error
BY_MODEL_LIMIT = 0.5        # 50% leave-one-model-out error
CONTENDED_LIMIT = 0.1       # fraction of points measured while contended


def assess_quality(profile: dict) -> dict:
    warns: list[str] = []
    worst = None
    for op, p in profile["operations"].items():
        src = p.get("source")
        if src == "underdetermined":
            warns.append(f"{op}: underdetermined fit ({p.get('n_points')} points for {p.get('n_params')} "
                         "parameters; needs parameters + 2)")
            continue
        if src != "measured":
            continue
        h, hm = p.get("heldout_mape"), p.get("heldout_mape_by_model")
        if h is not None and (worst is None or h > worst[1]):
            worst = (op, h)
        if h is not None and h > HELDOUT_LIMIT:
            warns.append(f"{op}: held-out error {100 * h:.0f}% > {100 * HELDOUT_LIMIT:.0f}%")
        if hm is not None and hm > BY_MODEL_LIMIT:
            warns.append(f"{op}: leave-one-model-out error {100 * hm:.0f}% > {100 * BY_MODEL_LIMIT:.0f}%")
    pts = [p for p in profile.get("points", []) if "skipped" not in p]
    contended = sum(1 for p in pts if p.get("contended"))
    frac = contended / len(pts) if pts else 0.0
    if frac > CONTENDED_LIMIT:
        warns.append(f"{contended} of {len(pts)} points measured while other processes competed for the CPU")
    dev = profile.get("device", {})
    threads = dev.get("threads") or 1
    loads = {k: dev.get(k) for k in ("load_avg_1m_at_start", "load_avg_1m_at_end") if dev.get(k) is not None}
    busy = {k: v for k, v in loads.items() if dev.get("kind") == "cpu" and v > threads}
    if busy:
        warns.append("load average above the calibration's threads (" + ", ".join(f"{k} {v}" for k, v in busy.items())
                     + f" > {threads}): other processes shared the cores")
    return {"status": "poor" if warns else "ok", "warnings": warns, "heldout_limit": HELDOUT_LIMIT,
            "by_model_limit": BY_MODEL_LIMIT, "worst_heldout": None if worst is None else {"op": worst[0], "heldout_mape": worst[1]},
            "contended_points": contended, "measured_points": len(pts), **loads}

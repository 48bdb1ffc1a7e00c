"""The terminal tables of ``rlhfsim validate``: per scenario the step and phases measured against
predicted, then the in-step operations (generation, scorer calls, the other phases' calls) and the page
faults, and per profile the median error."""

from __future__ import annotations


def print_table(doc: dict) -> None:
    from rich.console import Console

    c = Console()
    blocks = [doc] + doc.get("other_profiles", [])
    for b in blocks:
        _print_block(c, b)
    for b in blocks:
        if b["median_abs_error_pct"] is not None:
            n_bad = b.get("inconclusive_scenarios", 0)
            tail = ""
            if n_bad:
                good = b["median_abs_error_pct_conclusive"]
                tail = (f"; {n_bad} inconclusive (the machine ran at other rates than the profile's)"
                        + (f", median over the other {len(b['scenarios']) - n_bad}: {good:.1f}%" if good is not None else ""))
            c.print(f"profile {b['profile']}: median |step-time error| over {len(b['scenarios'])} scenario(s): "
                    f"{b['median_abs_error_pct']:.1f}%, max {b['max_abs_error_pct']:.1f}%" + tail)
    if doc.get("steps_run"):
        c.print(f"real steps run {doc['steps_run']}" + (" (one executor in memory at a time, as a job runs alone)"
                                                       if doc["steps_run"] == "sequential" else
                                                       " (every scenario's executor in memory; slower than a job alone)"))
    g = doc.get("generated")
    if g:
        c.print(f"generated set: seed {g['seed']}, {g['n']} scenario(s) in {g['dir']} ({g['redraws']} re-draw(s)); rerun: {g['rerun']}")


def _print_block(c, doc: dict) -> None:
    from rich.table import Table

    for s in doc["scenarios"]:
        nv = s.get("visits", 1)
        t = Table(title=f"{s['name']}  ({s['steps']} steps, first {s['warmup_steps']} excluded"
                        + (f"; {nv} visits" if nv > 1 else "") + f")  profile {s['profile']}")
        for col in ("", "measured s", "predicted s", "error"):
            t.add_column(col, justify="right" if col else "left")
        inconclusive = s.get("conclusive") is False
        t.add_row("[bold]step[/bold]", f"{s['measured_step_time_s']:.3f}", f"{s['predicted_step_time_s']:.3f}",
                  f"{s['error_pct']:+.1f}%" + (" [red]inconclusive[/red]" if inconclusive else ""))
        if nv > 1:
            t.add_row("step, each visit", " ".join(f"{x:.3f}" for x in s["measured_step_time_s_visits"]), "",
                      " ".join(f"{x:+.1f}%" for x in s["error_pct_visits"]))
        lo, hi = s["predicted_step_time_s_interval"]
        t.add_row(f"{100 * s['interval_level']:.0f}% interval ({s['interval_source']})", "", f"{lo:.3f}-{hi:.3f}",
                  "inside" if s["inside_interval"] else "[red]outside[/red]")
        for ph, v in s["phases"].items():
            e = "-" if v["error_pct"] is None else f"{v['error_pct']:+.1f}%"
            t.add_row(ph, f"{v['measured_s']:.3f}", f"{v['predicted_s']:.3f}", e)
        c.print(t)
        if inconclusive:
            c.print(f"[red]inconclusive[/red]: the error above describes the machine's state, not the model: {s['inconclusive_reason']}")
        g = s.get("generation_ops")
        if g and g["operations"]:
            t = _ops_table(f"generation inside the step ({g['runtime']}; per step; priced alone, no co-running scoring)",
                           g["operations"])
            t.add_row("host work between operations", "", f"{g['outside_ops_s']:.3f}", "0.000 (not priced)", "", "", "")
            c.print(t)
        g = s.get("scoring_ops")
        if g and g["operations"]:
            add = g.get("prefill_added_s") or 0.0
            c.print(_ops_table(f"scorer calls inside the step (per step; priced alone: the simulator multiplies a call "
                               f"that starts while decode runs by prefill_slowdown {g['prefill_slowdown']:.2f}"
                               + (f" and adds {1e3 * add:.2f} ms" if add else "") + ")", g["operations"]))
        g = s.get("phase_ops")
        if g:
            c.print(_ops_table("the other phases' calls inside the step (per step; each priced alone at its own shape; "
                               "error of a phase's first call / of the others)", g, split=True))
        pf = s.get("page_faults")
        if pf:
            t = Table(title="fresh pages faulted in by the minibatches (per step; calibrate.cpu.pagefaults)")
            for col in ("phase", "minibatches", "measured MiB", "priced MiB", "measured at the profile's rate s"):
                t.add_column(col, justify="left" if col == "phase" else "right")
            for ph, v in pf.items():
                rate = "-" if v["measured_s_at_profile_rate"] is None else f"{v['measured_s_at_profile_rate']:.3f}"
                t.add_row(ph, f"{v['minibatches_per_step']:.1f}", f"{v['measured_mib']:.1f}", f"{v['priced_mib']:.1f}", rate)
            c.print(t)


def _ops_table(title: str, ops: dict, split: bool = False):
    """One row per in-step operation: calls per step, measured and predicted seconds, error, ms per call
    (``split``: and the error of each phase's first call and of its other calls, ``phase_operations``), and the
    prediction's largest cost terms (over 5% of it)."""
    from rich.table import Table

    def pct(x):
        return "-" if x is None else f"{x:+.1f}%"

    t = Table(title=title)
    def made_of(v):   # the predicted seconds' largest cost terms (rlhfsim.costs.terms), share of the prediction
        terms, total = v.get("predicted_terms_s") or {}, v["predicted_s"]
        return ", ".join(f"{k} {100 * x / total:.0f}%" for k, x in list(terms.items())[:3] if total > 0 and x > 0.05 * total)

    cols = ["operation", "calls", "measured s", "predicted s", "error", "measured ms/call", "predicted ms/call"]
    for col in cols + (["first call", "other calls"] if split else []) + ["predicted: largest terms"]:
        t.add_column(col, justify="left" if col in ("operation", "predicted: largest terms") else "right")
    for name, v in ops.items():
        row = [name, f"{v['calls_per_step']:.1f}", f"{v['measured_s']:.3f}", f"{v['predicted_s']:.3f}", pct(v["error_pct"]),
               f"{v['measured_ms_per_call']:.2f}", f"{v['predicted_ms_per_call']:.2f}"]
        if split:
            row += [pct(v["first_call_error_pct"]), pct(v["other_calls_error_pct"])]
        t.add_row(*row, made_of(v))
    return t

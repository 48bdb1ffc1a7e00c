"""Terminal tables (rich) for simulation summaries and comparisons."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from rlhfsim.contracts import VERL_PHASE_KEYS, VERL_STEP_KEY


def reward_scoring_text(r: dict) -> str:
    """One line on how the reward model scored (the summary's ``reward_scoring``)."""
    how = (f"streamed during generation by {r['streaming']} ({r['streaming_source']})" if r["streamed"] else
           "scored after generation (nothing streamed to it)")
    text = f"reward model {r['model']} ({r['arch']}): {how}"
    if r.get("retokenize"):
        text += "; responses re-tokenized for it"
    if r.get("truncated_to_tokens"):
        text += (f"; rows truncated to its {r['truncated_to_tokens']} positions (absolute position table; "
                 "the frameworks truncate on the right)")
    return text


FEW_STEADY = 3   # fewer steady steps than this: the step statistics are one or two steps, said so


def print_summary(s: dict, console: Console | None = None, names: str = "rlhfsim") -> None:
    """The summary as tables; ``names="verl"``: phases under verl's ``timing_s/*`` names
    (``rlhfsim.contracts.VERL_PHASE_KEYS``), with ``timing_s/step`` last."""
    c = console or Console()
    steady = s["steady_steps"]
    c.print(f"[bold]{s['scenario']}[/bold]  schedule={s['schedule']}  profile={s['profile']} ({s['profile_source']})  "
            f"steps={s['steps']} (first {s['warmup_steps']} excluded as warm-up; {steady} steady)")
    if steady < FEW_STEADY:
        c.print(f"[yellow]only {steady} steady step{'' if steady == 1 else 's'}: the mean, p50 and p90 below are "
                f"{'that step' if steady == 1 else 'those steps'} (give --steps {s['warmup_steps'] + FEW_STEADY} or "
                f"more for a steady state over several steps)[/yellow]")
    g = s.get("generation_runtime")
    if g:
        c.print(f"generation runtime={g['runtime']}" + (
            f"  [yellow](profile {s['profile']!r} has no costs of its own for it: priced with its plain "
            "prefill/decode, no call overhead or handoff)[/yellow]" if g["fallback"] else
            f"  call overhead {g['call_overhead_s'] * 1e3:.1f} ms, chunk handoff {g['handoff_s'] * 1e3:.1f} ms "
            f"+ {g['handoff_per_row_s'] * 1e3:.2f} ms/row"
            + (f", left padding {g['pad_step_s'] * 1e3:.2f} ms + {g['pad_step_per_row_s'] * 1e3:.3f} ms/row per decode step"
               if g.get("pad_step_s") or g.get("pad_step_per_row_s") else "")))
    if s.get("reward_scoring"):
        c.print(reward_scoring_text(s["reward_scoring"]))
    if g and g.get("sampling_logprobs"):
        c.print("sampled tokens' log-probs recorded: " + (
            "priced with the sampling tail measured with the recorder" if g.get("logprobs_priced") else
            f"[yellow]not priced (profile {s['profile']!r} has no sampling tail measured with the recorder for "
            f"{g['runtime']}: `python -m calibrate.running.extend PROFILE --cost-terms` measures it)[/yellow]"))
    iv = s.get("step_time_s_interval")
    band = f"{100 * s['uncertainty']['level']:.0f}% interval" if iv else ""
    t = Table(title="step time (s)")
    for col in ("mean", *((band,) if iv else ()), "p50", "p90", "tokens/s"):
        t.add_column(col, justify="right")
    t.add_row(f"{s['step_time_s']:.3f}", *((interval_text(iv),) if iv else ()), f"{s['step_time_p50_s']:.3f}",
              f"{s['step_time_p90_s']:.3f}", f"{s['tokens_per_s']:.0f}")
    c.print(t)
    st = s.get("schedule_stats") or {}
    if st.get("staleness_max"):   # an async schedule's batches trained by a later policy than generated them
        c.print(f"staleness reached over the steady steps: mean {st['staleness_mean']:.2f}, max {st['staleness_max']} "
                "steps between the policy that generated a batch and the one that trains on it")
    t = Table(title="phases (span per step; overlapped phases overlap)")
    t.add_column("phase")
    t.add_column("s", justify="right")
    if iv:
        t.add_column(band, justify="right")
    t.add_column("% of step", justify="right")
    # a streamed phase spans the generation it listens to: split its span into busy and waiting for rollouts
    waits = {ph: w for ph, w in (s.get("phase_waiting_s") or {}).items()
             if ph != "generate" and s["phases_s"].get(ph) and w > 0.005 * s["phases_s"][ph]}
    if waits:
        t.add_column("busy s", justify="right")
        t.add_column("waiting for rollouts", justify="right")
    piv = s.get("phases_s_interval") or {}
    for ph, v in s["phases_s"].items():
        w = waits.get(ph)
        t.add_row(VERL_PHASE_KEYS[ph] if names == "verl" else ph, f"{v:.3f}",
                  *((interval_text(piv[ph]) if ph in piv else "",) if iv else ()), f"{100 * v / s['step_time_s']:.1f}",
                  *(((f"{v - w:.3f}", f"{w:.3f} ({100 * w / v:.0f}%)") if w is not None else ("", "")) if waits else ()))
    if names == "verl":
        t.add_row(VERL_STEP_KEY, f"{s['step_time_s']:.3f}", *((interval_text(iv),) if iv else ()), "100.0",
                  *(("", "") if waits else ()))
    c.print(t)
    if waits:
        c.print("a streamed phase's span runs alongside generation: busy is its own calls, the rest waiting for "
                "rollouts (`rlhfsim explain` splits the busy part by cost term)")
    if iv:
        print_interval(s, c)
    defaults = [k for k, v in s.get("step_costs", {}).items() if v["source"] == "default"]
    if defaults:
        c.print(f"[yellow]step costs priced with documented defaults, not measured: {', '.join(defaults)} "
                "(docs/cost-model.md; `rlhfsim calibrate` measures them)[/yellow]")
    t = Table(title="GPU utilization (busy: work assigned; active: kernels running)")
    t.add_column("pool")
    t.add_column("GPUs", justify="right")
    t.add_column("roles")
    t.add_column("busy", justify="right")
    t.add_column("active", justify="right")
    for pool, u in s["gpu_busy"].items():
        info = s["pools"][pool]
        t.add_row(pool, str(info["gpus"]), ",".join(info["roles"]), f"{100 * u:.1f}%", f"{100 * s['gpu_active'][pool]:.1f}%")
    c.print(t)


def print_comparison(v: dict, console: Console | None = None) -> None:
    c = console or Console()
    t = Table(title="schedule comparison (same seed, same sampled lengths)")
    t.add_column("variant")
    t.add_column("step time s", justify="right")
    t.add_column("speedup vs sync", justify="right")
    t.add_column("GPU busy / active")
    t.add_column("off-policy tokens", justify="right")
    for name, r in v["variants"].items():
        sp = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        util = "  ".join(f"{p} {100 * u:.0f}%/{100 * r['gpu_active'][p]:.0f}%" for p, u in r["gpu_busy"].items())
        t.add_row(name, f"{r['step_time_s']:.2f}", sp, util, f"{100 * r['off_policy_token_frac']:.1f}%")
    c.print(t)


def interval_text(iv) -> str:
    """An interval [low, high] as text, to the digits the point is printed with."""
    return f"{iv[0]:.3f} - {iv[1]:.3f}"


def print_interval(s: dict, console: Console | None = None) -> None:
    """What the interval of the summary rests on (``rlhfsim.sim.uncertainty``), in a line or two."""
    c = console or Console()
    u = s["uncertainty"]
    lo, hi = s["step_time_s_interval"]
    how = ("; step from its phases" if "phases" in (u.get("model_error") or {}).get("step_from", "") else
           "; step from the step's own record" if u.get("model_error") else "")
    drawn = f"; {u['draws']} parameter draws re-simulated" if u["draws"] else ""
    c.print(f"{100 * u['level']:.0f}% interval {lo:.3f} - {hi:.3f} s (x{hi / s['step_time_s']:.2f} / "
            f"x{lo / s['step_time_s']:.2f} of the point), source: {u['source']}{how}{drawn}"
            + ("" if u.get("point_inside", True) else "; the point lies outside it: the model's error has a sign"))
    if u.get("note"):
        c.print(f"[yellow]{u['note']}[/yellow]")

"""Figures: pure functions from checked records (load.py) to a plotly ``Figure``. No I/O here.

Run figures: per-GPU timeline, step time per step, phase breakdown, utilization per pool, response-length
histogram, schedule comparison (when summary.json has "variants"). Plan figures: Pareto scatter (step
time vs cost), heatmap of the objective over two axes, phase spans of the Pareto configurations.

Definitions used in titles and hovers (same as the simulator's, notes/contracts.md):
- a phase's span in a step = last end - first start of that phase's work in the step; spans of overlapped
  phases overlap, so spans can add up to more than the step time;
- steady state = the steps after the first ``warmup_steps`` rows of steps.csv;
- utilization of a pool = busy GPU-seconds / (GPUs x wall seconds), from summary.json; active utilization
  counts only the kernel seconds (each interval's active_s, capped per GPU by its busy time).
"""

from __future__ import annotations

import html
import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rlhfsim.contracts import CPU_POOL
from rlhfsim.report.load import PHASES, ROLES, Intervals, PlanRecords, RunRecords, axis_key, axis_label
from rlhfsim.report.timeline import timeline_rows
from rlhfsim.words import count

ROLE_COLOURS = {"actor": "#1f77b4", "critic": "#ff7f0e", "reference": "#2ca02c", "reward": "#d62728",
                "rollout": "#9467bd"}
PHASE_COLOURS = {"generate": "#9467bd", "retokenize": "#c5b0d5", "reward": "#d62728", "old_log_prob": "#aec7e8", "reference": "#2ca02c",
                 "critic_fwd": "#ffbb78", "adv": "#bcbd22", "actor_train": "#1f77b4", "critic_train": "#ff7f0e",
                 "weight_sync": "#7f7f7f"}
PHASE_PATTERNS = {"generate": "", "retokenize": "-", "reward": "/", "old_log_prob": "-", "reference": "\\", "critic_fwd": "x",
                  "adv": "", "actor_train": ".", "critic_train": "+", "weight_sync": "|"}
assert set(PHASE_COLOURS) == set(PHASE_PATTERNS) == set(PHASES)
SERIES_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6",
                  "#9d755d", "#bab0ac")
TEMPLATE = "plotly_white"


def _title(text: str, note: str = "") -> dict:
    if not note:
        return {"text": html.escape(text, quote=False)}
    return {"text": f"{html.escape(text, quote=False)}<br><sup>{html.escape(note, quote=False)}</sup>"}


def _steady(run: RunRecords) -> np.ndarray:
    """Row indices of steps.csv in step order, after the warm-up rows."""
    order = np.argsort(run.steps["step"], kind="stable")
    return order[run.summary["warmup_steps"]:]


def timeline_figure(intervals: Intervals, pools: dict, *, max_bars: int = 6000,
                    merge_gap_s: float | None = None) -> go.Figure:
    """Per-GPU timeline: one row per GPU (identical GPUs share a row), one bar per busy interval
    (merged when contiguous), coloured by role, patterned by phase."""
    layout = timeline_rows(intervals, pools, max_bars=max_bars, merge_gap_s=merge_gap_s)
    labels = [label for label, _ in layout.rows]
    by_role: dict[str, list] = {role: [] for role in ROLES}
    for label, bars in layout.rows:
        for b in bars:
            by_role[b.role].append((label, b))
    fig = go.Figure()
    for role, items in by_role.items():
        if not items:
            continue
        # The legend shows a solid swatch per role (a bar's own swatch would show its phase pattern).
        fig.add_trace(go.Bar(name=role, orientation="h", x=[None], y=[None], legendgroup=role,
                             marker_color=ROLE_COLOURS[role], hoverinfo="skip"))
        fig.add_trace(go.Bar(
            name=role, orientation="h", legendgroup=role, showlegend=False,
            y=[label for label, _ in items],
            base=np.array([b.start_s for _, b in items]),
            x=np.array([b.end_s - b.start_s for _, b in items]),
            marker={"color": ROLE_COLOURS[role], "line": {"width": 0},
                    "pattern": {"shape": [PHASE_PATTERNS[b.phase] for _, b in items], "fgcolor": "white",
                                "size": 6, "solidity": 0.3}},
            customdata=[[b.phase, f"{b.step_lo}" if b.step_lo == b.step_hi else f"{b.step_lo}–{b.step_hi}",
                         b.merged, b.start_s, b.end_s] for _, b in items],
            hovertemplate=("%{y}<br><b>%{customdata[0]}</b> (" + role + "), step %{customdata[1]}<br>"
                           "%{customdata[3]:.4f} – %{customdata[4]:.4f} s (%{x:.4f} s, "
                           "%{customdata[2]} interval(s))<extra></extra>"),
        ))
    present = [p for p in PHASES if np.any(intervals.phase == p)]
    for phase in present:  # legend entries explaining the patterns (no data)
        fig.add_trace(go.Bar(
            name=f"{phase} (pattern)", orientation="h", x=[None], y=[None], legendgroup=f"phase {phase}",
            hoverinfo="skip", marker={"color": "#bbbbbb", "pattern": {"shape": PHASE_PATTERNS[phase],
                                                                    "fgcolor": "#333333", "solidity": 0.3}},
        ))
    note = layout.note or f"{layout.intervals} intervals"
    fig.update_layout(
        template=TEMPLATE, barmode="overlay", bargap=0.25, title=_title("Per-GPU timeline", note),
        height=210 + 22 * len(labels), xaxis={"title": "simulated time (s)"},
        legend={"orientation": "h", "x": 0, "xanchor": "left", "yref": "container", "y": 0, "yanchor": "bottom",
                "font": {"size": 11}},
        yaxis={"categoryorder": "array", "categoryarray": labels, "autorange": "reversed", "type": "category"},
        margin={"l": 150, "r": 20, "t": 70, "b": 130},
    )
    return fig


def gpu_busy_over_time(intervals: Intervals, pools: dict, bins: int = 120) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(GPU labels ``pool:gpu``, bin edges in s, busy fraction per GPU and time bin): the share of each
    bin in which the GPU had work assigned (the union of its intervals, so overlapping work counts once)."""
    t1 = float(intervals.end_s.max()) if len(intervals) else 0.0
    edges = np.linspace(0.0, max(t1, 1e-12), bins + 1)
    width = edges[1] - edges[0]
    labels, rows = [], []
    gpu_pools = [(pool, g) for pool, spec in pools.items() if pool != CPU_POOL for g in range(spec["gpus"])]
    for pool, g in gpu_pools:
        mask = (intervals.pool == pool) & (intervals.gpu == g)
        segs = sorted(zip(intervals.start_s[mask], intervals.end_s[mask]))
        merged: list[list[float]] = []
        for a, b in segs:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        row = np.zeros(bins)
        for a, b in merged:
            lo, hi = int(min(a // width, bins - 1)), int(min(b // width, bins - 1))
            for k in range(lo, hi + 1):
                row[k] += max(0.0, min(b, edges[k + 1]) - max(a, edges[k]))
        labels.append(f"{pool}:{g}")
        rows.append(np.clip(row / width, 0.0, 1.0))
    return labels, edges, np.array(rows).reshape(len(labels), bins)


def gpu_utilization_figure(intervals: Intervals, pools: dict, bins: int = 120) -> go.Figure:
    """Utilization per GPU over time: a heatmap, one row per GPU, one column per time bin, the busy
    fraction of the bin (``gpu_busy_over_time``)."""
    labels, edges, busy = gpu_busy_over_time(intervals, pools, bins)
    mids = (edges[:-1] + edges[1:]) / 2
    fig = go.Figure(go.Heatmap(z=busy, x=mids, y=labels, zmin=0, zmax=1, colorscale="Viridis",
                               colorbar={"title": "busy", "tickformat": ".0%"},
                               hovertemplate="%{y}<br>t = %{x:.3f} s<br>busy %{z:.0%}<extra></extra>"))
    fig.update_layout(template=TEMPLATE, height=160 + 20 * len(labels),
                      title=_title("Utilization per GPU over time", f"{bins} bins of {edges[1] - edges[0]:.3g} s"),
                      xaxis_title="simulated time (s)",
                      yaxis={"autorange": "reversed", "type": "category"}, margin={"l": 110})
    return fig


def step_time_figure(run: RunRecords) -> go.Figure:
    """Step time per step, warm-up steps shaded, steady-state mean as a dashed line."""
    s = run.steps
    order = np.argsort(s["step"], kind="stable")
    extra = ("generated_tokens", "trained_rollouts", "deferred", "off_policy_token_frac", "chunk_tokens", "delta")
    fig = go.Figure(go.Scatter(
        x=s["step"][order], y=s["step_time_s"][order], mode="lines+markers", name="step time",
        customdata=np.column_stack([s[c][order] for c in extra]),
        hovertemplate="step %{x}: %{y:.4f} s<br>" + "<br>".join(
            f"{c} %{{customdata[{i}]:.4g}}" for i, c in enumerate(extra)) + "<extra></extra>",
    ))
    warmup = run.summary["warmup_steps"]
    if 0 < warmup < len(order):
        fig.add_vrect(x0=s["step"][order[0]] - 0.5, x1=s["step"][order[warmup]] - 0.5, fillcolor="#cccccc",
                      opacity=0.35, line_width=0, annotation_text="warm-up", annotation_position="top left")
    mean = run.summary["step_time_s"]
    fig.add_hline(y=mean, line_dash="dash", line_color="#444444", annotation_text=f"steady mean {mean:.3f} s")
    fig.update_layout(template=TEMPLATE, height=340, showlegend=False,
                      title=_title("Step time per step", f"p50 {run.summary['step_time_p50_s']:.3f} s, "
                                   f"p90 {run.summary['step_time_p90_s']:.3f} s"),
                      xaxis_title="step", yaxis_title="step time (s)", yaxis_rangemode="tozero")
    return fig


def phase_breakdown_figure(run: RunRecords) -> go.Figure:
    """Steady-state mean span per phase (summary.json), whiskers p10-p90 over steady steps (steps.csv)."""
    phases = [p for p in PHASES if p in run.summary["phases_s"]]
    means = np.array([run.summary["phases_s"][p] for p in phases])
    steady = _steady(run)
    lo, hi = np.full(len(phases), np.nan), np.full(len(phases), np.nan)
    for i, p in enumerate(phases):
        values = run.steps[f"{p}_s"][steady] if p in run.step_phases and steady.size else np.array([])
        values = values[np.isfinite(values)]
        if values.size:
            lo[i], hi[i] = np.percentile(values, [10, 90])
    has_spread = np.isfinite(lo)
    fig = go.Figure(go.Bar(
        x=phases, y=means, marker_color=[PHASE_COLOURS[p] for p in phases],
        text=[f"{m:.3f}" for m in means], textposition="inside", insidetextanchor="start",
        error_y={"type": "data", "symmetric": False, "visible": bool(has_spread.any()),
                 "array": np.where(has_spread, np.maximum(hi - means, 0), 0),
                 "arrayminus": np.where(has_spread, np.maximum(means - lo, 0), 0)},
        customdata=np.column_stack([lo, hi]),
        hovertemplate="%{x}: mean span %{y:.4f} s<br>p10 %{customdata[0]:.4f} s, p90 %{customdata[1]:.4f} s"
                      "<extra></extra>",
    ))
    step = run.summary["step_time_s"]
    fig.add_hline(y=step, line_dash="dash", line_color="#444444", annotation_text=f"step time {step:.3f} s")
    fig.update_layout(template=TEMPLATE, height=380, showlegend=False,
                      title=_title("Phase breakdown (steady state)",
                                   "mean span per phase, whiskers p10–p90; overlapped phases' spans overlap"),
                      xaxis_title="phase", yaxis_title="span (s)")
    return fig


def utilization_figure(summary: dict) -> go.Figure:
    """Per pool, the fraction of GPU time busy (summary.json gpu_utilization: work assigned) and, when the
    run recorded it, active (gpu_active: kernels executing, what nvidia-smi / DCGM report)."""
    pools = list(summary["pools"])
    info = [f"{count(summary['pools'][p]['gpus'], 'GPU')}: {', '.join(summary['pools'][p]['roles'])}" for p in pools]
    series = [("busy", summary["gpu_utilization"]), ("active", summary.get("gpu_active"))]
    fig = go.Figure()
    for i, (name, values) in enumerate(s for s in series if s[1] is not None):
        util = [values.get(p, math.nan) for p in pools]
        fig.add_trace(go.Bar(
            x=pools, y=util, name=name, text=[f"{u:.0%}" if math.isfinite(u) else "n/a" for u in util],
            textposition="outside", marker_color=SERIES_COLOURS[i], customdata=info,
            hovertemplate="%{x}: %{y:.1%} " + name + "<br>%{customdata}<extra></extra>",
        ))
    note = "busy: GPU-seconds with work assigned / (GPUs × wall seconds)"
    if "gpu_active" in summary:
        note += "; active: kernel GPU-seconds (host overheads excluded) / the same"
    fig.update_layout(template=TEMPLATE, height=360, barmode="group", showlegend=len(fig.data) > 1,
                      title=_title("GPU utilization per pool", note),
                      xaxis_title="pool", yaxis={"title": "utilization", "range": [0, 1.1], "tickformat": ".0%"})
    return fig


def length_histogram_figure(lengths: dict[str, np.ndarray]) -> go.Figure:
    """Histogram of response lengths of trained rollouts (prompt lengths available from the legend)."""
    resp = lengths["response_len"]
    note = "no rollouts" if resp.size == 0 else (
        f"{resp.size} rollouts: mean {resp.mean():.0f}, p50 {np.percentile(resp, 50):.0f}, "
        f"p90 {np.percentile(resp, 90):.0f}, max {resp.max()} tokens")
    fig = go.Figure()
    fig.add_trace(go.Histogram(x=resp, name="response", marker_color=SERIES_COLOURS[0], nbinsx=60))
    fig.add_trace(go.Histogram(x=lengths["prompt_len"], name="prompt", marker_color=SERIES_COLOURS[1],
                               nbinsx=60, visible="legendonly"))
    fig.update_layout(template=TEMPLATE, height=340, barmode="overlay", title=_title("Response lengths", note),
                      xaxis_title="tokens", yaxis_title="rollouts")
    fig.update_traces(opacity=0.8)
    return fig


def schedule_comparison_figure(summary: dict) -> go.Figure:
    """Step time (labelled with speedup), phase spans and utilization per schedule variant; the run's own
    schedule is added as "<schedule> (this run)" when the variants do not include it."""
    variants = dict(summary["variants"])
    if summary["schedule"] not in variants:
        variants = {f"{summary['schedule']} (this run)": {
            "step_time_s": summary["step_time_s"], "speedup": None,
            "phases_s": summary["phases_s"], "gpu_utilization": summary["gpu_utilization"],
            **({"gpu_active": summary["gpu_active"]} if "gpu_active" in summary else {})}, **variants}
    names = list(variants)
    colours = {n: SERIES_COLOURS[i % len(SERIES_COLOURS)] for i, n in enumerate(names)}
    util_title = ("GPU busy (plain) / active (hatched)" if any("gpu_active" in variants[n] for n in names)
                  else "GPU utilization")
    fig = make_subplots(rows=1, cols=3, column_widths=[0.25, 0.45, 0.3], horizontal_spacing=0.07,
                        subplot_titles=("step time (s)", "phase span (s)", util_title))
    fig.add_trace(go.Bar(
        x=names, y=[variants[n]["step_time_s"] for n in names], marker_color=[colours[n] for n in names],
        text=["" if variants[n].get("speedup") is None else f"{variants[n]['speedup']:.2f}×" for n in names],
        textposition="outside", showlegend=False, hovertemplate="%{x}: %{y:.4f} s %{text}<extra></extra>",
    ), row=1, col=1)
    phases = [p for p in PHASES if any(p in variants[n]["phases_s"] for n in names)]
    pools = list(dict.fromkeys(p for n in names for p in variants[n]["gpu_utilization"]))
    for n in names:
        fig.add_trace(go.Bar(
            x=phases, y=[variants[n]["phases_s"].get(p) for p in phases], name=n, legendgroup=n,
            marker_color=colours[n], hovertemplate=n + ": %{x} %{y:.4f} s<extra></extra>",
        ), row=1, col=2)
        fig.add_trace(go.Bar(
            x=pools, y=[variants[n]["gpu_utilization"].get(p) for p in pools], name=n, legendgroup=n,
            showlegend=False, marker_color=colours[n], hovertemplate=n + ": %{x} %{y:.1%} busy<extra></extra>",
        ), row=1, col=3)
        if "gpu_active" in variants[n]:  # hatched: the kernel-executing share of the same GPU time
            fig.add_trace(go.Bar(
                x=pools, y=[variants[n]["gpu_active"].get(p) for p in pools], name=n, legendgroup=n,
                showlegend=False, marker_color=colours[n], marker_pattern_shape="/", opacity=0.6,
                hovertemplate=n + ": %{x} %{y:.1%} active<extra></extra>",
            ), row=1, col=3)
    fig.update_yaxes(tickformat=".0%", range=[0, 1.05], row=1, col=3)
    fig.update_layout(template=TEMPLATE, height=420, barmode="group",
                      title=_title("Schedule comparison", "same scenario and seed under each schedule; label: speedup over sync"))
    return fig


def _numeric_axis(values: list) -> bool:
    return all(isinstance(v, float) for v in values)


def _axis_order(plan: PlanRecords, axis: str) -> list:
    """Axis keys in plan.json order, then any value only found in results.csv."""
    keys = list(dict.fromkeys(axis_key(v) for v in plan.plan["axes"][axis]))
    extra = {r[axis] for r in plan.rows} - set(keys)
    return keys + sorted(extra, key=str)


def _row_text(plan: PlanRecords, row: dict) -> str:
    return "<br>".join(f"{a} = {axis_label(axis_key(row.get(a, 'n/a')))}" for a in plan.axes)


def pareto_figure(plan: PlanRecords) -> go.Figure:
    """Step time vs cost of every feasible configuration; the Pareto front (plan.json) as a line,
    the best configuration as a star. Colour: the first categorical axis with more than one value."""
    feasible = [r for r in plan.rows if r["feasible"]]
    colour_axis = next((a for a in plan.axes if not _numeric_axis([r[a] for r in plan.rows])
                        and len({r[a] for r in plan.rows}) > 1), None)
    groups = {}
    for r in feasible:
        groups.setdefault(axis_label(r[colour_axis]) if colour_axis else "configuration", []).append(r)
    fig = go.Figure()
    for i, (name, rows) in enumerate(groups.items()):
        fig.add_trace(go.Scatter(
            x=[r["cost_per_1000_steps"] for r in rows], y=[r["step_time_s"] for r in rows], mode="markers",
            name=f"{colour_axis} = {name}" if colour_axis else name, text=[_row_text(plan, r) for r in rows],
            marker={"color": SERIES_COLOURS[i % len(SERIES_COLOURS)], "size": 8, "opacity": 0.7},
            hovertemplate="%{text}<br>step time %{y:.4f} s, cost %{x:.4g}<extra></extra>",
        ))
    front = sorted((r for r in plan.plan["pareto"] if "cost_per_1000_steps" in r and "step_time_s" in r),
                   key=lambda r: r["cost_per_1000_steps"])
    # the step's 90% interval on the front (rlhfsim.sim.uncertainty), where its rows carry one
    banded = front and all(isinstance(r.get("step_time_lo_s"), (int, float)) for r in front)
    fig.add_trace(go.Scatter(
        x=[r["cost_per_1000_steps"] for r in front], y=[r["step_time_s"] for r in front], mode="lines+markers",
        error_y={"type": "data", "symmetric": False, "color": "#888888",
                 "array": [r["step_time_hi_s"] - r["step_time_s"] for r in front],
                 "arrayminus": [r["step_time_s"] - r["step_time_lo_s"] for r in front]} if banded else None,
        name="Pareto front" + (" (bars: 90% interval of the step)" if banded else ""), line={"color": "#222222", "width": 2},
        marker={"symbol": "circle-open", "size": 12, "color": "#222222"}, text=[_row_text(plan, r) for r in front],
        hovertemplate="Pareto<br>%{text}<br>step time %{y:.4f} s, cost %{x:.4g}<extra></extra>",
    ))
    best = plan.plan.get("best")
    if best and "cost_per_1000_steps" in best and "step_time_s" in best:
        fig.add_trace(go.Scatter(
            x=[best["cost_per_1000_steps"]], y=[best["step_time_s"]], mode="markers", name="best",
            marker={"symbol": "star", "size": 18, "color": "#e45756", "line": {"width": 1, "color": "#222222"}},
            text=[_row_text(plan, best)], hovertemplate="best<br>%{text}<extra></extra>",
        ))
    bound = plan.plan.get("max_step_time_s")
    if isinstance(bound, (int, float)) and not isinstance(bound, bool):
        fig.add_hline(y=bound, line_dash="dot", line_color="#888888", annotation_text=f"max step time {bound:g} s")
    infeasible = len(plan.rows) - len(feasible)
    fig.update_layout(template=TEMPLATE, height=460,
                      title=_title("Step time vs cost", f"{len(feasible)} feasible configurations, "
                                   f"{infeasible} infeasible (not drawn); lower left is better"),
                      xaxis_title="cost per 1000 steps", yaxis_title="step time (s)")
    return fig


# Objective names of plan files (rlhfsim/plan/spec.py OBJECTIVES; a unit test keeps the two equal).
OBJECTIVE_METRICS = {"min_step_time": "step_time_s", "min_cost": "cost_per_1000_steps", "min_gpus": "gpus"}


def objective_metric(plan: PlanRecords) -> str:
    """The results.csv column the heatmap colours by: plan.json "objective" when it names a metric column
    (as {"metric": column}, a column name or an objective name like "min_cost"), otherwise step_time_s."""
    objective = plan.plan.get("objective")
    if isinstance(objective, dict):
        objective = objective.get("metric", objective.get("kind"))
    objective = OBJECTIVE_METRICS.get(objective, objective) if isinstance(objective, str) else objective
    metrics = ("step_time_s", "cost_per_1000_steps", "gpus", *plan.phase_columns, *plan.util_columns)
    return objective if isinstance(objective, str) and objective in metrics else "step_time_s"


def heatmap_figure(plan: PlanRecords, x: str, y: str, metric: str) -> go.Figure:
    """Best (lowest) ``metric`` over all other axes, for each (x, y) cell; cells whose configurations are
    all infeasible are blank with the first reason in the hover."""
    xs, ys = _axis_order(plan, x), _axis_order(plan, y)
    z = np.full((len(ys), len(xs)), np.nan)
    text = [["no configuration"] * len(xs) for _ in ys]
    xi, yi = {k: i for i, k in enumerate(xs)}, {k: i for i, k in enumerate(ys)}
    for r in plan.rows:
        i, j = yi[r[y]], xi[r[x]]
        value = r[metric]
        if r["feasible"] and math.isfinite(value):
            if not (value >= z[i, j]):  # NaN or larger
                z[i, j] = value
                text[i][j] = html.escape(_row_text(plan, r).replace("<br>", "; "), quote=False)
        elif not math.isfinite(z[i, j]) and text[i][j] == "no configuration":
            text[i][j] = "infeasible: " + html.escape(r["reason"] or "no reason given", quote=False)
    fig = go.Figure(go.Heatmap(
        x=[axis_label(k) for k in xs], y=[axis_label(k) for k in ys], z=z, customdata=text,
        colorscale="Viridis", reversescale=True, colorbar={"title": metric}, hoverongaps=True,
        texttemplate="%{z:.3g}", hovertemplate=f"{x} = %{{x}}<br>{y} = %{{y}}<br>{metric} = %{{z:.4g}}"
                                                "<br>%{customdata}<extra></extra>",
    ))
    fig.update_layout(template=TEMPLATE, height=max(320, 160 + 40 * len(ys)),
                      title=_title(f"Best {metric} by {x} and {y}", "minimum over the other axes; blank: infeasible"),
                      xaxis={"title": x, "type": "category"}, yaxis={"title": y, "type": "category"})
    return fig


def plan_phase_figure(plan: PlanRecords) -> go.Figure:
    """Phase spans of each Pareto configuration (grouped by phase), to see what limits each one."""
    phases = [c for c in plan.phase_columns]
    fig = go.Figure()
    for i, row in enumerate(sorted(plan.plan["pareto"], key=lambda r: r.get("cost_per_1000_steps", 0))):
        label = ", ".join(axis_label(axis_key(row.get(a, "n/a"))) for a in plan.axes)
        fig.add_trace(go.Bar(
            x=[c[:-2] for c in phases], y=[row.get(c) for c in phases], name=label,
            marker_color=SERIES_COLOURS[i % len(SERIES_COLOURS)],
            hovertemplate=html.escape(label, quote=False) + "<br>%{x}: %{y:.4f} s<extra></extra>",
        ))
    fig.update_layout(template=TEMPLATE, height=400, barmode="group",
                      title=_title("Phase spans of the Pareto configurations", "legend: " + ", ".join(plan.axes)),
                      xaxis_title="phase", yaxis_title="span (s)")
    return fig

"""Assemble figures into one self-contained HTML page: plotly.js is embedded once in <head> (the reader may
be offline), every figure is a <div> plus a Plotly.newPlot call, nothing is fetched from the network.

A run report has: summary tables, per-GPU timeline, step time per step, phase breakdown, utilization per
pool, response-length histogram, and the schedule comparison when summary.json has "variants".
A plan report has: plan tables (axes, best, Pareto rows), Pareto scatter, heatmap over two axes (plan.json
"heatmap" or the first two axes), phase spans of the Pareto configurations.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass

import plotly.graph_objects as go
import plotly.offline

from rlhfsim.report import figures
from rlhfsim.report.load import PlanRecords, RunRecords, axis_key, axis_label
from rlhfsim.report.text import reward_scoring_text
from rlhfsim.words import count

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1400px;
       color: #222; padding: 0 16px; }
h1 { font-size: 1.5em; margin-bottom: 4px; } h2 { font-size: 1.15em; margin: 28px 0 6px; }
table { border-collapse: collapse; font-size: 0.9em; margin: 6px 0 12px; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } .note { color: #555; font-size: 0.9em; margin: 2px 0 6px; }
section { margin-bottom: 18px; } code { background: #f4f4f4; padding: 0 3px; }
"""


_SHOWN_SUMMARY_KEYS = {"scenario", "schedule", "profile", "steps", "warmup_steps", "step_time_s", "step_time_p50_s",
                       "step_time_p90_s", "tokens_per_s", "pools", "phases_s", "gpu_utilization", "gpu_busy",
                       "gpu_active", "schedule_stats", "variants"}


@dataclass(frozen=True)
class Section:
    """One block of the page: a heading, an optional note, and a figure and/or an HTML table."""

    title: str
    figure: go.Figure | None = None
    note: str = ""
    table_html: str = ""


def _stat_value(value) -> object:
    """Long numeric lists (one value per step) shortened to count, range and mean."""
    if isinstance(value, list) and len(value) > 12 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return (f"{len(value)} values: min {min(value):.4g}, mean {sum(value) / len(value):.4g}, "
                f"max {max(value):.4g}; first {', '.join(f'{v:.4g}' for v in value[:6])}, ...")
    return value


def _cell(value) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    if isinstance(value, (dict, list)):
        return html.escape(json.dumps(value, sort_keys=True))
    return html.escape(str(value))


def table(rows: list[tuple[str, object]]) -> str:
    """A two-column key/value table."""
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{_cell(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def grid(header: list[str], rows: list[list[object]]) -> str:
    """A table with a header row."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def assemble(title: str, subtitle: str, sections: list[Section]) -> str:
    """The page: plotly.js once in <head>, then each section; figures get ids fig-0, fig-1, ..."""
    parts = []
    index = 0
    for section in sections:
        parts.append(f"<section><h2>{html.escape(section.title)}</h2>")
        if section.note:
            parts.append(f'<p class="note">{html.escape(section.note)}</p>')
        parts.append(section.table_html)
        if section.figure is not None:
            height = section.figure.layout.height or 450
            parts.append(section.figure.to_html(
                full_html=False, include_plotlyjs=False, div_id=f"fig-{index}", default_height=f"{height}px",
                config={"displaylogo": False, "responsive": True}))
            index += 1
        parts.append("</section>")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>\n"
        f"<script type=\"text/javascript\">{plotly.offline.get_plotlyjs()}</script>\n</head><body>\n"
        f"<h1>{html.escape(title)}</h1><p class=\"note\">{html.escape(subtitle)}</p>\n"
        + "\n".join(parts) + "\n</body></html>\n"
    )


def figure_count(sections: list[Section]) -> int:
    return sum(s.figure is not None for s in sections)


def _utilization_text(summary: dict, pool: str) -> str:
    busy = summary["gpu_utilization"].get(pool)
    text = "busy n/a" if busy is None else f"busy {busy:.1%}"
    if "gpu_active" in summary and pool in summary["gpu_active"]:
        text += f", active {summary['gpu_active'][pool]:.1%}"
    return text


def _interval_text(s: dict) -> str:
    """The step's interval beside its mean (``simulate``'s, rlhfsim.sim.uncertainty), and what it rests on."""
    iv, u = s.get("step_time_s_interval"), s.get("uncertainty") or {}
    if not iv:
        return ""
    return f"; {100 * u.get('level', 0.9):.0f}% interval {iv[0]:.4g} - {iv[1]:.4g} s ({u.get('source', '')})"


def run_sections(run: RunRecords, *, max_bars: int = 6000) -> list[Section]:
    s = run.summary
    overview = table([
        ("scenario", s["scenario"]), ("schedule", s["schedule"]), ("profile", s["profile"]),
        ("steps", f"{s['steps']} ({s['warmup_steps']} warm-up)"),
        ("step time, steady mean", f"{s['step_time_s']:.4f} s" + _interval_text(s)),
        ("step time p50 / p90", f"{s['step_time_p50_s']:.4f} s / {s['step_time_p90_s']:.4f} s"),
        ("tokens per second", f"{s['tokens_per_s']:.1f}"),
        *((("reward scoring", reward_scoring_text(s["reward_scoring"])),) if s.get("reward_scoring") else ()),
        *((f"pool {name}", f"{count(p['gpus'], 'GPU')}: {', '.join(p['roles'])}; " + _utilization_text(s, name))
          for name, p in s["pools"].items()),
        # Further scalar fields the simulator adds (e.g. profile_source, steady_steps).
        *((k, v) for k, v in s.items() if k not in _SHOWN_SUMMARY_KEYS and isinstance(v, (str, int, float))),
    ])
    stats = s["schedule_stats"]
    sections = [
        Section("Summary", table_html=overview),
        Section(f"Schedule statistics ({s['schedule']})",
                table_html=table([(k, _stat_value(v)) for k, v in stats.items()]) if stats else "<p class=\"note\">none recorded</p>"),
        Section("Per-GPU timeline", figures.timeline_figure(run.intervals, s["pools"], max_bars=max_bars),
                note="Bars are busy intervals, coloured by role, patterned by phase; hover for phase and step. "
                     "Zoom by dragging; double-click to reset."),
        Section("Step time", figures.step_time_figure(run)),
        Section("Phase breakdown", figures.phase_breakdown_figure(run)),
        Section("Utilization per pool", figures.utilization_figure(s),
                note="Busy: a GPU has work assigned. Active: it executes kernels (the cost model's roofline "
                     "part, host overheads excluded), what nvidia-smi and DCGM report as GPU utilization."),
        Section("Utilization per GPU over time", figures.gpu_utilization_figure(run.intervals, s["pools"]),
                note="Each row is one GPU; colour is the share of each time bin in which it had work assigned."),
        Section("Response lengths", figures.length_histogram_figure(run.lengths)),
    ]
    if s.get("variants"):
        sections.append(Section("Schedule comparison", figures.schedule_comparison_figure(s)))
    return sections


def run_report_html(run: RunRecords, *, max_bars: int = 6000) -> str:
    """The run report page."""
    s = run.summary
    return assemble(f"rlhfsim run: {s['scenario']} ({s['schedule']})", f"from {run.path}",
                    run_sections(run, max_bars=max_bars))


def heatmap_axes(plan: PlanRecords) -> tuple[str, str] | None:
    """plan.json "heatmap" axes, else the first two axes; None with fewer than two axes."""
    chosen = plan.plan.get("heatmap")
    if chosen:
        return chosen["x"], chosen["y"]
    return (plan.axes[0], plan.axes[1]) if len(plan.axes) >= 2 else None


def _has_interval(plan: PlanRecords) -> bool:
    return any(isinstance(r.get("step_time_lo_s"), float) and r["step_time_lo_s"] == r["step_time_lo_s"] for r in plan.rows)


def _config_rows(plan: PlanRecords, rows: list[dict]) -> list[list[object]]:
    band = _has_interval(plan)

    def iv(r):
        lo, hi = r.get("step_time_lo_s"), r.get("step_time_hi_s")
        return f"{lo:.4g} - {hi:.4g}" if isinstance(lo, float) and lo == lo and isinstance(hi, float) else "-"

    return [[axis_label(axis_key(r.get(a, ""))) for a in plan.axes]
            + [r.get("step_time_s", ""), *((iv(r),) if band else ()), r.get("cost_per_1000_steps", ""), r.get("gpus", "")]
            for r in rows]


def _objective_text(objective) -> object:
    if isinstance(objective, dict) and isinstance(objective.get("kind"), str) and isinstance(objective.get("metric"), str):
        return f"{objective['kind']} ({objective['metric']})"
    return "" if objective is None else objective


def plan_sections(plan: PlanRecords) -> list[Section]:
    feasible = sum(r["feasible"] for r in plan.rows)
    header = [*plan.axes, "step_time_s", *(("step time 90% interval",) if _has_interval(plan) else ()),
              "cost_per_1000_steps", "gpus"]
    best = plan.plan.get("best")
    pareto = sorted(plan.plan["pareto"], key=lambda r: r.get("cost_per_1000_steps", 0))
    sections = [
        Section("Plan", table_html=table([
            ("configurations", f"{len(plan.rows)} ({feasible} feasible)"),
            ("objective", _objective_text(plan.plan.get("objective"))),
            *((f"axis {a}", ", ".join(axis_label(axis_key(v)) for v in plan.plan["axes"][a])) for a in plan.axes),
        ])),
        Section("Best configuration", note=str(best.get("why", "")) if best else "",
                table_html=grid(header, _config_rows(plan, [best])) if best
                else "<p class=\"note\">no feasible configuration</p>"),
        Section("Pareto configurations (step time vs cost)", table_html=grid(header, _config_rows(plan, pareto))),
        Section("Pareto scatter", figures.pareto_figure(plan)),
    ]
    axes = heatmap_axes(plan)
    if axes is not None:
        sections.append(Section("Heatmap", figures.heatmap_figure(plan, *axes, figures.objective_metric(plan))))
    else:
        sections.append(Section("Heatmap", note="the plan has a single axis: no heatmap"))
    if plan.phase_columns and pareto:
        sections.append(Section("Phase spans", figures.plan_phase_figure(plan)))
    return sections


def plan_report_html(plan: PlanRecords) -> str:
    """The plan report page."""
    name = plan.plan.get("name")
    return assemble(f"rlhfsim plan: {name}" if isinstance(name, str) else "rlhfsim plan", f"from {plan.path}",
                    plan_sections(plan))

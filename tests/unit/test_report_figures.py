"""rlhfsim.report: loading and checking run/plan directories, timeline reduction, figures, HTML, trace."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import plotly.offline
import pytest

from rlhfsim.errors import RlhfsimError
from rlhfsim.report import render
from rlhfsim.report import figures
from rlhfsim.report.html import plan_report_html, plan_sections, run_report_html, run_sections
from rlhfsim.report.load import PHASES, ROLES, Intervals, load_plan, load_run
from rlhfsim.report.synthetic import write_plan_dir, write_run_dir
from rlhfsim.report.timeline import assign_lanes, merge_intervals, timeline_rows
from rlhfsim.report.trace import chrome_trace

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_dir(tmp_path):
    return write_run_dir(tmp_path / "run", steps=6, warmup_steps=1, chunks=4, seed=3)


@pytest.fixture
def plan_dir(tmp_path):
    return write_plan_dir(tmp_path / "plan")


def _intervals(rows) -> Intervals:
    """rows: (step, pool, gpu, role, phase, start_s, end_s)."""
    cols = list(zip(*rows))
    return Intervals(step=np.array(cols[0], dtype=np.int64), pool=np.array(cols[1], dtype=object),
                     gpu=np.array(cols[2], dtype=np.int64), role=np.array(cols[3], dtype=object),
                     phase=np.array(cols[4], dtype=object), start_s=np.array(cols[5], dtype=float),
                     end_s=np.array(cols[6], dtype=float))


def _rewrite_csv(path: Path, edit) -> None:
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    edit(rows)
    with path.open("w", newline="") as f:
        csv.writer(f).writerows(rows)


# --- loading ---------------------------------------------------------------------------------------------

def test_load_run_reads_every_file(run_dir):
    run = load_run(run_dir)
    n_intervals = sum(1 for _ in open(run_dir / "intervals.csv")) - 1
    assert len(run.intervals) == n_intervals > 0
    assert run.steps["step"].tolist() == list(range(6))
    assert set(run.step_phases) == set(run.summary["phases_s"])
    assert run.lengths["response_len"].size == 6 * 16
    assert set(run.intervals.phase) <= set(PHASES) and set(run.intervals.role) <= set(ROLES)


@pytest.mark.parametrize("breaks, expected", [
    (lambda d: (d / "intervals.csv").unlink(), "expected intervals.csv"),
    (lambda d: (d / "summary.json").write_text("{not json"), "summary.json: expected JSON"),
    (lambda d: _edit_summary(d, lambda s: s.pop("step_time_s")), "field 'step_time_s': expected a non-negative number, got None"),
    (lambda d: _edit_summary(d, lambda s: s["pools"]["train"].update(gpus=0)), "field 'pools.train.gpus'"),
    (lambda d: _edit_summary(d, lambda s: s["phases_s"].update(decode=1.0)), "field 'phases_s.decode'"),
    (lambda d: _rewrite_csv(d / "intervals.csv", lambda r: r[1].__setitem__(4, "decode")), "intervals.csv:2: column 'phase'"),
    (lambda d: _rewrite_csv(d / "intervals.csv", lambda r: r[3].__setitem__(2, "99")), "intervals.csv:4: column 'gpu': expected 0.."),
    (lambda d: _rewrite_csv(d / "intervals.csv", lambda r: r[2].__setitem__(6, "-1")), "intervals.csv:3: expected 0 <= start_s <= end_s"),
    (lambda d: _rewrite_csv(d / "intervals.csv", lambda r: r[2].__setitem__(7, "1e3")), "intervals.csv:3: column 'active_s': expected 0 <= active_s <= end_s - start_s"),
    (lambda d: _edit_summary(d, lambda s: s["gpu_active"].update(train=-0.1)), "field 'gpu_active.train'"),
    (lambda d: _rewrite_csv(d / "steps.csv", lambda r: r[2].__setitem__(1, "soon")), "steps.csv:3: column 'start_s': expected a number, got 'soon'"),
    (lambda d: _rewrite_csv(d / "lengths.csv", lambda r: [row.pop(3) for row in r]), "lengths.csv: expected column(s) response_len"),
    (lambda d: _rewrite_csv(d / "lengths.csv", lambda r: r[5].pop()), "lengths.csv:6: expected 4 fields, got 3"),
])
def test_malformed_run_dir_is_one_line_error(run_dir, tmp_path, breaks, expected):
    breaks(run_dir)
    with pytest.raises(RlhfsimError) as err:
        render(run_dir, tmp_path / "out.html", None)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out.html").exists()


def _edit_summary(run_dir: Path, edit) -> None:
    doc = json.loads((run_dir / "summary.json").read_text())
    edit(doc)
    (run_dir / "summary.json").write_text(json.dumps(doc))


def test_render_argument_errors(run_dir, plan_dir, tmp_path):
    with pytest.raises(RlhfsimError, match="found none"):
        render(tmp_path / "missing", tmp_path / "x.html", None)
    with pytest.raises(RlhfsimError, match="got neither"):
        render(run_dir, None, None)
    with pytest.raises(RlhfsimError, match="plan directory has no timeline"):
        render(plan_dir, None, tmp_path / "t.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RlhfsimError, match="expected summary.json"):
        render(empty, tmp_path / "x.html", None)


def test_load_plan_types_and_errors(plan_dir):
    plan = load_plan(plan_dir)
    assert plan.axes == ("cluster.gpu", "placement.train_gpus", "schedule.kind")
    assert len(plan.rows) == 12 and sum(r["feasible"] for r in plan.rows) == 10
    assert {r["placement.train_gpus"] for r in plan.rows} == {2.0, 4.0, 8.0}
    infeasible = [r for r in plan.rows if not r["feasible"]]
    assert all(math.isnan(r["step_time_s"]) and r["reason"] for r in infeasible)
    assert plan.util_columns == ("util_rollout", "util_train", "active_rollout", "active_train")
    _rewrite_csv(plan_dir / "results.csv", lambda r: r[1].__setitem__(r[0].index("feasible"), "maybe"))
    with pytest.raises(RlhfsimError, match=r"results.csv:2: column 'feasible': expected true or false, got 'maybe'"):
        load_plan(plan_dir)


# --- timeline reduction ----------------------------------------------------------------------------------

def test_merge_intervals_merges_only_small_gaps_of_the_same_key():
    iv = _intervals([
        (0, "p", 0, "rollout", "generate", 0.0, 1.0),
        (0, "p", 0, "rollout", "generate", 1.0, 2.0),      # touching: merged
        (1, "p", 0, "rollout", "generate", 2.05, 3.0),     # gap 0.05 <= 0.1: merged, steps 0-1
        (1, "p", 0, "rollout", "generate", 3.5, 4.0),      # gap 0.5: new bar
        (1, "p", 0, "actor", "actor_train", 3.0, 3.5),     # other key
        (1, "p", 1, "rollout", "generate", 0.0, 1.0),      # other GPU
    ])
    bars = merge_intervals(iv, 0.1)
    gen0 = sorted((b for b in bars if b.gpu == 0 and b.phase == "generate"), key=lambda b: b.start_s)
    assert [(b.start_s, b.end_s, b.merged, b.step_lo, b.step_hi) for b in gen0] == [(0.0, 3.0, 3, 0, 1), (3.5, 4.0, 1, 1, 1)]
    assert len(bars) == 4
    assert sum(b.merged for b in bars) == len(iv)


def test_lanes_never_overlap_and_use_the_minimum_number():
    rng = np.random.default_rng(7)
    for _ in range(50):
        starts = np.round(rng.uniform(0, 10, 40), 1)
        ends = starts + np.round(rng.uniform(0.1, 3, 40), 1)
        lanes = assign_lanes(starts, ends)
        for lane in np.unique(lanes):
            idx = np.flatnonzero(lanes == lane)
            order = idx[np.argsort(starts[idx])]
            assert np.all(starts[order][1:] >= ends[order][:-1])
        # Minimum lanes = the most intervals open at one instant (half-open [start, end)).
        depth = max(int(np.sum((starts <= s) & (s < ends))) for s in starts)
        assert lanes.max() + 1 == depth


def test_identical_gpus_share_a_row_and_overlaps_get_lanes(run_dir):
    run = load_run(run_dir)
    layout = timeline_rows(run.intervals, run.summary["pools"])
    labels = [label for label, _ in layout.rows]
    # Train GPUs are identical and run actor_train and critic_train at once: one group, two lanes.
    assert "train · gpu 0–3" in labels and "train · gpu 0–3 lane 2" in labels
    # Rollout GPUs finish generating at different times: one row each.
    assert [l for l in labels if l.startswith("rollout")] == [f"rollout · gpu {g}" for g in range(4)]
    for _, bars in layout.rows:
        bars = sorted(bars, key=lambda b: b.start_s)
        assert all(b.start_s >= a.end_s for a, b in zip(bars, bars[1:]))
    assert "identical GPUs share a row" in layout.note


def test_cap_keeps_a_prefix_of_steps_and_says_so(tmp_path):
    run = load_run(write_run_dir(tmp_path / "run", steps=12, chunks=30, seed=1))
    full = timeline_rows(run.intervals, run.summary["pools"], max_bars=10**9)
    capped = timeline_rows(run.intervals, run.summary["pools"], max_bars=full.bars_drawn // 3)
    assert capped.bars_drawn <= full.bars_drawn // 3 < full.bars_drawn
    assert "showing steps 0–" in capped.note
    kept_steps = {b.step_lo for _, bars in capped.rows for b in bars}
    assert kept_steps == set(range(max(kept_steps) + 1)) and max(kept_steps) < 11


# --- figures ---------------------------------------------------------------------------------------------

def test_timeline_figure_draws_every_kept_bar_at_its_time(run_dir):
    run = load_run(run_dir)
    fig = figures.timeline_figure(run.intervals, run.summary["pools"], merge_gap_s=0.0)
    data_traces = [t for t in fig.data if t.customdata is not None]
    assert {t.name for t in data_traces} == set(run.intervals.role)
    drawn = sum(len(t.x) for t in data_traces)
    assert drawn == len(merge_intervals(run.intervals, 0.0)) - _grouped_away(run)
    for t in data_traces:
        assert np.all(np.asarray(t.x) >= 0)
        starts = np.array([c[3] for c in t.customdata])
        assert np.allclose(np.asarray(t.base), starts)
        assert all(c[0] in PHASES for c in t.customdata)
        assert t.marker.color == figures.ROLE_COLOURS[t.name]
    assert fig.layout.barmode == "overlay"  # grouped mode would shift concurrent bars off their row


def _grouped_away(run) -> int:
    """Bars of GPUs 1..3 of the train pool, drawn once in the shared row of GPU 0."""
    bars = merge_intervals(run.intervals, 0.0)
    return sum(1 for b in bars if b.pool == "train" and b.gpu > 0)


def test_phase_breakdown_matches_summary_and_steps(run_dir):
    run = load_run(run_dir)
    fig = figures.phase_breakdown_figure(run)
    bar = fig.data[0]
    assert list(bar.x) == [p for p in PHASES if p in run.summary["phases_s"]]
    assert np.allclose(bar.y, [run.summary["phases_s"][p] for p in bar.x])
    steady = run.steps["actor_train_s"][1:]
    i = list(bar.x).index("actor_train")
    assert bar.customdata[i][1] == pytest.approx(np.percentile(steady, 90))


def test_utilization_histogram_and_comparison(run_dir):
    run = load_run(run_dir)
    util = figures.utilization_figure(run.summary)
    assert [t.name for t in util.data] == ["busy", "active"]
    busy, active = util.data
    assert list(busy.x) == list(active.x) == list(run.summary["pools"])
    assert np.allclose(busy.y, [run.summary["gpu_utilization"][p] for p in busy.x])
    assert np.allclose(active.y, [run.summary["gpu_active"][p] for p in active.x])
    assert all(0 <= a <= u <= 1 for a, u in zip(active.y, busy.y))
    hist = figures.length_histogram_figure(run.lengths)
    assert np.array_equal(np.asarray(hist.data[0].x), run.lengths["response_len"])
    assert f"max {run.lengths['response_len'].max()} tokens" in hist.layout.title.text
    comp = figures.schedule_comparison_figure(run.summary)
    assert list(comp.data[0].x) == ["sync", "oppo"] and list(comp.data[0].text) == ["1.00×", "1.40×"]
    hatched = [t for t in comp.data if t.marker.pattern.shape == "/"]
    assert [t.name for t in hatched] == ["sync", "oppo"]
    for t in hatched:
        assert list(t.y) == [run.summary["variants"][t.name]["gpu_active"][p] for p in t.x]
    # Without the run's own schedule among the variants it is added, without a speedup.
    summary = dict(run.summary, variants={"sync": dict(run.summary["variants"]["sync"], speedup=None)})
    comp = figures.schedule_comparison_figure(summary)
    assert list(comp.data[0].x) == ["oppo (this run)", "sync"] and list(comp.data[0].text) == ["", ""]


def test_heatmap_cell_is_the_best_over_other_axes(plan_dir):
    plan = load_plan(plan_dir)
    fig = figures.heatmap_figure(plan, "cluster.gpu", "placement.train_gpus", "step_time_s")
    hm = fig.data[0]
    assert list(hm.x) == ["h100", "a100"] and list(hm.y) == ["2", "4", "8"]
    for i, y in enumerate((2.0, 4.0, 8.0)):
        for j, x in enumerate(("h100", "a100")):
            cell = [r["step_time_s"] for r in plan.rows if r["feasible"]
                    and r["cluster.gpu"] == x and r["placement.train_gpus"] == y]
            if cell:
                assert hm.z[i][j] == pytest.approx(min(cell))
            else:
                assert math.isnan(hm.z[i][j]) and hm.customdata[i][j].startswith("infeasible: ")


def test_pareto_figure_and_objective(plan_dir):
    plan = load_plan(plan_dir)
    fig = figures.pareto_figure(plan)
    points = sum(len(t.x) for t in fig.data if t.name not in ("Pareto front", "best"))
    assert points == sum(r["feasible"] for r in plan.rows)
    front = next(t for t in fig.data if t.name == "Pareto front")
    assert list(front.x) == sorted(front.x) and len(front.x) == len(plan.plan["pareto"])
    best = next(t for t in fig.data if t.name == "best")
    assert best.y[0] == pytest.approx(min(r["step_time_s"] for r in plan.rows if r["feasible"]))
    assert figures.objective_metric(plan) == "step_time_s"
    plan.plan["objective"] = {"kind": "min_cost", "metric": "cost_per_1000_steps"}   # as rlhfsim plan writes it
    assert figures.objective_metric(plan) == "cost_per_1000_steps"
    plan.plan["objective"] = "min_gpus"
    assert figures.objective_metric(plan) == "gpus"


def test_objective_names_match_the_planner():
    from rlhfsim.plan.spec import OBJECTIVES

    assert figures.OBJECTIVE_METRICS == OBJECTIVES


# --- HTML and trace --------------------------------------------------------------------------------------

def test_run_html_is_self_contained_with_plotly_once(run_dir, tmp_path):
    out = tmp_path / "report.html"
    render(run_dir, out, None)
    text = out.read_text()
    run = load_run(run_dir)
    n_figures = sum(s.figure is not None for s in run_sections(run))
    assert n_figures == 7  # with utilization per GPU over time
    assert text.count("Plotly.newPlot(") == n_figures
    assert text.count("* plotly.js v") == 1
    # Outside the embedded plotly.js bundle, nothing refers to the network.
    page = text.replace(plotly.offline.get_plotlyjs(), "")
    assert len(page) < len(text) - 3_000_000
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.I)
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", page, re.I)
    assert "http://" not in page and "https://" not in page
    assert all(f'id="fig-{i}"' in text for i in range(n_figures))
    no_variants = json.loads((run_dir / "summary.json").read_text())
    del no_variants["variants"]
    (run_dir / "summary.json").write_text(json.dumps(no_variants))
    assert sum(s.figure is not None for s in run_sections(load_run(run_dir))) == 6


def test_untrusted_names_are_escaped(run_dir, tmp_path):
    _edit_summary(run_dir, lambda s: s.update(scenario="</script><b>x"))
    html_text = run_report_html(load_run(run_dir))
    assert "</script><b>x" not in html_text
    assert "&lt;/script&gt;&lt;b&gt;x" in html_text


def test_plan_html_has_pareto_and_heatmap(plan_dir):
    plan = load_plan(plan_dir)
    sections = plan_sections(plan)
    titles = [s.title for s in sections if s.figure is not None]
    assert titles == ["Pareto scatter", "Heatmap", "Phase spans"]
    assert plan_report_html(plan).count("Plotly.newPlot(") == 3


def test_plan_heatmap_axes_from_plan_json(tmp_path):
    plan = load_plan(write_plan_dir(tmp_path / "p", heatmap={"x": "schedule.kind", "y": "cluster.gpu"}))
    heat = next(s.figure for s in plan_sections(plan) if s.title == "Heatmap")
    assert heat.layout.xaxis.title.text == "schedule.kind" and list(heat.data[0].x) == ["sync", "oppo"]


def test_trace_events_are_well_formed(run_dir):
    run = load_run(run_dir)
    doc = json.loads(json.dumps(chrome_trace(run)))
    events = doc["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    complete = [e for e in events if e["ph"] == "X"]
    process_names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    thread_names = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    phase_events = [e for e in complete if e["cat"] in ROLES]
    assert len(phase_events) == len(run.intervals)
    assert {e["name"] for e in phase_events} == set(run.intervals.phase)
    assert all(e["name"] in PHASES for e in phase_events)
    step_events = [e for e in complete if e["cat"] == "step"]
    assert len(step_events) == len(run.steps["step"])
    total_us = sum(e["dur"] for e in phase_events)
    assert total_us == pytest.approx(1e6 * float(np.sum(run.intervals.end_s - run.intervals.start_s)), rel=1e-6)
    by_thread: dict = {}
    for e in complete:
        assert e["ts"] >= 0 and e["dur"] >= 0 and isinstance(e["args"]["step"], int)
        assert e["pid"] in process_names and (e["pid"], e["tid"]) in thread_names
        by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    for evs in by_thread.values():  # complete events on one thread must not overlap (Perfetto drops them)
        evs.sort(key=lambda e: e["ts"])
        assert all(b["ts"] >= a["ts"] + a["dur"] - 1e-6 for a, b in zip(evs, evs[1:]))
    assert any("overlap" in e["args"]["name"] for e in meta if e["name"] == "thread_name")
    assert process_names[1].startswith("rollout (4 GPUs")


def test_run_without_intervals_or_rollouts_still_renders(run_dir, tmp_path):
    for name in ("intervals.csv", "lengths.csv"):
        path = run_dir / name
        path.write_text(path.read_text().splitlines()[0] + "\n")
    render(run_dir, tmp_path / "r.html", tmp_path / "t.json")
    layout = timeline_rows(load_run(run_dir).intervals, load_run(run_dir).summary["pools"])
    assert layout.bars_drawn == 0 and [label for label, _ in layout.rows] == [
        "rollout · gpu 0–3", "train · gpu 0–3", "reward · gpu 0"]
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert [e["cat"] for e in events if e["ph"] == "X"] == ["step"] * 6
    assert "no rollouts" in (tmp_path / "r.html").read_text()


def test_large_run_stays_small(tmp_path):
    run_dir = write_run_dir(tmp_path / "big", steps=40, chunks=200, rollouts=8)
    out, trace = tmp_path / "big.html", tmp_path / "big.json"
    render(run_dir, out, trace)
    assert len(load_run(run_dir).intervals) > 100_000
    assert out.stat().st_size < 15e6
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" and e["cat"] != "step" for e in events) > 100_000


def test_report_loading_and_simulator_do_not_import_plotly():
    code = ("import sys, rlhfsim.report, rlhfsim.report.load, rlhfsim.report.trace, rlhfsim.report.text, "
            "rlhfsim.report.synthetic, rlhfsim.sim.run; assert 'plotly' not in sys.modules, 'plotly imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_summary_active_matches_the_intervals(run_dir):
    # The synthetic summary's gpu_active is the simulator's definition applied to intervals.csv: per GPU,
    # the sum of active_s (clipped to the steady window in proportion), capped by the GPU's busy time.
    from rlhfsim.sim.simulation import gpu_busy_active

    run = load_run(run_dir)
    iv = run.intervals
    assert iv.active_s is not None and np.all(iv.active_s <= iv.end_s - iv.start_s + 1e-6)
    order = np.argsort(run.steps["step"])
    t0, t1 = run.steps["start_s"][order[1]], run.steps["end_s"][order[-1]]
    for pool, spec in run.summary["pools"].items():
        busy = active = 0.0
        for gpu in range(spec["gpus"]):
            rows = [(max(a, t0), min(b, t1), x * (min(b, t1) - max(a, t0)) / (b - a))
                    for p, g, a, b, x in zip(iv.pool, iv.gpu, iv.start_s, iv.end_s, iv.active_s)
                    if p == pool and g == gpu and b > t0 and a < t1]
            b_s, a_s = gpu_busy_active(rows)
            busy, active = busy + b_s, active + a_s
        span = spec["gpus"] * (t1 - t0)
        assert busy / span == pytest.approx(run.summary["gpu_busy"][pool], rel=1e-6)
        assert active / span == pytest.approx(run.summary["gpu_active"][pool], rel=1e-6)
        assert run.summary["gpu_active"][pool] <= run.summary["gpu_busy"][pool]
    # Generation is 60% kernels; the train pool's concurrent actor and critic training add up past its busy
    # time, so the cap holds it at 100% of busy.
    assert run.summary["gpu_active"]["rollout"] < 0.7 * run.summary["gpu_busy"]["rollout"]
    assert run.summary["gpu_active"]["train"] == pytest.approx(run.summary["gpu_busy"]["train"], rel=1e-9)


def test_run_without_active_time_still_loads_and_renders(run_dir, tmp_path):
    # A run directory written before active time existed: no active_s column, no gpu_busy/gpu_active.
    _rewrite_csv(run_dir / "intervals.csv", lambda r: [row.pop() for row in r])
    _edit_summary(run_dir, lambda s: [d.pop(k) for d in (s, *s["variants"].values()) for k in ("gpu_busy", "gpu_active")])
    run = load_run(run_dir)
    assert run.intervals.active_s is None
    util = figures.utilization_figure(run.summary)
    assert [t.name for t in util.data] == ["busy"]
    comp = figures.schedule_comparison_figure(run.summary)
    assert not [t for t in comp.data if t.marker.pattern.shape == "/"]
    render(run_dir, tmp_path / "old.html", tmp_path / "old.json")
    events = json.loads((tmp_path / "old.json").read_text())["traceEvents"]
    assert all("active_s" not in e["args"] for e in events if e["ph"] == "X")


def test_trace_and_html_carry_active_time(run_dir):
    run = load_run(run_dir)
    events = [e for e in chrome_trace(run)["traceEvents"] if e["ph"] == "X" and e["cat"] in ROLES]
    assert sorted(e["args"]["active_s"] for e in events) == pytest.approx(sorted(run.intervals.active_s.tolist()))
    page = run_report_html(run)
    train = run.summary["gpu_active"]["train"]
    assert f"active {train:.1%}" in page

"""`rlhfsim report`: the HTML renders in a real browser (headless Chromium, offline) and the trace is valid.

The browser test loads the page from a file:// URL with networking features off, lets plotly run under a
10 s virtual-time budget, dumps the DOM, and counts what plotly drew: one plot container per figure, the
timeline's bars one SVG point per drawn bar, a heatmap layer in the plan report.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from rlhfsim.report import render
from rlhfsim.report.html import plan_sections, run_sections
from rlhfsim.report.load import PHASES, ROLES, load_plan, load_run
from rlhfsim.report.synthetic import write_plan_dir, write_run_dir
from rlhfsim.report.timeline import timeline_rows

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists() and shutil.which("chromium") is None,
                                    reason="headless Chromium not installed (Debian package `chromium`)")


def dump_dom(html_path: Path, profile_dir: Path) -> tuple[str, str]:
    """(DOM after scripts ran, browser stderr) for a local HTML file."""
    exe = str(CHROMIUM) if CHROMIUM.exists() else shutil.which("chromium")
    proc = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile_dir}", "--enable-logging=stderr", "--v=0", "--window-size=1400,1000",
         "--virtual-time-budget=10000", "--dump-dom", html_path.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, proc.stderr


def _figure_dom(dom: str, index: int) -> str:
    """The DOM of figure ``index`` (from its div to the next figure's)."""
    start = dom.index(f'id="fig-{index}"')
    end = dom.find(f'id="fig-{index + 1}"', start)
    return dom[start:end if end != -1 else len(dom)]


def _js_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "CONSOLE" in line and re.search(r"Uncaught|Error", line)]


@pytest.mark.hw
@needs_chromium
def test_run_report_renders_in_chromium(tmp_path):
    run_dir = write_run_dir(tmp_path / "run", steps=5, chunks=6, seed=2)
    out = tmp_path / "report.html"
    render(run_dir, out, None)
    run = load_run(run_dir)
    sections = [s for s in run_sections(run) if s.figure is not None]
    dom, stderr = dump_dom(out, tmp_path / "chromium")
    assert not _js_errors(stderr)
    assert dom.count('class="plot-container plotly"') == len(sections) == 7
    assert dom.count('class="main-svg"') >= 2 * len(sections)
    for i, section in enumerate(sections):
        fig_dom = _figure_dom(dom, i)
        assert 'class="cartesianlayer"' in fig_dom, section.title
        assert re.search(r'class="(trace (bars|scatter)|hm)', fig_dom), section.title  # hm: a heatmap's image
    # The timeline drew one SVG bar per bar it kept, in rows labelled per GPU.
    layout = timeline_rows(run.intervals, run.summary["pools"])
    timeline = _figure_dom(dom, 0)
    plot_area = timeline[timeline.index('class="cartesianlayer"'):timeline.index('class="infolayer"')]
    # Legend-only traces (no data) leave an empty "M0,0Z" point; every real bar has a drawn path.
    drawn = [d for d in re.findall(r'<g class="point"><path d="([^"]*)"', plot_area) if d != "M0,0Z"]
    assert len(drawn) == layout.bars_drawn > 0
    assert "rollout · gpu 3" in timeline and "train · gpu 0–3" in timeline
    assert "Schedule comparison" in _figure_dom(dom, 5)


@pytest.mark.hw
@needs_chromium
def test_plan_report_renders_in_chromium(tmp_path):
    plan_dir = write_plan_dir(tmp_path / "plan")
    out = tmp_path / "plan.html"
    render(plan_dir, out, None)
    n_figures = sum(s.figure is not None for s in plan_sections(load_plan(plan_dir)))
    dom, stderr = dump_dom(out, tmp_path / "chromium")
    assert not _js_errors(stderr)
    assert dom.count('class="plot-container plotly"') == n_figures == 3
    pareto, heatmap = _figure_dom(dom, 0), _figure_dom(dom, 1)
    assert re.search(r'class="trace scatter', pareto) and "Pareto front" in pareto
    assert 'class="hm"' in heatmap and "<image" in heatmap


def test_cli_report_on_a_simulated_run(tmp_path):
    """The real pipeline: `rlhfsim simulate --out` then `rlhfsim report` (HTML + trace)."""
    from rlhfsim.cli import main

    runner = CliRunner()
    run_dir = tmp_path / "run"
    result = runner.invoke(main, ["simulate", str(REPO / "scenarios" / "baseline.yaml"), "--steps", "3",
                                  "--compare", "sync,oppo", "--out", str(run_dir)])
    assert result.exit_code == 0, result.output
    html, trace = tmp_path / "r.html", tmp_path / "t.json"
    result = runner.invoke(main, ["report", str(run_dir), "-o", str(html), "--trace", str(trace)])
    assert result.exit_code == 0, result.output
    assert html.stat().st_size < 15e6 and html.read_text().count("Plotly.newPlot(") == 7
    events = json.loads(trace.read_text())["traceEvents"]
    phase_events = [e for e in events if e["ph"] == "X" and e["cat"] in ROLES]
    assert len(phase_events) == len(load_run(run_dir).intervals) > 0
    assert all(e["name"] in PHASES and e["dur"] >= 0 and e["ts"] >= 0 for e in phase_events)
    # A malformed directory is one line on stderr and exit code 2.
    (run_dir / "steps.csv").write_text("step,start_s\n0,0\n")
    result = runner.invoke(main, ["report", str(run_dir), "-o", str(html)])
    assert result.exit_code == 2 and "steps.csv: expected column(s) end_s" in result.output

"""Reports: terminal tables (text.py), plotly figures and a self-contained HTML page (figures.py, html.py),
a Chrome/Perfetto trace (trace.py), all read from a run or plan directory (load.py).

``render`` is what ``rlhfsim report`` calls. plotly is imported only when HTML is written, so importing this
package, ``rlhfsim.report.text``, ``.load`` or ``.trace`` never imports plotly (the simulator must not).
"""

from __future__ import annotations

from pathlib import Path

from rlhfsim.errors import RlhfsimError

__all__ = ["render"]


def _write(path: Path, text: str) -> None:
    from rlhfsim.files import write_text_atomic

    try:
        write_text_atomic(path, text)
    except OSError as exc:
        raise RlhfsimError(f"{path}: cannot write ({exc.strerror or exc})") from None


def render(run_dir: Path, out_html: Path | None, trace: Path | None) -> None:
    """Write the HTML report of ``run_dir`` to ``out_html`` and/or its Chrome trace to ``trace``.

    ``run_dir`` is a run directory (summary.json, steps.csv, intervals.csv, lengths.csv) or a plan
    directory (plan.json, results.csv). Raises RlhfsimError (one line) if it is missing or malformed,
    if nothing is asked for, or if a trace is asked of a plan directory."""
    from rlhfsim.report.load import is_plan_dir, load_plan, load_run

    run_dir = Path(run_dir)
    if out_html is None and trace is None:
        raise RlhfsimError("report: expected -o FILE.html and/or --trace FILE.json, got neither")
    if not run_dir.is_dir():
        raise RlhfsimError(f"{run_dir}: expected a run or plan directory, found none")
    if is_plan_dir(run_dir):
        if trace is not None:
            raise RlhfsimError(f"{run_dir}: a plan directory has no timeline to trace; --trace needs a run "
                               "directory from `rlhfsim simulate --out`")
        plan = load_plan(run_dir)
        from rlhfsim.report.html import plan_report_html

        _write(Path(out_html), plan_report_html(plan))
        return
    run = load_run(run_dir)
    if out_html is not None:
        from rlhfsim.report.html import run_report_html

        _write(Path(out_html), run_report_html(run))
    if trace is not None:
        from rlhfsim.report.trace import trace_json

        _write(Path(trace), trace_json(run))

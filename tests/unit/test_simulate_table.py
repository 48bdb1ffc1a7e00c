"""``rlhfsim simulate``'s terminal summary says what its numbers are (issue 54, 'also met'): a streamed phase's span
split into busy and waiting for rollouts (oppo.yaml's reward spans 66% of the step and waits 88% of it), and a run
left with fewer than three steady steps says so."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from click.testing import CliRunner

from rlhfsim.cli import main

OPPO = str(Path(__file__).resolve().parents[2] / "scenarios" / "oppo.yaml")


def test_a_streamed_phase_shows_busy_and_waiting():
    r = CliRunner().invoke(main, ["simulate", OPPO, "--steps", "4", "--no-uncertainty"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    row = next(ln for ln in r.output.splitlines() if re.match(r"│ reward +│", ln))
    span, pct, busy, wait, share = (float(x) for x in re.findall(r"\d+\.?\d*", row)[:5])
    assert busy + wait == pytest.approx(span, abs=2e-3) and wait > busy
    assert share == round(100 * wait / span)
    assert "waiting for rollouts" in r.output and "rlhfsim explain" in r.output
    doc = json.loads(CliRunner().invoke(main, ["simulate", OPPO, "--steps", "4", "--no-uncertainty",
                                               "--format", "json"]).output)
    assert doc["phase_waiting_s"]["reward"] == pytest.approx(wait, abs=2e-3)


def test_one_steady_step_is_said():
    r = CliRunner().invoke(main, ["simulate", OPPO, "--steps", "3", "--no-uncertainty"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "1 steady)" in r.output and "only 1 steady step: the mean, p50 and p90 below are that step" in r.output
    r = CliRunner().invoke(main, ["simulate", OPPO, "--steps", "6", "--no-uncertainty"], env={"COLUMNS": "200"})
    assert "only" not in r.output.split("\n")[1]

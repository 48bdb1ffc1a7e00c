"""From a fitted pilot run to a plan (issue 54 item 3; docs/guide/pilot-to-plan.md): ``rlhfsim whatif -o`` writes
the run as fitted (its lengths' shape in it) as a scenario, which ``simulate --profile OVERLAY`` prices as the
what-if did and ``rlhfsim plan --profile OVERLAY`` sweeps (the overlay: tests/fixtures/fromrun/f5-overlay.json,
play-verl's GRPO run fitted by ``rlhfsim calibrate --from-run``)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rlhfsim.cli import main

OVERLAY = str(Path(__file__).resolve().parents[1] / "fixtures" / "fromrun" / "f5-overlay.json")


def test_the_fitted_run_as_a_scenario_simulates_and_plans_as_fitted(tmp_path):
    runner = CliRunner()
    r = runner.invoke(main, ["whatif", OVERLAY, "--draws", "0", "-o", str(tmp_path / "base"), "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    fitted = next(row for row in doc["runs"][0]["rows"] if row["phase"] == "timing_s/step")["fitted_s"]
    (path,) = doc["written"]
    assert yaml.safe_load(Path(path).read_text())["workload"]["response_length"] == doc["runs"][0]["lengths"]["block"]
    r = runner.invoke(main, ["simulate", path, "--profile", OVERLAY, "--no-uncertainty", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["step_time_s"] == pytest.approx(fitted, rel=1e-9)
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"name": "pilot", "base": str(Path(path).relative_to(tmp_path)),
                                    "axes": {"cluster.nodes": [1, 2]}}))
    r = runner.invoke(main, ["plan", str(plan), "--profile", OVERLAY, "--workers", "1", "--no-uncertainty",
                             "-o", str(tmp_path / "out"), "--format", "json"])
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader((tmp_path / "out" / "results.csv").open()))
    one = next(x for x in rows if x["cluster.nodes"] == "1")
    assert float(one["step_time_s"]) == pytest.approx(fitted, rel=1e-6)   # priced with the overlay, not the plan's default


def test_a_joint_fit_takes_a_setting_per_run():
    from rlhfsim.errors import RlhfsimError
    from rlhfsim.fromrun.cli import sets_by_run, unique_ids

    ids = unique_ids(["grpo", "ppo", "ppo"])
    assert ids == ["grpo", "ppo#2", "ppo#3"]
    got = sets_by_run(["a=1", "2:b=2", "ppo#3:c=hdfs://x:y", "d=4"], ids)
    assert got == [("a=1", "d=4"), ("a=1", "b=2", "d=4"), ("a=1", "c=hdfs://x:y", "d=4")]
    with pytest.raises(RlhfsimError, match="expected RUN: to be 1..3"):
        sets_by_run(["4:b=2"], ids)

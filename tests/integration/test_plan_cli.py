"""``rlhfsim plan`` end to end on a tiny plan: the plan directory, JSON output, infeasible rows, errors
before anything runs, --resume after an interruption, local vs Ray giving identical results, and the
example plans under scenarios/."""

from __future__ import annotations

import csv
import glob
import json
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rlhfsim.cli import main
from rlhfsim.errors import ScenarioError
from rlhfsim.plan import load_plan, run_plan
from rlhfsim.plan.backends import run_chunk

ROOT = Path(__file__).resolve().parents[2]
TINY = yaml.safe_load((ROOT / "tests" / "fixtures" / "plan_base_tiny.yaml").read_text())  # the plan base scenario
AXES = {
    "cluster.gpus_per_node": [2, 4],
    "placement": ["colocated", "3+1"],
    "models.actor.model": ["tiny-qwen2", "qwen2.5-72b"],
    "schedule.kind": ["sync", "oppo"],
    "schedule.intra.chunk_tokens": [16, 64],
}
N = 32


@pytest.fixture
def plan_file(tmp_path):
    p = tmp_path / "plan-tiny.yaml"
    p.write_text(yaml.safe_dump({"base": TINY, "axes": AXES, "objective": "min_cost", "max_step_time_s": 10.0},
                                sort_keys=False))
    return p


def invoke(*args):
    return CliRunner().invoke(main, ["plan", *map(str, args)], catch_exceptions=False)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_plan_writes_results_plan_json_and_prints_json(plan_file, tmp_path):
    out = tmp_path / "out"
    r = invoke(plan_file, "--workers", "2", "--out", out, "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["configs"] == N and 0 < doc["feasible"] < N
    rows = read_csv(out / "results.csv")
    assert len(rows) == N
    assert list(rows[0])[:6] == ["config", *AXES]
    for c in ("feasible", "reason", "step_time_s", "cost_per_1000_steps", "gpus", "gpu_type", "generate_s",
              "weight_sync_s", "util_all", "util_actor", "util_reward", "active_all", "active_actor", "active_reward"):
        assert c in rows[0]
    header = list(rows[0])
    assert header.index("active_all") == header.index("util_all") + 1  # beside its busy column
    for row in rows:
        for pool in ("all", "actor", "reward"):
            if row[f"util_{pool}"]:
                assert 0 < float(row[f"active_{pool}"]) <= float(row[f"util_{pool}"]) <= 1
            else:
                assert row[f"active_{pool}"] == ""
    assert sum(r["feasible"] == "true" for r in rows) == doc["feasible"]
    for row in rows:
        if row["feasible"] == "false":
            assert row["reason"] and row["step_time_s"] == ""
        else:
            t, gpus = float(row["step_time_s"]), int(row["gpus"])
            assert float(row["cost_per_1000_steps"]) == pytest.approx(t * 1000 / 3600 * gpus * 3.5)  # h100 default
    assert {r["reason"] for r in rows if r["cluster.gpus_per_node"] == "2" and r["placement"] == "3+1"} == \
        {"placement 3+1 needs 4 GPUs, but the cluster has 2 (1 node(s) x 2)"}
    assert all("need" in r["reason"] for r in rows if r["models.actor.model"] == "qwen2.5-72b")
    # sync ignores the chunk size: those configurations repeat and agree exactly
    sync = [r for r in rows if r["schedule.kind"] == "sync" and r["feasible"] == "true"]
    assert len({(r["cluster.gpus_per_node"], r["placement"], r["step_time_s"]) for r in sync}) == len(sync) // 2

    plan = json.loads((out / "plan.json").read_text())
    assert plan["axes"] == AXES and plan["configs"] == N and plan["feasible"] == doc["feasible"]
    assert plan["objective"] == {"kind": "min_cost", "metric": "cost_per_1000_steps"}
    assert plan["heatmap"] == {"x": "cluster.gpus_per_node", "y": "placement"}
    best = doc["best"]
    assert best == plan["best"] and best["step_time_s"] <= 10.0
    feasible = [r for r in rows if r["feasible"] == "true"]
    assert best["cost_per_1000_steps"] == min(float(r["cost_per_1000_steps"]) for r in feasible)
    assert "of the step" in best["why"]
    assert doc["pareto"] and all(p["feasible"] for p in doc["pareto"])

    from rlhfsim.report import render

    render(out, tmp_path / "plan.html", None)
    assert "Pareto" in (tmp_path / "plan.html").read_text()


def test_table_output(plan_file, tmp_path):
    r = invoke(plan_file, "--workers", "1", "--out", tmp_path / "o")
    assert r.exit_code == 0, r.output
    assert f"{N} configurations" in r.stdout and "best (min_cost with step time <= 10 s)" in r.stdout
    assert "infeasible x8: placement 3+1 needs 4 GPUs" in r.stdout


def test_bad_axis_is_reported_before_anything_runs(tmp_path):
    p = tmp_path / "plan-bad.yaml"
    p.write_text(yaml.safe_dump({"base": TINY, "axes": {"schedule.kind": ["oppo"],
                                                        "schedule.intra.chunk_tokens": [64, 0]}}))
    r = invoke(p, "--out", tmp_path / "o")
    assert r.exit_code == 2
    assert r.stderr == "error: axes.schedule.intra.chunk_tokens[1]: expected a number >= 1, got 0\n"
    assert not (tmp_path / "o").exists()
    r = invoke(p, "--address", "auto")
    assert r.exit_code == 2 and "--address: expected only with --backend ray" in r.stderr


def test_resume_skips_done_configurations(plan_file, tmp_path):
    full = tmp_path / "full"
    assert invoke(plan_file, "--workers", "1", "--out", full).exit_code == 0

    part = tmp_path / "part"
    calls = []

    def interrupt(done, total):
        calls.append(done)
        if done >= 20:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_plan(load_plan(plan_file), workers=1, out=part, progress=interrupt)
    kept = read_csv(part / "results.csv")
    assert 20 <= len(kept) < N and not (part / "plan.json").exists()
    with open(part / "results.csv", "a") as f:
        f.write("deadbeef0000,2,tiny")  # a row cut short by the interruption is run again

    r = invoke(plan_file, "--workers", "1", "--out", part, "--resume", "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["resumed"] == len(kept) and doc["configs"] == N
    done = {row["config"] for row in kept}
    left = {json.dumps(c.doc, sort_keys=True) for c in load_plan(plan_file).configs if c.doc and c.id not in done}
    assert doc["simulated"] == len(left) > 0
    again = run_plan(load_plan(plan_file), workers=1, out=part, resume=True)
    assert again.resumed == N and again.simulated == 0
    assert (part / "results.csv").read_text() == (full / "results.csv").read_text()
    assert json.loads(r.stdout)["best"] == json.loads((full / "plan.json").read_text())["best"]


def test_resume_refuses_results_of_another_plan(plan_file, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "results.csv").write_text("config,other\n")
    r = invoke(plan_file, "--out", out, "--resume")
    assert r.exit_code == 2 and "expected the columns of this plan to resume" in r.stderr


def test_local_and_ray_give_identical_results(plan_file, tmp_path, monkeypatch):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'rlhfsim[ray]')")
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "rlhfsim-ray-*")))
    r = invoke(plan_file, "--backend", "ray", "--workers", "2", "--out", "ray-out", "--format", "json")
    assert r.exit_code == 0, r.output
    assert invoke(plan_file, "--backend", "local", "--workers", "2", "--out", "local-out").exit_code == 0
    assert (work / "ray-out" / "results.csv").read_text() == (work / "local-out" / "results.csv").read_text()
    assert sorted(p.name for p in work.iterdir()) == ["local-out", "ray-out"]
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "rlhfsim-ray-*"))) == before
    import ray

    assert not ray.is_initialized()


@pytest.mark.parametrize("path", sorted(glob.glob(str(ROOT / "scenarios" / "plan-*.yaml"))), ids=os.path.basename)
def test_example_plans_load_and_their_first_configuration_runs(path):
    plan = load_plan(path)
    feasible = [c for c in plan.configs if c.doc is not None]
    assert len(plan.configs) >= 10 and feasible
    c = feasible[0]
    doc = {**c.doc, "steps": 2, "warmup_steps": 1}
    ((_, metrics, reason),) = run_chunk([(0, doc, str(plan.base_dir), c.gpu_type)], plan.profiles)
    assert reason == "" and metrics["step_time_s"] > 0


def test_scoring_runtime_axis_uses_the_profiles_runtimes(tmp_path):
    from rlhfsim.costs.profile import BUNDLED_DIR

    prof = json.loads((BUNDLED_DIR / "default.json").read_text())
    prof["name"] = "two-runtimes"
    fast = dict(prof["operations"]["prefill"])
    prof["operations"]["score:eager"] = {**fast, "overhead_s": 0.05}
    prof["operations"]["score:onnxruntime"] = {**fast, "overhead_s": 0.001}
    (tmp_path / "two.json").write_text(json.dumps(prof))
    p = tmp_path / "plan-rt.yaml"
    p.write_text(yaml.safe_dump({"base": TINY, "profile": "two.json",
                                 "axes": {"models.reward.runtime": ["eager", "onnxruntime"]}}))
    o = run_plan(load_plan(p), workers=1, out=tmp_path / "o")
    eager, ort = o.rows
    assert eager["feasible"] and ort["feasible"]
    assert eager["reward_s"] > ort["reward_s"] > 0
    assert o.best["config"] == ort["config"]  # min_step_time by default

    p.write_text(yaml.safe_dump({"base": TINY, "profile": "missing.json", "axes": {"seed": [0]}}))
    with pytest.raises(ScenarioError) as e:
        load_plan(p)
    assert str(e.value).startswith("profile: ") and "missing.json" in str(e.value)


def test_ray_backend_without_ray_says_how_to_install(plan_file, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    r = invoke(plan_file, "--backend", "ray", "--out", tmp_path / "o")
    assert r.exit_code == 2
    assert r.stderr == "error: --backend ray: expected Ray installed, got an import error (pip install 'rlhfsim[ray]')\n"

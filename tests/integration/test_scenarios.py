"""Every scenario under scenarios/ (and scenarios/validate/, scenarios/validate/h200/) runs through
``rlhfsim simulate``; the validation sets also build the executor's configuration.

Mixins (``_*.yaml``) are merged into other files rather than run; plan files (``plan-*.yaml``) belong
to ``rlhfsim plan`` and are tested with it. The list is globbed at collection time, so a new scenario
is tested without editing this file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def scenario_files() -> list[Path]:
    files = sorted((ROOT / "scenarios").glob("*.yaml")) + validation_files()
    return [f for f in files if not f.name.startswith(("_", "plan-"))]


def validation_files() -> list[Path]:
    v = ROOT / "scenarios" / "validate"
    return [f for f in sorted(v.glob("*.yaml")) + sorted((v / "h200").glob("*.yaml")) if not f.name.startswith("_")]


def test_there_are_scenarios():
    names = {f.name for f in scenario_files()}
    assert {"oppo.yaml", "baseline.yaml"} <= names


@pytest.mark.parametrize("path", scenario_files(), ids=lambda p: str(p.relative_to(ROOT / "scenarios")))
def test_scenario_runs_through_the_cli(path, cli):
    p = cli("simulate", path, "--steps", 3, "--format", "json", timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stderr.strip() == "" or "Traceback" not in p.stderr
    doc = json.loads(p.stdout)
    assert doc["steps"] == 3
    assert doc["step_time_s"] > 0 and doc["tokens_per_s"] > 0
    assert doc["phases_s"]["generate"] > 0
    assert all(0 < u <= 1 for u in doc["gpu_utilization"].values())
    for name, v in doc.get("variants", {}).items():
        assert v["step_time_s"] > 0, name


def test_oppo_scenario_beats_sync():
    # The OPPO paper's setup: both parts of OPPO together are faster than the synchronous baseline,
    # and each part alone sits in between (same seed, same sampled lengths).
    from rlhfsim.scenario import load_scenario
    from rlhfsim.sim.run import compare

    sc = load_scenario(ROOT / "scenarios" / "oppo.yaml")
    out, _ = compare(sc, ["sync", "oppo-intra", "oppo-inter", "oppo"], steps=8)
    t = {k: v["step_time_s"] for k, v in out["variants"].items()}
    assert t["oppo"] < t["oppo-intra"] < t["sync"]
    assert t["oppo"] < t["oppo-inter"] < t["sync"]


@pytest.mark.hw
@pytest.mark.parametrize("path", validation_files(), ids=lambda p: str(p.relative_to(ROOT / "scenarios")))
def test_validation_scenarios_build_the_executor_config(path):
    pytest.importorskip("torch")
    from calibrate.validation.scenario import prepare

    device = "cuda" if path.parent.name == "h200" else "cpu"
    sc, setup, cfg, rollouts = prepare(path, device, None, 1)
    assert cfg.device == device and cfg.steps == sc.steps and len(rollouts) >= cfg.rollouts_needed
    assert cfg.actor == setup.shapes["actor"] and cfg.reward == setup.shapes["reward"]

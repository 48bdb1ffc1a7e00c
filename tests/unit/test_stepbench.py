"""calibrate.measuring.stepbench: every step scalar measured on the CPU, written where the simulator reads it, and
calibrate/ still imports without the simulator's dependencies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from calibrate.measuring.stepbench import measure_step_scalars  # noqa: E402
from rlhfsim.costs.model import CostModel  # noqa: E402
from rlhfsim.costs.profile import validate_profile  # noqa: E402
from rlhfsim.costs.stepcosts import STEP_SCALARS  # noqa: E402
from rlhfsim.hardware.catalog import get_gpu  # noqa: E402
from rlhfsim.models.catalog import CATALOG  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it

ROOT = Path(__file__).resolve().parents[2]


def test_step_scalars_measured_and_read_back():
    gpu = get_gpu("cpu")
    step = measure_step_scalars("cpu", "float32", CATALOG["tiny-qwen2"], gpu, iters=1)
    assert set(STEP_SCALARS) <= set(step) and step["source"] == "measured"
    assert all(step[k] >= 0 for k in STEP_SCALARS)
    assert 0 < step["host_copy_eff"] <= 1.5 and 0 < step["reshard_eff"] <= 1.5
    assert step["samples"]["train_piece"]["checkpointed_s"]  # raw samples kept
    doc = json.loads((ROOT / "tests" / "fixtures" / "profiles" / "cpu.json").read_text())
    doc["step"] = step
    cost = CostModel(gpu, validate_profile(json.loads(json.dumps(doc))))  # survives a JSON round trip
    assert all(v["source"] == "profile" for v in cost.step_costs().values())
    assert cost.step_scalar("adv_per_element_s") == step["adv_per_element_s"]


def test_stepbench_imports_without_simulator_dependencies():
    code = ("import sys; sys.modules['simpy'] = None; sys.modules['pydantic'] = None; sys.modules['plotly'] = None; "
            "import calibrate.measuring.stepbench, calibrate.running.run")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

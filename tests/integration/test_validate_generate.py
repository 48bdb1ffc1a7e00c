"""`rlhfsim validate --generate N --seed S` end to end on N=1 drawn from tiny ranges (seconds), and the
one-line errors of bad --generate values. No timing thresholds: a smoke test of the mechanism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "validate" / "generate-tiny-ranges.json"


def test_generate_one_writes_the_set_and_reports_errors_per_scenario_and_phase(tmp_path):
    out = tmp_path / "gen"
    r = subprocess.run([sys.executable, "-m", "rlhfsim.cli", "validate", "--generate", "1", "--seed", "3",
                        "--ranges", str(TINY), "--out-dir", str(out), "--steps", "2", "--threads", "1",
                        "--format", "json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "seed 3" in r.stderr and "--generate 1 --seed 3 --ranges" in r.stderr
    meta = json.loads((out / "generated.json").read_text())
    assert meta["seed"] == 3 and meta["n"] == 1 and meta["ranges"]["layers"] == {"range": [1, 2]}
    assert meta["ranges"]["engine"]["choices"] == ["static", "continuous"]   # untouched entries as documented
    (name,) = meta["scenarios"]
    assert (out / name).is_file() and all((out / m).is_file() for m in meta["models"])
    doc = json.loads(r.stdout)
    assert doc["profile"] == "cpu" and doc["generated"]["seed"] == 3 and doc["generated"]["ranges"] == meta["ranges"]
    (s,) = doc["scenarios"]
    assert s["name"] == Path(name).stem and s["profile"] == "cpu"
    assert doc["median_abs_error_pct"] == doc["max_abs_error_pct"] == pytest.approx(abs(s["error_pct"]))
    assert {"generate", "actor_train", "weight_sync"} <= set(s["phases"]) and "generation_ops" in s
    assert set(doc["phase_median_abs_error_pct"]) <= set(s["phases"])
    saved = json.loads((out / "validate.json").read_text())
    assert saved["scenarios"][0]["error_pct"] == s["error_pct"] and saved["generated"]["seed"] == 3


@pytest.mark.parametrize("args, where", [
    (["--generate", "0"], "--generate"),
    (["--generate", "abc"], "--generate"),
    (["--generate", "101"], "--generate"),
    (["--generate", "2", "--seed", "-1"], "--seed"),
    (["--generate", "2", "--scenario", "x.yaml"], "--generate"),
    (["--generate", "1", "--device", "cuda"], "--device"),
    (["--seed", "4", "--scenario", "x.yaml"], "--seed"),
    ([], "--scenario"),
])
def test_bad_generate_values_are_one_line_exit_2(args, where, tmp_path):
    r = subprocess.run([sys.executable, "-m", "rlhfsim.cli", "validate", *args], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "RLHFSIM_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and where in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "validate" / "generated").exists() or not any((tmp_path / "validate" / "generated").iterdir())

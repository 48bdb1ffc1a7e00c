"""Prediction intervals (rlhfsim.sim.uncertainty): the interval contains the point prediction, draws
come from bootstrap samples, covariance or a stated prior, and the CLI reports the pair."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from rlhfsim.cli import main
from rlhfsim.costs.profile import EFF_KEYS, load_profile
from rlhfsim.scenario import load_scenario
from rlhfsim.sim.run import simulate_uncertain
from rlhfsim.sim.uncertainty import draw_profiles

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "profiles" / "cpu.json"


def _with_samples(profile: dict, spread: float = 0.1, seed: int = 0) -> dict:
    """Each operation gets bootstrap-like samples spread symmetrically (in log) around its values."""
    rng = np.random.default_rng(seed)
    prof = copy.deepcopy(profile)
    for p in prof["operations"].values():
        base = np.array([p[k] for k in EFF_KEYS])
        f = np.exp(spread * rng.standard_normal((40, 4)))
        s = base * f
        s[:, :2] = np.minimum(s[:, :2], 1.5)
        p["samples"] = s.tolist()
    return prof


def test_draws_by_source():
    prof = load_profile(str(FIXTURE))
    ops = sorted(prof["operations"])
    prof = copy.deepcopy(prof)
    prof["operations"][ops[0]]["samples"] = [[0.5, 0.5, 1e-3, 0.0]] * 3
    prof["operations"][ops[1]]["covariance"] = (np.eye(4) * 1e-4).tolist()
    draws, by = draw_profiles(prof, 8, seed=1)
    assert len(draws) == 8 and by["bootstrap"] == [ops[0]] and by["covariance"] == [ops[1]]
    assert set(by["prior"]) == set(ops[2:])
    assert all(d["operations"][ops[0]]["compute_eff"] == 0.5 for d in draws)
    for d in draws:
        for p in d["operations"].values():
            assert 0 < p["compute_eff"] <= 1.5 and 0 < p["memory_eff"] <= 1.5 and p["overhead_s"] >= 0
    assert prof["operations"][ops[2]]["compute_eff"] == load_profile(str(FIXTURE))["operations"][ops[2]]["compute_eff"]


def test_interval_contains_the_point_prediction(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_with_samples(load_profile(str(FIXTURE)))))
    sc = load_scenario(ROOT / "tests" / "fixtures" / "tiny.yaml")
    base, unc = simulate_uncertain(sc, profile=str(path), draws=16)
    lo, hi = unc["step_time_s_interval"]
    assert lo < base.summary["step_time_s"] < hi and unc["point_inside"]
    assert unc["source"] == "measured" and unc["draws"] == 16
    for ph, (a, b) in unc["phases_s_interval"].items():
        assert a <= b


def test_cli_reports_the_interval_pair():
    res = CliRunner().invoke(main, ["simulate", str(ROOT / "tests" / "fixtures" / "tiny.yaml"), "--uncertainty",
                                    "--draws", "6", "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    lo, hi = doc["step_time_s_interval"]
    assert lo <= hi and doc["uncertainty"]["level"] == 0.9 and doc["uncertainty"]["source"] in ("prior", "measured", "measured+prior")
    assert set(doc["phases_s_interval"]) == set(doc["phases_s"])


def test_gpu_intervals_carry_the_bundled_model_error_and_cpu_ones_do_not():
    from rlhfsim.costs.model import CostModel
    from rlhfsim.hardware.catalog import get_gpu
    from rlhfsim.sim.run import simulate
    from rlhfsim.sim.uncertainty import interval, model_error, model_error_file

    err = model_error(load_profile("default"))
    assert model_error_file() is not None and err is not None and err.runs
    assert model_error(load_profile("cpu")) is None
    sc = load_scenario(ROOT / "scenarios" / "baseline.yaml")
    gpu = get_gpu(sc.cluster.gpu)
    res = interval(lambda c: simulate(sc, steps=3, cost=c, max_work=None), load_profile("default"), gpu, n=4)
    assert res["ops_by_source"]["prior"] == [] and res["ops_by_source"]["held"]  # the prior is not drawn twice
    assert res["draws"] == 0 and res["source"] == "field error"   # nothing drawn: not "measured" (issue 54)
    point = simulate(sc, steps=3, cost=CostModel(gpu, load_profile("default"))).summary
    # each phase's interval is its record's: point x exp(-bias -/+ 1.645 k sigma), within the sampling noise
    for ph, (lo, hi) in res["phases_s_interval"].items():
        name, rec = err.record(ph)
        if point["phases_s"][ph] > 0:
            a, b = rec.factors()
            assert lo / point["phases_s"][ph] == pytest.approx(a, rel=0.03) and hi / point["phases_s"][ph] == pytest.approx(b, rel=0.03)

"""Library entry points: simulate, variants, compare, the summary and the run directory."""

from __future__ import annotations

import csv
import json

import pytest

from rlhfsim.errors import ScenarioError
from rlhfsim.scenario import load_scenario
from rlhfsim.sim.run import VARIANTS, compare, rebuild, simulate, variant, write_outputs
from rlhfsim.contracts import PHASES


@pytest.fixture(scope="module")
def small(scenario_dict):
    return load_scenario(scenario_dict("gpu", schedule="oppo"))


def test_summary_fields_and_ranges(small):
    res = simulate(small, steps=5)
    s = res.summary
    for key in ("step_time_s", "phases_s", "gpu_utilization", "gpu_busy", "gpu_active", "tokens_per_s", "steps",
                "step_time_p50_s", "step_time_p90_s", "schedule_stats", "pools"):
        assert key in s
    assert s["steps"] == 5 and len(res.steps) == 5
    assert s["warmup_steps"] == 1 and s["steady_steps"] == 4
    steady = res.steps[1:]
    assert s["step_time_s"] == pytest.approx(sum(r.step_time_s for r in steady) / 4, rel=1e-12)
    assert s["step_time_p50_s"] <= s["step_time_p90_s"]
    window = steady[-1].end_s - steady[0].start_s
    assert s["tokens_per_s"] == pytest.approx(sum(r.generated_tokens for r in steady) / window, rel=1e-12)
    assert set(s["gpu_utilization"]) == {"actor", "reward"}
    assert all(0.0 < u <= 1.0 for u in s["gpu_utilization"].values())
    assert s["gpu_busy"] == s["gpu_utilization"] and set(s["gpu_active"]) == {"actor", "reward"}
    assert all(0.0 < s["gpu_active"][p] <= u for p, u in s["gpu_busy"].items())
    assert set(s["phases_s"]) <= set(PHASES)
    assert all(v >= 0 for v in s["phases_s"].values())
    assert s["schedule_stats"]["deferred_per_step"] == [4] * 5


def test_single_gpu_sync_is_fully_busy(scenario_dict):
    # One device, every phase in turn on it, nothing in between: utilization is exactly 1.
    res = simulate(load_scenario(scenario_dict("cpu")), steps=4)
    assert res.summary["gpu_utilization"] == {"all": pytest.approx(1.0, rel=1e-9)}
    assert 0.0 < res.summary["gpu_active"]["all"] < 1.0  # host overheads: busy, not active


def test_steps_and_seed_overrides(small):
    a = simulate(small, steps=3, seed=5)
    assert a.summary["steps"] == 3 and a.setup.scenario.seed == 5
    one = simulate(small, steps=1)
    assert one.summary["warmup_steps"] == 0 and one.summary["steady_steps"] == 1


@pytest.mark.parametrize("name", VARIANTS)
def test_variants(name, small):
    sc = variant(small, name)
    kind = {"oppo-intra": "oppo", "oppo-inter": "oppo"}.get(name, name)
    assert sc.schedule.kind == kind
    if name == "oppo-intra":
        assert sc.schedule.intra.enabled and not sc.schedule.inter.enabled
        assert sc.schedule.intra.chunk_tokens == small.schedule.intra.chunk_tokens
    if name == "oppo-inter":
        assert not sc.schedule.intra.enabled and sc.schedule.inter.enabled
        assert sc.schedule.inter.delta == small.schedule.inter.delta
    if name == "partial":
        assert sc.schedule.token_budget == small.workload.max_response_tokens // 4
    if name == "async":
        assert sc.schedule.max_staleness == 1
    assert sc.base_dir == small.base_dir


def test_unknown_variant_is_a_clean_error(small):
    with pytest.raises(ScenarioError, match=r"^--compare: expected variant names .* got 'fast'$"):
        compare(small, ["sync", "fast"])
    with pytest.raises(ScenarioError):
        variant(small, "fast")


def test_compare_uses_the_same_lengths_and_reports_speedup(small):
    out, results = compare(small, ["sync", "oppo"], steps=4)
    assert out["variants"]["sync"]["speedup"] == pytest.approx(1.0)
    for name, row in out["variants"].items():
        assert row["gpu_busy"] == results[name].summary["gpu_busy"]
        assert row["gpu_active"] == results[name].summary["gpu_active"]
    ratio = results["sync"].summary["step_time_s"] / results["oppo"].summary["step_time_s"]
    assert out["variants"]["oppo"]["speedup"] == pytest.approx(ratio)
    sync_lens = [x for r in results["sync"].steps for x in r.lengths]
    oppo_lens = {x[0]: x for r in results["oppo"].steps for x in r.lengths}
    assert all(oppo_lens[i] == (i, p, n) for i, p, n in sync_lens if i in oppo_lens)


def test_rebuild_revalidates(small):
    with pytest.raises(ScenarioError, match="^steps: expected a number >= 1, got 0$"):
        rebuild(small, {"steps": 0})


def test_unknown_scoring_runtime_is_a_clean_error(scenario_dict):
    d = scenario_dict("gpu")
    d["models"]["reward"]["runtime"] = "tensorrt-llm"
    with pytest.raises(ScenarioError, match=r"^models\.reward\.runtime: expected a scoring runtime of profile"):
        simulate(load_scenario(d), steps=2)


def test_write_outputs(small, tmp_path):
    res = simulate(small, steps=3)
    write_outputs(res, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["step_time_s"] == res.summary["step_time_s"]
    with open(tmp_path / "run" / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    assert float(rows[1]["step_time_s"]) == pytest.approx(res.steps[1].step_time_s)
    with open(tmp_path / "run" / "intervals.csv") as f:
        reader = csv.reader(f)
        header = next(reader)
        ivs = list(reader)
    assert header == ["step", "pool", "gpu", "role", "phase", "start_s", "end_s", "active_s"]
    # One row per GPU of each interval, with the interval's active seconds.
    assert len(ivs) == sum(iv.n_gpus for iv in res.intervals)
    assert all(float(r[6]) >= float(r[5]) for r in ivs)
    assert all(0.0 <= float(r[7]) <= float(r[6]) - float(r[5]) + 2e-6 for r in ivs)
    want = [f"{iv.active:.6f}" for iv in res.intervals for _ in range(iv.n_gpus)]
    assert [r[7] for r in ivs] == want
    assert {r[4] for r in ivs} <= set(PHASES)
    with open(tmp_path / "run" / "lengths.csv") as f:
        lens = list(csv.DictReader(f))
    assert len(lens) == sum(r.trained_rollouts for r in res.steps)

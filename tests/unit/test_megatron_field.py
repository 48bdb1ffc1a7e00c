"""The Megatron field rows (scenarios/examples/megatron-field/): runs.yaml loads, every row's scenario is the one
make_scenarios.py writes from it, and each scenario validates, except any row whose layout the simulator cannot
express yet, which must be refused with an error naming the field (so closing a gap shows up here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from rlhfsim.errors import RlhfsimError, ScenarioError
from rlhfsim.scenario.loader import load_scenario

HERE = Path(__file__).resolve().parents[2] / "scenarios" / "examples" / "megatron-field"

# Refused today: none. (The uneven pipelines of DeepSeek-V3 and Qwen3-235B-A22B, vLLM TP beyond an 8-GPU node's NVLink
# and expert tensor parallelism 1 were; a row the simulator cannot express goes here with the field its error names.)
REFUSED: dict[str, str] = {}


def _make():
    spec = importlib.util.spec_from_file_location("make_scenarios", HERE / "make_scenarios.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


DOC = yaml.safe_load((HERE / "runs.yaml").read_text())
ROWS = DOC["runs"]


def test_runs_yaml_rows_and_pairs():
    ids = [r["id"] for r in ROWS]
    assert len(ids) == len(set(ids)) >= 10
    assert {r["source"] for r in ROWS} <= set(DOC["sources"])
    assert {r["gpu"] for r in ROWS} == {"h100-sxm", "gb200", "h20"}
    for on, off in DOC["pairs"]:
        row = {r["id"]: r for r in ROWS}
        assert row[on]["policy"] == "on-policy" and row[off]["policy"].endswith(("-off", "async 0.5"))
    for r in ROWS:
        assert r["measured_step_s"] > 0
        if r.get("framework") == "areal":  # E4: synchronous AReaL runs on the same two pools as its async twin
            assert 0 < r["gen_gpus"] < r["gpus"]
        else:
            assert (r["gen_gpus"] is None) == (r["policy"] == "on-policy")
        if "launch" in r:  # verl rows: the published launch beside runs.yaml
            assert (HERE / r["launch"]).is_file() and r["mean_response_len"] > 0
        elif r.get("framework") in ("relax", "rlinf", "areal"):
            assert r["mean_response_len"] < r["max_response"]
        else:
            assert r["avg_seq"] < r["tmax"]


def test_clipped_lognormal_hits_the_published_mean():
    mk = _make()
    med = mk.median_for(3075.0, 3968.0)
    assert mk.clipped_mean(med, 3968.0) == pytest.approx(3075.0, rel=1e-6)
    assert mk.clipped_mean(med, 1e12) > 3075.0  # the cap pulls the mean down


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_scenario_is_written_from_its_row_and_validates(row):
    mk = _make()
    path = HERE / f"{row['id']}.yaml"
    if "launch" in row or row.get("framework") in ("relax", "rlinf", "areal"):
        build = ((lambda: mk.import_row(row).scenario) if "launch" in row
                 else (lambda: mk.relax_scenario(row)) if row["framework"] == "relax" else (lambda: mk.sglang_scenario(row)))
        if row["id"] in REFUSED:
            assert not path.exists()
            with pytest.raises(RlhfsimError, match=REFUSED[row["id"]].replace(".", r"\.")):
                build()
        else:
            sc = build()
            assert yaml.safe_load(path.read_text()) == sc
            assert load_scenario(sc).cluster.gpu == row["gpu"]
        return
    assert yaml.safe_load(path.read_text()) == mk.scenario(row, DOC["prompt_mean"])
    if row["id"] in REFUSED:
        with pytest.raises(ScenarioError, match=REFUSED[row["id"]].replace(".", r"\.")):
            load_scenario(path)
    else:
        sc = load_scenario(path)
        assert sc.cluster.gpu == row["gpu"]


def test_areal_rows_follow_e1_e2():
    """A1's steps are the published hours over 250 steps of 512 x 16 samples (E1), and the mean response comes back
    from the paper's Figure 5c throughputs (E2: 128.7k tokens/s at eta 0 with the sync step, 356.6k at eta 4 with the
    async step) within 0.1%."""
    hours = {"A1-1": 41.0, "A1-2": 14.8, "A1-3": 57.7, "A1-4": 25.4}
    row = {r["id"]: r for r in ROWS}
    for i, h in hours.items():
        r = row[i]
        assert r["measured_step_s"] == pytest.approx(h * 3600 / 250, abs=0.01)
        assert r["prompts"] * r["generations"] == 8192 and r["max_prompt"] + r["max_response"] == 28672
        assert r["policy"] == ("on-policy" if i in ("A1-1", "A1-3") else "4-off")
    for i, tput in (("A1-1", 128.7e3), ("A1-2", 356.6e3)):
        per_sample = tput * row[i]["measured_step_s"] / 8192
        assert per_sample == pytest.approx(row[i]["mean_prompt_len"] + row[i]["mean_response_len"], rel=1e-3)


def test_areal_and_rlinf_scenarios_place_roles_as_stated():
    """E4/E5: AReaL's rows put the actor and SGLang on two pools (75:25), sync at eta 0, async at max_staleness 4, weights
    over NCCL; D1/D3: RLinf's row is colocated with TP 2 engines, offload on, one sequence a micro-batch."""
    mk = _make()
    row = {r["id"]: r for r in ROWS}
    a_sync, a_async, rl = (mk.sglang_scenario(row[i]) for i in ("A1-1", "A1-2", "I1-1"))
    assert [p["gpus"] for p in a_sync["placement"]["pools"]] == [32, 96]
    assert a_sync["schedule"] == {"kind": "sync"} and a_async["schedule"] == {"kind": "async", "max_staleness": 4}
    assert a_sync["execution"]["weight_sync"]["kind"] == "nccl" and "reference" not in a_sync["models"]
    assert a_sync["algorithm"]["minibatch_size"] == 2048 and a_sync["generation"]["runtime"] == "sglang"
    assert rl["placement"] == {"kind": "colocated", "tp": {"actor": 2, "rollout": 2}}
    assert rl["execution"]["offload"]["actor"] == {"param": True, "grad": True, "optimizer": True}
    assert rl["execution"]["micro_batch"]["ppo_micro_batch_size_per_gpu"] == 1
    assert 0 < rl["generation"]["kv_cache_fraction"] < 0.55 + 1e-9

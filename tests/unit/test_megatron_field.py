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
        assert (r["gen_gpus"] is None) == (r["policy"] == "on-policy")
        if "launch" in r:  # verl rows: the published launch beside runs.yaml
            assert (HERE / r["launch"]).is_file() and r["mean_response_len"] > 0
        elif r.get("framework") == "relax":
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
    if "launch" in row or row.get("framework") == "relax":
        build = (lambda: mk.import_row(row).scenario) if "launch" in row else (lambda: mk.relax_scenario(row))
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

"""The time-boxed GPU session (lab/gpu/gpu_session.py, outside the installed packages) and the bundled H200 profile it produced.

A stage past its deadline is cut (SIGTERM to its process group) and recorded as cut; the bundled
``h200-measured`` profile is exactly what ``--from-journal`` assembles from the journal the H200
sessions wrote, here on a machine without a GPU (so the profile is reproducible from the raw data)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from calibrate.cli import calibrate_command  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab" / "gpu"))  # the session scripts
from gpu_session import Session  # noqa: E402
from rlhfsim.costs.profile import validate_profile  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it

PROFILES = Path(__file__).resolve().parents[2] / "rlhfsim" / "profiles"


def test_a_stage_past_its_deadline_is_cut_and_recorded(tmp_path):
    s = Session(tmp_path, budget_s=60)
    rec = s.run("sleepy", [sys.executable, "-c", "import time; time.sleep(60)"], limit_s=5)
    assert rec["cut"] and rec["rc"] != 0 and rec["seconds"] < 30
    quick = s.run("quick", [sys.executable, "-c", "print('done')"], limit_s=30)
    assert quick["rc"] == 0 and not quick["cut"]
    none = s.run("late", [sys.executable, "-c", "pass"], limit_s=1)
    assert none["skipped"] == "no time left" and none["rc"] is None
    doc = json.loads((tmp_path / "session.json").read_text())
    assert [st["stage"] for st in doc["stages"]] == ["sleepy", "quick", "late"]
    assert "done" in (tmp_path / "session.log").read_text()


def _leaves(doc, path=""):
    """{json path: leaf value} of a nested JSON document."""
    if isinstance(doc, dict):
        return {k: v for key, item in doc.items() for k, v in _leaves(item, f"{path}.{key}").items()}
    if isinstance(doc, list):
        return {k: v for i, item in enumerate(doc) for k, v in _leaves(item, f"{path}[{i}]").items()}
    return {path: doc}


def test_bundled_h200_profile_is_its_journal_assembled_without_a_gpu(tmp_path):
    bundled = json.loads((PROFILES / "h200-measured.json").read_text())
    shutil.copy(PROFILES / "h200-measured.journal.jsonl", tmp_path / "h200-measured.journal.jsonl")
    grid = {k: v for k, v in bundled["grid"].items() if k != "runtime_models_measured"}
    res = CliRunner().invoke(calibrate_command, ["--from-journal", "--gpu", "h200", "--name", "h200-measured",
                                                 "--out", str(tmp_path / "h200-measured.json"),
                                                 "--grid", json.dumps(grid), "--format", "json"])
    assert res.exit_code == 0, res.output
    fresh = json.loads((tmp_path / "h200-measured.json").read_text())
    validate_profile(fresh)
    # equal up to the last digits a fit's rounding may differ in from one CPU to another (the fit's
    # Jacobian is analytic, so the covariance and the bootstrap carry no finite-difference noise)
    for part in ("operations", "generation"):
        a, b = _leaves(fresh[part]), _leaves(bundled[part])
        assert a.keys() == b.keys(), part
        for path, value in b.items():
            if isinstance(value, float):
                assert a[path] == pytest.approx(value, rel=1e-6, abs=1e-12), path
            else:
                assert a[path] == value, path
    assert fresh["device"]["name"] == "NVIDIA H200" and fresh["gpu"] == "h200" and fresh["dtype"] == "bfloat16"
    gen = fresh["generation"]
    assert gen["hf_generate"]["valid"] and not gen["vllm"]["valid"] and "not importable" in gen["vllm"]["reason"]
    assert bundled["step"]["source"] == "measured" and bundled["step"]["device"] == "cuda"


def test_gpu_validate_rehearsed_on_cpu_writes_each_scenario_as_it_ends(tmp_path):
    """``lab/gpu/gpu_validate.py`` on CPU with tiny-model overrides: the env stage, one validate stage per
    scenario in the order given, each scenario's JSON and a summary per profile in session.json."""
    from gpu_validate import main

    tiny = [a for role in ("actor", "critic", "reference", "reward") for a in ("--set", f"models.{role}.model=tiny-qwen2")]
    rc = main(["--out", str(tmp_path), "--device", "cpu", "--scenarios", "oppo-inter,sync-static", "--profile", "cpu",
               "--budget-s", "240", "--set", "cluster.gpu=cpu", "--set", "workload.max_response_tokens=24",
               "--set", "workload.prompts_per_step=4", "--set", "algorithm.minibatch_size=2", *tiny])
    assert rc == 0
    doc = json.loads((tmp_path / "session.json").read_text())
    assert [st["stage"] for st in doc["stages"]] == ["env", "validate oppo-inter", "validate sync-static"]
    assert all(st["rc"] == 0 for st in doc["stages"])
    assert set(doc["results"]) == {"val-h200-oppo-inter", "val-h200-sync-static"}
    for by in doc["results"].values():
        r = by["cpu"]
        assert r["measured_s"] > 0 and r["predicted_s"] > 0 and "allocator" not in r   # no caching allocator on CPU
    assert (tmp_path / "val-oppo-inter.json").is_file() and (tmp_path / "val-sync-static.json").is_file()


def test_gpu_validate_refuses_more_scenarios_than_files_come_back(tmp_path, capsys):
    from gpu_validate import main

    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path), "--scenarios", "a,b,c,d,e,f"])
    assert e.value.code != 0 and "--scenarios: expected at most 5" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--scenarios", "no-such-scenario"])
    assert "expected a scenario file" in capsys.readouterr().err


def test_gpu_validate_calibrates_on_the_lease_and_runs_the_variant(tmp_path):
    """``--calibrate``: a quick calibration of the given model first (``lease.json``, first in every
    validate stage's ``--profile``); ``--variant``: the first scenario again with the environment variable
    set, its own file and results key."""
    from gpu_validate import main

    tiny = [a for role in ("actor", "critic", "reference", "reward") for a in ("--set", f"models.{role}.model=tiny-qwen2")]
    small = {"sampling": [[4, 4096]], "prefill": [[1, 64], [4, 64]], "decode": [[1, 64], [4, 64]],
             "score": [[1, 64], [4, 64]], "train": [[1, 64], [2, 64]], "gen_prefill": [[2, 32]],
             "gen_decode": [[2, 32]], "gen_pad": [[2, 32]], "interference": [[2, 64, 2, 64]],
             "strategies": [[4, 64]], "handoff": [[2, 32, 8, 4]], "chunk_batches": [2], "chunk_sizes": [16],
             "page_faults": False}   # a CPU-only term (a fixed 8-128 MiB ladder, ~15 s on two cores)
    rc = main(["--out", str(tmp_path), "--device", "cpu", "--scenarios", "sync-static", "--profile", "cpu",
               "--budget-s", "300", "--calibrate", "tiny-qwen2", "--calibrate-s", "150", "--grid-extra", json.dumps(small),
               "--variant", "onethread:OMP_NUM_THREADS=1", "--set", "cluster.gpu=cpu",
               "--set", "workload.max_response_tokens=16", "--set", "workload.prompts_per_step=4",
               "--set", "algorithm.minibatch_size=2", *tiny])
    assert rc == 0
    doc = json.loads((tmp_path / "session.json").read_text())
    assert [st["stage"] for st in doc["stages"]] == ["env", "calibrate", "validate sync-static",
                                                     "validate sync-static-onethread"]
    assert all(st["rc"] == 0 for st in doc["stages"])
    lease = str(tmp_path / "lease.json")
    assert doc["profile"] == f"{lease},cpu" and doc["variant"] == {"name": "onethread", "env": {"OMP_NUM_THREADS": "1"}}
    assert set(doc["results"]) == {"val-h200-sync-static", "val-h200-sync-static-onethread"}
    for by in doc["results"].values():
        assert set(by) == {lease, "cpu"} and by[lease]["predicted_s"] > 0
    lease_doc = json.loads((tmp_path / "lease.json").read_text())
    assert {"train", "decode", "decode:hf_generate", "prefill:hf_generate", "score:eager"} <= set(lease_doc["operations"])
    assert len(list(tmp_path.iterdir())) <= 8


def test_gpu_validate_refuses_a_bad_variant_or_grid(tmp_path, capsys):
    from gpu_validate import main

    for bad, field in ((["--scenarios", "sync-static", "--variant", "x=1"], "--variant: expected NAME:VAR=VALUE"),
                       (["--scenarios", "sync-static", "--grid-extra", "[1]"], "--grid-extra: expected a JSON object"),
                       (["--calibrate", "tiny-qwen2", "--variant", "a:B=1", "--scenarios", "sync-static,oppo-intra,oppo-inter"],
                        "--scenarios: expected at most 2 with --calibrate/--variant")):
        with pytest.raises(SystemExit) as e:
            main(["--out", str(tmp_path), *bad])
        assert e.value.code != 0 and field in capsys.readouterr().err

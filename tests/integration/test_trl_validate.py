"""A tiny TRL validation end to end (``rlhfsim validate --framework trl``): GRPO with a reward model and a
reference, RLOO with a rule reward, 2 steps each on tiny models. Checks what TRL did, not its timing:
every step trained, every completion's lengths recorded (and matching TRL's own logged length metrics),
replayed one for one into the simulator, the JSON shape of ``rlhfsim validate``; and the adapter's
completions log round-trips through ``rlhfsim lengths import``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it

def _has(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


needs_trl = pytest.mark.skipif(not (_has("trl") and _has("datasets")), reason="needs trl and datasets (pip install -e '.[trl]')")

TINY = {
    "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 1},
    "placement": {"kind": "colocated"},
    "generation": {"engine": "static", "runtime": "hf_generate", "max_batch": 4},
    "schedule": {"kind": "sync"},
    "workload": {"prompts_per_step": 2, "prompt_length": {"kind": "fixed", "value": 6},
                 "response_length": {"kind": "lognormal", "median": 4, "p99": 16}, "max_response_tokens": 12},
    "steps": 2, "warmup_steps": 1,
}
GRPO = {**TINY, "name": "tiny-trl-grpo", "seed": 3,
        "models": {"actor": {"model": "tiny-qwen2", "dtype": "float32"},
                   "reference": {"model": "tiny-qwen2", "dtype": "float32"},
                   "reward": {"model": "tiny-qwen2", "dtype": "float32"}},
        "algorithm": {"kind": "grpo", "group_size": 2, "minibatch_size": 4}}
RLOO = {**TINY, "name": "tiny-trl-rloo", "seed": 4,
        "models": {"actor": {"model": "tiny-qwen2", "dtype": "float32"}, "reward": {"kind": "rule"}},
        "algorithm": {"kind": "rloo", "group_size": 2, "minibatch_size": 4}}


@needs_trl
def test_tiny_trl_validation_replays_what_trl_did(cli, tmp_path):
    paths = []
    for d in (GRPO, RLOO):
        p = tmp_path / f"{d['name']}.yaml"
        p.write_text(yaml.safe_dump(d))
        paths.append(p)
    out = tmp_path / "val.json"
    r = cli("validate", "--framework", "trl", "--device", "cpu", "--scenario", paths[0], "--scenario", paths[1],
            "--format", "json", "--out", out, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["framework"] == "trl" and doc["profile"] == "cpu" and isinstance(doc["median_abs_error_pct"], float)
    assert [s["name"] for s in doc["scenarios"]] == ["tiny-trl-grpo", "tiny-trl-rloo"]
    for s, alg in zip(doc["scenarios"], ("grpo", "rloo")):
        assert s["algorithm"] == alg
        for k in ("measured_step_time_s", "predicted_step_time_s", "error_pct"):
            assert isinstance(s[k], float)
        assert {"generate", "reward", "actor_train"} <= set(s["phases"])
        for v in s["phases"].values():
            assert {"measured_s", "predicted_s", "error_pct"} <= set(v)
        c = s["checks"]
        assert c["steps_trained"] == c["steps_simulated"] == 2 and c["trl_global_steps_logged"] == [1, 2]
        assert c["rollouts_recorded"] == 2 * 4
        assert c["recorded_lengths_match_trl_metrics"] and c["lengths_replayed_one_for_one"]
    grpo, rloo = doc["scenarios"]
    assert grpo["phases"]["reference"]["measured_s"] > 0            # beta > 0 with a reference
    assert "reference" not in rloo["phases"] and rloo["phases"]["old_logprobs"]["measured_s"] > 0
    full = json.loads(out.read_text())   # --out keeps the per-rollout lengths
    for s in full["scenarios"]:
        rec = s["checks"]["recorded_lengths"]
        assert rec == s["checks"]["replayed_lengths"] and [len(x) for x in rec] == [4, 4]
        assert all(1 <= rl <= 12 and pl == 6 for step in rec for pl, rl in step)
    # --out keeps each scenario's trace and TRL completions log beside it; the log imports to the same trace
    from rlhfsim.workload.trace import read_trace

    for name in ("tiny-trl-grpo", "tiny-trl-rloo"):
        log, trace = tmp_path / "val.trl" / f"{name}.completions.jsonl", tmp_path / "val.trl" / f"{name}.trace.csv"
        r = cli("lengths", "import", log, "--trace", tmp_path / f"{name}.csv")
        assert r.returncode == 0, r.stderr
        assert read_trace(tmp_path / f"{name}.csv", "x") == read_trace(trace, "x")


@needs_trl
def test_trl_completions_log_round_trips(cli, tmp_path):
    from calibrate.frameworks.base import spec_from_scenario
    from calibrate.frameworks.trl import run_trl
    from rlhfsim.scenario import build_setup, load_scenario
    from rlhfsim.workload.trace import read_trace

    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(RLOO))
    sc = load_scenario(p)
    steps = run_trl(spec_from_scenario(sc, build_setup(sc), log_path=str(tmp_path / "log.jsonl")))
    assert [s.step for s in steps] == [0, 1]
    r = cli("lengths", "import", tmp_path / "log.jsonl", "--trace", tmp_path / "t.csv")
    assert r.returncode == 0, r.stderr
    got = [(t.step, t.prompt_id, t.rollout, t.prompt_len, t.response_len) for t in read_trace(tmp_path / "t.csv", "x")]
    assert got == [(s.step, x.prompt_id, x.rollout, x.prompt_len, x.response_len) for s in steps for x in s.rollouts]
    # groups: each prompt's 2 completions, 2 distinct prompts per step, each dataset prompt used once
    assert {(s, pid) for s, pid, *_ in got} == {(s, pid) for s, pid, *_ in got if sum(1 for g in got if g[:2] == (s, pid)) == 2}
    assert len({pid for _, pid, *_ in got}) == 4


@pytest.mark.parametrize("over,path,fragment", [
    ({"algorithm": {"kind": "ppo", "group_size": 1, "minibatch_size": 2}, "models": {"critic": {"model": "tiny-qwen2", "dtype": "float32"}}},
     "algorithm.kind", "expected grpo or rloo"),
    ({"algorithm": {"minibatch_size": 2}}, "algorithm.minibatch_size", "expected the 4 rollouts per step"),
    ({"generation": {"engine": "continuous", "runtime": None}}, "generation", "expected engine static with max_batch 4"),
    ({"models": {"reference": {"model": "small-qwen2", "dtype": "float32"}}}, "models.reference.model", "the actor's model"),
])
def test_scenarios_a_trl_step_cannot_run_are_one_line(cli, tmp_path, over, path, fragment):
    from rlhfsim.scenario.loader import deep_merge

    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(deep_merge(GRPO, over)))
    r = cli("validate", "--framework", "trl", "--device", "cpu", "--scenario", p, "--format", "json")
    assert r.returncode == 2 and r.stdout == ""
    assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert r.stderr.startswith(f"error: {path}:") and fragment in r.stderr, r.stderr


def test_calibrate_imports_without_trl():
    import subprocess
    import sys

    code = ("import sys; sys.modules.update(trl=None, datasets=None); import calibrate.validation.cli, calibrate.validation.trl; "
            "from calibrate.frameworks import FRAMEWORKS; from calibrate.frameworks.trl import run_trl; "
            "from calibrate.frameworks.base import FrameworkSpec; from rlhfsim.models.catalog import load_model; "
            "from rlhfsim.errors import RlhfsimError\n"
            "s = load_model('tiny-qwen2')\n"
            "try:\n run_trl(FrameworkSpec('x', 'grpo', s, None, None, True, 2, 1, (4,), 8, 4.0, 1, 'float32', 0))\n"
            "except RlhfsimError as e:\n print(e)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "expected trl to be installed" in r.stdout


TRL_SCENARIOS = sorted(p for p in (Path(__file__).resolve().parents[2] / "scenarios" / "validate" / "trl").glob("*.yaml")
                       if not p.name.startswith("_"))


def test_there_are_four_trl_scenarios_of_each_kind():
    from rlhfsim.scenario import load_scenario

    scs = [load_scenario(p) for p in TRL_SCENARIOS]
    kinds = {(s.algorithm.kind, s.models.reward.kind) for s in scs}
    assert len(scs) >= 4 and {("grpo", "model"), ("grpo", "rule"), ("rloo", "model")} <= kinds
    assert max(s.algorithm.group_size for s in scs) > 4 and max(s.workload.max_response_tokens for s in scs) > 128


@pytest.mark.parametrize("path", TRL_SCENARIOS, ids=lambda p: p.stem)
def test_trl_scenarios_simulate_and_make_a_trl_step(cli, path):
    from calibrate.frameworks.base import spec_from_scenario
    from rlhfsim.scenario import build_setup, load_scenario

    r = cli("simulate", path, "--steps", 2, "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["generation_runtime"]["runtime"] == "hf_generate" and doc["step_time_s"] > 0
    sc = load_scenario(path)
    spec = spec_from_scenario(sc, build_setup(sc))
    assert spec.rollouts_per_step == sc.algorithm.minibatch_size == sc.generation.max_batch
    assert len(spec.prompt_lens) == sc.workload.prompts_per_step * sc.steps and spec.mean_response_tokens > 1

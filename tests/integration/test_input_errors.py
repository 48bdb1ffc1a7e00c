"""Issue 14's inputs, each through the real command line: one line on stderr naming the field, exit
code 2, no traceback, no hang (the run is refused before it starts)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from rlhfsim.scenario.loader import MAX_DEPTH

TINY_BASE = {
    "name": "probe",
    "models": {"actor": {"model": "tiny-qwen2", "dtype": "float32"}, "reward": {"model": "tiny-qwen2", "dtype": "float32"}},
    "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 1},
    "algorithm": {"kind": "grpo", "group_size": 2, "minibatch_size": 4},
    "workload": {"prompts_per_step": 4, "prompt_length": {"kind": "fixed", "value": 16}, "max_prompt_tokens": 64,
                 "response_length": {"kind": "fixed", "value": 32}, "max_response_tokens": 64},
    "generation": {"engine": "continuous", "max_batch": 4},
    "steps": 2,
}


def run_cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-c", "from rlhfsim.cli import main; main()", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def one_error(p, field: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout[-500:], p.stderr[-2000:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert lines[0].startswith(f"error: {field}"), lines[0]
    return lines[0]


def _with(over: dict) -> dict:
    from rlhfsim.scenario.loader import deep_merge

    doc = deep_merge(json.loads(json.dumps(TINY_BASE)), over)
    if "response_length" in over.get("workload", {}):  # a distribution replaces the block, not merges into it
        doc["workload"]["response_length"] = over["workload"]["response_length"]
    return doc


CASES = {
    "config-binary": ({"models": {"actor": {"model": "CFG/binary.json"}}}, "models.actor.model", "binary"),
    "config-list": ({"models": {"actor": {"model": "CFG/list.json"}}}, "models.actor.model", "JSON object"),
    "config-zero": ({"models": {"actor": {"model": "CFG/zero.json"}}}, "models.actor.model", "in 1.."),
    "mixture-1e308": ({"workload": {"response_length": {"kind": "mixture", "components": [
        {"weight": 1e308, "dist": {"kind": "fixed", "value": 8}}, {"weight": 1, "dist": {"kind": "fixed", "value": 9}}]}}},
        "workload.response_length.components[0].weight", "<= 1000000000000"),
    "ppo-epochs": ({"algorithm": {"ppo_epochs": 1_000_000_000_000}}, "algorithm.ppo_epochs", "<= 1000"),
    "inter-delta": ({"schedule": {"kind": "oppo", "inter": {"delta": 1_000_000_000_000}}}, "schedule.inter.delta", "<= 1000000"),
    "overhead-inf": ({"generation": {"step_overhead_s": float("inf")}}, "generation.step_overhead_s", "finite"),
    "work-limit": ({"schedule": {"kind": "oppo", "inter": {"delta": 100_000}}, "steps": 100_000}, "schedule.inter.delta", "work limit"),
    "in-flight": ({"schedule": {"kind": "oppo", "inter": {"delta": 1_000_000}}}, "schedule.inter.delta", "rollouts in flight"),
    "epochs-work": ({"algorithm": {"ppo_epochs": 1000}, "steps": 100_000}, "algorithm.ppo_epochs", "work limit"),
    # issue 15: a streaming strategy the reward architecture cannot run, a reward model too short for the rollouts
    "encoder-incremental": ({"models": {"reward": {"model": "tiny-deberta", "streaming": "incremental"}},
                             "schedule": {"kind": "oppo", "intra": {"chunk_tokens": 16}, "inter": {"enabled": False}}},
                            "models.reward.streaming", "expected reencode or final_only"),
    # (an encoder's positions are not refused: relative ones run any length, absolute ones truncate)
    "decoder-positions": ({"workload": {"max_response_tokens": 5000}}, "models.reward.model", "4096 positions"),
    # issue 55: expert parallelism in generation needs experts to spread
    "gen-ep-dense": ({"generation": {"parallel": {"ep": 2}}}, "generation.parallel.ep", "dense model"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_issue_inputs_exit_2_naming_the_field(case, tmp_path, fixtures_dir):
    over, field, fragment = CASES[case]
    doc = json.loads(json.dumps(over).replace("CFG/", str(fixtures_dir / "bad") + "/"))
    path = tmp_path / "s.yaml"
    # YAML writes inf as .inf (json.dumps would write Infinity): dump the merged mapping with PyYAML.
    path.write_text(yaml.safe_dump(_with(doc)))
    line = one_error(run_cli("simulate", path), field)
    assert fragment in line, line


def test_deep_yaml_is_one_line(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: " + "[" * 5000 + "]" * 5000 + "\n")
    one_error(run_cli("simulate", deep), "deep.yaml")
    shallow = tmp_path / "shallow.yaml"  # parses, but deeper than any scenario
    shallow.write_text("description: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "\n")
    assert "levels of nesting" in one_error(run_cli("simulate", shallow), "description")


def test_nul_byte_in_defaults(tmp_path):
    p = tmp_path / "nul.yaml"
    p.write_text('defaults: ["_a\\0b"]\n' + yaml.safe_dump(TINY_BASE))
    one_error(run_cli("simulate", p), "defaults[0]")


def test_yaml_alias_bomb_is_refused(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    p = tmp_path / "bomb.yaml"
    p.write_text("\n".join(lines) + "\n")
    assert "at most" in one_error(run_cli("simulate", p), "a")


def test_plan_file_points_to_plan(fixtures_dir):
    from conftest import ROOT

    line = one_error(run_cli("simulate", ROOT / "scenarios" / "plan-oppo-7b-cheapest.yaml"), "plan-oppo-7b-cheapest.yaml")
    assert "rlhfsim plan" in line


def test_every_validation_error_listed(tmp_path):
    p = tmp_path / "many.yaml"
    p.write_text(yaml.safe_dump(_with({"steps": 0, "seed": -1, "algorithm": {"ppo_epochs": 0}, "bogus": 1})))
    r = run_cli("simulate", p)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("error: ") for line in lines), r.stderr
    assert {line.split(":")[1].strip() for line in lines} == {"steps", "seed", "algorithm.ppo_epochs", "bogus"}


def test_set_overrides_and_errors(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(TINY_BASE))
    r = run_cli("simulate", p, "--set", "workload.prompts_per_step=6", "--set", "schedule.kind=tail", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["schedule"] == "tail"
    one_error(run_cli("simulate", p, "--set", "workload.prompts=6"), "--set workload.prompts")
    one_error(run_cli("simulate", p, "--set", "nonsense"), "--set")
    one_error(run_cli("simulate", p, "--set", "workload.prompts_per_step=-1"), "workload.prompts_per_step")


@pytest.mark.parametrize("command", ["simulate", "plan", "report", "schema", "models", "gpus", "lengths", "calibrate",
                                     "validate", "runtimes"])
def test_short_help_everywhere(command):
    r = run_cli(command, "-h")
    assert r.returncode == 0 and "Usage:" in r.stdout, r.stderr


def test_encoder_streams_by_reencode_or_final_only(tmp_path):
    """The encoder strategies simulate; re-encoding prices more scorer work than scoring once."""
    tokens = {}
    for st in ("reencode", "final_only"):
        p = tmp_path / f"{st}.yaml"
        p.write_text(yaml.safe_dump(_with({"models": {"reward": {"model": "tiny-deberta", "streaming": st}},
                                           "schedule": {"kind": "oppo", "intra": {"chunk_tokens": 8},
                                                        "inter": {"enabled": False}}})))
        r = run_cli("simulate", p, "--format", "json")
        assert r.returncode == 0, r.stderr[-2000:]
        doc = json.loads(r.stdout)
        assert doc["step_costs"]["retokenize_per_token_s"]["source"] == "profile"   # tiny-deberta reads another tokenizer
        tokens[st] = doc["schedule_stats"]["chunks_scored"]
    assert tokens["reencode"] > tokens["final_only"]

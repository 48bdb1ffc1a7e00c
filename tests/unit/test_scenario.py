"""Scenario schema, YAML loading with mixins, and the resolved Setup."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest
import yaml

from rlhfsim.models.catalog import CATALOG, DTYPE_BYTES
from rlhfsim.scenario import Scenario, build_setup, load_scenario
from rlhfsim.scenario.checks import OPTIMIZER_BYTES_PER_PARAM
from rlhfsim.scenario.loader import deep_merge
from rlhfsim.scenario.schema import Colocated, LogNormal, RewardModel, RuleReward, SyncSchedule

ROOT = Path(__file__).resolve().parents[2]


def _scenario_files():
    files = sorted((ROOT / "scenarios").glob("*.yaml")) + sorted((ROOT / "scenarios" / "validate").glob("*.yaml"))
    return [f for f in files if not f.name.startswith(("_", "plan-"))]


@pytest.mark.parametrize("path", _scenario_files(), ids=lambda p: p.name)
def test_bundled_scenarios_load(path):
    sc = load_scenario(path)
    assert sc.base_dir == path.resolve().parent
    build_setup(sc)


def test_mixin_is_merged_under_the_document():
    sc = load_scenario(ROOT / "scenarios" / "oppo.yaml")
    assert (sc.cluster.gpu, sc.cluster.nodes, sc.cluster.gpus_per_node) == ("h200", 1, 8)
    s = build_setup(sc)
    assert [(p.name, p.gpus, p.roles) for p in s.pools] == [
        ("actor", 7, ("actor", "critic", "reference", "rollout")), ("reward", 1, ("reward",))]
    assert s.rollouts_per_step == 112 and s.replicas == 7


def test_fixture_with_mixin_and_empirical_lengths(fixtures_dir):
    sc = load_scenario(fixtures_dir / "tiny.yaml")
    assert sc.cluster.gpu == "cpu" and isinstance(sc.placement, Colocated)
    s = build_setup(sc)
    import numpy as np

    draws = s.response_sampler(np.random.default_rng(0), 500)
    assert set(draws.tolist()) == {12, 40, 7, 88, 33, 96}  # 150 is capped at max_response_tokens 96


def test_deep_merge():
    base = {"a": {"x": 1, "y": [1, 2]}, "b": 1}
    over = {"a": {"y": [3], "z": {"k": 2}}, "c": 3}
    assert deep_merge(base, over) == {"a": {"x": 1, "y": [3], "z": {"k": 2}}, "b": 1, "c": 3}
    assert base == {"a": {"x": 1, "y": [1, 2]}, "b": 1}  # inputs untouched


def test_document_wins_over_mixin(tmp_path):
    (tmp_path / "_node.yaml").write_text("cluster: {gpu: h100, nodes: 2, gpus_per_node: 8}\nsteps: 7\n")
    doc = yaml.safe_load((ROOT / "scenarios" / "baseline.yaml").read_text())
    doc.pop("cluster")
    doc["defaults"] = "_node"  # a single name works as well as a list
    doc["cluster"] = {"nodes": 1}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc))
    sc = load_scenario(tmp_path / "s.yaml")
    assert (sc.cluster.gpu, sc.cluster.nodes, sc.cluster.gpus_per_node) == ("h100", 1, 8)
    assert sc.steps == 5  # baseline's own value beats the mixin's


def test_load_from_mapping_does_not_touch_the_input(scenario_dict):
    d = scenario_dict("gpu")
    before = json.dumps(d, sort_keys=True)
    d["models"]["reward"].pop("kind", None)
    sc = load_scenario(d)
    assert isinstance(sc.models.reward, RewardModel) and sc.models.reward.kind == "model"
    assert "kind" not in d["models"]["reward"]
    assert json.dumps(d, sort_keys=True) == before


def test_defaults_are_filled(scenario_dict):
    d = scenario_dict("gpu")
    for k in ("placement", "algorithm", "generation", "schedule", "steps", "warmup_steps", "seed"):
        d.pop(k)
    d["workload"] = {"prompts_per_step": 16, "response_length": {"kind": "fixed", "value": 10},
                     "max_response_tokens": 64}
    sc = load_scenario(d)
    assert isinstance(sc.placement, Colocated) and isinstance(sc.schedule, SyncSchedule)
    assert sc.workload.prompt_length.value == 256 and sc.workload.max_prompt_tokens == 2048
    assert sc.generation.engine == "continuous" and sc.steps == 10 and sc.seed == 0


def test_rule_reward(scenario_dict):
    d = scenario_dict("gpu")
    d["models"]["reward"] = {"kind": "rule"}
    d["placement"] = {"kind": "colocated"}
    s = build_setup(load_scenario(d))
    assert isinstance(s.rule_reward, RuleReward) and "reward" not in s.shapes


def test_scenario_is_frozen(scenario_dict):
    sc = load_scenario(scenario_dict("gpu"))
    with pytest.raises(pydantic.ValidationError):
        sc.steps = 3
    with pytest.raises(pydantic.ValidationError):
        sc.workload.prompts_per_step = 3


def test_schema_has_help_text_next_to_fields():
    schema = Scenario.model_json_schema()
    assert {"models", "cluster", "workload"} <= set(schema["required"])
    assert schema["properties"]["steps"]["description"].startswith("Steps to simulate")
    defs = schema["$defs"]
    assert "description" in defs["LogNormal"]["properties"]["p99"]
    assert {"SyncSchedule", "OppoSchedule", "PartialSchedule", "AsyncSchedule"} <= set(defs)


def test_lognormal_needs_p99_above_median():
    LogNormal(median=10, p99=11)
    with pytest.raises(pydantic.ValidationError):
        LogNormal(median=10, p99=10)


# --- the resolved Setup -----------------------------------------------------------------------------
def test_setup_pools_tp_and_replicas(scenario_dict):
    d = scenario_dict("gpu", {"cluster": {"gpus_per_node": 8}, "placement": {"reward_gpus": 2,
                              "tp": {"actor": 2, "reward": 2}}})
    s = build_setup(load_scenario(d))
    assert [(p.name, p.gpus, p.first_gpu) for p in s.pools] == [("actor", 6, 0), ("reward", 2, 6)]
    assert s.tp["rollout"] == 2 and s.replicas == 3
    assert s.role_pool == {"actor": 0, "critic": 0, "reference": 0, "rollout": 0, "reward": 1}


def test_pools_spanning_nodes(scenario_dict):
    d = scenario_dict("gpu", {"cluster": {"nodes": 2, "gpus_per_node": 4}})
    d["placement"] = {"kind": "pools", "pools": [
        {"name": "train", "gpus": 6, "roles": ["actor", "critic", "reference"]},
        {"name": "rm", "gpus": 2, "roles": ["reward"]}]}
    s = build_setup(load_scenario(d))
    assert [p.spans_nodes for p in s.pools] == [True, False]


def test_resident_memory_and_kv_capacity(scenario_dict):
    # One actor GPU holding actor, critic and reference (bf16) plus the optimizer state of the two
    # trained models; the KV cache gets kv_cache_fraction of what is left.
    d = scenario_dict("gpu", {"cluster": {"gpus_per_node": 2}})
    s = build_setup(load_scenario(d))
    m = CATALOG["qwen2.5-0.5b"]
    want = (m.params("lm") + m.params("value") + m.params("lm")) * DTYPE_BYTES["bfloat16"] \
        + OPTIMIZER_BYTES_PER_PARAM * (m.params("lm") + m.params("value"))
    assert s.resident_bytes[0] == pytest.approx(want)
    assert s.resident_bytes[1] == pytest.approx(m.params("value") * 2)
    free = (s.gpu.mem_bytes - want) * 0.9
    assert s.kv_capacity_tokens == int(free // m.kv_bytes_per_token("bfloat16"))


def test_local_hf_config_model(tmp_path, scenario_dict):
    cfg = {"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
           "intermediate_size": 128, "vocab_size": 512, "num_key_value_heads": 2}
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text(json.dumps(cfg))
    d = scenario_dict("gpu")
    d["models"]["reward"]["model"] = "mine"
    sc = load_scenario(d, base_dir=tmp_path)
    s = build_setup(sc)
    assert (s.shapes["reward"].hidden, s.shapes["reward"].layers) == (64, 2)

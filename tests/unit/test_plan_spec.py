"""Plan files: axis paths and values are checked before anything runs (errors name the axis and value),
special values (placement presets, schedule.kind), and infeasible configurations with their reasons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlhfsim.errors import ScenarioError
from rlhfsim.plan import load_plan
from rlhfsim.scenario.paths import PathError, check_path, parse_path, set_path
from rlhfsim.plan.spec import config_id

TINY = yaml.safe_load((Path(__file__).resolve().parents[1] / "fixtures" / "plan_base_tiny.yaml").read_text())


def write_plan(tmp_path, axes, **extra):
    doc = {"base": TINY, "axes": axes, **extra}
    p = tmp_path / "plan-x.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def plan_error(tmp_path, axes, **extra) -> ScenarioError:
    with pytest.raises(ScenarioError) as e:
        load_plan(write_plan(tmp_path, axes, **extra))
    return e.value


def test_parse_path_with_indices():
    assert parse_path("placement.pools[1].gpus") == ("placement", "pools", 1, "gpus")
    assert parse_path("cluster.gpu") == ("cluster", "gpu")
    for bad in ("", "cluster..gpu", "cluster.gpu[x]", "1cluster"):
        with pytest.raises(PathError):
            parse_path(bad)


def test_check_path_through_unions_and_lists():
    check_path(parse_path("placement.reward_gpus"))          # only dedicated_reward has it
    check_path(parse_path("placement.pools[0].gpus"))
    check_path(parse_path("workload.response_length.p99"))
    with pytest.raises(PathError, match=r"expected a key of cluster \(gpu, gpus_per_node, nodes\), got unknown key 'gpuz'"):
        check_path(parse_path("cluster.gpuz"))
    with pytest.raises(PathError, match="to be a list"):
        check_path(parse_path("cluster[0]"))


def test_kind_switch_keeps_only_accepted_keys_and_skips_inapplicable_paths():
    doc = {"placement": {"kind": "dedicated_reward", "reward_gpus": 2, "tp": {"actor": 2}},
           "schedule": {"kind": "sync"}}
    assert set_path(doc, ("placement", "kind"), "colocated")
    assert doc["placement"] == {"kind": "colocated", "tp": {"actor": 2}}
    # chunk size does not apply to a sync schedule: nothing changes
    assert not set_path(doc, ("schedule", "intra", "chunk_tokens"), 64)
    assert doc["schedule"] == {"kind": "sync"}


def test_unknown_axis_path_is_reported_with_the_axis(tmp_path):
    e = plan_error(tmp_path, {"cluster.gpu": ["h100"], "schedule.intra.chunk_tokenz": [1]})
    assert e.path == "axes.schedule.intra.chunk_tokenz"
    assert "unknown key 'chunk_tokenz'" in e.message


def test_value_the_schema_rejects_names_axis_and_index(tmp_path):
    e = plan_error(tmp_path, {"schedule.kind": ["oppo"], "schedule.intra.chunk_tokens": [64, 128, -1]})
    assert str(e) == "axes.schedule.intra.chunk_tokens[2]: expected a number >= 1, got -1"


def test_catalog_values_are_plan_errors_not_infeasible(tmp_path):
    e = plan_error(tmp_path, {"cluster.gpu": ["h100", "h300"]})
    assert e.path == "axes.cluster.gpu[1]" and "'h300'" in e.message
    e = plan_error(tmp_path, {"models.critic.model": ["tiny-qwen2", "no-such-model"]})
    assert e.path == "axes.models.critic.model[1]"


def test_bad_placement_preset_and_schedule_variant(tmp_path):
    e = plan_error(tmp_path, {"placement": ["colocated", "seven+one"]})
    assert e.path == "axes.placement[1]" and "'N+M'" in e.message
    e = plan_error(tmp_path, {"schedule.kind": ["sync", "fast"]})
    assert e.path == "axes.schedule.kind[1]" and "oppo-intra" in e.message


def test_runtime_missing_from_profile_is_a_plan_error(tmp_path):
    e = plan_error(tmp_path, {"models.reward.runtime": ["onnxruntime"]})
    assert e.path == "axes.models.reward.runtime[0]"
    assert "'onnxruntime'" in e.message and "it has none" in e.message


def test_plan_fields_are_checked(tmp_path):
    assert plan_error(tmp_path, {"cluster.gpu": ["h100"]}, objective="fastest").path == "objective"
    assert plan_error(tmp_path, {"cluster.gpu": ["h100"]}, objective="min_gpus").path == "max_step_time_s"
    assert plan_error(tmp_path, {"cluster.gpu": ["h100"]}, prices={"h300": 1.0}).path == "prices.h300"
    assert plan_error(tmp_path, {"cluster.gpu": ["h100"], "steps": [3]}, heatmap={"x": "cluster.gpu", "y": "seed"}).path == "heatmap.y"
    assert plan_error(tmp_path, {"cluster.gpu": ["h100", "h100"]}).path == "axes.cluster.gpu[1]"
    assert plan_error(tmp_path, {}).path == "axes"


def test_infeasible_configurations_carry_their_reason(tmp_path):
    plan = load_plan(write_plan(tmp_path, {
        "cluster.gpus_per_node": [2, 4],
        "placement": ["colocated", "3+1"],
        "models.actor.model": ["tiny-qwen2", "qwen2.5-72b"],
    }))
    assert len(plan.configs) == 8
    by = {(c.values["cluster.gpus_per_node"], c.values["placement"], c.values["models.actor.model"]): c for c in plan.configs}
    ok = by[(4, "3+1", "tiny-qwen2")]
    assert ok.reason == "" and ok.doc["placement"]["kind"] == "dedicated_reward" and ok.doc["placement"]["reward_gpus"] == 1
    assert ok.pools == ("actor", "reward")
    assert by[(2, "3+1", "tiny-qwen2")].reason == "placement 3+1 needs 4 GPUs, but the cluster has 2 (1 node(s) x 2)"
    big = by[(4, "colocated", "qwen2.5-72b")]
    assert big.doc is None and big.reason.startswith("placement.tp.actor: models on pool 'all' need")
    assert "h100-sxm" in big.reason
    assert plan.pools == ["all", "actor", "reward"]


def test_placement_preset_keeps_tp_and_schedule_kind_uses_variants(tmp_path):
    base_tp = {"kind": "colocated", "tp": {"actor": 2}}
    p = tmp_path / "plan-y.yaml"
    p.write_text(yaml.safe_dump({"base": {**TINY, "placement": base_tp},
                                 "axes": {"placement": ["2+2"], "schedule.kind": ["oppo-intra"],
                                          "schedule.intra.chunk_tokens": [16]}}))
    (c,) = load_plan(p).configs
    assert c.reason == ""
    assert c.doc["placement"] == {"kind": "dedicated_reward", "reward_gpus": 2,
                                  "tp": {"actor": 2, "critic": 1, "reference": 1, "reward": 1, "rollout": None}}
    assert c.doc["schedule"]["kind"] == "oppo"
    assert c.doc["schedule"]["inter"]["enabled"] is False          # what variant('oppo-intra') builds
    assert c.doc["schedule"]["intra"]["chunk_tokens"] == 16         # applied after, whatever the order


def test_set_block_and_steps_apply_to_every_configuration(tmp_path):
    plan = load_plan(write_plan(tmp_path, {"seed": [0, 1]}, set={"workload.prompts_per_step": 6}, steps=2))
    assert [c.doc["workload"]["prompts_per_step"] for c in plan.configs] == [6, 6]
    assert [c.doc["steps"] for c in plan.configs] == [2, 2]
    assert all(c.doc["warmup_steps"] == 1 for c in plan.configs)
    assert plan.name == "x"  # plan-x.yaml without the leading plan-
    e = plan_error(tmp_path, {"seed": [0]}, set={"cluster.gpuz": 1})
    assert e.path == "set.cluster.gpuz"


def test_config_id_depends_on_values_not_order():
    a = config_id({"cluster.gpu": "h100", "placement": {"kind": "colocated"}})
    b = config_id({"placement": {"kind": "colocated"}, "cluster.gpu": "h100"})
    assert a == b and len(a) == 12
    assert a != config_id({"cluster.gpu": "h200", "placement": {"kind": "colocated"}})
    assert json.dumps(a)  # a plain string


def test_set_overrides_add_to_the_plans_set(tmp_path):
    """``rlhfsim plan --set PATH=VALUE``: applied to the base before the axes, like the plan's ``set:``."""
    p = write_plan(tmp_path, {"cluster.gpus_per_node": [1, 2]}, set={"steps": 3})
    plan = load_plan(p, overrides=[("workload.prompts_per_step", 6), ("steps", 2)])
    assert {c.doc["workload"]["prompts_per_step"] for c in plan.configs} == {6}
    assert {c.doc["steps"] for c in plan.configs} == {2}
    with pytest.raises(ScenarioError) as e:
        load_plan(p, overrides=[("workload.prompts", 6)])
    assert e.value.path == "set.workload.prompts"

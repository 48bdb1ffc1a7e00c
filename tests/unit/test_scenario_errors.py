"""Bad input: each case is one ScenarioError naming the YAML path, what was expected and what was given."""

from __future__ import annotations

import pytest
import yaml

from rlhfsim.errors import RlhfsimError, ScenarioError
from rlhfsim.scenario import load_scenario


def _set(path: str, value):
    """A mutation that sets a dotted path (list indices as [i]); ``...`` deletes the key."""

    def mutate(d):
        keys = path.replace("[", ".[").split(".")
        node = d
        for k in keys[:-1]:
            node = node[int(k[1:-1])] if k.startswith("[") else node.setdefault(k, {})
        last = keys[-1]
        if value is ...:
            node.pop(last)
        else:
            node[last] = value

    return mutate


POOLS_9_OF_8 = {"kind": "pools", "pools": [
    {"name": "train", "gpus": 4, "roles": ["actor", "critic", "reference"]},
    {"name": "rm", "gpus": 5, "roles": ["reward"]}]}

# (id, mutations, expected YAML path, fragments the message must contain)
CASES = [
    ("unknown-top-key", [_set("speed", "fast")], "speed", ["expected a known key", "'fast'"]),
    ("unknown-nested-key", [_set("models.actor.size", 7)], "models.actor.size", ["expected a known key", "7"]),
    ("unknown-key-in-reward", [_set("models.reward.foo", 1)], "models.reward.foo", ["expected a known key"]),
    ("unknown-key-in-schedule", [_set("schedule", {"kind": "oppo", "intra": {"chunk": 5}})],
     "schedule.intra.chunk", ["expected a known key", "5"]),
    ("wrong-type-int", [_set("workload.prompts_per_step", "many")], "workload.prompts_per_step",
     ["expected an integer", "'many'"]),
    ("wrong-type-fraction", [_set("workload.prompts_per_step", 2.5)], "workload.prompts_per_step",
     ["expected an integer", "2.5"]),
    ("wrong-type-float", [_set("generation.kv_cache_fraction", "half")], "generation.kv_cache_fraction",
     ["expected a number", "'half'"]),
    ("wrong-type-bool", [_set("schedule", {"kind": "oppo", "intra": {"enabled": "maybe"}})],
     "schedule.intra.enabled", ["expected true or false", "'maybe'"]),
    ("wrong-type-mapping", [_set("workload.response_length", "long")], "workload.response_length",
     ["expected a mapping", "'long'"]),
    ("wrong-type-list", [_set("placement", {"kind": "pools", "pools": {"name": "a"}})], "placement.pools",
     ["expected a list"]),
    ("wrong-type-reward-model", [_set("models.reward.model", 5)], "models.reward.model",
     ["expected a string", "5"]),
    ("range-fraction", [_set("generation.kv_cache_fraction", 1.5)], "generation.kv_cache_fraction",
     ["expected a number <= 1", "1.5"]),
    ("range-negative", [_set("workload.prompts_per_step", -3)], "workload.prompts_per_step",
     ["expected a number >= 1", "-3"]),
    ("range-zero-std", [_set("workload.response_length", {"kind": "normal", "mean": 0, "std": 1})],
     "workload.response_length.mean", ["expected a number > 0", "0"]),
    ("range-nan", [_set("workload.response_length.median", float("nan"))], "workload.response_length.median",
     ["expected a finite number", "nan"]),
    ("range-delta", [_set("schedule", {"kind": "oppo", "inter": {"delta": -1}})], "schedule.inter.delta",
     ["expected a number >= 0", "-1"]),
    ("range-pool-gpus", [_set("placement", {"kind": "pools", "pools": [{"name": "a", "gpus": 0, "roles": ["actor"]}]})],
     "placement.pools[0].gpus", ["expected a number >= 1", "0"]),
    ("lognormal-p99", [_set("workload.response_length", {"kind": "lognormal", "median": 300, "p99": 100})],
     "workload.response_length", ["expected p99 > median", "p99=100"]),
    ("missing", [_set("workload.response_length", ...)], "workload.response_length", ["expected a value", "nothing"]),
    ("missing-pools", [_set("placement", {"kind": "pools"})], "placement.pools", ["expected a value"]),
    ("missing-token-budget", [_set("schedule", {"kind": "partial"})], "schedule.token_budget", ["expected a value"]),
    ("kind-unknown", [_set("schedule", {"kind": "fastest"})], "schedule.kind",
     ["expected kind one of", "'sync'", "'fastest'"]),
    ("kind-missing", [_set("workload.response_length", {"median": 3})], "workload.response_length",
     ["expected a mapping with a `kind:` key"]),
    ("literal", [_set("models.actor.dtype", "int4")], "models.actor.dtype", ["expected one of", "'int4'"]),
    ("role-literal", [_set("placement", {"kind": "pools", "pools": [
        {"name": "a", "gpus": 4, "roles": ["actor", "critic", "reference", "reward", "judge"]}]})],
     "placement.pools[0].roles[4]", ["expected one of", "'judge'"]),
    ("empty-list", [_set("placement", {"kind": "pools", "pools": []})], "placement.pools",
     ["expected at least 1 item", "[]"]),
    ("tp-in-pools", [_set("placement", {"kind": "pools", "pools": [
        {"name": "a", "gpus": 4, "roles": ["actor", "critic", "reference", "reward"]}], "tp": {"actor": 0}})],
     "placement.tp.actor", ["expected a number >= 1", "0"]),
    ("model-unknown", [_set("models.actor.model", "gpt-5")], "models.actor.model",
     ["expected a catalog model", "qwen2.5-7b", "'gpt-5'"]),
    ("gpu-unknown", [_set("cluster.gpu", "tpu-v5")], "cluster.gpu", ["expected one of", "h200", "'tpu-v5'"]),
    ("model-too-big", [_set("models.actor.model", "qwen2.5-72b"), _set("cluster.gpu", "a100-40gb")],
     "placement.tp.actor", ["need", "GiB per GPU", "KV", "a100-40gb has 40.0 GiB", "raise the TP degree"]),
    ("model-too-big-reward", [_set("models.reward.model", "qwen2.5-72b")], "placement.tp.reward",
     ["pool 'reward'", "a100-80gb has 80.0 GiB"]),
    ("kv-does-not-fit", [_set("models.actor.model", "qwen2.5-14b"), _set("models.critic.model", "qwen2.5-0.5b"),
                         _set("models.reference.model", "qwen2.5-0.5b"),
                         _set("cluster", {"gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 8}),
                         _set("placement", {"kind": "dedicated_reward", "reward_gpus": 1, "tp": {"actor": 1}}),
                         _set("workload.max_response_tokens", 2_000_000)],
     "placement.tp.actor", ["KV for one", "2000512-token sequence"]),
    ("gpus-over-placed", [_set("cluster.gpus_per_node", 8), _set("placement", POOLS_9_OF_8)],
     "placement.pools[1].gpus", ["9 GPUs placed but the cluster has 8"]),
    ("reward-gpus", [_set("placement.reward_gpus", 4)], "placement.reward_gpus",
     ["expected fewer than the cluster's 4 GPUs", "4"]),
    ("tp-not-dividing", [_set("placement.tp", {"actor": 2})], "placement.tp.actor",
     ["expected a TP degree dividing the 3 GPUs of pool 'actor'", "got 2"]),
    ("tp-across-nodes", [_set("cluster", {"gpu": "a100-80gb", "nodes": 2, "gpus_per_node": 2}),
                         _set("placement.tp", {"actor": 3})], "placement.tp.actor", ["within one NVLink domain", "got 3"]),
    ("role-unplaced", [_set("placement", {"kind": "pools", "pools": [
        {"name": "a", "gpus": 4, "roles": ["actor", "critic", "reference"]}]})], "placement",
     ["every role placed", "'reward'"]),
    ("role-twice", [_set("placement", {"kind": "pools", "pools": [
        {"name": "a", "gpus": 2, "roles": ["actor", "critic", "reference", "reward"]},
        {"name": "b", "gpus": 2, "roles": ["reward"]}]})], "placement.pools[1].roles[0]", ["one pool", "'reward'"]),
    ("role-without-model", [_set("models.critic", ...), _set("placement", {"kind": "pools", "pools": [
        {"name": "a", "gpus": 4, "roles": ["actor", "critic", "reference", "reward"]}]})],
     "placement.pools[0].roles[1]", ["expected a role with a model", "'critic'"]),
    ("dedicated-with-rule", [_set("models.reward", {"kind": "rule"})], "placement.kind", ["expected a reward model"]),
    ("grpo-with-critic", [_set("algorithm", {"kind": "grpo", "group_size": 4})], "models.critic",
     ["expected no critic"]),
    ("minibatch", [_set("algorithm.minibatch_size", 64)], "algorithm.minibatch_size",
     ["at most the 16 rollouts", "64"]),
    ("warmup", [_set("warmup_steps", 4)], "warmup_steps", ["fewer warm-up steps than steps (4)", "4"]),
    ("replicas", [_set("generation.replicas", 5)], "generation.replicas", ["at most 3 replicas", "5"]),
    ("adaptive-bounds", [_set("schedule", {"kind": "oppo", "inter": {"adaptive": {"min": 9, "max": 4}}})],
     "schedule.inter.adaptive.min", ["min <= max (4)", "9"]),
    ("encoder-actor", [_set("models.actor.model", "deberta-v3-large")], "models.actor.model",
     ["expected a decoder", "deberta-v3-large"]),
    ("encoder-incremental", [_set("models.reward", {"model": "deberta-v3-large", "streaming": "incremental"}),
                             _set("workload.max_response_tokens", 256), _set("workload.max_prompt_tokens", 256)],
     "models.reward.streaming", ["expected reencode or final_only", "'deberta-v3-large'", "no causal KV cache",
                                 "got incremental"]),
    ("streaming-name", [_set("models.reward.streaming", "chunked")], "models.reward.streaming",
     ["incremental", "reencode", "final_only", "'chunked'"]),
    ("reward-positions", [_set("models.reward.model", "tiny-qwen2"), _set("workload.max_response_tokens", 4000)],
     "models.reward.model", ["4096 positions hold the longest prompt + response", "'tiny-qwen2'"]),  # a decoder's
    ("compare-name", [_set("compare", ["sync", "turbo"])], "compare[1]", ["expected one of", "'turbo'"]),
    ("mixture-inner", [_set("workload.response_length", {"kind": "mixture", "components": [
        {"weight": 1, "dist": {"kind": "fixed", "value": "x"}}]})],
     "workload.response_length.components[0].dist.value", ["expected an integer", "'x'"]),
    ("lengths-file-missing", [_set("workload.response_length", {"kind": "empirical", "path": "nope.csv"})],
     "workload.response_length.path", ["expected a CSV or JSONL file", "nope.csv", "no such file"]),
    ("mixin-missing", [_set("defaults", ["_nope"])], "defaults[0]", ["expected a mixin file", "'_nope'"]),
    ("mixin-not-underscore", [_set("defaults", ["nope"])], "defaults[0]", ["starting with '_'", "'nope'"]),
    ("mixin-not-a-list", [_set("defaults", {"a": 1})], "defaults", ["expected a list of mixin file names"]),
]


@pytest.mark.parametrize("mutations,path,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_scenario_names_path_expected_and_given(mutations, path, fragments, scenario_dict):
    d = scenario_dict("gpu")
    for m in mutations:
        m(d)
    with pytest.raises(ScenarioError) as ei:
        load_scenario(d)
    e = ei.value
    msg = str(e)
    assert e.path == path, msg
    assert msg.startswith(f"{path}: ") and len(msg) > len(path) + 10, msg
    assert "\n" not in msg
    for frag in fragments:
        assert frag in msg, msg


def test_the_issue_example_verbatim(scenario_dict):
    d = scenario_dict("gpu", {"cluster": {"gpus_per_node": 8}})
    d["placement"] = POOLS_9_OF_8
    with pytest.raises(ScenarioError) as ei:
        load_scenario(d)
    assert str(ei.value) == "placement.pools[1].gpus: 9 GPUs placed but the cluster has 8"


@pytest.mark.parametrize("name,fragments", [
    ("lengths_empty.csv", ["expected at least one length", "empty file"]),
    ("lengths_malformed.csv", ["expected one positive length per line", "'lots'"]),
    ("lengths_zero.csv", ["expected lengths >= 1", "got 0.0"]),
    ("lengths_badkey.jsonl", ["line 2 has none of the keys"]),
    ("lengths_badjson.jsonl", ["expected one positive length per line", "malformed"]),
    ("does_not_exist.csv", ["no such file"]),
])
def test_bad_lengths_files(name, fragments, scenario_dict, fixtures_dir):
    d = scenario_dict("gpu")
    d["workload"]["prompt_length"] = {"kind": "empirical", "path": name}
    with pytest.raises(ScenarioError) as ei:
        load_scenario(d, base_dir=fixtures_dir)
    assert ei.value.path == "workload.prompt_length.path"
    for frag in fragments:
        assert frag in str(ei.value)
    assert "\n" not in str(ei.value)


def test_bad_lengths_file_inside_a_mixture(scenario_dict, fixtures_dir):
    d = scenario_dict("gpu")
    d["workload"]["response_length"] = {"kind": "mixture", "components": [
        {"weight": 1, "dist": {"kind": "fixed", "value": 5}},
        {"weight": 1, "dist": {"kind": "empirical", "path": "lengths_empty.csv"}}]}
    with pytest.raises(ScenarioError) as ei:
        load_scenario(d, base_dir=fixtures_dir)
    assert ei.value.path == "workload.response_length.components[1].dist.path"


def test_yaml_syntax_error(fixtures_dir):
    with pytest.raises(ScenarioError) as ei:
        load_scenario(fixtures_dir / "bad_syntax.yaml")
    msg = str(ei.value)
    assert msg.startswith("bad_syntax.yaml: expected valid YAML, got a syntax error at line 4")
    assert "\n" not in msg


def test_mixin_cycle(fixtures_dir):
    with pytest.raises(ScenarioError, match=r"^defaults\[0\]: expected no cycles, got '_cycle_a' included twice$"):
        load_scenario(fixtures_dir / "cycle.yaml")


@pytest.mark.parametrize("text,fragment", [
    ("- a\n- b\n", "expected a mapping at the top level, got list"),
    ("just a string\n", "expected a mapping at the top level, got str"),
    ("", "models: expected a value"),
])
def test_not_a_mapping(tmp_path, text, fragment):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    with pytest.raises(ScenarioError, match=fragment):
        load_scenario(p)


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(ScenarioError, match=r"expected a YAML file, got .*nope\.yaml.*no such file"):
        load_scenario(tmp_path / "nope.yaml")
    p = tmp_path / "binary.yaml"
    p.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(ScenarioError, match="expected a UTF-8 text YAML file"):
        load_scenario(p)


def test_non_json_mapping_is_a_clean_error(scenario_dict):
    d = scenario_dict("gpu")
    d["name"] = {1, 2}
    with pytest.raises(ScenarioError, match="expected a mapping of YAML/JSON values"):
        load_scenario(d)


def test_bad_local_hf_config(tmp_path, scenario_dict):
    (tmp_path / "cfg.json").write_text('{"hidden_size": 8}')
    d = scenario_dict("gpu")
    d["models"]["reward"]["model"] = str(tmp_path / "cfg.json")
    with pytest.raises(ScenarioError) as ei:
        load_scenario(d)
    assert ei.value.path == "models.reward.model" and "num_attention_heads" in str(ei.value)


def test_every_error_is_an_rlhfsim_error():
    assert issubclass(ScenarioError, RlhfsimError)
    e = ScenarioError("a.b", "expected x, got y")
    assert str(e) == "a.b: expected x, got y" and e.path == "a.b"
    assert str(ScenarioError("", "whole message")) == "whole message"


def test_yaml_round_trip_of_cases_gives_the_same_errors(tmp_path, scenario_dict):
    # What a user writes in a file gets the same message as the mapping.
    d = scenario_dict("gpu")
    d["workload"]["prompts_per_step"] = "many"
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(ScenarioError) as ei:
        load_scenario(p)
    assert str(ei.value) == "workload.prompts_per_step: expected an integer, got 'many'"

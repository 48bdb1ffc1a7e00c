"""A plan's parallelism search (rlhfsim.plan.search): the plan-file syntax and its errors, what is not buildable, the
memory pruning, and the fast path's exactness against the full simulation (rlhfsim.plan.fastpath)."""

from __future__ import annotations

import copy
import random

import pytest
import yaml

from rlhfsim.costs.model import CostModel
from rlhfsim.errors import ScenarioError
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import load_model
from rlhfsim.plan import load_plan, run_plan
from rlhfsim.plan import fastpath as fp
from rlhfsim.plan import memory as mem
from rlhfsim.plan.search import layout_problem
from rlhfsim.scenario.checks import build_setup
from rlhfsim.sim.run import simulate

BASE = {
    "name": "moe-small",
    "models": {"actor": {"model": "qwen3-30b-a3b"}, "reference": {"model": "qwen3-30b-a3b"}, "reward": {"kind": "rule"}},
    "cluster": {"gpu": "h100-sxm", "nodes": 2, "gpus_per_node": 8},
    "placement": {"kind": "colocated", "tp": {"actor": 1, "reference": 1, "rollout": 2}},
    "algorithm": {"kind": "grpo", "group_size": 4, "minibatch_size": 16},
    "workload": {"prompts_per_step": 8, "prompt_length": {"kind": "normal", "mean": 128, "std": 32},
                 "response_length": {"kind": "lognormal", "median": 300, "p99": 900},
                 "max_prompt_tokens": 256, "max_response_tokens": 1024},
    "generation": {"engine": "continuous", "runtime": "vllm", "max_batch": 64},
    "schedule": {"kind": "sync"},
    "steps": 3, "warmup_steps": 1, "seed": 0,
    "execution": {"old_log_prob": True,
                  "micro_batch": {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 2048,
                                  "use_remove_padding": True},
                  "megatron": {"actor": {"ep": 8}, "reference": {"ep": 8}},
                  "weight_sync": {"kind": "reshard"}},
}
SEARCH = {"actor": {"tp": [1, 2], "pp": [1, 2], "vpp": [1, 2], "cp": [1, 2], "ep": [1, 4, 8]},
          "rollout": {"tp": [1, 2]}}


def write(tmp_path, search, base=BASE, **extra):
    p = tmp_path / "plan-s.yaml"
    p.write_text(yaml.safe_dump({"base": base, "search": {"parallelism": search}, **extra}, sort_keys=False))
    return p


def error(tmp_path, search, **extra) -> ScenarioError:
    with pytest.raises(ScenarioError) as e:
        load_plan(write(tmp_path, search, **extra))
    return e.value


def test_search_expands_buildable_layouts_with_the_base_first(tmp_path):
    plan = load_plan(write(tmp_path, SEARCH))
    assert plan.configs[0].base and plan.configs[0].values["actor.ep"] == 8 and plan.configs[0].values["pools"] == "base"
    assert list(plan.axes) == ["actor.tp", "actor.pp", "actor.vpp", "actor.cp", "actor.ep", "rollout.tp", "pools"]
    for c in plan.configs[1:]:
        v = c.values
        assert 16 % (v["actor.tp"] * v["actor.pp"] * v["actor.cp"]) == 0
        assert not (v["actor.vpp"] > 1 and v["actor.pp"] == 1)
        if c.scenario is not None:   # the reference follows the actor (reference: actor, the default)
            assert c.scenario.execution.megatron.reference == c.scenario.execution.megatron.actor
    # vpp 2 without pp is not a configuration, counted by reason
    assert any("vpp > 1 without pipeline stages" in k for k in plan.search.excluded)
    # a candidate's scenario (copied from the base with updates) is what validating its mapping gives
    from rlhfsim.scenario.loader import load_scenario

    for c in [c for c in plan.configs if c.scenario is not None][::7]:
        doc = c.scenario.model_dump(mode="json")
        assert load_scenario(doc, check=False).model_dump(mode="json") == doc
    assert len(plan.configs) == 1 + sum(1 for _ in plan.configs[1:])


@pytest.mark.parametrize("search, where, what", [
    ({"actor": {"tp": [1, 1]}}, "search.parallelism.actor.tp", "distinct"),
    ({"actor": {"tp": []}}, "search.parallelism.actor.tp", "at least 1"),
    ({"actor": {"pp": [0]}}, "search.parallelism.actor.pp[0]", "> 0"),
    ({"actor": {"tq": [1]}}, "search.parallelism.actor.tq", "unknown key"),
    ({"critic": "actor"}, "search.parallelism.critic", "no critic"),
    ({"pools": [{"generation_gpus": 16}]}, "search.parallelism.pools[0].generation_gpus", "fewer than the cluster's 16"),
    ({"pools": [{"generation_gpus": 8, "schedule": {"kind": "nope"}}]}, "search.parallelism.pools[0].schedule", ""),
])
def test_search_errors_name_the_field(tmp_path, search, where, what):
    e = error(tmp_path, search)
    assert e.path.startswith(where) and what in e.message, (e.path, e.message)


def test_dense_model_refuses_ep_and_axes_with_search(tmp_path):
    dense = copy.deepcopy(BASE)
    dense["models"] = {"actor": {"model": "qwen2.5-1.5b"}, "reference": {"model": "qwen2.5-1.5b"}, "reward": {"kind": "rule"}}
    dense["execution"]["megatron"] = {}
    with pytest.raises(ScenarioError) as e:
        load_plan(write(tmp_path, {"actor": {"ep": [1, 2]}}, base=dense))
    assert e.value.path == "search.parallelism.actor.ep" and "dense" in e.value.message
    e = error(tmp_path, SEARCH, axes={"seed": [0, 1]})
    assert e.path == "axes" and "not both" in e.message
    e = error(tmp_path, SEARCH, objective="min_gpus", max_step_time_s=10)
    assert e.path == "objective"


def test_layout_problem_names_megatron_constraints():
    m = load_model("qwen3-30b-a3b", "m", None)
    assert layout_problem(m, (1, 1, 1, 1, 8), 16, 8) is None
    assert layout_problem(m, (16, 1, 1, 1, 1), 16, 8) == "TP beyond one NVLink domain"
    assert layout_problem(m, (1, 5, 1, 1, 1), 20, 8) == "pp x vpp does not divide the layers"
    assert layout_problem(m, (1, 1, 1, 1, 3), 12, 8) == "ep does not divide the experts"
    assert layout_problem(m, (4, 2, 1, 1, 4), 16, 8) == "ep does not divide dp x cp"
    assert layout_problem(m, (1, 1, 1, 1, 1), 12, 8) is None


def test_memory_estimate_by_hand_and_pruning(tmp_path):
    m = load_model("qwen3-30b-a3b", "m", None)
    lay = mem.RankLayout(tp=1, pp=1, vpp=1, cp=1, ep=8, pool_gpus=32)
    routed = m.moe_layers * m.num_experts * m.expert_params
    shard = (m.params() - routed) + routed / 8
    est = mem.training_rank(m, "bfloat16", lay, 4096, checkpointing=False)
    assert est.weights == pytest.approx(2 * shard) and est.grads == pytest.approx(2 * shard)
    assert est.optimizer == pytest.approx(12 * m.params() / 32)
    per_layer = 17 * m.hidden + 6 * (m.experts_per_token * m.moe_intermediate)
    assert est.activations == pytest.approx(4096 * m.layers * per_layer)
    ckpt = mem.training_rank(m, "bfloat16", lay, 4096, checkpointing=True)
    assert ckpt.activations < est.activations / 10
    # one GPU per expert group of 1 holds every expert: pruned with its estimate named
    plan = load_plan(write(tmp_path, {"actor": {"tp": [1], "ep": [1, 8]}}))
    pruned = [c for c in plan.configs if c.reason.startswith("memory:")]
    assert pruned and all(c.values["actor.ep"] == 1 for c in pruned)
    assert "GiB" in pruned[0].reason and "optimizer" in pruned[0].reason


def test_fast_path_equals_the_full_simulation(tmp_path):
    """Sampled priced rows' step and phases against simulate() of the same scenario, to 1e-9 relative: colocated and
    on a split pool (synchronous)."""
    plan = load_plan(write(tmp_path, {**SEARCH, "pools": ["colocated", {"generation_gpus": 8, "schedule": {"kind": "sync"}}]}))
    o = run_plan(plan, out=tmp_path / "out", workers=1, uncertainty=False)
    priced = [(c, r) for c, r in zip(plan.configs, o.rows) if r["method"] == fp.FAST]
    assert len(priced) >= 8
    cost = CostModel(get_gpu("h100-sxm"), plan.profiles["h100-sxm"])
    split = [cr for cr in priced if cr[1]["pools"] == "split 8 gen"]
    assert split
    for c, r in random.Random(1).sample(priced, 6) + [priced[0], split[0]]:
        full = simulate(c.scenario, cost=cost).summary
        assert r["step_time_s"] == pytest.approx(full["step_time_s"], rel=1e-9)
        for ph, v in full["phases_s"].items():
            assert r[f"{ph}_s"] == pytest.approx(v, rel=1e-9, abs=1e-12), ph
    assert o.compare is not None and o.compare["base_step_s"] == pytest.approx(o.rows[0]["step_time_s"], rel=1e-9)


def test_padded_training_and_async_fall_back(tmp_path):
    """Padded pieces (no micro_batch) take the fast path exactly; an async split is simulated in full, and says so."""
    base = copy.deepcopy(BASE)
    base["execution"]["micro_batch"] = {}
    search = {"actor": {"tp": [1, 2], "ep": [8]},
              "pools": ["colocated", {"generation_gpus": 8, "schedule": {"kind": "async", "max_staleness": 1}}]}
    plan = load_plan(write(tmp_path, search, base=base))
    o = run_plan(plan, out=tmp_path / "out", workers=1, uncertainty=False)
    methods = {r["pools"]: r["method"] for r in o.rows if r["feasible"]}
    assert methods["colocated"] == fp.FAST and methods["split 8 gen"] == "simulated"
    cost = CostModel(get_gpu("h100-sxm"), plan.profiles["h100-sxm"])
    c, r = next((c, r) for c, r in zip(plan.configs, o.rows) if r["method"] == fp.FAST)
    assert r["step_time_s"] == pytest.approx(simulate(c.scenario, cost=cost).summary["step_time_s"], rel=1e-9)
    setup = build_setup(c.scenario)
    assert fp.eligible(setup, cost) is None
    text = (tmp_path / "out" / "results.csv").read_text().splitlines()[0]
    assert "method" in text and "base" in text


@pytest.mark.parametrize("plan_id, published", [("N6-H7", (1, 1, 1, 1, 8, 2)), ("N5-H3", (4, 4, 1, 1, 1, 4))])
def test_bundled_plans_search_around_the_published_layout(plan_id, published):
    """The bundled plans load; their first configuration is the published layout (runs.yaml's [TP, CP, EP, PP] and
    the generation TP), feasible, and the search holds other candidates."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scenarios/examples/megatron-field" / f"plan-{plan_id}.yaml"
    plan = load_plan(path)
    first = plan.configs[0]
    v = first.values
    assert first.base and first.scenario is not None and not first.reason
    assert (v["actor.tp"], v["actor.pp"], v["actor.vpp"], v["actor.cp"], v["actor.ep"], v["rollout.tp"]) == published
    assert sum(c.scenario is not None for c in plan.configs) > 50


def test_fast_path_with_a_critic_equals_the_full_simulation(tmp_path):
    """PPO: the critic's forward pass and its training after the actor's on the same pool, padded micro-batches."""
    base = copy.deepcopy(BASE)
    base["models"] = {"actor": {"model": "qwen2.5-0.5b"}, "critic": {"model": "qwen2.5-0.5b"},
                      "reference": {"model": "qwen2.5-0.5b"}, "reward": {"kind": "rule"}}
    base["algorithm"] = {"kind": "ppo", "minibatch_size": 8, "ppo_epochs": 2}
    base["cluster"] = {"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 8}
    base["placement"] = {"kind": "colocated", "tp": {"actor": 1, "critic": 1, "reference": 1, "rollout": 1}}
    base["execution"] = {"old_log_prob": True, "micro_batch": {"ppo_micro_batch_size_per_gpu": 2},
                         "advantage": {"enabled": True}}
    search = {"actor": {"tp": [1, 2], "pp": [1, 2]}, "critic": {"tp": [1, 2]}, "rollout": {"tp": [1, 2]}}
    plan = load_plan(write(tmp_path, search, base=base))
    assert "critic.tp" in plan.axes
    o = run_plan(plan, out=tmp_path / "out", workers=1, uncertainty=False)
    cost = CostModel(get_gpu("h100-sxm"), plan.profiles["h100-sxm"])
    priced = [(c, r) for c, r in zip(plan.configs, o.rows) if r["method"] == fp.FAST]
    assert len(priced) >= 8
    for c, r in random.Random(2).sample(priced, 5):
        full = simulate(c.scenario, cost=cost).summary
        assert r["step_time_s"] == pytest.approx(full["step_time_s"], rel=1e-9)
        assert r["critic_train_s"] == pytest.approx(full["phases_s"]["critic_train"], rel=1e-9)


@pytest.mark.parametrize("variant", ["reward_model", "fsdp_entropy"])
def test_fast_path_with_a_reward_model_or_fsdp_equals_the_full_simulation(tmp_path, variant):
    """A reward model's scoring pass, FSDP's per-call collectives and the entropy head, priced over arrays."""
    base = copy.deepcopy(BASE)
    base["models"] = {"actor": {"model": "qwen2.5-0.5b"}, "reference": {"model": "qwen2.5-0.5b"},
                      "reward": {"model": "qwen2.5-0.5b"} if variant == "reward_model" else {"kind": "rule"}}
    base["execution"]["megatron"] = {}
    if variant == "fsdp_entropy":
        base["execution"].update(sharding="fsdp", entropy=True)
    plan = load_plan(write(tmp_path, {"actor": {"tp": [1, 2]}, "rollout": {"tp": [1, 2]}}, base=base))
    o = run_plan(plan, out=tmp_path / "out", workers=1, uncertainty=False)
    cost = CostModel(get_gpu("h100-sxm"), plan.profiles["h100-sxm"])
    priced = [(c, r) for c, r in zip(plan.configs, o.rows) if r["method"] == fp.FAST]
    assert len(priced) >= 4
    for c, r in priced[:3]:
        assert r["step_time_s"] == pytest.approx(simulate(c.scenario, cost=cost).summary["step_time_s"], rel=1e-9)


def test_refine_simulates_only_the_best_screened(tmp_path):
    """refine K: of the configurations the fast path cannot price (an async split), the K best by the screen are
    simulated in full and the rest listed as screened out, with no step time."""
    search = {"actor": {"tp": [1, 2], "ep": [4, 8]}, "rollout": {"tp": [1, 2]}, "refine": 2,
              "pools": [{"generation_gpus": 8, "schedule": {"kind": "async", "max_staleness": 1}}]}
    plan = load_plan(write(tmp_path, search))
    o = run_plan(plan, out=tmp_path / "out", workers=1, uncertainty=False)
    split = [r for r in o.rows if r["pools"] == "split 8 gen" and r["method"] != "pruned"]
    methods = [r["method"] for r in split]
    assert methods.count("simulated") == 2 and methods.count("screened") == len(split) - 2 > 0
    for r in split:
        if r["method"] == "screened":
            assert not r["feasible"] and r["step_time_s"] is None and "screened out by refine 2" in r["reason"]
    assert error(tmp_path, {**search, "refine": 0}).path == "search.parallelism.refine"


def test_an_uneven_pipeline_with_expert_tensor_parallelism_keeps_its_split_and_is_fully_simulated(tmp_path):
    """The base's uneven stages (first/last stage layers) and etp carried into the search's rows of the same pp (not
    dropped), and such a row fully simulated (the fast path prices pieces at once; an uneven pipeline's call is its
    slowest stage's, chosen per call): its step equals simulate()'s."""
    lay = {"pp": 2, "first_stage_layers": 23, "last_stage_layers": 25, "ep": 4, "etp": 1}
    base = copy.deepcopy(BASE)
    base["placement"]["tp"].update(actor=2, reference=2)
    base["execution"]["megatron"] = {"actor": lay, "reference": lay}
    plan = load_plan(write(tmp_path, {"actor": {"tp": [2], "pp": [2, 4], "ep": [4]}, "rollout": {"tp": [1, 2]}}, base=base))
    o = run_plan(plan, out=tmp_path / "out", workers=1, uncertainty=False)
    rows = list(zip(plan.configs, o.rows))
    same = [(c, r) for c, r in rows if c.scenario.execution.megatron.actor.pp == 2]
    assert same and all(c.scenario.execution.megatron.actor.first_stage_layers == 23
                        and c.scenario.execution.megatron.actor.etp == 1 for c, _ in same)
    assert {r["method"] for _, r in same} == {"simulated"}
    deeper = [(c, r) for c, r in rows if c.scenario.execution.megatron.actor.pp == 4]
    assert deeper and all(c.scenario.execution.megatron.actor.first_stage_layers is None for c, _ in deeper)
    assert {r["method"] for _, r in deeper} == {fp.FAST}
    cost = CostModel(get_gpu("h100-sxm"), plan.profiles["h100-sxm"])
    c, r = same[0]
    assert r["step_time_s"] == pytest.approx(simulate(c.scenario, cost=cost).summary["step_time_s"], rel=1e-12)
    c, r = deeper[0]
    assert r["step_time_s"] == pytest.approx(simulate(c.scenario, cost=cost).summary["step_time_s"], rel=1e-9)


def test_memory_shards_the_experts_over_etp_and_holds_an_uneven_pipelines_largest_stage():
    m = load_model("qwen3-30b-a3b", "m", None)
    routed = m.moe_layers * m.num_experts * m.expert_params
    dense = m.params("lm") - routed
    # etp 1 under tp 4: a GPU holds 1/8 of the experts whole, not 1/32 (Megatron's MoE parallel folding)
    assert mem.shard_params(m, mem.RankLayout(4, 1, 1, 1, 8, 32, etp=1)) == pytest.approx(dense / 4 + routed / 8, rel=1e-12)
    assert mem.shard_params(m, mem.RankLayout(4, 1, 1, 1, 8, 32)) == pytest.approx(dense / 4 + routed / 32, rel=1e-12)
    # 48 layers over pp 2 as 20 + 28: the largest stage's 28/48 of the GPU's share, not half
    even = mem.shard_params(m, mem.RankLayout(1, 1, 1, 1, 8, 32))
    assert mem.shard_params(m, mem.RankLayout(1, 2, 1, 1, 8, 32, first=20, last=28)) == pytest.approx(even * 28 / 48,
                                                                                                      rel=1e-12)

"""`rlhfsim import openrlhf`: Ray actor groups become pools (or one colocated pool), the example launch
simulates, dotted flag names of newer releases read as aliases, and bad input names the flag."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rlhfsim.cli import main
from rlhfsim.importers import ImportError_, ImportOptions
from rlhfsim.importers.openrlhf import import_openrlhf
from rlhfsim.scenario import load_scenario
from rlhfsim.sim.run import simulate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "scenarios" / "examples" / "openrlhf-ppo.sh"
BASE = ("--pretrain Qwen/Qwen2.5-1.5B-Instruct --remote_rm_url http://localhost:5000/get_reward --bf16 "
        "--actor_num_gpus_per_node 4 --ref_num_gpus_per_node 4 --vllm_num_engines 4 --rollout_batch_size 64 "
        "--n_samples_per_prompt 8 --advantage_estimator group_norm --train_batch_size 128 --micro_train_batch_size 4")


def _import(text: str, source: str = "t", **kw):
    return import_openrlhf(text, ImportOptions(**{"gpu": "h100-sxm", **kw}), source)


def test_example_launch_places_one_pool_per_actor_group_and_simulates():
    sc = _import(EXAMPLE.read_text(), str(EXAMPLE.relative_to(ROOT))).scenario
    pools = {p["name"]: (p["gpus"], p["roles"]) for p in sc["placement"]["pools"]}
    assert pools == {"actor": (4, ["actor"]), "reference": (2, ["reference"]), "critic": (4, ["critic"]),
                     "reward": (2, ["reward"]), "vllm": (4, ["rollout"])}
    assert sc["cluster"] == {"gpu": "h100-sxm", "nodes": 2, "gpus_per_node": 8}
    assert sc["algorithm"] == {"kind": "ppo", "group_size": 1, "ppo_epochs": 1, "minibatch_size": 128}
    assert sc["models"]["actor"]["model"] == "llama-3.1-8b" and sc["models"]["reward"]["model"] == "llama-3.1-8b"
    ex = sc["execution"]
    assert ex["micro_batch"] == {"ppo_micro_batch_size_per_gpu": 8, "log_prob_micro_batch_size_per_gpu": 16,
                                 "use_remove_padding": True}
    assert ex["gradient_checkpointing"] and ex["weight_sync"] == {"kind": "copy"}
    assert yaml.safe_load(EXAMPLE.with_suffix(".yaml").read_text()) == sc
    assert simulate(load_scenario(sc), steps=2).summary["step_time_s"] > 0


def test_group_norm_with_a_remote_reward_and_colocated_models():
    res = _import(BASE + " --colocate_all_models --vllm_tensor_parallel_size 2")
    sc = res.scenario
    assert sc["algorithm"]["kind"] == "grpo" and sc["algorithm"]["group_size"] == 8
    assert sc["models"]["reward"] == {"kind": "rule"} and "reference" in sc["models"]
    assert sc["placement"] == {"kind": "colocated", "tp": {"rollout": 2}}
    assert sc["cluster"]["nodes"] == 1 and sc["execution"]["weight_sync"] == {"kind": "reshard"}


def test_colocated_pairs_share_a_pool():
    text = BASE.replace("group_norm", "gae").replace("--n_samples_per_prompt 8", "--n_samples_per_prompt 1") \
        .replace("--train_batch_size 128", "--train_batch_size 32") + \
        " --colocate_actor_ref --reward_pretrain Qwen/Qwen2.5-0.5B-Instruct --critic_num_gpus_per_node 2" \
        " --reward_num_gpus_per_node 2 --colocate_critic_reward"
    text = text.replace("--remote_rm_url http://localhost:5000/get_reward ", "")
    pools = {p["name"]: p["roles"] for p in _import(text).scenario["placement"]["pools"]}
    assert pools == {"actor": ["actor", "reference"], "critic": ["critic", "reward"], "vllm": ["rollout"]}


def test_dotted_flags_of_newer_releases_are_aliases():
    dotted = ("--actor.model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --reward.remote_url http://x --bf16 "
              "--actor.num_gpus_per_node 4 --ref.num_gpus_per_node 4 --vllm.num_engines 4 --rollout.batch_size 64 "
              "--rollout.n_samples_per_prompt 8 --algo.advantage.estimator group_norm --train.batch_size 128 "
              "--train.micro_batch_size 4")
    assert _import(dotted).scenario == _import(BASE).scenario


def test_enforce_eager_selects_vllm_without_cuda_graphs():
    assert _import(BASE).scenario["generation"]["runtime"] == "vllm"
    res = _import(BASE + " --vllm.enforce_eager")
    assert res.scenario["generation"]["runtime"] == "vllm_eager"
    assert {s.key: s.status for s in res.settings}["enforce_eager"] == "mapped"


def test_every_flag_is_accounted_for():
    res = _import(BASE + " --actor_learning_rate 5e-7 --zero_stage 3 --mystery_flag 1")
    assert len(res.settings) == BASE.count("--") + 3
    unmapped = {s.key: s.target for s in res.by_status("unmapped")}
    assert unmapped["mystery_flag"] == "not recognised by the importer" and "zero_stage" not in unmapped
    assert res.scenario["execution"]["sharding"] == "fsdp"  # ZeRO-3: per-call parameter gathers
    assert {s.key for s in res.by_status("no_cost")} == {"actor_learning_rate"}


@pytest.mark.parametrize("extra, message", [
    (" --n_samples_per_prompt two", "--n_samples_per_prompt: expected a whole number >= 1, got 'two'"),
    (" --advantage_estimator magic", "--advantage_estimator: expected one of gae"),
    (" --vllm_num_engines 0", "--vllm_num_engines: expected vLLM engines"),
    (" --train_batch_size 4096", "--train_batch_size: expected at most rollout_batch_size x n_samples_per_prompt (512)"),
])
def test_bad_flags_name_themselves(extra, message):
    with pytest.raises(ImportError_) as e:
        _import(BASE + extra)
    assert str(e.value).startswith(message)


def test_cli_error_is_one_line_and_exit_2():
    res = CliRunner().invoke(main, ["import", "openrlhf", "--gpu", "h100-sxm", "--", "--pretrain", "acme/unknown-13b"])
    assert res.exit_code == 2 and res.stderr.startswith("error: --pretrain: expected a model in the catalog")
    assert res.stderr.count("\n") == 1

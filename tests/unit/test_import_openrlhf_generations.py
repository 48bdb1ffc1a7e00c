"""`rlhfsim import openrlhf` on OpenRLHF's own example launches of both flag generations (tests/data/openrlhf/,
PROVENANCE.md there): the flat flags up to v0.10.1 (--bf16 before v0.9.2, --param_dtype and --max_len after) and the
dotted flags of v0.10.2 on; the same launch in both generations imports to the same scenario, and errors name the
flag as the launch wrote it."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from rlhfsim.cli import main
from rlhfsim.importers import ImportError_, ImportOptions
from rlhfsim.importers.openrlhf import import_openrlhf
from rlhfsim.importers.openrlhf_flags import DOTTED, canonical
from rlhfsim.scenario import load_scenario

DATA = Path(__file__).resolve().parents[1] / "data" / "openrlhf"
OLD = DATA / "e52bc6c5-train_ppo_llama_ray.sh"                      # flat, --bf16 (2024-11)
FLAT_V010 = DATA / "v0.10.1.post2-train_ppo_ray_hybrid_engine.sh"   # flat, --param_dtype, --max_len (2026-04)
DOTTED_HYBRID = DATA / "3c3be623-train_ppo_ray_hybrid_engine.sh"   # dotted (v0.10.2 on)
DOTTED_RFN = DATA / "3c3be623-train_ppo_with_reward_fn.sh"         # dotted, a reward function


def _import(path_or_text, gpu="h100-sxm", **kw):
    text = path_or_text.read_text() if isinstance(path_or_text, Path) else path_or_text
    return import_openrlhf(text, ImportOptions(gpu=gpu, **kw), getattr(path_or_text, "name", "t"))


def test_old_flat_launch_colocates_pairs_and_shards_with_zero3():
    res = _import(OLD)
    sc = res.scenario
    pools = {p["name"]: (p["gpus"], p["roles"]) for p in sc["placement"]["pools"]}
    assert pools == {"actor": (2, ["actor", "reference"]), "critic": (2, ["critic", "reward"]), "vllm": (4, ["rollout"])}
    assert sc["placement"]["tp"] == {"rollout": 2} and sc["cluster"]["nodes"] == 1
    assert {m["dtype"] for m in sc["models"].values() if "dtype" in m} == {"bfloat16"}
    assert (sc["workload"]["max_prompt_tokens"], sc["workload"]["max_response_tokens"]) == (1024, 1024)
    ex = sc["execution"]
    assert ex["sharding"] == "fsdp" and ex["offload"]["actor"]["optimizer"] and ex["offload"]["critic"]["optimizer"]
    assert ex["micro_batch"]["log_prob_micro_batch_size_per_gpu"] == 32
    assert "OpenRLHF launch read by its flat flag names (OpenRLHF up to v0.10.1)" in res.assumptions
    assert any("critic is the reward model's shape" in x for x in res.assumptions)
    load_scenario(sc)


def test_the_same_launch_in_both_generations_imports_alike():
    flat, dotted = _import(FLAT_V010, gpu="h200"), _import(DOTTED_HYBRID, gpu="h200")
    a, b = dict(flat.scenario), dict(dotted.scenario)
    a.pop("description"), b.pop("description")
    assert a == b
    sc = b
    assert sc["placement"] == {"kind": "colocated", "tp": {"rollout": 2}} and sc["models"]["actor"]["dtype"] == "bfloat16"
    assert sc["generation"]["runtime"] == "vllm_eager" and sc["execution"]["weight_sync"] == {"kind": "reshard"}
    assert sc["execution"]["micro_batch"]["ppo_max_token_len_per_gpu"] == 16384
    # --data.max_len 2048 without --rollout.max_new_tokens: halves when no mean prompt length is given
    assert (sc["workload"]["max_prompt_tokens"], sc["workload"]["max_response_tokens"]) == (1024, 1024)
    assert "OpenRLHF launch read by its dotted flag names (OpenRLHF v0.10.2 on)" in dotted.assumptions
    keys = {s.key: s for s in dotted.settings}
    assert keys["vllm_enable_sleep"].status == "unmapped" and "written --vllm.enable_sleep" in keys["vllm_enable_sleep"].target
    assert keys["param_dtype"].status == "mapped" and keys["max_len"].status == "mapped"
    assert len(dotted.settings) == DOTTED_HYBRID.read_text().split("# Enable")[0].count("--")
    load_scenario(sc)


def test_dotted_reward_function_launch_is_ppo_with_a_rule_reward_and_the_actor_as_critic():
    res = _import(DOTTED_RFN)
    sc = res.scenario
    assert sc["models"]["reward"] == {"kind": "rule"} and sc["models"]["critic"]["model"] == "llama-3.1-8b"
    assert sc["algorithm"]["kind"] == "ppo"
    pools = {p["name"]: (p["gpus"], p["roles"]) for p in sc["placement"]["pools"]}
    assert pools == {"actor": (2, ["actor", "reference"]), "critic": (2, ["critic"]), "vllm": (4, ["rollout"])}
    assert any("critic is the actor's model" in x for x in res.assumptions)
    unmapped = {s.key for s in res.by_status("unmapped")}
    assert unmapped == set(), unmapped      # every flag of the example is known
    assert {s.key for s in res.by_status("no_cost")} >= {"actor_learning_rate", "critic_learning_rate", "use_wandb"}


def test_caps_of_max_len_and_max_new_tokens():
    base = DOTTED_RFN.read_text()
    sc = _import(base.replace("--data.max_len 2048", "--data.max_len 4096 --rollout.max_new_tokens 3072")).scenario
    assert (sc["workload"]["max_prompt_tokens"], sc["workload"]["max_response_tokens"]) == (1024, 3072)
    res = _import(base.replace("--data.max_len 2048", "--data.max_len 4096"), mean_prompt_len=200.0)
    w = res.scenario["workload"]
    assert (w["max_prompt_tokens"], w["max_response_tokens"]) == (300, 3796)
    assert any("each response may run to data.max_len=4096 less its prompt" in x for x in res.assumptions)


def test_flat_launch_of_a_later_release_trains_in_bf16_without_the_flag():
    text = OLD.read_text().replace("   --bf16 \\\n", "")
    with pytest.raises(ImportError_) as e:
        _import(text)
    assert str(e.value).startswith("--bf16: expected it set") and "--set param_dtype=bf16" in str(e.value)
    later = text.replace("--generate_max_len 1024", "--generate_max_len 1024 --stop_properly_penalty_coef 0.5")
    res = _import(later)
    assert res.scenario["models"]["actor"]["dtype"] == "bfloat16"
    assert any("appeared in v0.9.2" in x for x in res.assumptions)
    assert _import(text, sets=("param_dtype=fp16",)).scenario["models"]["actor"]["dtype"] == "float16"


@pytest.mark.parametrize("old, new, message", [
    ("--rollout.batch_size 1024", "--rollout.batch_size lots", "--rollout.batch_size: expected a whole number >= 1, got 'lots'"),
    ("--ds.param_dtype bf16", "--ds.param_dtype fp32", "--ds.param_dtype: expected bf16 or fp16, got 'fp32'"),
    ("--data.max_len 2048", "--data.max_len 2048 --rollout.max_new_tokens 4096",
     "--rollout.max_new_tokens: expected fewer tokens than --data.max_len (2048: prompt + response), got 4096"),
    ("--vllm.num_engines 2", "--vllm.num_engines 0", "--vllm.num_engines: expected vLLM engines"),
    ("--algo.kl.init_coef 0.01", "--algo.kl.init_coef 0.01 --algo.advantage.estimator magic",
     "--algo.advantage.estimator: expected one of gae"),
    ("--actor.model_name_or_path OpenRLHF/Llama-3-8b-sft-mixture", "--actor.model_name_or_path acme/unknown-13b",
     "--actor.model_name_or_path: expected a model in the catalog"),
    ("--train.batch_size 128", "--train.batch_size 4096",
     "--train.batch_size: expected at most rollout.batch_size x rollout.n_samples_per_prompt (1024), got 4096"),
])
def test_dotted_errors_name_the_flag_as_written(old, new, message):
    text = DOTTED_RFN.read_text()
    assert old in text
    with pytest.raises(ImportError_) as e:
        _import(text.replace(old, new))
    assert str(e.value).startswith(message)


def test_a_launch_mixing_generations_is_read_with_a_note():
    text = DOTTED_RFN.read_text().replace("--ds.param_dtype bf16", "--bf16")
    res = _import(text)
    assert res.scenario["models"]["actor"]["dtype"] == "bfloat16"
    assert any("mixes the flat --bf16" in x and "--ds.param_dtype bf16" in x for x in res.assumptions)


def test_every_dotted_name_has_one_flat_name():
    assert len(set(DOTTED.values())) == len(DOTTED)
    assert canonical("vllm.enforce_eager") == "enforce_eager" and canonical("pretrain") == "pretrain"


def test_cli_dotted_launch_error_is_one_line_and_exit_2(tmp_path):
    p = tmp_path / "launch.sh"
    p.write_text(DOTTED_RFN.read_text().replace("--rollout.batch_size 1024", "--rollout.batch_size lots"))
    res = CliRunner().invoke(main, ["import", "openrlhf", str(p), "--gpu", "h100-sxm"])
    assert res.exit_code == 2 and res.stderr == "error: --rollout.batch_size: expected a whole number >= 1, got 'lots'\n"


def test_every_openrlhf_field_launch_imports_and_loads():
    import yaml

    field = Path(__file__).resolve().parents[2] / "scenarios" / "examples" / "field"
    docs = [yaml.safe_load(f.read_text()) or {} for f in [field / "runs.yaml", *sorted(field.glob("runs-*.yaml"))]]
    runs = [r for d in docs for r in (d.get("runs") or []) + (d.get("unscored") or [])
            if r.get("framework") == "openrlhf"]
    assert runs
    for run in runs:
        for gpu in [run["gpu"]] if "gpu" in run else run["gpus"]:
            res = _import(field / run["launch"], gpu=gpu, mean_response_len=run.get("mean_response_len"),
                          mean_prompt_len=run.get("mean_prompt_len"), gpus_per_node=run.get("gpus_per_node"))
            assert load_scenario(res.scenario).cluster.gpu == gpu
            assert not [s.key for s in res.settings if s.target.startswith("not recognised")], run["id"]

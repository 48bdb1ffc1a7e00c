"""`rlhfsim import verl`: the example launches become scenarios that simulate, every setting is accounted
for, the mapping round-trips through verl overrides, and bad input is one line naming the setting (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rlhfsim.cli import main
from rlhfsim.importers import ImportError_, ImportOptions, import_verl, render_yaml
from rlhfsim.importers.common import launch_tokens
from rlhfsim.importers.verl_export import export_verl
from rlhfsim.scenario import load_scenario
from rlhfsim.sim.run import simulate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "scenarios" / "examples"
GRPO, PPO = EXAMPLES / "verl-grpo.sh", EXAMPLES / "verl-ppo.sh"
AR = "actor_rollout_ref"


def _import(path: Path, **kw):
    opts = ImportOptions(**{"gpu": "h100-sxm", **kw})
    return import_verl(path.read_text(), opts, str(path.relative_to(ROOT)))


def _overrides(path: Path) -> int:
    return len(launch_tokens(path.read_text(), ("verl.trainer.main_ppo",), "test"))


def test_grpo_launch_maps_to_a_colocated_sync_grpo_scenario_that_simulates():
    res = _import(GRPO, mean_response_len=300)
    sc = res.scenario
    assert sc["algorithm"] == {"kind": "grpo", "group_size": 5, "ppo_epochs": 1, "minibatch_size": 256 * 5}
    assert sc["workload"]["prompts_per_step"] == 1024
    assert (sc["workload"]["max_prompt_tokens"], sc["workload"]["max_response_tokens"]) == (512, 1024)
    assert sc["models"]["actor"]["model"] == "qwen2.5-7b" and sc["models"]["reference"]["model"] == "qwen2.5-7b"
    assert "critic" not in sc["models"] and sc["models"]["reward"] == {"kind": "rule"}
    assert sc["placement"] == {"kind": "colocated", "tp": {"rollout": 2}}
    assert sc["schedule"] == {"kind": "sync"} and sc["cluster"] == {"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 8}
    assert sc["generation"]["engine"] == "continuous" and sc["generation"]["runtime"] == "vllm"
    ex = sc["execution"]
    assert ex["micro_batch"] == {"ppo_micro_batch_size_per_gpu": 16, "log_prob_micro_batch_size_per_gpu": 32,
                                 "use_remove_padding": True, "pad_to": "max_length",
                                 "ref_log_prob_micro_batch_size_per_gpu": 32}
    assert ex["sharding"] == "fsdp" and ex["entropy"] is True
    assert ex["gradient_checkpointing"] and ex["old_log_prob"] and ex["weight_sync"] == {"kind": "reshard", "engine_sleep": True}
    assert ex["offload"]["reference"] == {"param": True} and not ex["offload"]["actor"]["optimizer"]
    assert ex["ulysses_sequence_parallel_size"] == 1
    summary = simulate(load_scenario(sc), steps=2).summary
    assert summary["step_time_s"] > 0 and "old_log_prob" in summary["phases_s"]


def test_ppo_launch_maps_critic_and_reference_from_the_kl_penalty():
    sc = _import(PPO, gpu="a100-80gb").scenario
    assert sc["algorithm"]["kind"] == "ppo" and sc["algorithm"]["group_size"] == 1
    assert sc["algorithm"]["minibatch_size"] == 64
    assert sc["models"]["critic"]["model"] == "qwen2.5-0.5b"
    assert "reference" in sc["models"]  # algorithm.use_kl_in_reward=True
    assert sc["placement"]["tp"] == {"rollout": 1}
    assert sc["execution"]["offload"]["critic"] == {"param": False, "grad": False, "optimizer": False}
    assert simulate(load_scenario(sc), steps=2).summary["phases_s"]["critic_train"] > 0


@pytest.mark.parametrize("path", [GRPO, PPO], ids=lambda p: p.name)
def test_every_setting_of_the_launch_is_accounted_for(path):
    res = _import(path)
    assert len(res.settings) == _overrides(path)
    assert {s.status for s in res.settings} <= {"mapped", "no_cost", "unmapped"}
    assert all(s.target for s in res.settings)


def test_unmapped_settings_and_assumptions_are_listed_in_the_header():
    res = _import(GRPO, sets=(f"{AR}.rollout.free_cache_engine=True", f"{AR}.ref.ulysses_sequence_parallel_size=2", "foo.bar=1"))
    unmapped = {s.key: s.target for s in res.by_status("unmapped")}
    assert f"{AR}.rollout.free_cache_engine" not in unmapped and res.scenario["execution"]["weight_sync"]["engine_sleep"]
    assert "actor_rollout_ref.actor.ulysses_sequence_parallel_size's is used" in unmapped[f"{AR}.ref.ulysses_sequence_parallel_size"]
    assert unmapped["foo.bar"] == "not recognised by the importer"
    assert "trainer.test_freq" in unmapped
    text = render_yaml(res)
    assert "#   UNMAPPED foo.bar=1: not recognised by the importer" in text
    assert "mean response length 512 tokens (half of data.max_response_length=1024" in text
    assert load_scenario(yaml.safe_load(text)) is not None  # the header is comments only


@pytest.mark.parametrize("path", [GRPO, PPO], ids=lambda p: p.name)
@pytest.mark.parametrize("execution", [True, False])
def test_round_trip_through_verl_overrides(path, execution):
    first = _import(path, mean_response_len=300, mean_prompt_len=100, execution=execution).scenario
    overrides, opts = export_verl(first)
    second = import_verl(" ".join(overrides), opts, str(path.relative_to(ROOT))).scenario
    assert second == first


def test_committed_example_scenarios_match_a_fresh_import():
    for path, gpu in ((GRPO, "h100-sxm"), (PPO, "a100-80gb")):
        committed = yaml.safe_load(path.with_suffix(".yaml").read_text())
        assert committed == _import(path, gpu=gpu).scenario, path.name


def test_yaml_config_reads_like_the_same_overrides(tmp_path):
    cfg = {"algorithm": {"adv_estimator": "grpo"},
           "data": {"train_batch_size": 64, "max_prompt_length": 256, "max_response_length": 512,
                    "train_files": "${oc.env:HOME}/x.parquet"},
           AR: {"model": {"path": "Qwen/Qwen2.5-1.5B-Instruct"}, "rollout": {"n": 4, "name": "vllm"},
                "actor": {"ppo_mini_batch_size": 16, "use_kl_loss": True}},
           "trainer": {"n_gpus_per_node": 4, "nnodes": 1}}
    from_yaml = import_verl(yaml.safe_dump(cfg), ImportOptions(gpu="h100-sxm"), "cfg.yaml", is_yaml=True)
    flat = ("algorithm.adv_estimator=grpo data.train_batch_size=64 data.max_prompt_length=256 "
            f"data.max_response_length=512 {AR}.model.path=Qwen/Qwen2.5-1.5B-Instruct {AR}.rollout.n=4 "
            f"{AR}.rollout.name=vllm {AR}.actor.ppo_mini_batch_size=16 {AR}.actor.use_kl_loss=True "
            "trainer.n_gpus_per_node=4 trainer.nnodes=1")
    from_args = import_verl(flat, ImportOptions(gpu="h100-sxm"), "cfg.yaml")
    assert from_yaml.scenario == from_args.scenario
    assert from_yaml.scenario["models"]["actor"]["model"] == "qwen2.5-1.5b"


def test_shell_script_variables_defaults_and_trailing_arguments():
    text = """#!/bin/bash
export MODEL=Qwen/Qwen2.5-3B-Instruct
N=${N:-8}
# a comment line between
uv run -m verl.trainer.main_ppo algorithm.adv_estimator=grpo \\
    actor_rollout_ref.model.path=$MODEL \\
    actor_rollout_ref.rollout.n=${N} \\
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \\
    trainer.n_gpus_per_node=8 "${@:1}" 2>&1 | tee log.txt
"""
    toks = launch_tokens(text, ("verl.trainer.main_ppo",), "test")
    assert toks == ["algorithm.adv_estimator=grpo", f"{AR}.model.path=Qwen/Qwen2.5-3B-Instruct",
                    f"{AR}.rollout.n=8", f"{AR}.actor.ppo_mini_batch_size=128", "trainer.n_gpus_per_node=8"]
    sc = import_verl(text, ImportOptions(gpu="h200"), "t.sh").scenario
    assert sc["models"]["actor"]["model"] == "qwen2.5-3b" and sc["algorithm"]["group_size"] == 8


@pytest.mark.parametrize("override, message", [
    ("data.train_batch_size=lots", "data.train_batch_size: expected a whole number >= 1, got 'lots'"),
    (f"{AR}.model.path=acme/unknown-13b", f"{AR}.model.path: expected a model in the catalog"),
    (f"{AR}.model.path=$UNSET_PATH", f"{AR}.model.path: expected a value, got the unset shell variable $UNSET_PATH"),
    ("algorithm.adv_estimator=magic", "algorithm.adv_estimator: expected gae, grpo, rloo or another verl estimator"),
    (f"{AR}.rollout.name=tgi", f"{AR}.rollout.name: expected one of vllm, sglang"),
    (f"{AR}.rollout.gpu_memory_utilization=1.5", f"{AR}.rollout.gpu_memory_utilization: expected a fraction in (0, 1]"),
    (f"{AR}.actor.use_kl_loss=maybe", f"{AR}.actor.use_kl_loss: expected True or False, got 'maybe'"),
])
def test_bad_settings_name_themselves(override, message):
    with pytest.raises(ImportError_) as e:
        import_verl(GRPO.read_text(), ImportOptions(gpu="h100-sxm", sets=(override,)), "t")
    assert str(e.value).startswith(message)


def test_ulysses_and_legacy_global_micro_batches():
    sets = (f"{AR}.actor.ulysses_sequence_parallel_size=2", f"{AR}.ref.ulysses_sequence_parallel_size=2",
            f"{AR}.actor.ppo_micro_batch_size=64", f"{AR}.rollout.log_prob_micro_batch_size=128")
    text = GRPO.read_text().replace(f"{AR}.actor.ppo_micro_batch_size_per_gpu=16", "").replace(
        f"{AR}.rollout.log_prob_micro_batch_size_per_gpu=32", "")
    res = import_verl(text, ImportOptions(gpu="h100-sxm", sets=sets), "t")
    ex = res.scenario["execution"]
    assert ex["ulysses_sequence_parallel_size"] == 2
    # verl divides a global size by the data-parallel ranks: 8 GPUs / sp 2 = 4
    assert ex["micro_batch"]["ppo_micro_batch_size_per_gpu"] == 16
    assert ex["micro_batch"]["log_prob_micro_batch_size_per_gpu"] == 32
    # the reference's own per-GPU size is the scenario's ref_log_prob_micro_batch_size_per_gpu
    assert ex["micro_batch"]["ref_log_prob_micro_batch_size_per_gpu"] == 32
    assert {s.key for s in res.by_status("unmapped")} == {"trainer.save_freq", "trainer.test_freq"}
    assert simulate(load_scenario(res.scenario), steps=2).summary["step_time_s"] > 0


def test_scenario_check_failures_name_the_launch_setting():
    with pytest.raises(ImportError_, match=rf"^{AR}.rollout.tensor_model_parallel_size \(scenario placement.tp.rollout\): "
                                           "expected a TP degree dividing the 8 GPUs"):
        import_verl(GRPO.read_text(), ImportOptions(gpu="h100-sxm", sets=(f"{AR}.rollout.tensor_model_parallel_size=3",)), "t")


def test_ppo_with_groups_imports_and_a_missing_model_is_an_error():
    # PPO with several samples per prompt (verl's rollout.n with GAE): a PPO scenario with groups
    sc = import_verl(f"{AR}.model.path=qwen2.5-0.5b {AR}.rollout.n=4 data.train_batch_size=64 "
                     f"{AR}.actor.ppo_mini_batch_size=16 critic.ppo_mini_batch_size=16",
                     ImportOptions(gpu="h100-sxm"), "t").scenario
    assert sc["algorithm"]["kind"] == "ppo" and sc["algorithm"]["group_size"] == 4 and "critic" in sc["models"]
    assert simulate(load_scenario(sc), steps=2).summary["step_time_s"] > 0
    with pytest.raises(ImportError_, match=f"^{AR}.model.path: expected the actor's model, got nothing"):
        import_verl("algorithm.adv_estimator=grpo", ImportOptions(gpu="h100-sxm"), "t")


def test_cli_writes_the_scenario_and_lists_unmapped(tmp_path):
    out = tmp_path / "grpo.yaml"
    res = CliRunner().invoke(main, ["import", "verl", str(GRPO), "--gpu", "h100-sxm", "--mean-response-len", "300",
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "unmapped trainer.test_freq=-1" in res.output
    assert load_scenario(out).workload.prompts_per_step == 1024
    plain = CliRunner().invoke(main, ["import", "verl", str(GRPO), "--gpu", "h100-sxm", "--no-execution"])
    assert plain.exit_code == 0 and "execution:" not in plain.output


def test_cli_out_is_a_directory_and_h_is_help(tmp_path):
    """The CLI's conventions: ``-o/--out DIR`` writes ``DIR/scenario.yaml`` (``--format json``:
    ``DIR/import.json``), a path ending in .yaml/.yml is the file itself; ``-h`` is help."""
    from rlhfsim.contracts import IMPORT_JSON_FILE, IMPORTED_SCENARIO_FILE

    args = ["import", "verl", str(GRPO), "--gpu", "h100-sxm"]
    assert CliRunner().invoke(main, [*args, "--out", str(tmp_path / "run")]).exit_code == 0
    assert load_scenario(tmp_path / "run" / IMPORTED_SCENARIO_FILE).workload.prompts_per_step == 1024
    assert CliRunner().invoke(main, [*args, "-o", str(tmp_path / "run"), "--format", "json"]).exit_code == 0
    assert "scenario" in json.loads((tmp_path / "run" / IMPORT_JSON_FILE).read_text())
    assert CliRunner().invoke(main, [*args, "-o", str(tmp_path / "g.yml")]).exit_code == 0
    assert load_scenario(tmp_path / "g.yml").workload.prompts_per_step == 1024
    res = CliRunner().invoke(main, ["import", "verl", "-h"])
    assert res.exit_code == 0 and "--out" in res.output and "Usage" in res.output


@pytest.mark.parametrize("args, message", [
    (["import", "verl", str(GRPO)], "error: --gpu: expected the GPU the run used"),
    (["import", "verl", str(GRPO), "--gpu", "tpu-v5"], "error: --gpu: expected one of"),
    (["import", "verl", "missing.sh", "--gpu", "h100-sxm"], "error: import verl: expected a launch script or config file"),
    (["import", "verl", f"{AR}.model.path=qwen2.5-0.5b", "data.train_batch_size=0", "--gpu", "h100-sxm"],
     "error: data.train_batch_size: expected a whole number >= 1"),
])
def test_cli_errors_are_one_line_and_exit_2(args, message):
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2
    assert res.stderr.startswith(message) and res.stderr.count("\n") == 1 and "Traceback" not in res.output


def test_every_field_launch_imports_and_loads():
    field = EXAMPLES / "field"
    docs = [yaml.safe_load(f.read_text()) or {} for f in [field / "runs.yaml", *sorted(field.glob("runs-*.yaml"))]]
    verl_runs = [r for d in docs for r in (d.get("runs") or []) + (d.get("unscored") or [])
                 if r.get("framework", "verl") == "verl"]
    assert verl_runs
    for run in verl_runs:
        for gpu in [run["gpu"]] if "gpu" in run else run["gpus"]:
            sets = tuple(run.get("set", ()))
            res = _import(field / run["launch"], gpu=gpu, mean_response_len=run.get("mean_response_len"), sets=sets,
                          verl_version=run.get("verl_version"))
            assert load_scenario(res.scenario, base_dir=field).cluster.gpu == gpu
            launch_keys = {t.partition("=")[0].lstrip("+") for t in launch_tokens((field / run["launch"]).read_text(),
                                                                               ("verl.trainer.main_ppo",), "test")}
            assert len(launch_keys) == _overrides(field / run["launch"]), run["id"]
            # every launch override and every set key is recorded once (a set key overriding the launch's replaces it)
            assert len(res.settings) == len(launch_keys | {s.partition("=")[0] for s in sets}), run["id"]
            if sets:
                got = {s.key: s.value for s in res.settings}
                assert all(got[k] == v for k, _, v in (s.partition("=") for s in sets)), run["id"]


def test_enforce_eager_selects_vllm_without_cuda_graphs_and_older_releases_default_to_it():
    """rollout.enforce_eager=True (vLLM) -> generation.runtime vllm_eager; unset, it takes the default of the
    release given with --verl-version (True before v0.6.0, verl #2956) or today's (False), and says which."""
    eager = _import(GRPO, sets=(f"{AR}.rollout.enforce_eager=True",))
    assert eager.scenario["generation"]["runtime"] == "vllm_eager"
    assert {s.key: s.status for s in eager.settings}[f"{AR}.rollout.enforce_eager"] == "mapped"
    now = _import(GRPO)
    assert now.scenario["generation"]["runtime"] == "vllm"
    assert any("enforce_eager not set: verl's current default False" in x for x in now.assumptions)
    old = _import(GRPO, verl_version="0.2")
    assert old.scenario["generation"]["runtime"] == "vllm_v0_eager"   # verl 0.2 pins vLLM <= 0.6.3: V0 only
    assert any("enforce_eager not set: True, the default of verl 0.2" in x for x in old.assumptions)
    assert _import(GRPO, verl_version="v0.6.1").scenario["generation"]["runtime"] == "vllm"
    assert _import(GRPO, verl_version="0.3.0.post1", sets=(f"{AR}.rollout.enforce_eager=False",)
                   ).scenario["generation"]["runtime"] == "vllm"
    sim_eager = simulate(load_scenario(eager.scenario), steps=2).summary["phases_s"]["generate"]
    sim_graphs = simulate(load_scenario(now.scenario), steps=2).summary["phases_s"]["generate"]
    assert sim_eager > sim_graphs
    with pytest.raises(ImportError_, match=r"--verl-version: expected a release such as 0.4 or v0.5.0, got 'latest'"):
        _import(GRPO, verl_version="latest")
    overrides, opts = export_verl(eager.scenario)
    assert import_verl(" ".join(overrides), opts, eager.source).scenario == eager.scenario

"""What `rlhfsim import verl` sets of the generation engine by verl release and launch: the step budget and chunked
prefill, SGLang's own limits before verl 0.6, max_num_seqs's default by release, the rollout mode's dispatch and
prefix caching, and the KV cache's arithmetic per engine (rlhfsim.importers.verl)."""

from __future__ import annotations

import pytest

from rlhfsim.costs import terms as T
from rlhfsim.importers import ImportError_, ImportOptions, import_verl
from rlhfsim.importers.verl import PROFILE_LOGIT_BYTES, kv_fraction
from rlhfsim.models.catalog import CATALOG, DTYPE_BYTES
from rlhfsim.scenario.checks import build_setup
from rlhfsim.scenario.loader import load_scenario

AR = "actor_rollout_ref"
LAUNCH = (f"python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo data.train_batch_size=64 "
          f"{AR}.model.path=Qwen/Qwen2.5-0.5B-Instruct {AR}.rollout.n=4 {AR}.actor.ppo_mini_batch_size=16 "
          f"trainer.n_gpus_per_node=2 {AR}.rollout.tensor_model_parallel_size=1 ")


def _gen(extra: str = "", version: str | None = None, gpu: str = "h100-sxm") -> tuple[dict, list[str]]:
    res = import_verl(LAUNCH + extra, ImportOptions(gpu=gpu, verl_version=version))
    return res.scenario["generation"], res.assumptions


def test_the_step_budget_and_chunked_prefill_follow_the_engine():
    gen, _ = _gen(f"{AR}.rollout.max_num_batched_tokens=4096 {AR}.rollout.enable_chunked_prefill=False "
                  f"{AR}.rollout.mode=sync", "0.3")
    assert (gen["runtime"], gen["max_num_batched_tokens"], gen["chunked_prefill"]) == ("vllm_eager", 4096, True)  # V1
    gen, _ = _gen(f"{AR}.rollout.enable_chunked_prefill=False {AR}.rollout.mode=sync", "0.2")
    assert (gen["runtime"], gen["max_num_batched_tokens"], gen["chunked_prefill"]) == ("vllm_v0_eager", 8192, False)
    assert load_scenario({**import_verl(LAUNCH, ImportOptions(gpu="h100-sxm")).scenario}) is not None


def test_max_num_seqs_default_by_release():
    assert _gen("", "0.3")[0]["max_batch"] == 1024 and _gen("", "0.8")[0]["max_batch"] == 1024
    assert _gen("", "0.9")[0]["max_batch"] == 256 and _gen()[0]["max_batch"] == 256


def test_sglang_before_verl_0_6_runs_on_its_own_limits():
    gen, a = _gen(f"{AR}.rollout.name=sglang {AR}.rollout.max_num_seqs=64", "0.4")
    assert gen["max_num_batched_tokens"] == 8192 and gen["chunked_prefill"] is False
    # SGLang's max_running_requests from its pool of T tokens: min(max(T / 32768 x 512, 2048), 4096), at most T / 2
    sc = import_verl(LAUNCH + f"{AR}.rollout.name=sglang", ImportOptions(gpu="h100-sxm", verl_version="0.4")).scenario
    tokens = build_setup(load_scenario(sc)).kv_capacity_tokens
    assert gen["max_batch"] == min(min(max(int(tokens / 32768 * 512), 2048), 4096), tokens // 2) >= 2048
    assert any("max_running_requests" in x for x in a)
    assert _gen(f"{AR}.rollout.name=sglang {AR}.rollout.max_num_seqs=64", "0.6")[0]["max_batch"] == 64   # passed since 0.6


@pytest.mark.parametrize("extra, version, dispatch, share", [
    ("", None, "rows", True),                                           # today's default: the async server mode
    ("", "0.5", "prompts", True),                                       # sync before v0.7.0
    (f"{AR}.rollout.mode=async", "0.5", "rows", True),
    (f"{AR}.rollout.enable_prefix_caching=False {AR}.rollout.mode=sync", "0.6", "prompts", False),
    (f"{AR}.rollout.enable_prefix_caching=False {AR}.rollout.mode=sync", "0.4", "prompts", True),   # verl passed True
])
def test_the_rollout_mode_deals_prompts_or_samples_and_prefix_caching_follows_the_release(extra, version, dispatch, share):
    gen, _ = _gen(extra, version)
    assert (gen["dispatch"], gen["prefix_caching"]) == (dispatch, share)


def test_a_bad_rollout_mode_is_one_line():
    with pytest.raises(ImportError_, match=f"{AR}.rollout.mode: expected sync or async, got 'batch'"):
        _gen(f"{AR}.rollout.mode=batch")


def test_kv_fraction_by_engine_by_hand():
    sc = import_verl(LAUNCH + f"{AR}.rollout.gpu_memory_utilization=0.6", ImportOptions(gpu="h100-sxm")).scenario
    probe = {**sc, "generation": {**sc["generation"], "kv_cache_fraction": 1.0}}
    setup = build_setup(load_scenario(probe, check=False))
    m, mem, res = CATALOG["qwen2.5-0.5b"], setup.gpu.mem_bytes, setup.resident_bytes[0]
    w = m.params("lm") * DTYPE_BYTES["bfloat16"]
    peak = sc["generation"]["max_batch"] * m.vocab * PROFILE_LOGIT_BYTES + 8192 * 2 * m.intermediate * 2
    assert kv_fraction(sc, 0.6, [], "vllm") == round((0.6 * mem - w - peak) / (mem - res), 4)
    assert kv_fraction(sc, 0.6, [], "vllm", "0.2") == round(0.6 * (mem - res - w - peak) / (mem - res), 4)
    assert kv_fraction(sc, 0.6, [], "sglang") == round((0.6 * mem - w) / (mem - res), 4)


def test_explain_on_an_imported_launch_names_the_generation_terms(tmp_path):
    """`rlhfsim explain` on a scenario `rlhfsim import verl` wrote, priced with a profile that has the engine's host
    keys, shows them (engine_host), the chunks riding in decode steps (prefill_chunk) and the decode's own terms."""
    import copy
    import json
    from pathlib import Path

    from click.testing import CliRunner

    from rlhfsim.cli import main
    from rlhfsim.costs.profile import load_profile

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "grpo.yaml"
    r = CliRunner().invoke(main, ["import", "verl", str(root / "scenarios" / "examples" / "verl-grpo.sh"), "--gpu",
                                  "h100-sxm", "--set", "data.train_batch_size=256", "--set",
                                  "actor_rollout_ref.actor.ppo_mini_batch_size=16", "-o", str(out)])
    assert r.exit_code == 0, r.output
    prof = copy.deepcopy(load_profile("default"))
    prof["generation"]["vllm"].update({"step_host_s": 1e-3, "step_host_per_seq_s": 30e-6, "step_host_overlap": 0.5})
    (tmp_path / "p.json").write_text(json.dumps(prof))
    r = CliRunner().invoke(main, ["explain", str(out), "--steps", "2", "--profile", str(tmp_path / "p.json")])
    assert r.exit_code == 0, r.output
    generate = next(line for line in r.output.splitlines() if line.startswith("generate"))
    assert T.ENGINE_HOST in generate and T.PREFILL_CHUNK in generate and T.DECODE_KERNELS in generate

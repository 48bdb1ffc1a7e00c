"""``rlhfsim validate``'s decisions before and after the real steps, as a new user meets them (issue 48):
the generation runtime of a scenario that names none, the executor's refusals named by scenario path,
and a result marked inconclusive when the device check read the machine at other rates than the
profile's. Small documents built by hand; no step runs."""

from __future__ import annotations

import pytest

from calibrate.validation.compare import error_block
from calibrate.validation.devcheck import mark_inconclusive
from calibrate.validation.scenario import executor_runtime
from rlhfsim.errors import ScenarioError
from rlhfsim.scenario import load_scenario


def test_a_continuous_scenario_naming_no_runtime_validates_with_the_executors(scenario_dict):
    d = scenario_dict("cpu", {"generation": {"engine": "continuous"}})
    sc = load_scenario(d)
    assert sc.generation.resolved_runtime == "vllm"   # the continuous engine's default, which the executor lacks
    new, note = executor_runtime(sc)
    assert new.generation.runtime == "kv_decoder" and new.generation.engine == "continuous"
    assert "generation.runtime" in note and "kv_decoder" in note and "vllm" in note
    assert new.model_dump(exclude={"generation"}) == sc.model_dump(exclude={"generation"})


@pytest.mark.parametrize("generation", [{"engine": "static"}, {"engine": "continuous", "runtime": "vllm"},
                                        {"engine": "continuous", "runtime": "kv_decoder"}])
def test_a_runnable_or_named_runtime_is_kept(scenario_dict, generation):
    sc = load_scenario(scenario_dict("cpu", {"generation": generation}))
    new, note = executor_runtime(sc)
    assert new is sc and note is None


@pytest.mark.hw   # builds the executor's config (calibrate.executor imports torch)
def test_hf_generate_with_keep_kv_is_refused_by_scenario_path(scenario_dict):
    from calibrate.validation.scenario import exec_config
    from rlhfsim.scenario import build_setup

    d = scenario_dict("cpu", {"generation": {"engine": "static", "runtime": "hf_generate"}})
    d["schedule"] = {"kind": "oppo", "intra": {"enabled": False}, "inter": {"delta": 2, "keep_kv": True}}
    sc = load_scenario(d)
    with pytest.raises(ScenarioError) as e:
        exec_config(sc, build_setup(sc), "cpu", sc.steps, [], 1)
    text = str(e.value)
    assert text.startswith("schedule.inter.keep_kv:"), text
    assert "generation.runtime 'hf_generate'" in text and "ExecConfig" not in text and "gen_runtime" not in text


def _row(name: str, error: float, ratios: dict | None = None) -> dict:
    row = {"name": name, "error_pct": error, "phases": {}}
    if ratios is not None:
        row["device_ratios"] = ratios
    return row


def _check(ref: str, ratios: dict, same: bool | None = True) -> dict:
    return {"ref": ref, "profile": ref, "profile_cpu_model": "A", "local_cpu_model": "A" if same else "B",
            "same_cpu_model": same, "ratios": ratios, "warnings": []}


def test_a_slow_machine_marks_the_result_inconclusive_in_the_json():
    """The issue's case: the run read memory at 0.57-0.84x the cached calibration's rates."""
    slow = {"gemv_2mib_bytes_s": 0.84, "gemv_8mib_bytes_s": 0.57, "gemm_flop_s": 0.97}
    doc = {"device": "cpu", **error_block([_row("a", -23.0), _row("b", 4.0)]), "other_profiles": [],
           "device_check": {"profiles": [_check("quick.json", slow)], "probes": [], "warnings": []}}
    doc["profile"] = "quick"
    mark_inconclusive(doc, [["quick.json", "quick.json"]], 0.15)
    a, b = doc["scenarios"]
    assert a["conclusive"] is False and b["conclusive"] is False
    assert "gemv_8mib_bytes_s x0.57" in a["inconclusive_reason"] and "gemm" not in a["inconclusive_reason"]
    assert doc["inconclusive_scenarios"] == 2 and doc["median_abs_error_pct_conclusive"] is None


def test_each_scenario_is_judged_by_its_own_probes_and_profile():
    doc = {"device": "cpu", **error_block([_row("a", -23.0, {"gemv_8mib_bytes_s": 0.6}),
                                           _row("b", 4.0, {"gemv_8mib_bytes_s": 1.05})]),
           "profile": "quick", "other_profiles": [{"profile": "cpu", **error_block([_row("a", 12.0), _row("b", -8.0)])}],
           "device_check": {"profiles": [_check("q.json", {"gemv_8mib_bytes_s": 0.8}),
                                         _check("cpu", {"gemv_8mib_bytes_s": 1.1}, same=False)],
                            "probes": [], "warnings": []}}
    mark_inconclusive(doc, [["q.json", "q.json"], ["cpu", "cpu"]], 0.15)
    assert [s["conclusive"] for s in doc["scenarios"]] == [False, True]   # their own ratios, not the run's 0.8
    assert doc["median_abs_error_pct_conclusive"] == 4.0 and doc["median_abs_error_pct"] == pytest.approx(13.5)
    other = doc["other_profiles"][0]
    assert [s["conclusive"] for s in other["scenarios"]] == [False, False]   # another CPU model
    assert "this machine is 'B'" in other["scenarios"][1]["inconclusive_reason"]


def test_the_table_says_inconclusive(capsys):
    from calibrate.validation.tables import print_table

    row = {**_row("a", -23.0), "steps": 3, "warmup_steps": 1, "profile": "quick", "measured_step_time_s": 1.0,
           "predicted_step_time_s": 0.77, "predicted_step_time_s_interval": [0.7, 0.8], "interval_level": 0.9,
           "interval_source": "x", "inside_interval": False}
    doc = {**error_block([row]), "profile": "quick", "other_profiles": [],
           "device_check": {"profiles": [_check("q", {"gemv_8mib_bytes_s": 0.57})], "probes": [], "warnings": []}}
    mark_inconclusive(doc, [["q"]], 0.15)
    print_table(doc)
    out = " ".join(capsys.readouterr().out.split())
    assert "inconclusive" in out and "x0.57" in out and "1 inconclusive" in out


@pytest.mark.hw   # builds the executor's config (calibrate.executor imports torch)
def test_a_truncating_reward_model_is_refused_for_validation_only(scenario_dict):
    """The simulator prices an ELECTRA's rows truncated to its 512 positions; the executor scores rows
    whole, so validation says which cap to lower instead of failing inside the executor."""
    from calibrate.validation.scenario import exec_config
    from rlhfsim.scenario import build_setup

    d = scenario_dict("cpu", {"models": {"reward": {"model": "tiny-electra", "dtype": "float32"}},
                              "workload": {"max_prompt_tokens": 256, "max_response_tokens": 512}})
    sc = load_scenario(d)
    setup = build_setup(sc)
    assert setup.reward_max_tokens == 512
    with pytest.raises(ScenarioError, match=r"^workload.max_response_tokens: .*512 positions.*got 256 \+ 512"):
        exec_config(sc, setup, "cpu", sc.steps, [], 1)


@pytest.mark.hw   # builds the executor's config (calibrate.executor imports torch)
def test_validate_prepares_a_continuous_scenario_naming_no_runtime(tmp_path, capsys):
    """`validate` on a copy of scenarios/validate/sync-continuous.yaml without its runtime line: the
    executor and the simulator both take kv_decoder, and stderr says so (it was refused: vllm)."""
    import shutil
    from pathlib import Path

    from calibrate.validation.scenario import prepare

    src = Path(__file__).resolve().parents[2] / "scenarios" / "validate"
    shutil.copy(src / "_cpu_small.yaml", tmp_path / "_cpu_small.yaml")
    text = (src / "sync-continuous.yaml").read_text().replace(", runtime: kv_decoder", "")
    assert "runtime" not in text
    (tmp_path / "s.yaml").write_text(text)
    sc, setup, cfg, _ = prepare(tmp_path / "s.yaml", "cpu", 2, 1)
    assert sc.generation.runtime == "kv_decoder" and cfg.gen_runtime == "kv_decoder" and cfg.engine == "continuous"
    assert "validating with kv_decoder" in " ".join(capsys.readouterr().err.split())

"""Generated validation scenarios (``rlhfsim.validate_gen``): a seed names one set, every drawn scenario
loads, the executor accepts it, its predicted run stays within the bound, and the ranges are covered."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfsim.models.catalog import CATALOG
from rlhfsim.scenario import load_scenario
from rlhfsim.validate_gen import RANGES, draw, estimate_run_s, write_set


def test_same_seed_same_set_and_scenario_i_does_not_depend_on_n(tmp_path):
    a = draw(4, 11, tmp_path / "a")
    b = draw(4, 11, tmp_path / "b")
    c = draw(2, 11, tmp_path / "c")
    assert a.scenarios == b.scenarios and a.configs == b.configs and a.redraws == b.redraws
    assert c.scenarios == a.scenarios[:2]
    assert draw(4, 12, tmp_path / "d").scenarios != a.scenarios


def test_written_set_loads_and_records_seed_ranges_and_files(tmp_path):
    d = draw(3, 5, tmp_path)
    paths = write_set(d, tmp_path)
    meta = json.loads((tmp_path / "generated.json").read_text())
    assert meta["seed"] == 5 and meta["n"] == 3 and meta["ranges"] == json.loads(json.dumps(RANGES))
    assert meta["scenarios"] == [p.name for p in paths] and meta["redraws"] == d.redraw_count
    assert "--generate 3 --seed 5" in meta["rerun"]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "models").glob("*.json")) == meta["models"]
    for p in paths:
        sc = load_scenario(p)   # the YAML on disk, models resolved relative to it
        assert sc.cluster.gpu == "cpu" and sc.name == p.stem


def _check(doc: dict, base: Path, ranges: dict) -> None:
    sc = load_scenario(doc, base_dir=base)
    m = sc.models
    actor = _shape(base, m.actor.model)
    assert _shape(base, m.reference.model) == actor
    lo, hi = ranges["layers"]["range"]
    assert lo <= actor.layers <= hi and actor.hidden in ranges["hidden"]["choices"]
    assert actor.vocab in ranges["vocab"]["choices"] and actor.heads % actor.kv_heads == 0
    assert actor.hidden // actor.heads in ranges["head_dim"]["choices"]
    if m.reward.kind == "model":
        reward = _shape(base, m.reward.model)
        assert reward.vocab >= actor.vocab   # the reward model reads the actor's token ids
        if reward.arch == "encoder":
            assert not (sc.schedule.kind == "oppo" and sc.schedule.intra.enabled)
            assert sc.workload.max_prompt_tokens + sc.workload.max_response_tokens <= reward.max_positions
    elif sc.schedule.kind == "oppo":
        assert not sc.schedule.intra.enabled   # nothing to stream to
    if m.critic is not None:
        assert _shape(base, m.critic.model).vocab >= actor.vocab
    if sc.generation.runtime == "hf_generate":
        assert sc.generation.engine == "static"
        assert not (sc.schedule.kind == "oppo" and sc.schedule.inter.enabled and sc.schedule.inter.keep_kv)
    r = sc.workload.prompts_per_step * sc.algorithm.group_size
    lo, hi = ranges["rollouts_per_step"]["range"]
    assert lo <= r <= hi and sc.algorithm.minibatch_size <= r
    assert estimate_run_s(sc) <= ranges["max_run_s"]["value"]


def _shape(base: Path, ref: str):
    from rlhfsim.models.catalog import load_model

    shape = load_model(ref, base_dir=base)
    assert shape.name not in CATALOG   # drawn, not a catalog shape under another name
    return shape


@settings(max_examples=12)
@given(seed=st.integers(min_value=0, max_value=2**40))
def test_every_draw_loads_fits_the_ranges_and_the_run_time_bound(seed):
    with tempfile.TemporaryDirectory() as t:
        d = draw(3, seed, Path(t))
        assert len(d.scenarios) == 3 and all(e <= RANGES["max_run_s"]["value"] for e in d.estimated_run_s)
        for doc in d.scenarios:
            _check(doc, Path(t), RANGES)


@pytest.mark.hw
def test_the_executor_accepts_every_drawn_scenario(tmp_path):
    pytest.importorskip("torch")
    from calibrate.executor.config import validate as exec_validate
    from calibrate.validation.scenario import prepare

    for seed in (1, 2):
        d = tmp_path / str(seed)
        for p in write_set(draw(4, seed, d), d):
            _, _, cfg, _ = prepare(p, "cpu", None, 1)
            exec_validate(cfg)


def test_draws_cover_the_categorical_ranges(tmp_path):
    d = draw(40, 0, tmp_path)
    seen: dict[str, set] = {k: set() for k in ("algorithm", "engine", "runtime", "reward", "schedule", "response_length", "model_type")}
    for doc in d.scenarios:
        seen["algorithm"].add(doc["algorithm"]["kind"])
        seen["engine"].add(doc["generation"]["engine"])
        seen["runtime"].add(doc["generation"]["runtime"])
        rw = doc["models"]["reward"]
        seen["reward"].add("rule" if rw.get("kind") == "rule" else ("encoder" if "deberta" in rw["model"] else "decoder"))
        s = doc["schedule"]
        seen["schedule"].add("sync" if s["kind"] == "sync" else
                             {(True, False): "oppo-intra", (False, True): "oppo-inter", (True, True): "oppo"}[
                                 (s["intra"]["enabled"], s["inter"]["enabled"])])
        seen["response_length"].add(doc["workload"]["response_length"]["kind"])
        seen["model_type"].add(json.loads((tmp_path / doc["models"]["actor"]["model"]).read_text())["model_type"])
    for k, v in seen.items():
        assert v == set(RANGES[k]["choices"]), k


def test_a_narrower_range_override_is_respected_and_infeasible_ranges_fail_in_one_line(tmp_path):
    from rlhfsim.errors import RlhfsimError

    d = draw(3, 4, tmp_path / "a", {"layers": {"range": [1, 1]}, "vocab": {"choices": [512]}})
    for doc in d.scenarios:
        assert json.loads((tmp_path / "a" / doc["models"]["actor"]["model"]).read_text())["num_hidden_layers"] == 1
    with pytest.raises(RlhfsimError, match="no feasible draw"):
        draw(1, 4, tmp_path / "b", {"max_run_s": {"value": 1e-6}}, max_attempts=5)
    assert math.isfinite(sum(d.estimated_run_s))


def test_ranges_that_leave_a_reward_no_schedule_redraw_it(tmp_path):
    # Intra-step streams to a decoder reward only: ranges of intra-step schedules alone re-draw the
    # encoder and rule rewards (counted by reason) instead of failing in the draw.
    d = draw(4, 7, tmp_path, {"schedule": {"choices": ["oppo-intra", "oppo"]},
                              "reward": {"choices": ["decoder", "encoder", "rule"], "weights": [0.2, 0.4, 0.4]}})
    assert all(doc["schedule"]["intra"]["enabled"] for doc in d.scenarios)
    assert all(doc["models"]["reward"].get("kind") != "rule" for doc in d.scenarios)
    assert any(r.startswith("no schedule in ranges.schedule") for r in d.redraws)


@pytest.mark.parametrize("entry, message", [
    ({"schedule": {"choices": []}}, r"--ranges schedule\.choices: expected a non-empty list of str"),
    ({"hidden": {"choices": ["wide"]}}, r"--ranges hidden\.choices: expected a non-empty list of int"),
    ({"layers": {"range": [4, 2]}}, r"--ranges layers\.range: expected \[low, high\] with low <= high"),
    ({"layers": {"range": [1.5, 2]}}, r"--ranges layers\.range: expected .*integers"),
    ({"response_tail": {"log_range": [0, 2]}}, r"--ranges response_tail\.log_range: expected .* > 0"),
    ({"max_run_s": {"value": "long"}}, r"--ranges max_run_s\.value: expected a number > 0"),
    ({"reward": {"choices": ["decoder", "rule"], "weights": [1]}}, r"--ranges reward\.weights: expected one number"),
    ({"kv_heads": {"choices": [1]}}, r"--ranges kv_heads\.choices: expected no override"),
])
def test_bad_ranges_entries_name_the_field(tmp_path, entry, message):
    from calibrate.validation.generated import read_ranges
    from rlhfsim.errors import RlhfsimError

    f = tmp_path / "ranges.json"
    f.write_text(json.dumps(entry))
    with pytest.raises(RlhfsimError, match=message):
        read_ranges(f)

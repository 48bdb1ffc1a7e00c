"""rlhfsim.fromrun.logs (verl step lines, steady steps) and the profile ``extends`` hook."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rlhfsim.costs.profile import load_profile
from rlhfsim.errors import ProfileError
from rlhfsim.fromrun.logs import LogError, parse_console, parse_jsonl, read_log, skipped_text, steady_steps

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "scenarios" / "examples" / "fromrun" / "logs"


def line(step: int, extra: str = "", total: float = 10.0) -> str:
    return (f"\x1b[36m(TaskRunner pid=1)\x1b[0m step:{step} - actor/lr:0.000 - response_length/mean:100.5 - "
            f"timing_s/gen:{2.0 + step / 100:.3f} - timing_s/update_actor:3.000{extra} - timing_s/step:{total:.3f}")


def test_console_lines_read_with_ray_prefix_and_colours():
    text = "config {'a': 1}\n" + line(1) + "\nrandom step: words\n" + line(2)
    steps = parse_console(text, "x.log")
    assert [(s.step, s.line) for s in steps] == [(1, 2), (2, 4)]
    assert steps[1].metrics["timing_s/gen"] == pytest.approx(2.02)
    assert steps[0].metrics["response_length/mean"] == 100.5


def test_truncated_console_line_names_its_line():
    cut = line(3)[: line(3).index("timing_s/step") - 3]
    with pytest.raises(LogError, match=r"x\.log line 3: .*timing_s/step"):
        parse_console(line(1) + "\n" + line(2) + "\n" + cut, "x.log")
    with pytest.raises(LogError, match=r"x\.log line 2: expected KEY:NUMBER"):
        parse_console(line(1) + "\n" + line(2).replace("3.000", "3.0O0"), "x.log")


def test_jsonl_read_and_bad_line_named():
    recs = [{"step": i, "data": {"timing_s/gen": 1.0, "timing_s/step": 2.0, "note": "x"}} for i in (1, 2)]
    text = "\n".join(json.dumps(r) for r in recs)
    steps = parse_jsonl(text, "m.jsonl")
    assert [s.step for s in steps] == [1, 2] and "note" not in steps[0].metrics
    with pytest.raises(LogError, match=r"m\.jsonl line 3: expected a JSON object"):
        parse_jsonl(text + '\n{"step": 3, "data": {"timing_s/g', "m.jsonl")


def test_steady_steps_skip_warmup_validation_checkpoint_and_say_so():
    text = "\n".join([line(1), line(2), line(3, " - timing_s/testing:5.000"), line(4),
                      line(5, " - timing_s/save_checkpoint:2.000"), line(6)])
    st = steady_steps(parse_console(text), "x.log", warmup=1, min_steps=3)
    assert [s.step for s in st.kept] == [2, 4, 6]
    assert st.skipped == {1: "warm-up", 3: "validation", 5: "checkpoint"}
    assert "testing" not in " ".join(st.phase_samples()) and "timing_s/gen" in st.phase_samples()
    assert skipped_text(st) == "warm-up 1; validation 3; checkpoint 5"
    with pytest.raises(LogError, match="expected at least 4 steady steps, got 3 of 6"):
        steady_steps(parse_console(text), "x.log", warmup=1, min_steps=4)


def test_play_verl_ppo_extract_gives_the_field_tables_measured_step(tmp_path):
    # runs.yaml F6 (computed independently, by hand): steps 2-44 less 10, 20, 30, 40; mean timing_s/step 40.521
    st = steady_steps(read_log(LOGS / "verl_ppo_qwen2.5b_8gpu.log.steps.gz"), "F6")
    assert len(st.kept) == 39 and st.kept[0].step == 2 and st.kept[-1].step == 44
    assert st.mean("timing_s/step") == pytest.approx(40.521, abs=5e-4)
    bad = tmp_path / "cut.log.gz"
    bad.write_bytes(gzip.compress(b"step:1 - timing_s/gen:1.0 - timing_s/step:2.0\n")[:-6])
    with pytest.raises(LogError, match="cut.log.gz"):
        read_log(bad)
    with pytest.raises(LogError, match="expected verl step lines"):
        empty = tmp_path / "empty.log"
        empty.write_text("nothing here\n")
        read_log(empty)


def test_profile_extends_merges_over_its_base_and_refuses_cycles(tmp_path):
    base = load_profile("default")
    over = tmp_path / "over.json"
    over.write_text(json.dumps({"schema_version": 1, "name": "o", "extends": "default",
                                "operations": {"train": {"compute_eff": 0.123}}, "step": {"microbatch_train_s": 0.01}}))
    p = load_profile(str(over))
    assert p["operations"]["train"]["compute_eff"] == 0.123
    assert p["operations"]["train"]["memory_eff"] == base["operations"]["train"]["memory_eff"]
    assert p["operations"]["decode"] == base["operations"]["decode"] and p["name"] == "o"
    assert p["step"]["microbatch_train_s"] == 0.01 and p["provenance"] == base["provenance"]
    second = tmp_path / "second.json"
    second.write_text(json.dumps({"extends": "over.json", "name": "s", "operations": {"decode": {"overhead_s": 0.5}}}))
    q = load_profile(str(second))
    assert q["operations"]["train"]["compute_eff"] == 0.123 and q["operations"]["decode"]["overhead_s"] == 0.5
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"extends": "b.json"}))
    b.write_text(json.dumps({"extends": "a.json"}))
    with pytest.raises(ProfileError, match="cycle"):
        load_profile(str(a))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"extends": "default", "operations": {"train": {"compute_eff": -1}}}))
    with pytest.raises(ProfileError, match=r"operations\.train\.compute_eff"):
        load_profile(str(bad))

"""rlhfsim.fromrun.logs: every format a framework writes (verl console of each release, metrics JSONL, TensorBoard,
wandb CSV, OpenRLHF's console), read from whole public logs (tests/data/logs/, PROVENANCE.md there), and the
profile ``extends`` hook. The defects of issue 54 are in test_fromrun_logs_defects.py."""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import pprint
from pathlib import Path

import numpy as np
import pytest

from rlhfsim.costs.profile import load_profile
from rlhfsim.errors import ProfileError
from rlhfsim.fromrun.logs import LogError, parse_console, read_log, skipped_text, steady_steps
from rlhfsim.report.tfevents import event_file_bytes

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "logs"
EXTRACTS = ROOT / "scenarios" / "examples" / "fromrun" / "logs"
F6 = DATA / "playverl-ppo-qwen2.5-0.5b.log.gz"
U2 = DATA / "verldata-gpg-qwen2-7b-math.log.gz"
V01 = DATA / "verl-data-gemma-2-2b-ppo-v0.1.log.gz"


def text_of(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode()


def line(step: int, extra: str = "", total: float = 10.0) -> str:
    return (f"\x1b[36m(TaskRunner pid=1)\x1b[0m step:{step} - actor/lr:0.000 - response_length/mean:100.500 - "
            f"timing_s/gen:{2.0 + step / 100:.3f} - timing_s/update_actor:3.000{extra} - timing_s/step:{total:.3f}")


def test_console_lines_read_with_ray_prefix_colours_and_tqdm_returns():
    text = "config {'a': 1}\n" + line(1) + "\nrandom step: words\nTraining Progress: 1%|\r" + line(2)
    steps = parse_console(text, "x.log")
    assert [(s.step, s.line, s.kind) for s in steps] == [(1, 2, "train"), (2, 4, "train")]
    assert steps[1].metrics["timing_s/gen"] == pytest.approx(2.02)
    assert steps[0].metrics["response_length/mean"] == 100.5 and not steps.bad


def test_play_verl_ppo_whole_log_gives_the_field_tables_measured_step():
    # runs.yaml F6 (computed independently, by hand): steps 2-44 less 10, 20, 30, 40; mean timing_s/step 40.521
    log = read_log(F6)
    st = steady_steps(log, "F6")
    assert log.format == "verl console" and len(log.steps) == 45 and not log.bad
    assert len(st.kept) == 39 and st.kept[0].step == 2 and st.kept[-1].step == 44
    assert st.mean("timing_s/step") == pytest.approx(40.521, abs=5e-4)
    assert skipped_text(st) == "warm-up 1; validation and checkpoint 10, 20, 30, 40, 45"
    assert st.notices() == []
    same = steady_steps(read_log(EXTRACTS / "verl_ppo_qwen2.5b_8gpu.log.steps.gz"), "F6")
    assert [s.metrics for s in same.kept] == [s.metrics for s in st.kept]


def test_verl_04_whole_log_with_its_validation_only_step_zero():
    """diqiuzhuanzhuan/verldata (verl 0.4, field run U2): ``val_before_train`` logs ``step:0`` with validation
    metrics only; runs.yaml's U2 (by hand): steps 2-209 less every 5th and the last, 167 steps, mean 265.59 s."""
    log = read_log(U2)
    st = steady_steps(log, "U2")
    zero = [s for s in log.steps if s.step == 0]
    assert len(zero) == 1 and zero[0].kind == "validation" and all(k.startswith("val-") for k in zero[0].metrics)
    assert not log.bad and [s.step for s in st.validation_only] == [0]
    assert len(st.kept) == 167 and st.mean("timing_s/step") == pytest.approx(265.59, abs=5e-3)
    assert any("validation-only records" in n and "steps 0" in n for n in st.notices())


def test_verl_01_timers_are_read_and_the_step_is_their_sum():
    log = read_log(V01)
    first = next(s for s in log.steps if s.kind == "train" and s.step == 1)
    phases = ("gen", "ref", "values", "adv", "update_critic", "update_actor")
    assert first.metrics["timing_s/gen"] == first.metrics["timing/gen"] == 42.247
    assert first.metrics["timing_s/step"] == pytest.approx(sum(first.metrics[f"timing/{p}"] for p in phases))
    assert log.steps[0].step == 0 and log.steps[0].kind == "validation"    # step:0 - test_score/openai/gsm8k:0.521
    st = steady_steps(log, "v01")
    assert len(st.kept) == 95 and any("verl 0.1 timer names" in n for n in st.notices())
    assert all(st.skipped[k] == "validation" for k in range(9, 100, 10))


def verl05_line(step: int, metrics: dict) -> str:
    """A step line as verl >= 0.5 prints it (``concat_dict_to_str``: ``f"{k}:{pprint.pformat(v)}"``), with the
    metrics verl averages with numpy (actor/, critic/ losses, perf/) as numpy 2 scalars."""
    def val(k, v):
        return np.float64(v) if k.startswith(("actor/", "critic/vf", "perf/")) else float(v)
    return "(TaskRunner pid=3165) step:%d - " % step + " - ".join(f"{k}:{pprint.pformat(val(k, v))}"
                                                                  for k, v in metrics.items())


def test_verl_05_reprs_and_numpy_scalars_read_as_the_same_numbers():
    orig = read_log(F6)
    text = "\n".join(verl05_line(s.step, s.metrics) for s in orig.steps)
    assert "np.float64(" in text
    log = parse_console(text, "v05.log")
    assert not log.bad and [s.metrics for s in log.steps] == [s.metrics for s in orig.steps]


def to_jsonl(steps, val_zero: dict | None = None) -> str:
    recs = ([{"step": 0, "data": val_zero}] if val_zero else []) + [{"step": s.step, "data": s.metrics} for s in steps]
    return "\n".join(json.dumps(r) for r in recs) + "\n"


def test_metrics_jsonl_verl_file_logger_and_flat_records(tmp_path):
    orig = read_log(F6)
    p = tmp_path / "run.jsonl"
    p.write_text(to_jsonl(orig.steps, {"val-core/openai/gsm8k/reward/mean@1": 0.004}))
    log = read_log(p)
    st = steady_steps(log, "j")
    assert log.format == "metrics JSONL" and [s.step for s in st.validation_only] == [0]
    assert st.mean("timing_s/step") == pytest.approx(40.521, abs=5e-4) and len(st.kept) == 39
    flat = tmp_path / "wandb-history.jsonl"
    flat.write_text("\n".join(json.dumps({"_step": s.step, "_runtime": 1.0, **s.metrics}) for s in orig.steps))
    assert steady_steps(read_log(flat), "f").mean("timing_s/step") == pytest.approx(40.521, abs=5e-4)


def tfevents(steps) -> bytes:
    """Events as torch's SummaryWriter.add_scalar writes them: one scalar per event."""
    return event_file_bytes([(s.step, 1.7e9 + s.step, {k: v}) for s in steps for k, v in s.metrics.items()])


def test_tensorboard_event_files_one_scalar_per_event_and_a_resumed_directory(tmp_path):
    orig = read_log(F6)
    f = tmp_path / "events.out.tfevents.1700000000.host"
    f.write_bytes(tfevents(orig.steps))
    log = read_log(f)
    st = steady_steps(log, "tb")
    assert log.format == "TensorBoard events" and len(log.steps) == 45 and len(st.kept) == 39
    assert st.mean("timing_s/step") == pytest.approx(40.521, abs=5e-4)       # float32 scalars
    # a run restarted from step 20's checkpoint writes a second file that logs 21-45 again
    d = tmp_path / "tensorboard_log"
    d.mkdir()
    (d / "events.out.tfevents.1700000000.a").write_bytes(tfevents(orig.steps[:30]))
    later = [s for s in orig.steps if s.step > 20]
    (d / "events.out.tfevents.1700009999.a").write_bytes(tfevents(later))
    st2 = steady_steps(read_log(d), "tb")
    assert st2.replaced == list(range(21, 31)) and st2.skipped[21] == "warm-up (resumed run)"
    assert any("a resumed run" in n and "21-30 logged again" in n for n in st2.notices())


def test_wandb_csv_history_and_panel_exports(tmp_path):
    orig = read_log(F6)
    keys = sorted({k for s in orig.steps for k in s.metrics})
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["_step", "_runtime", *keys])
    for s in orig.steps:
        w.writerow([s.step, 1.0, *[repr(s.metrics[k]) if k in s.metrics else "" for k in keys]])
    hist = tmp_path / "history.csv"
    hist.write_text(buf.getvalue())
    st = steady_steps(read_log(hist), "csv")
    assert read_log(hist).format == "wandb CSV" and st.mean("timing_s/step") == pytest.approx(40.521, abs=5e-4)
    panel = tmp_path / "panel.csv"
    rows = ["Step," + ",".join(f'"ppo-run - {k}","ppo-run - {k}__MIN","ppo-run - {k}__MAX"' for k in keys[:3] +
                               ["timing_s/step"])]
    for s in orig.steps:
        rows.append(f"{s.step}," + ",".join(f"{s.metrics.get(k, '')},," for k in keys[:3] + ["timing_s/step"]))
    panel.write_text("\n".join(rows) + "\n")
    got = read_log(panel)
    assert [s.metrics["timing_s/step"] for s in got.steps] == [s.metrics["timing_s/step"] for s in orig.steps]
    two = tmp_path / "two.csv"
    two.write_text('Step,"a - timing_s/step","b - timing_s/step"\n1,2.0,3.0\n')
    with pytest.raises(LogError, match=r"two\.csv: expected one run's columns, got 2 runs"):
        read_log(two)


def openrlhf_line(step: int, status: dict) -> str:
    # OpenRLHF >= 0.9.6 (ppo_trainer.py): logger.info(f"✨ Global step {global_step}: {log_status}"), a dict's repr
    return f"(PPOTrainer pid=77) INFO 03-20 10:00:{step:02d} ppo_trainer.py:547] ✨ Global step {step}: {status!r}"


def test_openrlhf_console_lines_with_timers_and_evaluation(tmp_path):
    lines = []
    for step in range(1, 7):
        t = {"timing/generation": 20.0 + step, "timing/make_experience": 6.5, "timing/ppo_train": 11.25,
             "timing/broadcast": 0.5}
        status = {"policy_loss": -0.01 * step, "rollout/response_length_mean": 300.0 + step,
                  "rollout/truncated_rate": 0.02, "actor_lr": 5e-07, "generated_samples": ["text", 1.0], **t,
                  "timing/step_total": sum(t.values())}
        lines.append(openrlhf_line(step, status))
    lines.insert(3, "(PPOTrainer pid=77) INFO ppo_trainer.py:422] ✨ Evaluation completed in 0:01:02, global_step 3, "
                    "eval_metrics: {'eval_accuracy': 0.41}")
    p = tmp_path / "openrlhf.log"
    p.write_text("\n".join(["Episode [1/1]: 0%|", *lines]) + "\n")
    log = read_log(p)
    assert log.format == "OpenRLHF console" and log.framework == "openrlhf" and not log.bad
    st = steady_steps(log, "o")
    assert [s.step for s in st.kept] == [2, 3, 4, 5, 6] and [s.step for s in st.validation_only] == [3]
    assert st.mean("timing_s/step") == pytest.approx(24 + 6.5 + 11.25 + 0.5) and st.mean("response_length/mean") == pytest.approx(304.0)
    assert st.mean("response_length/clip_ratio") == pytest.approx(0.02)
    # 0.8.5-0.9.5: no timers on the step line; 'Experience making completed in H:MM:SS' before it
    old = tmp_path / "old.log"
    old.write_text("\n".join(f"INFO experience_maker.py:610] ✨ Experience making completed in 0:01:0{s}\n"
                             + openrlhf_line(s, {"policy_loss": 0.1, "response_length": 200.0 + s})
                             for s in range(1, 5)) + "\n")
    log = read_log(old)
    assert [s.metrics["timing/make_experience"] for s in log.steps] == [61.0, 62.0, 63.0, 64.0]
    assert [s.metrics["response_length/mean"] for s in log.steps] == [201.0, 202.0, 203.0, 204.0]
    assert any("whole seconds" in n for n in log.notes) and "timing_s/step" not in log.steps[0].metrics
    cut = tmp_path / "cut.log"
    cut.write_text("\n".join(lines[:3] + [lines[4][:120]] + lines[5:]) + "\n")
    assert [b.reason for b in read_log(cut).bad] == ["truncated line (the dict does not close)"]


def test_no_step_records_and_unreadable_files_are_one_line(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    with pytest.raises(LogError, match="expected step records"):
        read_log(empty)
    with pytest.raises(LogError, match="no such file"):
        read_log(tmp_path / "missing.log")
    notgz = tmp_path / "x.log.gz"
    notgz.write_bytes(b"plain text, not gzip")
    with pytest.raises(LogError, match="expected a gzip-compressed log"):
        read_log(notgz)


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
    assert math.isclose(st.mean("timing_s/gen"), (2.02 + 2.04 + 2.06) / 3)


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

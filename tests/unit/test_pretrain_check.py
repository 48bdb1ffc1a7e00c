"""The MoE pre-training check (scenarios/examples/megatron-field/pretrain.yaml, pretrain.py): every published row is
pinned to its source and complete, and pretrain.py's step is the actor_train pricing's parts, expert_gemm among them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from rlhfsim.costs.terms import EP_ALLTOALL, EXPERT_GEMM, OPTIMIZER, PIPELINE_BUBBLE
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import load_model

HERE = Path(__file__).resolve().parents[2] / "scenarios" / "examples" / "megatron-field"
DOC = yaml.safe_load((HERE / "pretrain.yaml").read_text())
FIELDS = {"id", "release", "model", "gpu", "precision", "dtype", "gpus", "gbs", "mbs", "seq", "tp", "pp", "cp", "vp",
          "ep", "tokens_per_s_gpu", "tflops_per_gpu"}


def _pretrain():
    spec = importlib.util.spec_from_file_location("pretrain", HERE / "pretrain.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rows_are_pinned_and_complete():
    assert "/blob/0a25f911b2ed6c6905a539504fdb8e5b40e3438b/" in DOC["source"]
    ids = [r["id"] for r in DOC["rows"]]
    assert len(ids) == len(set(ids)) and len([r for r in DOC["rows"] if not r.get("tokendrop")]) >= 10
    for r in DOC["rows"]:
        assert FIELDS <= set(r), r["id"]
        load_model(r["model"]), get_gpu(r["gpu"])   # catalog names
        assert r["gpus"] % (r["tp"] * r["pp"] * r["cp"]) == 0 and r["gbs"] % (r["mbs"] * r["gpus"] // (r["tp"] * r["pp"] * r["cp"])) == 0


def test_a_rows_step_is_the_sum_of_its_terms():
    mod = _pretrain()
    row = next(r for r in DOC["rows"] if r["id"] == "P4")   # Qwen3-30B-A3B, 16 H100, PP 2 x VP 12, EP 8
    t, terms = mod.step(row, {}, DOC["etp"])
    assert sum(terms.values()) == pytest.approx(t)
    assert min(terms[EXPERT_GEMM], terms[EP_ALLTOALL], terms[PIPELINE_BUBBLE], terms[OPTIMIZER]) > 0

"""A decode step's attention under kernel terms by shape: its FLOPs at the GEMMs' sustained rate, not at the skinny
efficiency of the step's rows (rlhfsim/costs/model.py _Decode.attn_peak), and the engine check that shows why
(scenarios/examples/engine-check)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from rlhfsim.costs.model import CostModel
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import CATALOG

ROOT = Path(__file__).resolve().parents[2]
FROZEN = ROOT / "tests" / "fixtures" / "profiles" / "default.json"


@pytest.fixture(scope="module")
def h100():
    return CostModel.load(get_gpu("h100-sxm"), "h100-sxm")


def _growth(cost, model, batch, short, long, runtime="vllm"):
    dec = cost.decoder(CATALOG[model], "bfloat16", 1, runtime)
    return dec.price(batch, batch * long, 1).total_s - dec.price(batch, batch * short, 1).total_s


def test_one_sequence_long_cache_is_bound_by_reading_it(h100):
    # one Qwen2.5-0.5B sequence from 128 to 32,640 cached tokens: the growth is the KV bytes at the weights'
    # streaming rate (the attention's FLOPs at e_max are far below them), not the FLOPs at e_c(1, S)
    m = CATALOG["qwen2.5-0.5b"]
    got = _growth(h100, "qwen2.5-0.5b", 1, 128, 32640)
    ks = h100.by_shape
    kv = h100.decoder(m, "bfloat16", 1, "vllm").kv_b * (32640 - 128)
    assert got == pytest.approx(kv / (h100.gpu.mem_bw * ks.weight_memory_eff), rel=1e-9)
    skinny = m.layers * m.attn_flops_per_pair * (32640 - 128) / (h100.gpu.peak("bfloat16") * ks.compute_eff(1, m.layer_params))
    assert got < 0.5 * skinny   # what pricing them at the batch's rows gave


def test_attention_rate_is_the_sustained_gemm_rate(h100):
    dec = h100.decoder(CATALOG["qwen2.5-7b"], "bfloat16", 2, "vllm")
    assert dec.attn_peak == pytest.approx(2 * h100.gpu.peak("bfloat16") * h100.by_shape.e_max)
    # and the linear layers still take the batch's skinny efficiency: a bigger batch's FLOPs per row cost less
    c1, c256 = dec._lines(1, 0.0)[0], dec._lines(256, 0.0)[0]
    assert c256 - dec.floor < 256 * (c1 - dec.floor)


def test_without_kernel_terms_by_shape_one_rate_prices_both():
    cost = CostModel.load(get_gpu("h100-sxm"), str(FROZEN))
    dec = cost.decoder(CATALOG["qwen2.5-7b"], "bfloat16", 1, "vllm")
    assert cost.by_shape is None and dec.attn_peak is None
    k = dec.shape
    c0, cs, _, _ = dec._lines(8, 1000.0)
    assert c0 == (k.f_linear * 8 + k.f_head * 8 + k.f_attn * 1000.0) / dec.peak + dec.floor
    assert cs == k.f_attn * 8 / dec.peak


def _check_module():
    path = ROOT / "scenarios" / "examples" / "engine-check" / "check.py"
    spec = importlib.util.spec_from_file_location("engine_check", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["engine_check"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_engine_check_points_price_and_pin():
    mod = _check_module()
    points = mod.load_points()
    for p in points:   # every point names its source and a setup the catalog has
        assert p["source"].startswith("https://github.com/") and p["model"] in CATALOG and p["tpot_ms"] > 0
    rs = mod.rows("h100-sxm")
    by = {r["id"]: r for r in rs}
    assert len(rs) == len(points) == 18
    # the small-batch steps where the weights dominate: within 5% (dense 72B TP 2, MoE 30B-A3B at 10 sequences)
    assert abs(by["vllm-23151-qwen3-30b-a3b-c10"]["error_pct"]) < 5
    assert abs(by["tt-143-qwen2.5-72b-tp2-c1-8192-128"]["error_pct"]) < 5
    # vLLM's async scheduling (vllm#53060's points): the engine's host work hidden behind a device step longer than it
    assert "engine_host" not in by["vllm-53060-qwen2.5-0.5b-b1-kv128"]["terms_ms"]
    assert by["tt-143-qwen2.5-72b-tp2-c1-128-128"]["terms_ms"]["engine_host"] > 0   # verl-era vLLM: serial
    # the attention's growth with the cache for one sequence: within 25% of vLLM + FA3's, not 4.5 times it
    g = {r["id"]: r for r in mod.growth(rs)}
    assert 0.9 < g["vllm-53060-qwen2.5-0.5b-b1-kv32640"]["ratio"] < 1.25

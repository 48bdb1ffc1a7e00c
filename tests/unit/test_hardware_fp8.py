"""The hardware catalog's Blackwell and CDNA 4 rows, the NVLink domain of an NVL72 rack reaching the link choice, and
``dtype: float8`` (FP8 GEMMs at the FP8 peak, weights at one byte, the rest in bfloat16; refused without FP8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhfsim.costs import flops as fl
from rlhfsim.costs import parallel as P
from rlhfsim.costs.model import CostModel
from rlhfsim.errors import ScenarioError
from rlhfsim.hardware.catalog import GB, GPUS, TFLOPS, GiB, get_gpu
from rlhfsim.models.catalog import load_model
from rlhfsim.scenario.checks import build_setup
from rlhfsim.scenario.loader import load_scenario, parse_set

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "scenarios" / "baseline.yaml"
MOE = ROOT / "scenarios" / "examples" / "moe-qwen3-30b-a3b.yaml"


def _setup(path, *sets):
    return build_setup(load_scenario(path, overrides=[parse_set(s) for s in sets]))


def _error(path, *sets) -> str:
    with pytest.raises(ScenarioError) as e:
        _setup(path, *sets)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# --- the catalog rows ------------------------------------------------------------------------------
def test_gb200_and_mi355x_rows_are_the_datasheets_per_gpu():
    gb = get_gpu("gb200-nvl72")
    # the NVL72 rack's figures over its 72 GPUs, dense (half the sparse): 360 PF BF16, 720 PF FP8, 576 TB/s
    assert gb.peak("bfloat16") == 360e15 / 2 / 72 and gb.peak("float8") == 720e15 / 2 / 72
    assert gb.mem_bw == 576e12 / 72 and gb.mem_bytes == 186 * GiB
    assert gb.intra_node_bw == 1800 / 2 * GB and gb.nvlink_domain == 72
    mi = get_gpu("mi355x")
    # 256 CUs x 2.4 GHz x 4,096 (BF16) and 8,192 (FP8) dense FLOP per CU per clock
    assert mi.peak("bfloat16") == pytest.approx(256 * 2.4e9 * 4096, rel=1e-4)
    assert mi.peak("float8") == pytest.approx(256 * 2.4e9 * 8192, rel=1e-4)
    assert mi.mem_bytes == 288 * GiB and mi.mem_bw == 8000 * GB and mi.nvlink_domain == 0


def test_fp8_peaks_are_twice_bf16_where_the_gpu_has_fp8_and_absent_where_not():
    with_fp8 = {"h100-sxm", "h100-pcie", "h200", "gh200", "h20", "b200", "gb200", "l40s", "l4", "mi300x", "mi355x"}
    assert {n for n, g in GPUS.items() if "float8" in g.peak_flops} == with_fp8
    for n in with_fp8:   # the datasheets round (L4: BF16 242, FP8 485 sparse; L40S: BF16 362.05, FP8 733 dense)
        assert GPUS[n].peak("float8") == pytest.approx(2 * GPUS[n].peak("bfloat16"), rel=1.5e-2), n
    assert get_gpu("h20").peak("float8") == 296 * TFLOPS


# --- the NVLink domain -----------------------------------------------------------------------------
def test_link_domain_is_the_rack_on_nvl72_and_the_node_elsewhere():
    assert get_gpu("gb200").link_domain(4) == 72
    assert get_gpu("b200").link_domain(8) == 8 and get_gpu("h100").link_domain(4) == 4


def test_a_pool_across_trays_of_one_nvl72_stays_on_nvlink_and_across_racks_does_not():
    cluster = "cluster={gpu: %s, nodes: %d, gpus_per_node: 4}"
    # 16 GPUs in 4 trays of one rack: one NVLink domain; the same 4 nodes of H100s cross the inter-node link
    assert not _setup(BASELINE, cluster % ("gb200", 4)).pools[0].spans_nodes
    assert _setup(BASELINE, cluster % ("h100-sxm", 4)).pools[0].spans_nodes
    # 144 GPUs: two racks
    assert _setup(BASELINE, cluster % ("gb200", 36)).pools[0].spans_nodes


def test_tp_may_cross_trays_of_an_nvl72_but_not_nodes_of_an_hgx_board():
    sets = ("placement.tp.actor=8", "placement.tp.critic=8", "placement.tp.reference=8", "placement.tp.reward=8")
    setup = _setup(BASELINE, "cluster={gpu: gb200, nodes: 4, gpus_per_node: 4}", *sets)
    assert setup.tp["actor"] == 8
    msg = _error(BASELINE, "cluster={gpu: h100-sxm, nodes: 4, gpus_per_node: 4}", *sets)
    assert msg.startswith("placement.tp.") and "within one NVLink domain" in msg and "<= 4" in msg and "got 8" in msg


def test_megatron_groups_take_the_nvl72_domain_for_their_link():
    moe = ("placement.tp.actor=2", "execution.sharding=none", "execution.megatron.actor.ep=2")
    on_h100 = P.layout_of(_setup(MOE, *moe, "cluster={gpu: h100-sxm, nodes: 2, gpus_per_node: 4}"), "actor")
    on_gb200 = P.layout_of(_setup(MOE, *moe, "cluster={gpu: gb200, nodes: 2, gpus_per_node: 4}"), "actor")
    assert on_h100.inter_node(8) and not on_gb200.inter_node(8)


# --- float8 ----------------------------------------------------------------------------------------
def test_float8_halves_the_weights_and_keeps_activations_and_kv_in_bf16():
    m = load_model("qwen2.5-7b")
    b, f = fl.ShapeCoeffs.of(m, "bfloat16", "lm"), fl.ShapeCoeffs.of(m, "float8", "lm")
    assert f.weight_bytes * 2 == b.weight_bytes and f.decode_weight_bytes * 2 == b.decode_weight_bytes
    assert (f.kv_bytes, f.act_bytes, f.f_linear) == (b.kv_bytes, b.act_bytes, b.f_linear)
    assert m.kv_bytes_per_token("float8") == m.kv_bytes_per_token("bfloat16")
    assert fl.tp_allreduce_bytes(m, "float8", 100, 4) == fl.tp_allreduce_bytes(m, "bfloat16", 100, 4)


def test_float8_training_runs_at_the_fp8_peak():
    cost = CostModel.load(get_gpu("h100-sxm"), "default")
    m = load_model("qwen2.5-7b")
    p = cost.ops["train"]
    for dtype in ("bfloat16", "float8"):
        w = fl.ShapeCoeffs.of(m, dtype, "lm").train(65536, 16)
        compute = w.flops / (cost.gpu.peak(dtype) * p.compute_eff)
        assert compute > w.bytes / (cost.gpu.mem_bw * p.memory_eff)   # compute-bound: the peak sets the time
        assert cost.train(m, dtype, 65536, 16).active_s == pytest.approx(compute, rel=1e-12)


def test_float8_decode_streams_half_the_weight_bytes():
    cost = CostModel.load(get_gpu("h100-sxm"), "default")
    m = load_model("qwen2.5-7b")
    bf, f8 = cost.decode_steps(m, "bfloat16", 1, 100, 10), cost.decode_steps(m, "float8", 1, 100, 10)
    assert f8.active_s < 0.55 * bf.active_s     # weights dominate a one-row decode step; KV stays bf16


def test_float8_on_a_gpu_without_fp8_is_one_line_naming_the_yaml_path():
    msg = _error(BASELINE, "models.actor.dtype=float8")
    assert msg.startswith("models.actor.dtype: expected a dtype a100-80gb has tensor cores for")
    assert "got 'float8'" in msg
    assert _setup(BASELINE, "models.actor.dtype=float8", "cluster.gpu=h100-sxm").dtypes["rollout"] == "float8"

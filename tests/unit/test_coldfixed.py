"""A decode step's fixed costs after its weights stream (``calibrate.cpu.coldfixed``): the probe's points become a
table of factors by footprint, the cost model multiplies a decode step's overheads and sampling tail by the
factor at the model's footprint (its weights and bandwidth untouched), the fit takes the same factor off each
decode point and so recovers the hot overheads, and a bad table is refused with its path."""

from __future__ import annotations

import copy

import numpy as np
import pytest

pytest.importorskip("scipy")

from calibrate.fitting.assemble import fitted, kernels_summary, with_tails  # noqa: E402
from calibrate.cpu.coldfixed import cold_summary, feet, probe_shape  # noqa: E402
from calibrate.fitting.fit import arrays, fitted_value, overhead_x, point_value, predict  # noqa: E402
from rlhfsim.costs import cpuhost  # noqa: E402
from rlhfsim.costs import flops as fl  # noqa: E402
from rlhfsim.costs.model import CostModel, OpParams  # noqa: E402
from rlhfsim.costs.profile import ProfileError, load_profile, validate_profile  # noqa: E402
from rlhfsim.hardware.catalog import get_gpu  # noqa: E402
from rlhfsim.models.catalog import CATALOG  # noqa: E402

pytestmark = pytest.mark.hw  # the calibrator (calibrate.cpu.coldfixed imports torch); the fast loop skips it

CPU = get_gpu("cpu")
MIB = 2**20
TABLE = {"footprint_mib": [0.0, 4.0, 16.0, 32.0], "factor": [1.0, 1.0, 1.5, 2.0]}


def _cold(foot: float, us: float, model: str = "tiny-qwen2") -> dict:
    return {"op": "cold_step", "model": model, "footprint_mib": foot, "tmean_s": us * 1e-6, "median_s": us * 1e-6}


def test_the_probe_points_make_a_table_of_factors_at_least_one():
    pts = [_cold(0, 700), _cold(4, 690), _cold(16, 1050), _cold(32, 1400), _cold(0, 5000, "other"),
           {"op": "prefill", "model": "tiny-qwen2", "tmean_s": 1.0, "median_s": 1.0}]
    t = cold_summary(pts, point_value)
    assert t["footprint_mib"] == [0.0, 4.0, 16.0, 32.0] and t["model"] == "tiny-qwen2"
    assert t["factor"] == pytest.approx([1.0, 1.0, 1.5, 2.0])   # 690/700 is noise, clipped at 1
    assert t["step_us"] == pytest.approx([700, 690, 1050, 1400])
    assert cold_summary([_cold(4, 700), _cold(16, 900)], point_value) is None   # no baseline without a sweep
    assert cold_summary([_cold(0, 700)], point_value) is None
    assert kernels_summary(pts)["cold_overheads"]["factor"] == t["factor"]
    validate_profile({**load_profile("cpu"), "kernels": {"cold_overheads": t}}, "p")


def test_the_factor_is_interpolated_in_mib_and_held_at_the_ends():
    assert cpuhost.cold_factor(None, 64 * MIB) == 1.0
    assert cpuhost.cold_factor(TABLE, 2 * MIB) == 1.0 and cpuhost.cold_factor(TABLE, 10 * MIB) == pytest.approx(1.25)
    assert cpuhost.cold_factor(TABLE, 24 * MIB) == pytest.approx(1.75) and cpuhost.cold_factor(TABLE, 500 * MIB) == 2.0


def test_the_probe_runs_on_the_smallest_actor_at_zero_and_the_grids_footprints():
    from calibrate.running.grid import QUICK_CPU

    assert probe_shape([CATALOG["small-qwen2"], CATALOG["tiny-qwen2-l4"], CATALOG["tiny-qwen2"]]) is CATALOG["tiny-qwen2"]
    assert probe_shape([]) is None
    assert feet(QUICK_CPU) == (0.0,) + tuple(float(f) for f in QUICK_CPU.gemm_footprints_mib)


def test_the_cost_model_scales_the_overheads_and_tail_only_at_the_models_footprint():
    base = load_profile("cpu")
    hot, cold = CostModel(CPU, base), CostModel(CPU, {**base, "kernels": {**(base.get("kernels") or {}), "cold_overheads": TABLE}})
    for name in ("tiny-qwen2", "small-qwen2-l2", "small-qwen2"):
        m = CATALOG[name]
        x = cpuhost.cold_factor(TABLE, fl.ShapeCoeffs.of(m, "float32", "lm").decode_weight_bytes)
        for rt in (None, "kv_decoder", "hf_generate"):
            for b in (1, 4):
                h = hot.decoder(m, "float32", runtime=rt).coeffs(b, 64 * b)
                c = cold.decoder(m, "float32", runtime=rt).coeffs(b, 64 * b)
                assert c[:4] == h[:4]   # the roofline's parts are the same
                d_h, d_c = hot.decoder(m, "float32", 1, rt), cold.decoder(m, "float32", 1, rt)
                fixed = d_h.over + d_h.tail0 + d_h.tail_row * b
                assert c[4] - h[4] == pytest.approx((x - 1.0) * fixed, rel=1e-9, abs=1e-15)
                # an explicit per-step overhead (a scenario's step_overhead_s) is taken as given; the tail still cools
                e_h = hot.decoder(m, "float32", runtime=rt).coeffs(b, 64 * b, 1e-3)[4]
                e_c = cold.decoder(m, "float32", runtime=rt).coeffs(b, 64 * b, 1e-3)[4]
                assert e_c - e_h == pytest.approx((x - 1.0) * (d_h.tail0 + d_h.tail_row * b), rel=1e-9, abs=1e-15)
                assert d_c.cold == pytest.approx(x)
        assert (x > 1.0) == (name != "tiny-qwen2")


def test_the_fit_recovers_the_hot_overheads_from_points_that_ran_cold():
    kern = {"cold_overheads": TABLE}
    tail = {"kv_decoder": {"sample_s": 3e-5, "sample_per_logit_s": 2e-9}}
    truth = OpParams(0.3, 0.5, 3e-4, 2e-4)
    pts = []
    for name in ("tiny-qwen2", "tiny-qwen2-l4", "tiny-qwen2-v8k", "small-qwen2-l2", "small-qwen2-l3-mha", "small-qwen2"):
        m = CATALOG[name]
        for b in (1, 4, 16):
            pt = {"op": "decode", "head": "lm", "dtype": "float32", "shape": m.to_dict(), "model": m.name, "batch": b,
                  "prefix_len": 64, "runtime": "kv_decoder"}
            pt = with_tails([pt], {}, kern)[0]
            tl = tail["kv_decoder"]["sample_s"] + tail["kv_decoder"]["sample_per_logit_s"] * b * m.vocab
            fc, fm, lay, _ = arrays([{**pt, "median_s": 1.0}], CPU)
            t = float(predict(fc, fm, lay, truth, overhead_x([pt]))[0]) + pt["cold_x"] * tl
            pts.append({**pt, "sampling_tail_s": tl, "tmean_s": t, "median_s": t})
    assert sorted({round(p["cold_x"], 3) for p in pts})[-1] > 1.4 and min(p["cold_x"] for p in pts) == 1.0
    # the tail taken off is the cold one
    p = pts[-1]
    assert fitted_value(p) == pytest.approx(point_value(p) - p["cold_x"] * p["sampling_tail_s"])
    got = fitted(pts, CPU, OpParams(0.5, 0.5, 1e-4, 1e-4))
    assert got["fit_mape"] < 0.01 and got["overhead_s"] == pytest.approx(3e-4, rel=0.05)
    assert got["overhead_per_layer_s"] == pytest.approx(2e-4, rel=0.05)
    blind = fitted([{k: v for k, v in q.items() if k != "cold_x"} for q in pts], CPU, OpParams(0.5, 0.5, 1e-4, 1e-4))
    assert blind["fit_mape"] > 5 * got["fit_mape"] and blind["heldout_mape_by_model"] > got["heldout_mape_by_model"]


@pytest.mark.parametrize("bad", [
    {"footprint_mib": [4.0, 0.0], "factor": [1.0, 1.2]},
    {"footprint_mib": [0.0, 4.0], "factor": [1.0, 0.8]},
    {"footprint_mib": [0.0, 4.0], "factor": [1.0]},
    {"footprint_mib": [0.0, 4.0], "factor": [1.0, float("nan")]},
    [1.0, 2.0],
])
def test_a_bad_table_is_refused_with_its_path(bad):
    doc = copy.deepcopy(load_profile("cpu"))
    doc["kernels"] = {**(doc.get("kernels") or {}), "cold_overheads": bad}
    with pytest.raises(ProfileError, match=r"p\.kernels\.cold_overheads: expected increasing footprint_mib"):
        validate_profile(doc, "p")
    assert np.isfinite(cpuhost.cold_factor(TABLE, 1.0))

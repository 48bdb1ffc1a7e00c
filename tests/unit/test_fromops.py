"""calibrate.fitting.fromops (kernel terms from Vidur-format per-operation measurements) and their use in the cost model
(rlhfsim.costs.byshape): parsing, the fits by hand, the curve and the fitted collectives in CostModel, the closed
decode sum, one-line errors, the bundled profiles and the sustained rates of the catalog."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from calibrate.fitting import fromops as fo
from rlhfsim.costs import flops as fl
from rlhfsim.costs.byshape import ShapeKernels, allreduce_terms
from rlhfsim.costs.model import LINK_EFF, LINK_LATENCY_S, CostModel, decode_sum, roofline
from rlhfsim.costs.profile import load_profile, validate_profile
from rlhfsim.fromrun.pool import base_for
from rlhfsim.errors import ProfileError
from rlhfsim.hardware.catalog import SUSTAINED, balance_ratio, carried_operations, get_gpu, stack_factor
from rlhfsim.models.catalog import load_model

ROOT = Path(__file__).resolve().parents[2]
SHAPE = {"n_head": 4, "n_kv_head": 2, "n_embd": 64, "n_expanded_embd": 128, "vocab_size": 1000, "use_gated_mlp": "True"}


def _mlp_csv(path: Path, rows: list[tuple[int, int, dict]]) -> Path:
    """An mlp.csv in Vidur's columns: (tokens, tp, {op: ms})."""
    ops = list(fo.GEMMS + fo.ELEMENTWISE)
    cols = [f"time_stats.{op}.median" for op in ops] + list(SHAPE) + ["num_tokens", "num_tensor_parallel_workers"]
    lines = [",".join(cols)]
    for tokens, tp, ms in rows:
        lines.append(",".join([str(ms.get(op, 0.01)) for op in ops] + [str(v) for v in SHAPE.values()] + [str(tokens), str(tp)]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _net_csv(path: Path, coll: str, rows: list[tuple[int, int, int, float]]) -> Path:
    """(rank, workers, size, ms) rows of an all_reduce.csv / send_recv.csv (one node)."""
    lines = [f",time_stats.{coll}.median,rank,num_workers,size,collective,devices_per_node,max_devices_per_node"]
    for i, (rank, n, size, ms) in enumerate(rows):
        lines.append(f"{i},{ms},{rank},{n},{size},{coll},{n},8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


# -- parsing -----------------------------------------------------------------------------------------------
def test_read_compute_parses_and_keeps_the_first_of_a_repeated_pair(tmp_path):
    f = _mlp_csv(tmp_path / "mlp.csv", [(1, 1, {"mlp_up_proj": 0.5}), (1, 1, {"mlp_up_proj": 9.0}), (16, 2, {})])
    rows = fo.read_compute(f, "org/m")
    assert [(r["tokens"], r["tp"]) for r in rows] == [(1, 1), (16, 2)]
    assert rows[0]["t_s"]["mlp_up_proj"] == pytest.approx(0.5e-3)
    assert rows[0]["gated"] is True and rows[0]["n_embd"] == 64 and rows[0]["model"] == "org/m"


def test_read_network_takes_the_slowest_rank(tmp_path):
    f = _net_csv(tmp_path / "all_reduce.csv", "all_reduce", [(0, 2, 2048, 0.010), (1, 2, 2048, 0.014)])
    (row,) = fo.read_network(f)
    assert (row["workers"], row["size"], row["t_s"]) == (2, 2048, pytest.approx(14e-6))


def test_gemm_work_counts_by_hand():
    r = {**{k: int(v) for k, v in SHAPE.items() if k not in ("use_gated_mlp", "vocab_size")}, "gated": True, "tokens": 8,
         "tp": 2, "t_s": {g: 1e-3 for g in fo.GEMMS}, "model": "m"}
    # head dim 16: qkv 64 x (4 + 4) x 16 / 2 = 64 x 64, o 32 x 64, up 64 x 128, down 64 x 64 (per GPU)
    assert fo.layer_gemms(r) == [(64, 64), (32, 64), (64, 128), (64, 64)]
    w = fo.gemm_work([r])
    s = 64 * 64 + 32 * 64 + 64 * 128 + 64 * 64
    assert w["s"][0] == s and w["flops"][0] == 2 * 8 * s and w["wbytes"][0] == 2 * s
    assert w["abytes"][0] == 2 * 8 * (128 + 96 + 192 + 128) and w["t"][0] == pytest.approx(4e-3)


@pytest.mark.parametrize("body, needle", [
    ("num_tokens\n1\n", "expected columns"),
    ("", "expected columns"),
])
def test_bad_compute_files_are_one_line(tmp_path, body, needle):
    f = tmp_path / "mlp.csv"
    f.write_text(body)
    with pytest.raises(fo.OpsError) as e:
        fo.read_compute(f)
    assert needle in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)


def test_a_bad_number_names_its_line_and_column(tmp_path):
    f = _mlp_csv(tmp_path / "mlp.csv", [(1, 1, {}), (2, 1, {"attn_pre_proj": "fast"})])
    with pytest.raises(fo.OpsError, match=r"line 3: time_stats.attn_pre_proj.median: expected a finite number >= 0, got 'fast'"):
        fo.read_compute(f)


def test_a_directory_without_data_and_an_unprofiled_gpu_are_one_line(tmp_path):
    with pytest.raises(fo.OpsError, match="expected <org>/<model>/mlp.csv files, got none"):
        fo.read_dir(tmp_path, "h100-sxm")
    with pytest.raises(fo.OpsError, match="expected a GPU that Vidur profiled"):
        fo.read_dir(tmp_path, "h200")


# -- the fits by hand ----------------------------------------------------------------------------------------
def test_linear_fit_on_three_points_recovers_latency_and_bandwidth():
    lat, bw = 20e-6, 300e9
    x = np.array([1e5, 1e6, 1e7])
    a, c = fo._linear_relative(x, lat + x / bw)
    assert a == pytest.approx(1 / bw, rel=1e-9) and c == pytest.approx(lat, rel=1e-9)


def test_collective_fit_by_hand_uses_ring_wire_bytes(tmp_path):
    n, lat, bw = 4, 30e-6, 200e9
    rows = [(0, n, s, 1e3 * (lat + 2 * (n - 1) / n * s / bw)) for s in (2048, 1 << 20, 1 << 25)]
    fit = fo.fit_collective(fo.read_network(_net_csv(tmp_path / "all_reduce.csv", "all_reduce", rows)), "all_reduce")
    p = fit["4"]
    assert p["latency_s"] == pytest.approx(lat, rel=1e-6) and p["bus_bw"] == pytest.approx(bw, rel=1e-6)
    assert p["heldout_mape"] < 1e-6 and p["n_points"] == 3


def test_eff_curve_rises_with_tokens_and_falls_for_small_shards():
    e = fo.eff_curve(np.array([1.0, 100.0, 10000.0]), 1e6, 0.8, 100.0, 1e5)
    assert e[0] < e[1] < e[2] < 0.8
    assert e[1] == pytest.approx(0.8 * 0.5 * 1e6 / 1.1e6)
    assert fo.eff_curve(100.0, 1e5, 0.8, 100.0, 1e5) < fo.eff_curve(100.0, 1e7, 0.8, 100.0, 1e5)


def test_gemm_fit_recovers_a_curve_it_generated():
    truth = {"e_max": 0.75, "m_half": 64.0, "s_half": 0.0, "weight_memory_eff": 0.85, "t0_gemm_s": 3e-6}
    m = np.array([1, 4, 16, 64, 128, 256, 512, 1024, 4096] * 2, float)
    s = np.array([2e7] * 9 + [5e7] * 9)
    w = {"m": m, "s": s, "flops": 2 * m * s, "wbytes": 2 * s, "abytes": 2 * m * 4e4, "tp": np.ones_like(m),
         "model": np.array(["a"] * 9 + ["b"] * 9)}
    peak, bw = 989e12, 3.35e12
    w["t"] = fo.predict_gemm(w, truth, peak, bw)
    got = fo.fit_gemm(w, peak, bw)
    assert got["e_max"] == pytest.approx(0.75, abs=0.011) and got["m_half"] == pytest.approx(64, rel=0.1)
    assert got["weight_memory_eff"] == pytest.approx(0.85, rel=1e-3) and got["t0_gemm_s"] == pytest.approx(3e-6, rel=1e-2)
    assert np.max(np.abs(fo.predict_gemm(w, got, peak, bw) / w["t"] - 1)) < 0.03


# -- the cost model's use -------------------------------------------------------------------------------------
SECTION = {"applies_to": ["prefill", "decode"],
           "gemm": {"e_max": 0.8, "m_half": 100.0, "s_half": 1e6, "weight_memory_eff": 0.9, "t0_gemm_s": 4e-6},
           "elementwise": {"memory_eff": 0.6, "floor_s": 10e-6}}
COLLECTIVES = {"all_reduce": {"by_workers": {"2": {"latency_s": 12e-6, "bus_bw": 250e9},
                                             "8": {"latency_s": 30e-6, "bus_bw": 350e9}}}}


def _default():
    return copy.deepcopy(load_profile("default"))


def _with(**sections):
    doc = _default()
    doc.update(sections)
    return validate_profile(doc)


def test_forward_is_priced_with_the_curve_by_hand():
    gpu, m = get_gpu("h100-sxm"), load_model("qwen2.5-1.5b", "m")
    cost = CostModel(gpu, _with(kernels_by_shape=SECTION))
    n, tp = 512.0, 1
    total, active = cost.forward(m, "bfloat16", n, 2.0, tp)
    shape = fl.ShapeCoeffs.of(m, "bfloat16", "value")
    w = shape.forward(n, 2.0)
    ks = ShapeKernels.of(cost.profile)
    e_c = 0.8 * n / (n + 100.0) * (m.layer_params / (m.layer_params + 1e6))
    mem = (shape.weight_bytes + (w.bytes - shape.weight_bytes) * 0.9 / 0.6) / (gpu.mem_bw * 0.9)
    kernel = max(w.flops / (gpu.peak("bfloat16") * e_c), mem) + m.layers * (4 * 4e-6 + 10e-6)
    p = cost.ops["prefill"]
    assert active == pytest.approx(kernel, rel=1e-12)
    assert total == pytest.approx(kernel + p.overhead_s + p.overhead_per_layer_s * m.layers, rel=1e-12)
    assert ks.applies("prefill") and ks.applies("decode:vllm") and not ks.applies("train")


def test_array_path_equals_scalar_path_with_the_curve():
    cost = CostModel(get_gpu("h100-sxm"), _with(kernels_by_shape=SECTION, collectives=COLLECTIVES))
    m = load_model("qwen2.5-7b", "m")
    ns = np.array([1.0, 17.0, 128.0, 300.0, 4096.0])
    for tp in (1, 2, 4):
        arr = cost.forward(m, "bfloat16", ns, 3.0, tp).total_s
        assert np.array_equal(arr, np.array([cost.forward(m, "bfloat16", x, 3.0, tp).total_s for x in ns]))


def test_decode_sum_stays_closed_form_with_the_curve():
    gpu, m = get_gpu("h100-sxm"), load_model("qwen2.5-7b", "m")
    cost = CostModel(gpu, _with(kernels_by_shape=SECTION, collectives=COLLECTIVES))
    batch, kv0, steps, tp = 48, 48 * 700.0, 900, 2
    coeffs = cost.decoder(m, "bfloat16", tp).coeffs(batch, kv0)
    c0, cs, u0, us, over = coeffs
    by_step = sum(max(c0 + cs * i, u0 + us * i) + over for i in range(steps))
    assert decode_sum(coeffs, steps)[0] == pytest.approx(by_step, rel=1e-12)
    # the step's GEMMs are at the efficiency of its rows, its attention at the sustained e_max (the attention's matmuls
    # run over the cached keys, not the batch's rows); the floor is on both lines
    k = fl.ShapeCoeffs.of(m, "bfloat16", "lm")
    e_c = 0.8 * batch / (batch + 100.0) * ((m.layer_params / tp) / (m.layer_params / tp + 1e6))
    floor = m.layers * (4 * 4e-6 + 10e-6)
    peak = tp * gpu.peak("bfloat16")
    assert c0 == pytest.approx((k.f_linear * batch + k.f_head * batch) / (peak * e_c) + k.f_attn * kv0 / (peak * 0.8) + floor)
    assert cs == pytest.approx(k.f_attn * batch / (peak * 0.8))
    many = cost.decoder(m, "bfloat16", tp).coeffs(np.array([batch, 3]), np.array([kv0, 10.0]))
    assert many[0][0] == c0 and many[2][0] == u0


def test_tp_all_reduce_uses_the_fitted_collective():
    m = load_model("qwen2.5-7b", "m")
    cost = CostModel(get_gpu("h100-sxm"), _with(collectives=COLLECTIVES))
    nbytes = fl.tp_allreduce_bytes(m, "bfloat16", 64.0, 8)
    assert cost._tp_comm_s(m, "bfloat16", 64.0, 8) == pytest.approx(nbytes / 350e9 + 2 * m.layers * 30e-6)
    # 4 workers not measured: the nearest count on a log scale, ties to the larger (2 and 8 are equally far)
    assert allreduce_terms(COLLECTIVES, 4) == (30e-6, 350e9) and allreduce_terms(COLLECTIVES, 3) == (12e-6, 250e9)
    assert allreduce_terms({}, 4) is None


def test_profiles_without_the_sections_price_as_before():
    gpu, m = get_gpu("h100-sxm"), load_model("qwen2.5-7b", "m")
    doc = _default()
    doc.pop("collectives", None)   # the bundled default carries a small-message floor only (test_collective_floor)
    cost = CostModel(gpu, doc)
    assert cost.by_shape is None and cost.collectives == {}
    w = fl.ShapeCoeffs.of(m, "bfloat16", "value").forward(1000.0, 4.0)
    total, _ = roofline(w, cost.ops["prefill"], gpu.peak("bfloat16"), gpu.mem_bw, 4)
    comm = fl.tp_allreduce_bytes(m, "bfloat16", 1000.0, 4) / (gpu.intra_node_bw * LINK_EFF) + 2 * m.layers * LINK_LATENCY_S
    assert cost.forward(m, "bfloat16", 1000.0, 4.0, 4).total_s == total + comm


@pytest.mark.parametrize("mutate, path", [
    (lambda d: d["kernels_by_shape"]["gemm"].update(e_max=0), "kernels_by_shape.gemm.e_max"),
    (lambda d: d["kernels_by_shape"]["gemm"].update(m_half=-1), "kernels_by_shape.gemm.m_half"),
    (lambda d: d["kernels_by_shape"]["elementwise"].pop("floor_s"), "kernels_by_shape.elementwise.floor_s"),
    (lambda d: d["kernels_by_shape"].update(applies_to=[]), "kernels_by_shape.applies_to"),
    (lambda d: d["collectives"]["all_reduce"]["by_workers"]["2"].update(bus_bw=0), "collectives.all_reduce.by_workers.2.bus_bw"),
    (lambda d: d["collectives"]["all_reduce"]["by_workers"].update({"one": {}}), "collectives.all_reduce.by_workers"),
])
def test_bad_sections_are_one_line_profile_errors(mutate, path):
    doc = _default()
    doc["kernels_by_shape"], doc["collectives"] = copy.deepcopy(SECTION), copy.deepcopy(COLLECTIVES)
    mutate(doc)
    with pytest.raises(ProfileError) as e:
        validate_profile(doc)
    assert path in str(e.value) and "\n" not in str(e.value)


# -- bundled profiles, the CLI, the catalog -----------------------------------------------------------------
@pytest.mark.parametrize("name", ["h100-sxm", "a100-80gb"])
def test_bundled_profiles_carry_provenance_and_held_out_errors(name):
    doc = load_profile(name)
    sec = doc["kernels_by_shape"]
    assert doc["gpu"] == name and doc["extends_chain"]
    # every operation the default has, as it has it (its efficiencies carried to the profile's GPU: costs.profile.extend),
    # once the terms fitted to public logs are taken back (each with its record)
    assert base_for(name)["operations"] == carried_operations(load_profile("default")["operations"], "h100-sxm", name)
    assert all(rec["determined_by"] or rec["at_bound"] for rec in (doc.get("from_logs") or {}).values())
    assert sec["source"]["repository"] == "microsoft/vidur" and len(sec["source"]["commit"]) == 40
    assert sec["source"]["license"] == "MIT"
    assert 0 < sec["gemm"]["heldout_mape"] < 0.10 and 0 < sec["elementwise"]["heldout_mape"] < 0.25
    assert {"2", "4", "8"} <= set(doc["collectives"]["all_reduce"]["by_workers"])


def test_auto_profile_takes_the_architectures_curves_and_says_so():
    cost = CostModel.load(get_gpu("h200"), "auto")
    assert cost.name == "h100-sxm" and "h200's datasheet peaks" in cost.profile["provenance"]["source"]
    assert CostModel.load(get_gpu("h100-sxm"), "auto").profile["provenance"]["source"] == "public"
    assert CostModel.load(get_gpu("l4"), "auto").name == "public"   # no profile of its own: the public logs' host terms
    # a GPU scenario without --profile gets its GPU's own (docs/accuracy.md, "GPU: public runs"); default by name
    assert CostModel.load(get_gpu("h100-sxm")).name == "h100-sxm"
    assert CostModel.load(get_gpu("h100-sxm"), "default").name == "default"


def test_sustained_rates_scale_a_derived_profile_on_another_stack():
    assert stack_factor("h100-sxm") == 1.0 and stack_factor("a100-80gb") == 1.0
    f = stack_factor("mi300x")
    assert f == pytest.approx((668.4 / 1307.4) / (794.5 / 989.0))
    assert all(s.source for s in SUSTAINED.values())
    cost = CostModel.load(get_gpu("mi300x"), "default")
    # the stack scales the GEMMs of a pass, the GPU's balance the rest (catalog.carried_compute_eff)
    e_g = 794.5 / 989.0
    want = 1 / (1 / (e_g * f) + balance_ratio("mi300x") * (1 / 0.55 - 1 / e_g))
    assert cost.ops["prefill"].compute_eff == pytest.approx(want)
    assert "carried to mi300x (stack x0.64" in cost.profile["provenance"]["source"]


def test_cli_from_ops_writes_a_profile_and_fails_in_one_line(tmp_path):
    data = tmp_path / "vidur"
    for model, scale in (("org/a", 1.0), ("org/b", 2.0)):
        rows = []
        for tp in (1, 2):
            for n in (1, 4, 16, 64, 256, 1024, 4096):
                rows.append((n, tp, {g: scale * (0.01 + n * 2e-5) / tp for g in fo.GEMMS} |
                             {e: 0.002 + n * 1e-6 for e in fo.ELEMENTWISE}))
        _mlp_csv(data / "compute" / "h100" / model / "mlp.csv", rows)
    _net_csv(data / "network" / "h100_dgx" / "all_reduce.csv", "all_reduce",
             [(0, 2, s, 0.01 + s / 2e8) for s in (2048, 1 << 16, 1 << 20, 1 << 24)])
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "rlhfsim.cli", "calibrate", "--from-ops", str(data), "--gpu", "h100-sxm",
                        "-o", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    doc = load_profile(str(out / "profile.json"))
    assert doc["kernels_by_shape"]["gemm"]["n_points"] == 28 and "2" in doc["collectives"]["all_reduce"]["by_workers"]
    bad = subprocess.run([sys.executable, "-m", "rlhfsim.cli", "calibrate", "--from-ops", str(tmp_path / "none"),
                          "--gpu", "h100-sxm"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "mlp.csv" in bad.stderr


def test_fit_on_the_public_h100_data_holds_out():
    fit = fo.fit_all(ROOT / "calibrate" / "public" / "vidur", "h100-sxm")
    assert fit["gemm_heldout"][0] < 0.08 and len(fit["models"]) == 6
    rat = fo.ratios(fit, load_profile("default")["operations"])
    after = [r["after"] for r in rat["gemm_layer"] if r["tp"] == "all"]
    assert all(0.9 < a < 1.1 for a in after)


def test_runtimes_prints_the_terms_with_provenance():
    r = subprocess.run([sys.executable, "-m", "rlhfsim.cli", "runtimes", "--profile", "h100-sxm"], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "microsoft/vidur@7d47513363ec (MIT)" in r.stdout and "all_reduce over 8 GPUs" in r.stdout

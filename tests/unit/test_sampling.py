"""The two terms of a decode step the roofline cannot carry. The sampling tail (``calibrate.measuring.sampling``):
its points are journaled per runtime and resumed, its fit recovers a line, the roofline fits take it off
each generation point and keep the whole time in their held-out error, the simulator adds it back per
decode step and per prefill call (and never to a scoring pass), a runtime without a tail of its own takes
the right one. The GEMM weight passes (``calibrate.cpu.gemm``): measured as a ratio, counted by decode steps of
two rows or more only, in the fit and the simulator alike. The training rate by width
(``calibrate.cpu.widths``): measured per layer, dividing the body FLOPs of a training pass. ``calibrate.running.extend
--cost-terms`` upgrades a measured profile with all three."""

from __future__ import annotations

import copy
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from calibrate.fitting.assemble import sampling_summary, with_tails  # noqa: E402
from calibrate.fitting.fit import TAIL_FLOOR, fit_operation, fitted_value, point_value  # noqa: E402
from calibrate.running.grid import QUICK_CPU, with_overrides  # noqa: E402
from calibrate.running.journal import Journal, with_points  # noqa: E402
from calibrate.running.progress import Progress  # noqa: E402
from calibrate.measuring.sampling import fit_tail, measure_sampling, plan_size, sampled_runtimes  # noqa: E402
from calibrate.running.session import Session  # noqa: E402
from rlhfsim.costs import cpuhost  # noqa: E402
from rlhfsim.costs.genruntimes import sample_tail  # noqa: E402
from rlhfsim.costs.model import CostModel, OpParams  # noqa: E402
from rlhfsim.costs.profile import load_profile  # noqa: E402
from rlhfsim.errors import RlhfsimError  # noqa: E402
from rlhfsim.hardware.catalog import get_gpu  # noqa: E402
from rlhfsim.models.catalog import CATALOG  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it

META = {"device_kind": "cpu", "device_name": "test", "dtype": "float32", "threads": 1}
GRID = {"sampling": [[1, 512], [4, 512], [1, 4096], [4, 4096]], "warmup": 0, "min_iters": 2, "max_iters": 3,
        "point_budget_s": 0.0, "quiet_wait_s": 0.0}
CPU = get_gpu("cpu")


@pytest.fixture(scope="module")
def journaled(tmp_path_factory):
    path = tmp_path_factory.mktemp("sampling") / "s.journal.jsonl"
    grid = with_overrides(QUICK_CPU, GRID)
    rts = ["hf_generate", "hf_static", "kv_decoder", "vllm"]
    with Journal.open(path, META, resume=False) as j:
        s = Session("cpu", "float32", grid, j, Progress(plan_size(grid, rts), enabled=False), path.parent)
        measure_sampling(s, rts)
        assert s.progress.done == plan_size(grid, rts) == 12    # hf_generate's points twice: plain, recorded
        records = list(j.records)
    return path, grid, rts, records


def test_points_per_runtime_with_a_sampler_of_its_own(journaled):
    _, _, rts, records = journaled
    assert sampled_runtimes(rts) == ["hf_generate", "kv_decoder"]    # hf_static shares; vllm samples inside
    pts = [r for r in records if r.get("kind") == "point"]
    assert sorted((p["runtime"], p["batch"], p["vocab"], p.get("logprobs", False)) for p in pts) == sorted(
        [(rt, b, v, False) for rt in ("hf_generate", "kv_decoder") for b, v in GRID["sampling"]]
        + [("hf_generate", b, v, True) for b, v in GRID["sampling"]])     # the executor's recorder: hf_generate only
    assert all(p["op"] == "sample" and p["tmean_s"] > 0 and p["logits"] == p["batch"] * p["vocab"] for p in pts)
    hooked = [p for p in pts if p["runtime"] == "hf_generate"]
    assert all(p["steps"] == 8 and "between forwards" in p["timed"] for p in hooked)
    assert all(("LogprobRecorder" in p["timed"]) == bool(p.get("logprobs")) for p in hooked)
    assert len({p["key"] for p in hooked}) == 8


def test_a_resume_measures_nothing_again(journaled, tmp_path, monkeypatch):
    path, grid, rts, records = journaled
    copy_path = tmp_path / "c.journal.jsonl"
    copy_path.write_bytes(path.read_bytes())
    import calibrate.measuring.sampling as sm

    def boom(*a, **k):
        raise AssertionError("a journaled point was measured again")

    monkeypatch.setattr(sm, "sample_next", boom)
    monkeypatch.setattr(sm, "_hooked", boom)
    with Journal.open(copy_path, META, resume=True) as j:
        s = Session("cpu", "float32", grid, j, Progress(plan_size(grid, rts), enabled=False), tmp_path)
        measure_sampling(s, rts)
        assert len(j.records) == len(records) and s.progress.done == plan_size(grid, rts)


def _without_tails(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    for info in doc["generation"].values():
        for k in ("sample_s", "sample_per_logit_s", "sampling"):
            info.pop(k, None)
    doc.pop("kernels", None)
    return doc


def _passes_only(table: dict) -> dict:
    """A footprint table without its one-row rates (the made-up timings of a passes test are no rates)."""
    return {k: v for k, v in table.items() if k not in ("gb_s_1row", "ratios")}


def _pt(rows, vocab, t, rt="kv_decoder"):
    return {"op": "sample", "runtime": rt, "batch": rows, "vocab": vocab, "tmean_s": t, "median_s": t}


def test_fit_recovers_a_line_keeps_both_terms_non_negative_and_reports_heldout_error():
    pts = [_pt(r, v, 3e-5 + 2e-8 * r * v) for r in (1, 4, 16) for v in (1024, 8192)]
    fit = fit_tail(pts, point_value)
    assert fit["sample_s"] == pytest.approx(3e-5, rel=1e-6) and fit["sample_per_logit_s"] == pytest.approx(2e-8, rel=1e-6)
    assert fit["fit_mape"] < 1e-9 and fit["heldout_mape"] < 1e-6 and fit["n_points"] == 6
    flat = fit_tail([_pt(1, 1024, 2e-3), _pt(16, 8192, 1e-3)], point_value)     # falling: no negative slope
    assert flat["sample_per_logit_s"] == 0.0 and flat["sample_s"] > 0 and flat["heldout_mape"] is None
    assert fit_tail([_pt(1, 1024, 1e-3)], point_value) is None


def test_generation_points_are_fitted_less_their_tail_and_judged_on_the_whole_time():
    shapes = [CATALOG[n] for n in ("tiny-qwen2", "small-qwen2", "tiny-qwen2-l4", "small-qwen2-l2",
                                   "small-qwen2-l3-mha", "tiny-qwen2-v8k")]
    tail = (5e-5, 2e-8)
    prof = CostModel(CPU, _without_tails(load_profile("cpu")))
    points = []
    for m in shapes:          # decode points made from a known roofline plus a known tail
        for b, c in ((1, 64), (4, 256), (16, 64), (16, 512)):
            t = prof.decode_steps(m, "float32", b, b * c, 1).total_s + tail[0] + tail[1] * b * m.vocab
            points.append({"op": "decode", "model": m.name, "shape": m.to_dict(), "dtype": "float32", "head": "lm",
                           "batch": b, "prefix_len": c, "tokens": b, "tmean_s": t, "median_s": t})
    samples = [_pt(r, v, tail[0] + tail[1] * r * v) for r in (1, 16) for v in (1024, 16384)]
    tails = sampling_summary(samples)
    tagged = with_tails(points + samples, tails)
    for p in tagged:
        if p["op"] == "decode":
            assert p["sampling_tail_s"] == pytest.approx(tail[0] + tail[1] * p["batch"] * p["shape"]["vocab"])
            assert fitted_value(p) == pytest.approx(point_value(p) - p["sampling_tail_s"])
    floor = {**tagged[0], "sampling_tail_s": 10 * point_value(tagged[0])}
    assert fitted_value(floor) == pytest.approx(TAIL_FLOOR * point_value(floor))
    prior = OpParams.from_dict(load_profile("default")["operations"]["decode"])
    with_tail = fit_operation([p for p in tagged if p["op"] == "decode"], CPU, prior, bootstrap=0)
    without = fit_operation(points, CPU, prior, bootstrap=0)
    # the tail is rows x vocab, which no roofline term carries: taking it off fits better across models
    assert with_tail["fit_mape"] < 2e-3 < 10 * 2e-3 < without["fit_mape"]
    assert with_tail["heldout_mape_by_model"] < 0.5 * without["heldout_mape_by_model"]


def _profile_with(base: dict, tails: dict) -> dict:
    doc = copy.deepcopy(base)
    for rt, (a, b) in tails.items():
        doc["generation"].setdefault(rt, {}).update(sample_s=a, sample_per_logit_s=b)
    return doc


def test_simulator_adds_the_tail_per_decode_step_and_per_prefill_call_never_to_scoring():
    base = _without_tails(load_profile("cpu"))
    a, b = 4e-4, 3e-8
    m = CATALOG["small-qwen2"]
    c0, c1 = CostModel(CPU, base), CostModel(CPU, _profile_with(base, {"hf_generate": (a, b)}))
    for batch in (1, 8):
        d = c1.decode_steps(m, "float32", batch, batch * 100, 10, runtime="hf_generate").total_s - \
            c0.decode_steps(m, "float32", batch, batch * 100, 10, runtime="hf_generate").total_s
        assert d == pytest.approx(10 * (a + b * batch * m.vocab), rel=1e-9)
        # a scenario's own per-step overhead replaces the fitted overhead, not the measured tail
        d2 = c1.decode_steps(m, "float32", batch, batch * 100, 10, overhead_s=0.0, runtime="hf_generate").total_s - \
            c0.decode_steps(m, "float32", batch, batch * 100, 10, overhead_s=0.0, runtime="hf_generate").total_s
        assert d2 == pytest.approx(d, rel=1e-9)
        p = c1.forward(m, "float32", batch * 64, batch, head="lm", gen_runtime="hf_generate").total_s - \
            c0.forward(m, "float32", batch * 64, batch, head="lm", gen_runtime="hf_generate").total_s
        assert p == pytest.approx(a + b * batch * m.vocab, rel=1e-9)
    # scoring and log-prob passes do not sample
    assert c1.forward(m, "float32", 512, 8, head="lm", all_logits=True).total_s == c0.forward(m, "float32", 512, 8, head="lm", all_logits=True).total_s
    assert c1.forward(m, "float32", 512, 8).total_s == c0.forward(m, "float32", 512, 8).total_s
    # kv_decoder (plain) steps are unchanged: hf_generate's tail is its own
    assert c1.decode_steps(m, "float32", 8, 800, 10).total_s == c0.decode_steps(m, "float32", 8, 800, 10).total_s


def test_which_tail_a_runtime_takes():
    gen = {"kv_decoder": {"sample_s": 1.0, "sample_per_logit_s": 2.0},
           "hf_generate": {"sample_s": 3.0, "sample_per_logit_s": 4.0}, "hf_static": {}}
    assert sample_tail("hf_generate", gen, True) == (3.0, 4.0)
    assert sample_tail("hf_static", gen, True) == (3.0, 4.0)        # the same generate() loop
    assert sample_tail(None, gen, False) == (1.0, 2.0)              # the plain operations: kv_decoder's
    assert sample_tail("kv_decoder", gen, True) == (1.0, 2.0)
    assert sample_tail("vllm", gen, False) == (1.0, 2.0)            # priced by the plain ops: their tail
    assert sample_tail("vllm", gen, True) == (0.0, 0.0)             # its own ops carry its sampler
    assert sample_tail("hf_generate", {}, True) == (0.0, 0.0)       # a profile from before the tail


def test_grid_sampling_override_is_checked():
    assert with_overrides(QUICK_CPU, {"sampling": []}).sampling == ()
    with pytest.raises(RlhfsimError, match=r"grid.sampling: expected a list of \[rows, vocabulary\]"):
        with_overrides(QUICK_CPU, {"sampling": [[4]]})


def test_gemm_passes_are_measured_as_a_ratio_and_counted_only_from_two_rows(tmp_path):
    from calibrate.cpu.gemm import gemm_summary, measure_gemm, plan_size as gemm_size
    from rlhfsim.costs import flops as fl

    grid = with_overrides(QUICK_CPU, {**GRID, "gemm": [[1, 256, 64], [2, 256, 64], [4, 256, 64]], "gemm_footprints_mib": []})
    with Journal.open(tmp_path / "g.journal.jsonl", META, resume=False) as j:
        s = Session("cpu", "float32", grid, j, Progress(gemm_size(grid), enabled=False), tmp_path)
        measure_gemm(s)
        pts = [r for r in j.records if r.get("kind") == "point"]
    assert sorted(p["batch"] for p in pts) == [1, 2, 4] and all(p["weight_bytes"] == 256 * 64 * 4 for p in pts)
    summ = gemm_summary(pts, point_value)
    assert summ["gemm_weight_passes"] >= 1.0 and len(summ["ratios"]) == 2
    made = [{"op": "gemm", "batch": r, "out_features": 8, "in_features": 8, "tmean_s": t, "median_s": t}
            for r, t in ((1, 1.0), (2, 1.9), (4, 2.1), (8, 0.5))]
    assert gemm_summary(made, point_value)["gemm_weight_passes"] == pytest.approx(1.9)   # median of 1.9, 2.1, 0.5
    assert gemm_summary(made[1:], point_value) is None                                  # no 1-row point
    m = CATALOG["small-qwen2"]
    k = fl.ShapeCoeffs.of(m, "float32", "lm")
    assert fl.decode_step_work(m, "float32", 1, 64, 1.0, 2.0).bytes == k.decode(1, 64).bytes   # a GEMV: once
    two = fl.decode_step_work(m, "float32", 4, 256, 1.0, 2.0).bytes - k.decode(4, 256).bytes
    assert two == pytest.approx(k.weight_bytes)                                                # packed: twice
    import numpy as np
    assert list(fl.gemm_passes(np.array([1.0, 2.0, 16.0]), 1.7)) == [1.0, 1.7, 1.7]
    base = _without_tails(load_profile("cpu"))
    c0, c1 = CostModel(CPU, base), CostModel(CPU, {**base, "kernels": {"gemm_weight_passes": 2.0}})
    assert c1.decode_steps(m, "float32", 1, 64, 5).total_s == c0.decode_steps(m, "float32", 1, 64, 5).total_s
    assert c1.decode_steps(m, "float32", 4, 1024, 5).total_s > c0.decode_steps(m, "float32", 4, 1024, 5).total_s
    from rlhfsim.costs.profile import ProfileError, validate_profile
    with pytest.raises(ProfileError, match="kernels.gemm_weight_passes: expected a finite number >= 1"):
        validate_profile({**base, "kernels": {"gemm_weight_passes": 0.5}}, "p")


def test_gemm_passes_by_footprint_are_measured_over_copies_and_priced_at_the_models_footprint(tmp_path):
    """``gemm_footprints_mib``: each matrix again, cycled through distinct copies adding up to each footprint;
    the table is the per-footprint median ratio, interpolated in log footprint and held at the ends, and a
    decode step of >= 2 rows counts the weights at its model's footprint (fit points alike)."""
    from calibrate.fitting.assemble import kernels_summary, with_tails
    from calibrate.cpu.gemm import gemm_summary, measure_gemm, plan_size as gemm_size
    from rlhfsim.costs.profile import ProfileError, validate_profile

    grid = with_overrides(QUICK_CPU, {**GRID, "gemm": [[1, 256, 64], [2, 256, 64]], "gemm_footprints_mib": [1, 2]})
    assert gemm_size(grid) == 6
    with Journal.open(tmp_path / "f.journal.jsonl", META, resume=False) as j:
        s = Session("cpu", "float32", grid, j, Progress(gemm_size(grid), enabled=False), tmp_path)
        measure_gemm(s)
        pts = [r for r in j.records if r.get("kind") == "point"]
    feet = sorted((p.get("footprint_mib") or 0, p.get("copies") or 1, p["batch"]) for p in pts)
    assert feet == [(0, 1, 1), (0, 1, 2), (1, 16, 1), (1, 16, 2), (2, 32, 1), (2, 32, 2)]   # 64 KiB matrix
    by = gemm_summary(pts, point_value)["by_footprint"]
    assert by["footprint_mib"] == [1.0, 2.0] and all(p >= 1.0 for p in by["passes"]) and len(by["ratios"]) == 2
    made = [{"op": "gemm", "batch": r, "out_features": 8, "in_features": 8, "weight_bytes": 256, "footprint_mib": f,
             "copies": 4, "tmean_s": t, "median_s": t} for f, r, t in ((4, 1, 1.0), (4, 2, 2.0), (16, 1, 1.0), (16, 2, 1.2))]
    table = gemm_summary(made + [{**made[0], "footprint_mib": None}, {**made[1], "footprint_mib": None}],
                         point_value)["by_footprint"]
    assert table["passes"] == pytest.approx([2.0, 1.2])
    mib = 2**20
    assert cpuhost.footprint_passes(table, 3.0, 4 * mib) == pytest.approx(2.0)
    assert cpuhost.footprint_passes(table, 3.0, 8 * mib) == pytest.approx(1.6)      # halfway in log footprint
    assert cpuhost.footprint_passes(table, 3.0, 1 * mib) == 2.0 and cpuhost.footprint_passes(table, 3.0, 64 * mib) == 1.2
    assert cpuhost.footprint_passes(None, 3.0, 64 * mib) == 3.0                    # no table: the scalar
    m = CATALOG["small-qwen2"]                                                # 18.5 MiB of float32 weights
    base = _without_tails(load_profile("cpu"))
    scalar = CostModel(CPU, {**base, "kernels": {"gemm_weight_passes": 2.0}})
    by_foot = CostModel(CPU, {**base, "kernels": {"gemm_weight_passes": 2.0, "gemm_passes_by_footprint": _passes_only(table)}})
    assert by_foot.decode_steps(m, "float32", 1, 64, 5).total_s == scalar.decode_steps(m, "float32", 1, 64, 5).total_s
    assert by_foot.decode_steps(m, "float32", 4, 1024, 5).total_s < scalar.decode_steps(m, "float32", 4, 1024, 5).total_s
    kern = kernels_summary(made + [{**made[0], "footprint_mib": None}, {**made[1], "footprint_mib": None}])
    assert kern["gemm_passes_by_footprint"]["passes"] == pytest.approx([2.0, 1.2])
    point = {"op": "decode", "head": "lm", "dtype": "float32", "batch": 4, "shape": m.to_dict(), "model": m.name}
    assert with_tails([point], {}, kern)[0]["gemm_weight_passes"] == pytest.approx(1.2)
    bad = {**base, "kernels": {"gemm_weight_passes": 2.0, "gemm_passes_by_footprint": {"footprint_mib": [16, 4], "passes": [1, 2]}}}
    with pytest.raises(ProfileError, match="kernels.gemm_passes_by_footprint: expected increasing footprint_mib"):
        validate_profile(bad, "p")


def test_gemm_passes_by_rows_grow_from_one_pass_at_one_row():
    """``by_rows``: the footprint table's passes per row count (median over matrices); a decode step's passes
    interpolate linearly in rows from 1 at one row to the measured row counts and hold beyond the last, at
    the model's footprint; a fit point gets the passes at its own rows; a bad table is refused."""
    import numpy as np

    from calibrate.fitting.assemble import kernels_summary, with_tails
    from calibrate.cpu.gemm import gemm_summary
    from rlhfsim.costs import flops as fl
    from rlhfsim.costs.profile import ProfileError, validate_profile

    made = [{"op": "gemm", "batch": r, "out_features": o, "in_features": 8, "weight_bytes": 256, "footprint_mib": f,
             "copies": 4, "tmean_s": t, "median_s": t}
            for f, o, r, t in ((4, 8, 1, 1.0), (4, 8, 2, 1.8), (4, 8, 4, 2.8), (4, 16, 1, 1.0), (4, 16, 2, 2.0), (4, 16, 4, 3.0),
                               (16, 8, 1, 1.0), (16, 8, 2, 1.2), (16, 8, 4, 1.4), (16, 16, 1, 1.0), (16, 16, 2, 1.2), (16, 16, 4, 1.4))]
    by = gemm_summary(made + [{**made[0], "footprint_mib": None}, {**made[1], "footprint_mib": None}], point_value)["by_footprint"]
    assert by["by_rows"]["rows"] == [2, 4]
    assert np.allclose(by["by_rows"]["passes"], [[1.9, 1.2], [2.9, 1.4]])     # medians over the two matrices
    assert by["passes"] == pytest.approx([2.4, 1.3])                          # the old one-number table is kept
    mib = 2**20
    rows, passes = cpuhost.footprint_passes(by, 3.0, 4 * mib)
    assert rows == (1.0, 2.0, 4.0) and passes == pytest.approx((1.0, 1.9, 2.9))
    assert cpuhost.footprint_passes(by, 3.0, 8 * mib)[1] == pytest.approx((1.0, 1.55, 2.15))   # halfway in log footprint
    table = cpuhost.footprint_passes(by, 3.0, 4 * mib)
    assert fl.gemm_passes(1, table) == 1.0 and fl.gemm_passes(2, table) == pytest.approx(1.9)
    assert fl.gemm_passes(3, table) == pytest.approx(2.4) and fl.gemm_passes(16, table) == pytest.approx(2.9)
    assert list(fl.gemm_passes(np.array([1.0, 1.5, 4.0, 8.0]), table)) == pytest.approx([1.0, 1.45, 2.9, 2.9])
    assert cpuhost.passes_at(table, 2) == pytest.approx(1.9) and cpuhost.passes_at(2.5, 2) == 2.5
    m = CATALOG["tiny-qwen2"]                                                 # 2.4 MiB of float32 weights: held at 4 MiB
    base = _without_tails(load_profile("cpu"))
    kern = kernels_summary(made + [{**made[0], "footprint_mib": None}, {**made[1], "footprint_mib": None}])
    kern["gemm_passes_by_footprint"] = _passes_only(kern["gemm_passes_by_footprint"])
    rowwise = CostModel(CPU, {**base, "kernels": kern})
    flat = CostModel(CPU, {**base, "kernels": {**kern, "gemm_passes_by_footprint": {
        k: v for k, v in kern["gemm_passes_by_footprint"].items() if k != "by_rows"}}})
    assert rowwise.decode_steps(m, "float32", 1, 64, 5).total_s == flat.decode_steps(m, "float32", 1, 64, 5).total_s
    assert rowwise.decode_steps(m, "float32", 2, 128, 5).total_s < flat.decode_steps(m, "float32", 2, 128, 5).total_s   # 1.9 < 2.4
    assert rowwise.decode_steps(m, "float32", 8, 512, 5).total_s > flat.decode_steps(m, "float32", 8, 512, 5).total_s   # 2.9 > 2.4
    point = {"op": "decode", "head": "lm", "dtype": "float32", "shape": m.to_dict(), "model": m.name}
    got = [p["gemm_weight_passes"] for p in with_tails([{**point, "batch": b} for b in (1, 2, 16)], {}, kern)]
    assert got == pytest.approx([1.0, 1.9, 2.9])
    bad = {**kern["gemm_passes_by_footprint"], "by_rows": {"rows": [4, 2], "passes": [[2, 1], [3, 1]]}}
    with pytest.raises(ProfileError, match="by_rows: increasing rows >= 2"):
        validate_profile({**base, "kernels": {**kern, "gemm_passes_by_footprint": bad}}, "p")
    validate_profile({**base, "kernels": kern}, "p")


def test_decode_weights_stream_no_faster_than_the_footprint_sweep_measured():
    """``gb_s_1row``: per footprint, the median over matrices (each counted once, whatever its row counts) of
    the one-row rate; interpolated in log footprint and held at the ends (``flops.footprint_rate``). A decode
    step whose footprint streams slower than the decode fit's bandwidth prices its weights at that rate, in
    the simulator and in the fit (``calibrate.fitting.assemble.fitted`` iterates the factor with the fitted
    ``memory_eff`` and recovers it); a model below the crossover is priced as before; a bad table is refused."""
    from calibrate.fitting.assemble import fitted
    from calibrate.fitting.fit import arrays, predict
    from calibrate.cpu.gemm import gemm_summary
    from rlhfsim.costs import flops as fl
    from rlhfsim.costs.profile import ProfileError, validate_profile
    from rlhfsim.models.catalog import ModelShape

    mib = 2**20
    # per footprint two matrices of 1 MiB cycled over its copies; one-row rates 60/70 GB/s at 4 MiB, 8/10 at 64
    made = [{"op": "gemm", "batch": r, "out_features": o, "in_features": 8, "weight_bytes": mib, "footprint_mib": f,
             "copies": f, "tmean_s": t1 * x, "median_s": t1 * x}
            for f, o, gb in ((4, 8, 60.0), (4, 16, 70.0), (64, 8, 8.0), (64, 16, 10.0))
            for t1 in (f * mib / (gb * 1e9),) for r, x in ((1, 1.0), (2, 1.5), (4, 2.0))]
    by = gemm_summary(made + [{**made[0], "footprint_mib": None}, {**made[1], "footprint_mib": None}], point_value)["by_footprint"]
    assert by["gb_s_1row"] == pytest.approx([65.0, 9.0])
    assert cpuhost.footprint_rates(_passes_only(by)) is None
    assert cpuhost.footprint_rates({k: v for k, v in by.items() if k != "gb_s_1row"}) == pytest.approx([65.0, 9.0])   # an older table's
    assert cpuhost.footprint_rate(by, 4 * mib) == pytest.approx(65e9) and cpuhost.footprint_rate(by, 1 * mib) == pytest.approx(65e9)
    assert cpuhost.footprint_rate(by, 16 * mib) == pytest.approx(37e9) and cpuhost.footprint_rate(by, 256 * mib) == pytest.approx(9e9)
    assert cpuhost.footprint_rate(None, 4 * mib) is None and cpuhost.stream_factor(None, 20e9) == 1.0
    assert cpuhost.stream_factor(9e9, 18e9) == pytest.approx(2.0) and cpuhost.stream_factor(65e9, 18e9) == 1.0

    base = _without_tails(load_profile("cpu"))
    kern = {"gemm_weight_passes": 1.5, "gemm_passes_by_footprint": by}
    capped = CostModel(CPU, {**base, "kernels": kern})
    plain = CostModel(CPU, {**base, "kernels": {**kern, "gemm_passes_by_footprint": _passes_only(by)}})
    bw = CPU.mem_bw * capped.ops["decode"].memory_eff
    assert 9e9 < bw < 37e9   # the test's premise: the fit's bandwidth between the in-cache and the streamed rates
    small, big = CATALOG["tiny-qwen2"], ModelShape(name="big", arch="decoder", layers=4, hidden=512, intermediate=2048,
                                                    heads=8, kv_heads=8, vocab=8192, tied_embeddings=True)
    wbig = fl.ShapeCoeffs.of(big, "float32", "lm").decode_weight_bytes
    assert wbig > 32 * mib
    for b in (1, 4):
        assert capped.decoder(small, "float32").coeffs(b, 64 * b) == plain.decoder(small, "float32").coeffs(b, 64 * b)
        u_capped, u_plain = capped.decoder(big, "float32").coeffs(b, 64 * b)[2], plain.decoder(big, "float32").coeffs(b, 64 * b)[2]
        w = wbig * cpuhost.passes_at(cpuhost.footprint_passes(by, 1.5, wbig), b)
        assert u_capped - u_plain == pytest.approx(w / cpuhost.footprint_rate(by, wbig) - w / bw, rel=1e-9)

    # the fit: points made by the capped price of known parameters are fitted back, the big model's streamed
    truth = OpParams(0.3, 0.9, 2e-4, 1.5e-4)
    pts = []
    for m in (small, CATALOG["small-qwen2-l2"], CATALOG["small-qwen2"], big):
        for b in (1, 4, 16):
            pt = {"op": "decode", "head": "lm", "dtype": "float32", "shape": m.to_dict(), "model": m.name, "batch": b,
                  "prefix_len": 64}
            pt = with_tails([pt], {}, kern)[0]
            x = cpuhost.stream_factor(1e9 * pt["stream_gb_s"], CPU.mem_bw * truth.memory_eff)
            t = float(predict(*arrays([{**pt, "stream_x": x, "median_s": 1.0}], CPU)[:3], truth)[0])
            pts.append({**pt, "tmean_s": t, "median_s": t})
    assert [p["stream_gb_s"] > CPU.mem_bw * truth.memory_eff / 1e9 for p in pts[::3]] == [True, True, True, False]
    got = fitted(pts, CPU, OpParams(0.5, 0.5, 1e-4, 1e-4))
    # recovered up to the fit's weak prior (PRIOR_WEIGHT); without the rates the big model bends the one bandwidth
    assert got["streamed_points"] == 3 and got["memory_eff"] == pytest.approx(0.9, rel=0.03) and got["fit_mape"] < 0.01
    blind = fit_operation([{k: v for k, v in p.items() if k != "stream_gb_s"} for p in pts], CPU, OpParams(0.5, 0.5, 1e-4, 1e-4))
    assert blind["fit_mape"] > 10 * got["fit_mape"] and blind["heldout_mape"] > 10 * got["heldout_mape"]
    validate_profile({**base, "kernels": kern}, "p")
    with pytest.raises(ProfileError, match="gb_s_1row: as many rates > 0"):
        validate_profile({**base, "kernels": {**kern, "gemm_passes_by_footprint": {**by, "gb_s_1row": [65.0]}}}, "p")


def test_training_rate_by_mlp_ratio_is_measured_and_interpolated(tmp_path):
    """Widths measured at further MLP ratios (``width_mlp_ratios``): keys of their own (the grid's own
    ratio keeps its keys, so older journals resume), one normalization over every (ratio, width), and
    r(h, ratio) interpolated linearly between the measured ratios and held at the ends."""
    from calibrate.cpu.widths import measure_widths, plan_size as widths_size, width_summary

    grid = with_overrides(QUICK_CPU, {**GRID, "widths": [64, 128], "width_tokens": 64, "width_mlp_ratios": [2, 4]})
    assert widths_size(grid) == 2 * 2 * 3
    with Journal.open(tmp_path / "w.journal.jsonl", META, resume=False) as j:
        s = Session("cpu", "float32", grid, j, Progress(widths_size(grid), enabled=False), tmp_path)
        measure_widths(s)
        pts = [r for r in j.records if r.get("kind") == "point"]
    ratios = sorted({p["shape"]["intermediate"] // p["width"] for p in pts})
    assert ratios == [2, 3, 4] and len({p["key"] for p in pts}) == 12
    assert sum(p["model"].endswith(("-r2", "-r4")) for p in pts) == 8    # the grid's own ratio (3) untagged
    # made-up per-layer times: each ratio's layer FLOPs in the same time per width, so the wider MLP is faster
    made = [{**p, "tmean_s": 1e-3 + p["layers"] * (2e-3 if p["width"] == 64 else 4e-3)} for p in pts]
    summ = width_summary(made, point_value)
    assert summ["mlp_ratio"] == 3 and set(summ["by_ratio"]) == {"2", "3", "4"}
    r2, r3, r4 = (cpuhost.width_rate(summ, 128, k) for k in (2, 3, 4))
    assert r2 < r3 < r4 == pytest.approx(1.0)
    assert cpuhost.width_rate(summ, 128, 2.5) == pytest.approx((r2 + r3) / 2)
    assert cpuhost.width_rate(summ, 128, 1.0) == r2 and cpuhost.width_rate(summ, 128, 8.0) == r4     # held at the ends
    assert cpuhost.width_rate(summ, 128) == pytest.approx(summ["relative_rate"][1])            # no ratio: the grid's own


def test_training_rate_by_width_is_measured_per_layer_and_divides_the_body_flops(tmp_path):
    from calibrate.cpu.widths import measure_widths, plan_size as widths_size, width_summary
    from rlhfsim.costs import flops as fl

    grid = with_overrides(QUICK_CPU, {**GRID, "widths": [64, 128], "width_tokens": 64, "width_mlp_ratios": []})
    with Journal.open(tmp_path / "w.journal.jsonl", META, resume=False) as j:
        s = Session("cpu", "float32", grid, j, Progress(widths_size(grid), enabled=False), tmp_path)
        measure_widths(s)
        pts = [r for r in j.records if r.get("kind") == "point"]
    assert sorted((p["width"], p["layers"]) for p in pts) == [(64, 1), (64, 3), (128, 1), (128, 3)]
    assert all(p["op"] == "width_train" and p["tokens"] == 64 for p in pts)
    # a made-up measurement: per-layer times 2 ms (width 64) and 4 ms (width 128), 1 ms fixed
    made = [{**p, "tmean_s": 1e-3 + p["layers"] * (2e-3 if p["width"] == 64 else 4e-3)} for p in pts]
    summ = width_summary(made, point_value)
    assert summ["widths"] == [64, 128] and summ["layer_ms"] == pytest.approx([2.0, 4.0])
    assert max(summ["relative_rate"]) == 1.0 and summ["relative_rate"][0] < 1.0   # width 128: 4x the FLOPs in 2x the time
    assert cpuhost.width_rate(summ, 64) == pytest.approx(summ["relative_rate"][0])
    assert cpuhost.width_rate(summ, 32) == cpuhost.width_rate(summ, 64) and cpuhost.width_rate(summ, 512) == 1.0   # held at the ends
    assert summ["relative_rate"][0] < cpuhost.width_rate(summ, 90) < 1.0                             # log-interpolated
    assert cpuhost.width_rate(None, 128) == 1.0
    m = CATALOG["tiny-qwen2"]
    k = fl.ShapeCoeffs.of(m, "float32", "lm")
    extra = k.train(512, 2, body_rate=0.5).flops - k.train(512, 2).flops
    assert extra == pytest.approx(3 * k.f_linear * 512)              # body FLOPs counted twice at half the rate
    base = _without_tails(load_profile("cpu"))
    eff = {"widths": [128, 256], "relative_rate": [0.5, 1.0]}
    c0, c1 = CostModel(CPU, base), CostModel(CPU, {**base, "kernels": {"width_efficiency": eff}})
    assert c1.train(CATALOG["small-qwen2"], "float32", 512, 2).total_s == c0.train(CATALOG["small-qwen2"], "float32", 512, 2).total_s
    assert c1.train(m, "float32", 512, 2).total_s > c0.train(m, "float32", 512, 2).total_s
    from rlhfsim.costs.profile import ProfileError, validate_profile
    with pytest.raises(ProfileError, match="kernels.width_efficiency: expected increasing widths"):
        validate_profile({**base, "kernels": {"width_efficiency": {"widths": [256, 128], "relative_rate": [1.0, 0.5]}}}, "p")


def test_extend_cost_terms_upgrades_a_measured_profile(tmp_path, monkeypatch):
    from calibrate.running import extend as ext

    path = tmp_path / "cpu.json"
    doc = _without_tails(with_points(load_profile("cpu")))   # the bundled profile keeps its points beside it
    doc["points"] = [p for p in doc["points"] if p["op"] not in ("sample", "gemm", "width_train")]
    path.write_text(json.dumps(doc))
    monkeypatch.setattr(ext, "usable_cores", lambda: 1)
    out = ext.extend_cost_terms(path, 1, sampling=[[1, 1024], [8, 1024], [1, 8192], [8, 8192]],
                                gemm=[[1, 512, 128], [2, 512, 128]], widths=[64, 128], gemm_footprints=[])
    on_disk = json.loads(path.read_text())
    assert on_disk["generation"]["kv_decoder"]["sample_per_logit_s"] > 0
    assert on_disk["generation"]["hf_generate"]["sample_per_logit_s"] > 0
    assert on_disk["generation"]["hf_static"]["sampling"] == {"shared_with": "hf_generate"}
    assert on_disk["kernels"]["gemm_weight_passes"] >= 1.0 and on_disk["kernels"]["gemm"]["source"] == "measured"
    assert on_disk["kernels"]["width_efficiency"]["widths"] == [64, 128]
    ext_rec = [e for e in on_disk["provenance"]["extensions"] if e.get("what") == "cost_terms"]
    assert len(ext_rec) == 1 and "decode" in ext_rec[0]["added"] and "decode:hf_generate" in ext_rec[0]["added"]
    assert {"kernels.gemm_weight_passes", "kernels.width_efficiency", "train"} <= set(ext_rec[0]["added"])
    assert sum(p["op"] == "sample" for p in on_disk["points"]) == 12 and sum(p["op"] == "gemm" for p in on_disk["points"]) == 2
    assert on_disk["generation"]["hf_generate"]["sampling_logprobs"]["n_points"] == 4     # the recorder's twins
    assert sum(p["op"] == "width_train" for p in on_disk["points"]) == 4 * 3   # 2 widths x 2 depths x MLP ratios 3, 2, 4
    assert set(on_disk["kernels"]["width_efficiency"]["by_ratio"]) == {"2", "3", "4"}
    assert all(p.get("width_rate") is None for p in on_disk["points"])    # the annotations stay out of the file
    assert on_disk["operations"]["decode"]["source"] == "measured"
    # the handover extension of the same issue is kept
    assert any(e.get("issue") == 16 and e.get("what") is None for e in on_disk["provenance"]["extensions"])
    assert (tmp_path / "cpu.cost_terms.journal.jsonl").is_file() and out["generation"] == on_disk["generation"]


def test_decode_streams_an_untied_lms_weights_but_its_input_embedding():
    """A decode step gathers one row of the input embedding per sequence: an untied LM streams the same
    weights as the same shape tied (its LM head), while its parameters (memory, training, forward passes)
    still count both matrices; the footprint the weight passes are looked up at is the streamed bytes."""
    import dataclasses

    from rlhfsim.costs import flops as fl

    tied = CATALOG["small-qwen2"]
    untied = dataclasses.replace(tied, name="small-qwen2-untied", tied_embeddings=False)
    kt, ku = fl.ShapeCoeffs.of(tied, "float32", "lm"), fl.ShapeCoeffs.of(untied, "float32", "lm")
    assert ku.weight_bytes - kt.weight_bytes == 4 * tied.vocab * tied.hidden          # two matrices held
    assert ku.decode_weight_bytes == kt.decode_weight_bytes == kt.weight_bytes         # one streamed
    for b in (1, 4):
        assert ku.decode(b, 64 * b, 1.0, 2.0).bytes == kt.decode(b, 64 * b, 1.0, 2.0).bytes
    assert ku.forward(64, 1).bytes > kt.forward(64, 1).bytes                           # forward passes unchanged
    assert fl.ShapeCoeffs.of(untied, "float32", "value").decode_weight_bytes == fl.ShapeCoeffs.of(untied, "float32", "value").weight_bytes
    base = _without_tails(load_profile("cpu"))
    table = {"footprint_mib": [4.0, 64.0], "passes": [2.0, 1.2]}
    cm = CostModel(CPU, {**base, "kernels": {"gemm_weight_passes": 2.0, "gemm_passes_by_footprint": table}})
    for b in (1, 4):
        assert cm.decode_steps(untied, "float32", b, 64 * b, 5).total_s == pytest.approx(cm.decode_steps(tied, "float32", b, 64 * b, 5).total_s)

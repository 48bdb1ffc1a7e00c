"""Calibration fitting, journal and resume: the fit recovers known roofline parameters from synthetic
points, reports small held-out error, and the journal survives torn writes and skips measured points."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from calibrate.fitting.fit import fit_operation, point_work
from calibrate.running.grid import QUICK_CPU, with_overrides
from calibrate.running.journal import Journal, journal_path, read_journal, with_points
from calibrate.running.progress import Progress
from calibrate.running.session import Session, point_key
from rlhfsim.costs.model import OpParams, roofline
from rlhfsim.errors import RlhfsimError
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import CATALOG

pytestmark = pytest.mark.hw  # the calibrator's fit (calibrate.running.grid imports torch); the fast loop skips it

PRIOR = OpParams(0.5, 0.7, 1e-3, 0.0)


def synthetic(op: str, true: OpParams, gpu, models, shapes, noise: float = 0.0, seed: int = 0) -> list[dict]:
    """Points whose times follow the CostModel's form exactly (times a lognormal noise factor)."""
    rng = np.random.default_rng(seed)
    pts = []
    for name in models:
        m = CATALOG[name]
        for b, n in shapes:
            p = {"op": op, "model": name, "shape": m.to_dict(), "dtype": "float32", "head": "value", "batch": b,
                 "seq_len": 1 if op == "decode" else n, "prefix_len": n if op == "decode" else 0,
                 "tokens": b if op == "decode" else b * n}
            w = point_work(p)
            t = roofline(w, true, gpu.peak("float32"), gpu.mem_bw).total_s
            p["median_s"] = t * float(np.exp(noise * rng.standard_normal()))
            pts.append(p)
    return pts


@pytest.mark.parametrize("op,true", [
    ("score", OpParams(0.42, 0.31, 2e-4, 5e-5)),
    ("prefill", OpParams(0.8, 0.5, 1e-3, 0.0)),
    ("decode", OpParams(0.3, 0.12, 5e-5, 2e-5)),
])
def test_fit_recovers_known_parameters(op, true):
    gpu = get_gpu("h200")
    shapes = [(1, 1), (1, 16), (4, 64), (16, 128), (16, 512), (64, 512), (64, 2048), (512, 256), (1024, 64)]
    pts = synthetic(op, true, gpu, ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"], shapes)
    got = fit_operation(pts, gpu, PRIOR)
    assert got["compute_eff"] == pytest.approx(true.compute_eff, rel=0.05)
    assert got["memory_eff"] == pytest.approx(true.memory_eff, rel=0.05)
    # Overheads are recovered up to how much they matter: predictions, not each number, are the target.
    assert got["fit_mape"] < 0.01
    assert got["heldout_mape"] < 0.02
    assert got["heldout_mape_by_model"] < 0.03
    assert got["n_points"] == len(pts)


def test_fit_with_noise_has_matching_heldout_error_and_generalizes_to_a_new_size():
    gpu = get_gpu("cpu")
    true = OpParams(0.6, 0.4, 3e-4, 1e-4)
    shapes = [(1, 8), (1, 64), (4, 32), (4, 256), (16, 128), (16, 512)]
    pts = synthetic("score", true, gpu, ["tiny-qwen2", "small-qwen2", "qwen2.5-0.5b"], shapes, noise=0.05, seed=3)
    got = fit_operation(pts, gpu, PRIOR)
    assert 0.02 < got["heldout_mape"] < 0.1  # about the noise level (5%), not zero and not wild
    fitted = OpParams(got["compute_eff"], got["memory_eff"], got["overhead_s"], got["overhead_per_layer_s"])
    # An unmeasured, larger model: the fitted form carries over through the FLOP/byte counts.
    unseen = synthetic("score", true, gpu, ["qwen2.5-1.5b"], [(1, 64), (4, 256), (16, 512)])
    for p in unseen:
        pred = roofline(point_work(p), fitted, gpu.peak("float32"), gpu.mem_bw).total_s
        assert pred == pytest.approx(p["median_s"], rel=0.15)


def test_single_layer_count_puts_fixed_cost_in_overhead_s():
    gpu = get_gpu("cpu")
    true = OpParams(0.5, 0.5, 2e-3, 0.0)
    pts = synthetic("score", true, gpu, ["tiny-qwen2"], [(1, 8), (4, 64), (16, 256), (16, 512)])
    got = fit_operation(pts, gpu, PRIOR)
    assert got["overhead_per_layer_s"] == 0.0
    assert got["overhead_s"] == pytest.approx(2e-3, rel=0.05)
    assert got["heldout_mape_by_model"] is None  # one model: nothing to leave out


def test_optimizer_points_use_fp32_peak_and_no_layers():
    gpu = get_gpu("h200")
    pts = []
    true = OpParams(0.5, 0.35, 4e-3, 0.0)
    for name in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b"):
        p = {"op": "optimizer", "model": name, "shape": CATALOG[name].to_dict(), "dtype": "bfloat16", "head": "lm",
             "batch": 1, "seq_len": 0, "prefix_len": 0, "tokens": 0}
        p["median_s"] = roofline(point_work(p), true, gpu.peak("float32"), gpu.mem_bw).total_s
        pts.append(p)
    got = fit_operation(pts, gpu, PRIOR)
    assert got["memory_eff"] == pytest.approx(0.35, rel=0.05)
    assert got["overhead_s"] == pytest.approx(4e-3, rel=0.1)
    assert got["fit_mape"] < 0.01


# -- journal ------------------------------------------------------------------------------------------
META = {"device_kind": "cpu", "device_name": "test cpu", "dtype": "float32", "threads": 2}


def _point(key: str, t: float = 1e-3) -> dict:
    return {"kind": "point", "key": key, "op": "score", "median_s": t}


def test_journal_torn_last_line_is_ignored_and_cut_on_resume(tmp_path):
    path = journal_path(tmp_path / "cpu.json")
    assert path.name == "cpu.journal.jsonl"
    with Journal.open(path, META, resume=False) as j:
        j.append(_point("a"))
        j.append(_point("b"))
    full = path.read_bytes()
    torn = json.dumps(_point("c")).encode()[:17]  # an append cut short by a kill
    path.write_bytes(full + torn)
    assert [r.get("key") for r in read_journal(path)] == [None, "a", "b"]
    assert path.read_bytes().endswith(torn)  # reading alone does not modify the file
    with Journal.open(path, META, resume=True) as j:
        assert j.has("a") and j.has("b") and not j.has("c")
        j.append(_point("c"))
    recs = read_journal(path)
    assert [r.get("key") for r in recs] == [None, "a", "b", "c"]
    assert path.read_bytes() == full + (json.dumps(_point("c")) + "\n").encode()


def test_journal_complete_json_without_newline_counts_as_torn(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text(json.dumps({"kind": "meta", **META}) + "\n" + json.dumps(_point("a")))
    assert [r.get("key") for r in read_journal(path)] == [None]


def test_journal_corrupt_middle_line_is_an_error(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text(json.dumps({"kind": "meta", **META}) + "\n{not json\n" + json.dumps(_point("a")) + "\n")
    with pytest.raises(RlhfsimError, match=r"j.jsonl:2: expected one JSON object per line"):
        read_journal(path)


def test_resume_refuses_a_journal_from_another_device(tmp_path):
    path = tmp_path / "cpu.journal.jsonl"
    Journal.open(path, META, resume=False).close()
    with pytest.raises(RlhfsimError, match=r"dtype='float32'.*dtype='bfloat16'"):
        Journal.open(path, {**META, "dtype": "bfloat16"}, resume=True)


def test_fresh_run_replaces_the_old_journal(tmp_path):
    path = tmp_path / "cpu.journal.jsonl"
    with Journal.open(path, META, resume=False) as j:
        j.append(_point("a"))
    with Journal.open(path, META, resume=False) as j:
        assert not j.has("a")
    assert len(read_journal(path)) == 1


def test_resume_skips_measured_points_and_measures_the_rest(tmp_path):
    path = tmp_path / "cpu.journal.jsonl"
    grid = with_overrides(QUICK_CPU, {"warmup": 0, "min_iters": 2, "max_iters": 2, "point_budget_s": 0.0})
    k1 = point_key("score", "tiny-qwen2", "float32", batch=1, seq_len=8)
    k2 = point_key("score", "tiny-qwen2", "float32", batch=2, seq_len=8)
    fields = {"op": "score", "model": "tiny-qwen2", "batch": 1, "seq_len": 8}
    with Journal.open(path, META, resume=False) as j:
        s = Session("cpu", "float32", grid, j, Progress(2, enabled=False), tmp_path)
        assert s.measure(k1, fields, lambda: 1)["samples_s"]
    calls = []
    with Journal.open(path, META, resume=True) as j:
        s = Session("cpu", "float32", grid, j, Progress(2, enabled=False), tmp_path)
        assert s.measure(k1, fields, lambda: calls.append(1)) is None
        assert calls == []  # the journaled point is not measured again
        rec = s.measure(k2, {**fields, "batch": 2}, lambda: calls.append(2))
        assert len(calls) == 3  # first call + 2 samples
        assert rec["first_call_s"] >= 0 and len(rec["samples_s"]) == 2
        assert s.progress.done == 2
    assert [r.get("key") for r in read_journal(path)] == [None, k1, k2]


# -- contention guard ---------------------------------------------------------------------------------
def _scripted_session(tmp_path, monkeypatch, ratios, wait_s: float = 5.0) -> Session:
    import calibrate.running.session as sess

    seq = iter(ratios)
    monkeypatch.setattr(sess, "contention_ratio", lambda threads, calls=9: next(seq))
    monkeypatch.setattr(sess.time, "sleep", lambda s: None)
    grid = with_overrides(QUICK_CPU, {"warmup": 0, "min_iters": 1, "max_iters": 1, "quiet_wait_s": wait_s})
    j = Journal.open(tmp_path / "j.jsonl", META, resume=False)
    return Session("cpu", "float32", grid, j, Progress(1, enabled=False), tmp_path, threads=2)


def test_a_disturbed_point_is_measured_again(tmp_path, monkeypatch):
    # before: busy, then quiet; after the first try: disturbed; second try quiet before and after.
    s = _scripted_session(tmp_path, monkeypatch, [9.0, 1.0, 7.0, 0.8, 0.9])
    calls = []
    rec = s.measure("k", {"op": "score", "model": "m", "batch": 1, "seq_len": 1}, lambda: calls.append(1))
    assert len(calls) == 4  # two attempts of first call + one sample
    assert rec["contention_ratio"] == 0.9 and rec["contended"] is False


def test_a_point_that_never_gets_quiet_is_flagged(tmp_path, monkeypatch):
    s = _scripted_session(tmp_path, monkeypatch, itertools.repeat(9.0), wait_s=0.05)
    rec = s.measure("k", {"op": "score", "model": "m", "batch": 1, "seq_len": 1}, lambda: None)
    assert rec["contended"] is True and rec["contention_ratio"] == 9.0


# -- identifiability and uncertainty ------------------------------------------------------------------
def test_fit_with_fewer_points_than_parameters_plus_two_is_underdetermined():
    gpu = get_gpu("cpu")
    true = OpParams(0.5, 0.5, 2e-3, 0.0)
    for shapes in ([(4, 64)], [(1, 8), (16, 512)], [(1, 8), (4, 64), (16, 512), (16, 256)]):
        pts = synthetic("score", true, gpu, ["tiny-qwen2"], shapes)   # one layer count: 3 parameters
        got = fit_operation(pts, gpu, PRIOR)
        assert got["n_params"] == 3 and got["status"] == "underdetermined", shapes
        assert got["heldout_mape"] is None and got["samples"] is None and got["covariance"] is None
    pts = synthetic("score", true, gpu, ["tiny-qwen2"], [(1, 8), (4, 64), (16, 512), (16, 256), (4, 512)])
    assert fit_operation(pts, gpu, PRIOR)["status"] == "ok"
    # two layer counts: 4 parameters, so 5 points are still too few
    pts = synthetic("score", true, gpu, ["tiny-qwen2", "small-qwen2"], [(1, 8), (4, 64)])[:5]
    got = fit_operation(pts, gpu, PRIOR)
    assert got["n_params"] == 4 and got["status"] == "underdetermined"


def test_assembled_underdetermined_operation_is_never_measured():
    from calibrate.fitting.assemble import fitted

    gpu = get_gpu("cpu")
    pts = synthetic("score", OpParams(0.5, 0.5, 2e-3, 0.0), gpu, ["tiny-qwen2"], [(4, 64), (16, 128)])
    assert fitted(pts, gpu, PRIOR)["source"] == "underdetermined"
    pts = synthetic("score", OpParams(0.5, 0.5, 2e-3, 0.0), gpu, ["tiny-qwen2"], [(1, 8), (1, 64), (4, 64), (16, 128), (16, 512)])
    assert fitted(pts, gpu, PRIOR)["source"] == "measured"


def test_ok_fit_keeps_covariance_and_bootstrap_samples_around_the_estimate():
    gpu = get_gpu("cpu")
    true = OpParams(0.6, 0.4, 3e-4, 1e-4)
    shapes = [(1, 8), (1, 64), (4, 32), (4, 256), (16, 128), (16, 512)]
    pts = synthetic("score", true, gpu, ["tiny-qwen2", "small-qwen2"], shapes, noise=0.05, seed=4)
    got = fit_operation(pts, gpu, PRIOR)
    assert got["status"] == "ok" and "least_squares" in got["method"]
    cov = np.array(got["covariance"])
    assert cov.shape == (4, 4) and np.allclose(cov, cov.T) and np.all(np.diag(cov) >= 0)
    samples = np.array(got["samples"])
    assert samples.shape[1] == 4 and len(samples) >= 30
    assert np.all(samples[:, :2] > 0) and np.all(samples[:, :2] <= 1.5) and np.all(samples[:, 2:] >= 0)
    lo, hi = np.percentile(samples[:, 0], [2.5, 97.5])
    assert lo <= got["compute_eff"] <= hi


def test_a_deberta_points_work_counts_its_score_traffic_under_eager_only():
    m = CATALOG["tiny-deberta"]
    base = {"op": "reencode", "model": m.name, "shape": m.to_dict(), "dtype": "float32", "batch": 1, "seq_len": 256,
            "tokens": 256}
    eager, aoti = point_work({**base, "runtime": "eager"}), point_work({**base, "runtime": "aoti_cpp"})
    assert eager.bytes > 2 * aoti.bytes and eager.flops > aoti.flops
    from rlhfsim.costs import flops as fl
    assert eager == fl.forward_work(m, "float32", 256, 1, scoring_runtime="eager")


def test_refit_encoders_fits_a_profiles_encoder_operations_from_its_own_points(tmp_path, capsys):
    pytest.importorskip("torch")
    import copy

    from calibrate.running import extend as ext
    from calibrate.fitting.assemble import _measured
    from rlhfsim.costs.profile import load_profile

    doc = copy.deepcopy(with_points(load_profile("cpu")))   # the bundled profile keeps its points beside it
    doc["operations"]["encode:eager"] = {**doc["operations"]["encode:eager"], "compute_eff": 0.01}   # a stale fit
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(doc))
    assert ext.cli([str(path), "--refit-encoders"]) == 0
    out = json.loads(path.read_text())
    pts = [p for p in _measured(out["points"], op="score", runtime="eager", strategy="padded")
           if not p.get("varlen") and p["shape"]["arch"] == "encoder"]
    want = fit_operation(pts, get_gpu("cpu"), OpParams.from_dict(load_profile("default")["operations"]["prefill"]))
    assert out["operations"]["encode:eager"]["compute_eff"] == pytest.approx(want["compute_eff"]) != 0.01
    assert out["runtimes"]["eager"]["fits"]["encoder"]["compute_eff"] == pytest.approx(want["compute_eff"])
    for op in ("prefill", "decode", "train", "score:eager"):            # the decoders' fits are not touched
        assert out["operations"][op] == doc["operations"][op]
    ext_rec = out["provenance"]["extensions"][-1]
    assert ext_rec["what"] == "refit_encoders" and "encode:eager" in ext_rec["added"] and "reencode:eager" in ext_rec["added"]
    # a profile without encoder points: a one-line error, exit status 2, the file untouched
    h200 = tmp_path / "h200.json"
    h200.write_text(json.dumps(load_profile("h200-measured")))
    before = h200.read_text()
    capsys.readouterr()
    assert ext.cli([str(h200), "--refit-encoders"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --refit-encoders:") and "\n" not in err and h200.read_text() == before

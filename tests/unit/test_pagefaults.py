"""Page faults of large tensors (``calibrate.cpu.pagefaults``): the threshold rule, the priced term (only
logits-sized tensors above the threshold, only passes with every logit or an LM-head loss, the array form
equal to the scalar one), the fit taking the calibration's own faults off its training points, a real
measurement on this CPU, the extension of a measured profile, and the executor's in-step record that
validation sets next to the price."""

from __future__ import annotations

import copy
import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from calibrate.fitting.assemble import refit_train, with_tails  # noqa: E402
from calibrate.fitting.fit import fitted_value, point_value  # noqa: E402
from calibrate.running.journal import with_points  # noqa: E402
from calibrate.cpu.pagefaults import PATTERNS, count_shape, measure_page_faults, threshold_of  # noqa: E402
from rlhfsim.costs.cpuhost import page_fault_s  # noqa: E402
from rlhfsim.costs.model import CostModel  # noqa: E402
from rlhfsim.costs.profile import load_profile  # noqa: E402
from rlhfsim.hardware.catalog import get_gpu  # noqa: E402
from rlhfsim.models.catalog import CATALOG  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it

PF = {"fault_s_per_byte": 2e-10, "threshold_bytes": 24 * 2**20,
      "tensors": {"logprob_forward": 3.0, "logprob_train": 6.0, "labels_train": 4.0}}


def test_threshold_is_below_the_sizes_that_always_fault():
    c = 2e-10
    # 16 MiB faulted once, 24 did not: only sizes from which every larger one faults count
    assert threshold_of({8: 0.0, 16: c, 24: 0.0, 32: c, 40: c, 64: c}, c) == 24 * 2**20
    assert threshold_of({8: c, 16: c, 32: c}, c) == 0
    assert threshold_of({8: 0.0, 16: 0.0}, c) == 16 * 2**20


def test_term_prices_logits_tensors_above_the_threshold_only():
    vocab = 4096
    below = (PF["threshold_bytes"] // (4 * vocab)) - 1
    above = below + 2
    assert page_fault_s(PF, below, vocab, "logprob_forward") == 0.0
    assert page_fault_s(PF, above, vocab, "logprob_forward") == pytest.approx(3.0 * above * vocab * 4 * 2e-10)
    assert page_fault_s(PF, above, vocab, "logprob_train") == pytest.approx(2 * page_fault_s(PF, above, vocab, "logprob_forward"))
    assert page_fault_s(None, above, vocab, "logprob_train") == 0.0
    arr = np.array([below, above, 3.0 * above])
    got = page_fault_s(PF, arr, vocab, "logprob_forward")
    assert list(got) == [page_fault_s(PF, float(x), vocab, "logprob_forward") for x in arr]


def _models():
    base = load_profile("cpu")
    plain = copy.deepcopy(base)
    plain.setdefault("kernels", {}).pop("page_faults", None)
    with_pf = copy.deepcopy(plain)
    with_pf["kernels"]["page_faults"] = PF
    gpu = get_gpu("cpu")
    return CostModel(gpu, plain), CostModel(gpu, with_pf)


def test_cost_model_adds_the_term_to_logprob_passes_and_lm_training_only():
    plain, pf = _models()
    m = CATALOG["tiny-qwen2-v8k"]
    big, small = 8 * 512, 8 * 64            # logits 128 MiB and 16 MiB
    for n in (big, small):
        extra = page_fault_s(PF, n, m.vocab, "logprob_forward")
        assert pf.forward(m, "float32", n, 8, runtime="eager", head="lm", all_logits=True).total_s == pytest.approx(
            plain.forward(m, "float32", n, 8, runtime="eager", head="lm", all_logits=True).total_s + extra, rel=1e-12)
        # a generation prefill (last-token logits) and a value head fault nothing priced
        assert pf.forward(m, "float32", n, 8, head="lm").total_s == plain.forward(m, "float32", n, 8, head="lm").total_s
        assert pf.forward(m, "float32", n, 8, head="value").total_s == plain.forward(m, "float32", n, 8, head="value").total_s
        extra_t = page_fault_s(PF, n, m.vocab, "logprob_train")
        assert pf.train(m, "float32", n, 8, head="lm").total_s == pytest.approx(plain.train(m, "float32", n, 8, head="lm").total_s + extra_t, rel=1e-12)
        assert pf.train(m, "float32", n, 8, head="value").total_s == plain.train(m, "float32", n, 8, head="value").total_s
    assert page_fault_s(PF, big, m.vocab, "logprob_forward") > 0 and page_fault_s(PF, small, m.vocab, "logprob_forward") == 0
    arr = np.array([small, big], dtype=np.float64)
    t_arr, _ = pf.forward(m, "float32", arr, 8, runtime="eager", head="lm", all_logits=True)
    assert list(t_arr) == [pf.forward(m, "float32", float(x), 8, runtime="eager", head="lm", all_logits=True).total_s for x in arr]


def test_measured_logprob_tail_is_added_after_the_roofline_of_every_logprob_pass_only():
    from rlhfsim.costs.flops import TAIL_LOGIT_BYTES
    from rlhfsim.costs.model import roofline

    plain, pf = _models()
    tail_doc = copy.deepcopy(pf.profile)
    s = 0.5e-9
    tail_doc["kernels"]["page_faults"] = {**PF, "logprob_tail": {"s_per_logit": s}}
    tail = CostModel(get_gpu("cpu"), tail_doc)
    m = CATALOG["tiny-qwen2-v8k"]
    for n in (8 * 64, 8 * 512):
        got, active = tail.forward(m, "float32", n, 8, runtime="eager", head="lm", all_logits=True)
        # by hand: the pass's roofline less the tail's bytes, then the measured tail, then the faults
        k = tail._forward_kernel(m, "float32", 1, "prefill", "eager", "lm", None)
        w = k.shape.forward(n, 8, 0.0, n)
        w = w._replace(bytes=w.bytes - TAIL_LOGIT_BYTES * m.vocab * n)
        roof, kern = roofline(w, k.p, k.peak, k.bw, 1)
        assert got == pytest.approx(roof + s * n * m.vocab + page_fault_s(PF, n, m.vocab, "logprob_forward"), rel=1e-12)
        assert active == pytest.approx(kern + s * n * m.vocab, rel=1e-12)
        # more than without the measured tail here: the pass's FLOPs hid the bytes the tail moves
        assert got > pf.forward(m, "float32", n, 8, runtime="eager", head="lm", all_logits=True).total_s
        # a generation prefill (last-token logits: its sampling tail is measured apart), a value head and training
        # are priced as before
        assert tail.forward(m, "float32", n, 8, head="lm").total_s == pf.forward(m, "float32", n, 8, head="lm").total_s
        assert tail.forward(m, "float32", n, 8, head="value", all_logits=True).total_s == pf.forward(m, "float32", n, 8, head="value", all_logits=True).total_s
        assert tail.train(m, "float32", n, 8, head="lm").total_s == pf.train(m, "float32", n, 8, head="lm").total_s
        # tensor parallel: each GPU's tail over its vocabulary shard; sequence parallel: over its share of the tokens
        k2 = tail._forward_kernel(m, "float32", 2, "prefill", "eager", "lm", None)
        roof2, _ = roofline(w, k2.p, k2.peak, k2.bw, 2)
        assert tail.forward(m, "float32", n, 8, 2, runtime="eager", head="lm", all_logits=True).total_s == pytest.approx(
            roof2 + tail._tp_comm_s(m, "float32", n, 2) + s * n * m.vocab / 2 + page_fault_s(PF, n, m.vocab / 2, "logprob_forward"),
            rel=1e-12)
        from rlhfsim.costs.flops import sequence_parallel
        roof_sp, kern_sp = roofline(sequence_parallel(w, k.shape.weight_bytes, 2), k.p, k.peak, k.bw, 1)
        got_sp = tail.forward(m, "float32", n, 8, runtime="eager", head="lm", all_logits=True, sp=2)
        comm_sp = tail._ulysses_comm_s(m, "float32", n, 2)
        assert got_sp[1] == pytest.approx(kern_sp + comm_sp + s * n / 2 * m.vocab, rel=1e-12)
    arr = np.array([8 * 64, 8 * 512], dtype=np.float64)
    t_arr, a_arr = tail.forward(m, "float32", arr, 8, runtime="eager", head="lm", all_logits=True)
    assert list(t_arr) == [tail.forward(m, "float32", float(x), 8, runtime="eager", head="lm", all_logits=True).total_s for x in arr]
    assert list(a_arr) == [tail.forward(m, "float32", float(x), 8, runtime="eager", head="lm", all_logits=True).active_s for x in arr]


@pytest.mark.parametrize("bad", [-1e-9, 1.0, "fast", True, None])
def test_profile_rejects_a_bad_logprob_tail_naming_its_path(bad):
    from rlhfsim.costs.profile import validate_profile
    from rlhfsim.errors import ProfileError

    doc = copy.deepcopy(load_profile("cpu"))
    doc["kernels"]["page_faults"] = {**PF, "logprob_tail": {"s_per_logit": bad}}
    with pytest.raises(ProfileError, match=r"kernels\.page_faults\.logprob_tail\.s_per_logit: expected"):
        validate_profile(doc, "profile x")


@pytest.mark.parametrize("field, bad, path", [
    ("fault_s_per_byte", -1.0, "fault_s_per_byte"), ("threshold_bytes", "24 MiB", "threshold_bytes"),
    ("tensors", {"logprob_forward": 3.0, "logprob_train": 6.0}, "tensors.labels_train"),
    ("tensors", [3.0], "tensors.logprob_forward")])
def test_profile_rejects_bad_page_faults_naming_the_field(field, bad, path):
    from rlhfsim.costs.profile import validate_profile
    from rlhfsim.errors import ProfileError

    doc = copy.deepcopy(load_profile("cpu"))
    doc["kernels"]["page_faults"] = {**PF, field: bad}
    with pytest.raises(ProfileError, match=re.escape(f"kernels.page_faults.{path}: expected")):
        validate_profile(doc, "profile x")
    doc["kernels"]["page_faults"] = "yes"
    with pytest.raises(ProfileError, match=r"kernels\.page_faults: expected an object"):
        validate_profile(doc, "profile x")


def test_fit_takes_the_calibrations_own_faults_off_lm_training_points():
    shape = CATALOG["tiny-qwen2-v8k"].to_dict()
    big = {"op": "train", "head": "lm", "batch": 4, "seq_len": 256, "shape": shape, "model": "m", "tmean_s": 0.09, "median_s": 0.09}
    small = {**big, "seq_len": 64, "tmean_s": 0.02}
    value = {**big, "head": "value", "tmean_s": 0.03}
    out = with_tails([big, small, value], {}, {"page_faults": PF})
    assert out[0]["fault_s"] == pytest.approx(4.0 * 4 * 256 * 8192 * 4 * 2e-10)
    assert "fault_s" not in out[1] and "fault_s" not in out[2]
    assert fitted_value(out[0]) == pytest.approx(point_value(big) - out[0]["fault_s"])


@pytest.fixture(scope="module")
def measured():
    return measure_page_faults(count_shape([CATALOG["tiny-qwen2"]]), threads=1, calls=3)


def test_measurement_on_this_cpu(measured):
    pf = measured
    assert pf["fault_s_per_byte"] > 0 and pf["threshold_bytes"] >= 0
    assert set(pf["tensors"]) == set(PATTERNS) and all(v >= 0 for v in pf["tensors"].values())
    # a backward allocates at least what its forward did: never fewer faulted tensors than the forward
    assert pf["tensors"]["logprob_train"] >= pf["tensors"]["logprob_forward"]
    assert pf["count_shape"]["logits_bytes"] >= 90 * 2**20 and pf["source"] == "measured"
    # the log-prob tail after the head, per logit: a real timing on logits already in memory (the VM: 0.3-0.7 ns)
    tail = pf["logprob_tail"]
    assert 0 < tail["s_per_logit"] < 1e-7 and len(tail["points"]) == 6
    assert {p["vocab"] for p in tail["points"]} == {1024, 8192} and all(p["s"] > 0 for p in tail["points"])


def test_count_shape_keeps_the_family_and_makes_the_logits_dominate():
    base = CATALOG["small-qwen2"]
    sh = count_shape([base, CATALOG["tiny-qwen2"]])
    assert (sh.hf_model_type, sh.tied_embeddings) == (base.hf_model_type, base.tied_embeddings)
    assert sh.layers == 1 and sh.vocab >= 64 * sh.hidden


def test_refit_train_uses_the_term(tmp_path, measured):
    doc = copy.deepcopy(with_points(load_profile("cpu")))   # the bundled profile keeps its points beside it
    doc["kernels"]["page_faults"] = {**measured, "threshold_bytes": 0}   # every lm training point faults
    before = doc["operations"]["train"]
    assert refit_train(doc, get_gpu("cpu"))
    after = doc["operations"]["train"]
    assert after != before and after["n_points"] == before["n_points"]
    json.dumps(doc)   # still a plain document


def test_validation_report_sets_measured_faults_beside_the_price():
    from types import SimpleNamespace

    from calibrate.validation.compare import page_faults

    m = CATALOG["tiny-qwen2-v8k"]
    setup = SimpleNamespace(shapes={"actor": m, "reference": m, "critic": CATALOG["tiny-qwen2"]})
    steps = [SimpleNamespace(faults=[("reference", 3 * 2**20, 8, 513), ("actor_train", 0, 8, 65),
                                     ("critic_train", 2**20, 8, 513)])] * 2
    for rate in (2e-10, 0.0):   # a measured rate of zero (a noisy quick calibration) prices nothing, no error
        cost = SimpleNamespace(page_faults={**PF, "fault_s_per_byte": rate})
        got = page_faults(setup, cost, steps)
        assert got["reference"]["minibatches_per_step"] == 1 and got["reference"]["measured_mib"] == pytest.approx(3.0)
        assert got["reference"]["priced_mib"] == pytest.approx(3.0 * 8 * 512 * 8192 * 4 / 2**20)
        assert got["actor_train"]["priced_mib"] == 0 and got["critic_train"]["priced_mib"] == 0
        assert got["reference"]["measured_s_at_profile_rate"] == pytest.approx(3 * 2**20 * rate)
    assert page_faults(setup, SimpleNamespace(page_faults=None), steps)["reference"]["measured_s_at_profile_rate"] is None


def test_runtimes_prints_the_term_and_the_probe():
    from click.testing import CliRunner

    from calibrate.cli import runtimes_command

    out = CliRunner().invoke(runtimes_command, ["--profile", "cpu"])
    assert out.exit_code == 0, out.output
    pf = load_profile("cpu")["kernels"]["page_faults"]
    assert f"page faults of large tensors: {1e9 * pf['fault_s_per_byte']:.3f} ns per byte" in out.output
    assert "device state probe at the start" in out.output

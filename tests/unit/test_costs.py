"""FLOP/byte counts, the roofline CostModel (closed-form decode sums), and the Profile format."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from rlhfsim.costs import flops as fl
from rlhfsim.costs.model import LINK_EFF, CostModel, OpParams, _sum_max_linear, roofline
from rlhfsim.costs.profile import (BUNDLED_DIR, SCHEMA_VERSION, load_profile, resolve_profile_path,
                                   user_profile_dir, validate_profile)
from rlhfsim.errors import ProfileError
from rlhfsim.files import write_json_atomic
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import CATALOG, DTYPE_BYTES

Q7 = CATALOG["qwen2.5-7b"]
Q05 = CATALOG["qwen2.5-0.5b"]


@pytest.fixture(scope="module")
def h100():
    return CostModel.load(get_gpu("h100-sxm"), "default")   # the datasheet-derived profile the tests work by hand


# --- model shapes and FLOP counts -------------------------------------------------------------------
@pytest.mark.parametrize("name,published_b", [("qwen2.5-0.5b", 0.494), ("qwen2.5-1.5b", 1.544),
                                              ("qwen2.5-7b", 7.616), ("qwen2.5-72b", 72.7),
                                              ("llama-3.1-8b", 8.03), ("llama-3.1-70b", 70.6)])
def test_parameter_counts_match_published_sizes(name, published_b):
    # Published totals include norms and biases the count leaves out: within 1%.
    assert CATALOG[name].params("lm") / 1e9 == pytest.approx(published_b, rel=0.01)


def test_value_head_replaces_the_lm_head():
    assert Q7.params("lm") - Q7.params("value") == Q7.vocab * Q7.hidden - Q7.hidden  # untied
    assert Q05.params("lm") - Q05.params("value") == -Q05.hidden  # tied: the LM head is the embedding
    assert Q7.kv_bytes_per_token("bfloat16") == 2 * 28 * 4 * 128 * 2


def test_forward_work_terms():
    n, s = 4096, 8
    w = fl.forward_work(Q7, "bfloat16", n, s)
    per = n / s
    body = 2.0 * Q7.layers * Q7.layer_params * n
    attn = 4.0 * Q7.layers * Q7.hidden * s * per * (per + 1) / 2
    assert w.flops == pytest.approx(body + attn + 2.0 * Q7.hidden * s)
    assert w.bytes == pytest.approx(Q7.params("value") * 2 + 12 * Q7.layers * Q7.hidden * 2 * n)
    assert w.layers == Q7.layers
    lm = fl.forward_work(Q7, "bfloat16", n, s, logits_tokens=s, head="lm")
    assert lm.flops - w.flops == pytest.approx(2.0 * Q7.hidden * Q7.vocab * s - 2.0 * Q7.hidden * s)
    # logits: written in fp32, log-softmaxed, read (16 bytes each)
    assert lm.bytes - fl.forward_work(Q7, "bfloat16", n, s, head="lm").bytes == pytest.approx(
        fl.LOGIT_BYTES * Q7.vocab * s)


def test_logprob_pass_pays_for_every_tokens_logits():
    # A reference (log-prob) pass needs the LM head at every token, a generation prefill at the last one.
    cm = CostModel.load(get_gpu("h100-sxm"), "default")
    last = cm.forward(Q7, "bfloat16", 4096, 8, head="lm").total_s
    every = cm.forward(Q7, "bfloat16", 4096, 8, head="lm", all_logits=True).total_s
    w_last = fl.forward_work(Q7, "bfloat16", 4096, 8, 0.0, 8, "lm")
    w_every = fl.forward_work(Q7, "bfloat16", 4096, 8, 0.0, 4096, "lm")
    assert w_every.flops - w_last.flops == pytest.approx(2.0 * Q7.hidden * Q7.vocab * (4096 - 8))
    assert every > last
    assert cm.forward(Q7, "bfloat16", 4096, 8, all_logits=True).total_s == cm.forward(Q7, "bfloat16", 4096, 8).total_s  # value head
    assert cm.chunk_prefill(Q7, "bfloat16", 512, 4, 4000, head="lm").total_s > cm.chunk_prefill(Q7, "bfloat16", 512, 4, 4000).total_s


def test_cached_prefix_adds_attention_and_kv_reads():
    a = fl.forward_work(Q7, "bfloat16", 256, 4, cached_tokens=0)
    b = fl.forward_work(Q7, "bfloat16", 256, 4, cached_tokens=4000)
    assert b.flops - a.flops == pytest.approx(4.0 * Q7.layers * Q7.hidden * 4 * 64 * 1000)
    assert b.bytes - a.bytes == pytest.approx(2 * Q7.layers * Q7.kv_dim * 2 * 4000)


def test_encoder_attention_is_bidirectional():
    enc = CATALOG["deberta-v3-large"]
    w = fl.forward_work(enc, "float32", 1024, 2, scoring_runtime="onnxruntime")   # compiled: no eager-only terms
    body = 2.0 * enc.layers * enc.layer_params * 1024
    rel = 2.0 * enc.layers * 2.0 * (2 * fl.DEBERTA_SPAN) * enc.hidden * 1024      # c2p and p2c products
    assert w.flops == pytest.approx(body + 4.0 * enc.layers * enc.hidden * 2 * 512 * 512 + 2 * enc.hidden * 2 + rel)


def test_deberta_disentangled_attention_is_counted_from_its_module():
    """DeBERTa-v2 (flops module docstring): the c2p/p2c products per token under every runtime; under PyTorch
    eager also the relative embeddings' projections per call and the score matrices' traffic, which grows with
    heads x (query, key) pairs, not with the width; another encoder family and a decoder get none of it."""
    enc = CATALOG["deberta-v3-large"]
    L, h, H, S2 = enc.layers, enc.hidden, enc.heads, 2 * fl.DEBERTA_SPAN
    eager = fl.forward_work(enc, "float32", 1024, 2)
    fused = fl.forward_work(enc, "float32", 1024, 2, scoring_runtime="aoti_cpp")
    assert fl.forward_work(enc, "float32", 1024, 2, scoring_runtime="eager") == eager
    assert eager.flops - fused.flops == pytest.approx(2.0 * L * 2.0 * S2 * h * h)             # projections, per call
    pairs = 2 * 512 * 512
    extra = L * (H * (fl.SCORE_PASSES * 4 + 16) + fl.INDEX_BYTES_PER_PAIR) * pairs + 2 * L * S2 * 4 * H * 1024 + 2 * L * S2 * h * 4 * 2
    assert eager.bytes - fused.bytes == pytest.approx(extra)
    # the same heads at half the width: the same score traffic per pair
    from dataclasses import replace
    narrow = replace(enc, name="narrow", hidden=h // 2, intermediate=enc.intermediate // 2)
    k_wide, k_narrow = fl.ShapeCoeffs.of(enc, "float32"), fl.ShapeCoeffs.of(narrow, "float32")
    assert k_wide.rel_pair_bytes == k_narrow.rel_pair_bytes > 0
    electra = replace(enc, name="electra-like", hf_model_type="electra")
    assert fl.forward_work(electra, "float32", 1024, 2).flops == pytest.approx(fused.flops - 2.0 * L * 2.0 * S2 * h * 1024)
    assert fl.ShapeCoeffs.of(CATALOG["tiny-qwen2"], "float32").f_rel_token == 0.0


def test_decode_arrays_match_single_steps():
    f, b = fl.decode_steps_arrays(Q7, "bfloat16", 16, 8000, 5)
    for i in range(5):
        w = fl.decode_step_work(Q7, "bfloat16", 16, 8000 + 16 * i)
        assert f[i] == pytest.approx(w.flops) and b[i] == pytest.approx(w.bytes)


def test_train_and_optimizer_work():
    t = fl.train_work(Q7, "bfloat16", 2048, 4)
    fwd = fl.forward_work(Q7, "bfloat16", 2048, 4, 0.0, 2048, "lm")
    assert t.flops == pytest.approx(3 * fwd.flops) and t.bytes == pytest.approx(3 * fwd.bytes)
    o = fl.optimizer_work(Q7, shards=8)
    assert o.bytes == pytest.approx(32 * Q7.params("lm") / 8)


def test_allreduce_bytes():
    assert fl.allreduce_bytes(1e9, 1) == 0.0
    assert fl.allreduce_bytes(1e9, 2) == pytest.approx(1e9)
    assert fl.allreduce_bytes(1e9, 8) == pytest.approx(2 * 7 / 8 * 1e9)
    assert fl.tp_allreduce_bytes(Q7, "bfloat16", 100, 1) == 0.0
    assert fl.tp_allreduce_bytes(Q7, "bfloat16", 100, 4) == pytest.approx(
        2 * Q7.layers * fl.allreduce_bytes(100 * Q7.hidden * 2, 4))


# --- roofline and CostModel ---------------------------------------------------------------------------
def test_roofline_takes_the_slower_bound():
    p = OpParams(0.5, 0.8, 0.001, 1e-5)
    compute = fl.Work(flops=1e15, bytes=1e6, layers=10)
    memory = fl.Work(flops=1e6, bytes=1e12, layers=10)
    assert roofline(compute, p, 1e15, 1e12).total_s == pytest.approx(2.0 + 0.001 + 1e-4)
    assert roofline(memory, p, 1e15, 1e12).total_s == pytest.approx(1.25 + 0.001 + 1e-4)
    assert roofline(compute, p, 1e15, 1e12, tp=2).total_s == pytest.approx(1.0 + 0.001 + 1e-4)


def test_sum_max_linear_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(200):
        a1, a2 = rng.uniform(0, 1, 2)
        s1, s2 = rng.uniform(-0.01, 0.02, 2)
        n = int(rng.integers(0, 300))
        i = np.arange(n)
        want = float(np.maximum(a1 + s1 * i, a2 + s2 * i).sum())
        assert _sum_max_linear(a1, s1, a2, s2, n) == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_decode_steps_is_the_sum_of_single_steps(h100):
    # Closed form over n steps == sum of n one-step predictions (roofline of each step's work).
    p = h100.ops["decode"]
    for batch, kv0, n in [(1, 100, 1), (64, 64 * 500, 300), (256, 256 * 3000, 4000), (8, 10, 20000)]:
        steps = [roofline(fl.decode_step_work(Q7, "bfloat16", batch, kv0 + batch * i), p,
                          h100.gpu.peak("bfloat16"), h100.gpu.mem_bw).total_s for i in range(n)]
        assert h100.decode_steps(Q7, "bfloat16", batch, kv0, n).total_s == pytest.approx(sum(steps), rel=1e-9)


def test_decode_steps_is_additive(h100):
    whole = h100.decode_steps(Q7, "bfloat16", 32, 32 * 200, 1000, tp=2).total_s
    parts = h100.decode_steps(Q7, "bfloat16", 32, 32 * 200, 377, tp=2).total_s + \
        h100.decode_steps(Q7, "bfloat16", 32, 32 * 200 + 32 * 377, 623, tp=2).total_s
    assert whole == pytest.approx(parts, rel=1e-12)
    assert h100.decode_steps(Q7, "bfloat16", 32, 0, 0).total_s == 0.0
    assert h100.decode_steps(Q7, "bfloat16", 0, 0, 10).total_s == 0.0


def test_decode_overhead_override(h100):
    base = h100.decode_steps(Q7, "bfloat16", 8, 800, 100, overhead_s=0.0).total_s
    assert h100.decode_steps(Q7, "bfloat16", 8, 800, 100, overhead_s=0.01).total_s == pytest.approx(base + 1.0)
    p = h100.ops["decode"]
    default = h100.decode_steps(Q7, "bfloat16", 8, 800, 100).total_s
    assert default == pytest.approx(base + 100 * (p.overhead_s + p.overhead_per_layer_s * Q7.layers))


def test_small_batch_decode_is_memory_bound(h100):
    # One sequence: every step reads the weights it multiplies by once (an untied model's input embedding
    # only has one row gathered); FLOPs are negligible.
    assert not Q7.tied_embeddings
    t = h100.decode_steps(Q7, "bfloat16", 1, 0, 1, overhead_s=0.0).total_s
    p = h100.ops["decode"]
    streamed = Q7.params("lm") - Q7.embedding_params
    assert t == pytest.approx(streamed * 2 / (h100.gpu.mem_bw * p.memory_eff), rel=1e-3)


def test_tensor_parallel_adds_communication(h100):
    t1 = h100.forward(Q7, "bfloat16", 8192, 8, tp=1).total_s
    t2 = h100.forward(Q7, "bfloat16", 8192, 8, tp=2).total_s
    comm = fl.tp_allreduce_bytes(Q7, "bfloat16", 8192, 2) / (h100.gpu.intra_node_bw * LINK_EFF)
    assert t1 / 2 < t2 < t1
    assert t2 > comm


def test_operations_are_zero_for_no_tokens(h100):
    assert h100.forward(Q7, "bfloat16", 0, 1).total_s == 0.0
    assert h100.train(Q7, "bfloat16", 0, 1).total_s == 0.0
    assert h100.chunk_prefill(Q7, "bfloat16", 0, 1, 1000).total_s == 0.0


def test_chunk_prefill_uses_its_own_parameters(h100):
    a = h100.chunk_prefill(Q7, "bfloat16", 4096, 16, 16 * 1000).total_s
    w = fl.forward_work(Q7, "bfloat16", 4096, 16, 16 * 1000)
    assert a == pytest.approx(roofline(w, h100.ops["chunk_prefill"], h100.gpu.peak("bfloat16"), h100.gpu.mem_bw).total_s)


def test_optimizer_and_weight_sync(h100):
    local = h100.optimizer(Q7, "bfloat16", tp=1, dp=1).total_s
    assert h100.optimizer(Q7, "bfloat16", tp=1, dp=4).total_s > local / 4  # sharded step plus the all-reduce
    assert h100.allreduce_s(1e9, 1) == 0.0
    assert h100.allreduce_s(1e9, 8, inter_node=True) > h100.allreduce_s(1e9, 8)
    assert h100.weight_sync_s(Q7, "bfloat16", 1) == pytest.approx(
        Q7.params("lm") * 2 / (h100.gpu.intra_node_bw * LINK_EFF) + 10e-6)


def test_scoring_runtime_lookup(h100):
    prof = copy.deepcopy(h100.profile)
    prof["operations"]["score:onnxruntime"] = {**prof["operations"]["prefill"], "compute_eff": 0.2}
    cm = CostModel(h100.gpu, prof)
    assert cm.runtimes == ["onnxruntime"]
    slow = cm.forward(Q7, "bfloat16", 65536, 64, runtime="onnxruntime").total_s
    assert slow > cm.forward(Q7, "bfloat16", 65536, 64).total_s
    with pytest.raises(KeyError, match="no scoring runtime 'tensorrt'"):
        cm.params("prefill", "tensorrt")


def test_cpu_gets_the_bundled_cpu_profile_when_present():
    cm = CostModel.load(get_gpu("cpu"))
    want = "cpu" if (BUNDLED_DIR / "cpu.json").is_file() else "default"
    assert cm.name == want


# --- profiles -------------------------------------------------------------------------------------------
def _profile():
    return copy.deepcopy({k: v for k, v in load_profile("default").items() if k != "_path"})


def test_default_profile_is_valid_and_complete():
    doc = load_profile("default")
    assert doc["schema_version"] == SCHEMA_VERSION
    assert {"prefill", "decode", "chunk_prefill", "train", "optimizer"} <= set(doc["operations"])
    assert doc["_path"].endswith("default.json")


@pytest.mark.parametrize("mutate,fragment", [
    (lambda d: d.update(schema_version=99), "schema_version: expected 1, got 99"),
    (lambda d: d.pop("operations"), "operations: expected a value"),
    (lambda d: d.update(operations=[]), "operations: expected an object"),
    (lambda d: d["operations"]["decode"].update(compute_eff=0.0), "operations.decode.compute_eff"),
    (lambda d: d["operations"]["decode"].update(memory_eff=2.0), "operations.decode.memory_eff"),
    (lambda d: d["operations"]["train"].update(overhead_s=-1), "operations.train.overhead_s"),
    (lambda d: d["operations"]["train"].update(overhead_s="x"), "got 'x'"),
    (lambda d: d["operations"].update(prefill=3), "operations.prefill.compute_eff"),
])
def test_validate_profile_errors(mutate, fragment):
    d = _profile()
    mutate(d)
    with pytest.raises(ProfileError, match=fragment.replace(".", r"\.")):
        validate_profile(d)


def test_validate_profile_rejects_non_objects():
    with pytest.raises(ProfileError, match="expected a JSON object, got list"):
        validate_profile([])


def test_profile_files(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHFSIM_PROFILE_DIR", str(tmp_path / "profiles"))
    assert user_profile_dir() == tmp_path / "profiles"
    d = _profile()
    d["name"] = "mine"
    write_json_atomic(tmp_path / "profiles" / "mine.json", d)
    assert [p.name for p in (tmp_path / "profiles").iterdir()] == ["mine.json"]  # no temp file left
    assert load_profile("mine")["name"] == "mine"
    assert load_profile(str(tmp_path / "profiles" / "mine.json"))["name"] == "mine"
    with pytest.raises(ProfileError, match="expected a profile name .*default.*mine.* got 'nope'"):
        resolve_profile_path("nope")
    with pytest.raises(ProfileError, match="no such file"):
        load_profile(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ProfileError, match="expected valid JSON"):
        load_profile(str(tmp_path / "bad.json"))
    (tmp_path / "old.json").write_text(json.dumps({**d, "schema_version": 0}))
    with pytest.raises(ProfileError, match="re-run `rlhfsim calibrate`"):
        load_profile(str(tmp_path / "old.json"))


def test_dtype_bytes():
    from rlhfsim.models.catalog import ACTIVATION_BYTES
    assert DTYPE_BYTES == {"float32": 4, "bfloat16": 2, "float16": 2, "float8": 1}
    assert ACTIVATION_BYTES == {**DTYPE_BYTES, "float8": 2}   # float8: FP8 weights, bf16 activations


def test_encoder_passes_use_their_own_family_fit():
    """``encode:RUNTIME`` (calibrate.fitting.assemble.encoder_score_ops) prices an encoder reward model's forward
    passes; decoders keep ``score:RUNTIME``; without it an encoder falls back to ``score:RUNTIME`` too."""
    import copy

    from rlhfsim.costs.profile import load_profile
    from rlhfsim.hardware.catalog import get_gpu

    prof = copy.deepcopy(load_profile("default"))
    base = dict(prof["operations"]["prefill"])
    prof["operations"]["score:eager"] = {**base, "overhead_s": 0.001}
    enc, dec = CATALOG["deberta-v3-large"], CATALOG["qwen2.5-0.5b"]
    without = CostModel(get_gpu("h200"), copy.deepcopy(prof))
    prof["operations"]["encode:eager"] = {**base, "overhead_s": 0.05}
    cm = CostModel(get_gpu("h200"), prof)
    assert cm.forward(enc, "bfloat16", 512, 4, runtime="eager").total_s - without.forward(enc, "bfloat16", 512, 4, runtime="eager").total_s == \
        pytest.approx(0.049)
    assert cm.forward(dec, "bfloat16", 512, 4, runtime="eager").total_s == without.forward(dec, "bfloat16", 512, 4, runtime="eager").total_s
    # re-encode passes of an encoder without a reencode:RUNTIME fit take the encoder fit as well
    assert cm.rescore(enc, "bfloat16", 300, 1, runtime="eager") == cm.forward(enc, "bfloat16", 300, 1, runtime="eager")

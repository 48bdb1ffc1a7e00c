"""A framework call's decoder-layer element-wise kernels (rlhfsim.costs.eager, term layer_elementwise): bytes composed
by hand from transformers' modeling code, priced after the roofline."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfsim.costs import eager
from rlhfsim.costs.model import CostModel
from rlhfsim.costs.profile import load_profile
from rlhfsim.costs.terms import LAYER_ELEMENTWISE
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import load_model

H100 = get_gpu("h100-sxm")
M = load_model("qwen2.5-0.5b")   # 24 layers, h 896, I 4864, 14 + 2 heads of 64


def _per_layer_by_hand(tp: int = 1) -> float:
    rmsnorm = 2 + 4 + 4 * 2 + 4 + 4 * 2 + 4 + 2 + 2 * 2   # to(fp32), pow, mean, x*rsqrt, to(bf16), weight*: 36 B
    assert rmsnorm == 36 == eager.rmsnorm_bytes(2)
    norms = 2 * rmsnorm * 896
    adds = 2 * (2 + 2 + 2) * 896
    rope = (2 + 4 + 4 + 4 + 6) * 64 * (14 + 2)          # neg, cat, q*cos, rot*sin, sum: 20 B per element
    mlp = (2 + 2 + 4 + 2) * 4864                        # SiLU read+write, product two reads + write
    return norms + adds + (rope + mlp) / tp


def test_bytes_per_token_by_hand():
    assert eager.layer_bytes_per_token(M, "bfloat16") == _per_layer_by_hand() == 144384
    assert eager.bytes_per_token(M, "bfloat16") == 24 * 144384 + 36 * 896
    # tensor parallelism splits the heads and the intermediate, not the norms and adds on the hidden state
    assert eager.layer_bytes_per_token(M, "bfloat16", tp=2) == _per_layer_by_hand(2)


def test_qwen3_normalizes_q_and_k_and_an_encoder_has_none():
    q3 = load_model("qwen3-8b")
    plain = replace(q3, hf_model_type="qwen2")
    extra = eager.layer_bytes_per_token(q3, "bfloat16") - eager.layer_bytes_per_token(plain, "bfloat16")
    assert extra == 36 * 128 * (32 + 8)
    enc = replace(M, arch="encoder")
    assert eager.elementwise_s(enc, "bfloat16", 1000, 1e12, 0.5) == 0.0


def _cost(name: str) -> CostModel:
    return CostModel(H100, copy.deepcopy(load_profile(name)))


def test_a_forward_call_on_gemm_curves_adds_its_elementwise_time_after_the_roofline():
    cost = _cost("h100-sxm")   # kernels_by_shape: Vidur's GEMM curves and element-wise efficiency
    eff = cost.by_shape.elementwise_eff
    tokens = 16384
    fwd = cost.framework_call(False, M, "bfloat16", tokens, 32, 1, "lm", logprob=True)
    want = eager.bytes_per_token(M, "bfloat16") * tokens / (H100.mem_bw * eff)
    assert fwd.elementwise_s == pytest.approx(want, rel=1e-12)
    assert fwd.device_s == pytest.approx(fwd.kernel_s + fwd.head_s + want, rel=1e-12)
    terms = fwd.terms()
    assert terms[LAYER_ELEMENTWISE] == pytest.approx(want, rel=1e-12)
    assert sum(terms.values()) == pytest.approx(fwd.total_s, rel=1e-12)
    sp = cost.framework_call(False, M, "bfloat16", tokens, 32, 1, "lm", logprob=True, sp=2)
    assert sp.elementwise_s == pytest.approx(want / 2, rel=1e-12)   # one GPU of a Ulysses pair: half the tokens
    value = cost.framework_call(False, M, "bfloat16", tokens, 32, 1, "value")
    assert value.elementwise_s == pytest.approx(want, rel=1e-12)    # a critic's values: the same layers


def test_none_where_a_whole_pass_efficiency_holds_them():
    h100 = _cost("h100-sxm")
    # training is priced from operations.train.compute_eff, a whole training pass's fraction (fitted to logs)
    assert h100.framework_call(True, M, "bfloat16", 16384, 32, 1, "lm", logprob=True).elementwise_s == 0.0
    # a profile without kernel terms by shape prices a forward from the prefill's whole-pass efficiency
    default = _cost("default")
    assert default.by_shape is None
    call = default.framework_call(False, M, "bfloat16", 16384, 32, 1, "lm", logprob=True)
    assert call.elementwise_s == 0.0 and call.terms()[LAYER_ELEMENTWISE] == 0.0


def test_a_cpu_profile_has_no_framework_and_no_elementwise_term():
    prof = copy.deepcopy(load_profile("h100-sxm"))
    prof.pop("framework", None)
    call = CostModel(H100, prof).framework_call(False, M, "bfloat16", 4096, 8, 1, "lm")
    assert call.elementwise_s == 0.0


@settings(max_examples=40, deadline=None)
@given(n1=st.floats(1.0, 1e6), n2=st.floats(1.0, 1e6), tp=st.sampled_from([1, 2, 4, 8]),
       name=st.sampled_from(["qwen2.5-0.5b", "qwen2.5-7b", "qwen3-8b"]))
def test_nonnegative_monotone_in_tokens_and_split_by_tp(n1, n2, tp, name):
    m = load_model(name)
    lo, hi = sorted((n1, n2))
    a = eager.elementwise_s(m, "bfloat16", lo, H100.mem_bw, 0.57, tp=tp)
    b = eager.elementwise_s(m, "bfloat16", hi, H100.mem_bw, 0.57, tp=tp)
    assert 0.0 < a <= b
    assert eager.bytes_per_token(m, "bfloat16", tp) <= eager.bytes_per_token(m, "bfloat16", 1)

"""The costs frameworks pay around kernels (rlhfsim.costs.framework): expected values composed by hand."""

from __future__ import annotations

import copy

import pytest

from conftest import make_dict
from rlhfsim.costs import framework as fw
from rlhfsim.costs import terms as T
from rlhfsim.costs.model import LINK_LATENCY_S, CostModel
from rlhfsim.costs.profile import load_profile, validate_profile
from rlhfsim.errors import ProfileError
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import load_model
from rlhfsim.scenario import load_scenario
from rlhfsim.scenario.checks import build_setup
from rlhfsim.sim import execution as ex

H100 = get_gpu("h100-sxm")
M = load_model("qwen2.5-0.5b")


def _cost(framework: dict | None = "default") -> CostModel:
    prof = copy.deepcopy(load_profile("default"))
    if framework is None:
        prof.pop("framework")
    elif framework != "default":
        prof["framework"] = framework
    return CostModel(H100, prof)


FW = {"host_forward_per_layer_s": 1e-3, "host_train_per_layer_s": 4e-3, "host_checkpoint_mult": 2.0,
      "fsdp_host_per_unit_s": 5e-4}


def test_a_launch_bound_call_costs_its_host_time_not_the_sum():
    cost = _cost(FW)
    call = cost.framework_call(False, M, "bfloat16", 64, 2, 1, "value")
    kernel, active = cost.forward(M, "bfloat16", 64, 2, 1, head="value", all_logits=True)
    assert kernel < M.layers * 1e-3  # a 64-token forward of a 0.5B model: the device's share is small
    assert call.total_s == pytest.approx(M.layers * 1e-3)
    assert call.active_s == active  # the device is busy for its kernels only; the rest of the call waits on the host
    terms = call.terms()
    assert terms[T.HOST_LAUNCH_BOUND] == pytest.approx(M.layers * 1e-3 - kernel)
    assert sum(terms.values()) == pytest.approx(call.total_s, rel=1e-12)


def test_a_device_bound_call_is_unchanged_by_the_host():
    with_host, without = _cost(FW), _cost(None)
    big = dict(training=True, m=load_model("qwen2.5-7b"), dtype="bfloat16", n_tokens=16384, n_seqs=16)
    a, b = with_host.framework_call(**big), without.framework_call(**big)
    assert a.host_s < a.device_s and a.total_s == b.total_s


def test_checkpointing_multiplies_the_host_and_the_kernels_apart():
    cost = _cost(FW)
    plain = cost.framework_call(True, M, "bfloat16", 64, 2, 1, "lm")
    ckpt = cost.framework_call(True, M, "bfloat16", 64, 2, 1, "lm", checkpointing=True, ckpt_frac=1 / 3)
    assert plain.host_s == pytest.approx(M.layers * 4e-3) and ckpt.host_s == pytest.approx(M.layers * 8e-3)
    assert ckpt.kernel_s == pytest.approx(plain.kernel_s * 4 / 3)


def test_the_log_prob_head_prices_its_bytes_per_logit_after_the_roofline():
    cost = _cost(FW)
    n = 8192
    per_logit = (fw.LOGPROB_BYTES + fw.ENTROPY_BYTES) * fw.TRAIN_HEAD_MULT / (H100.mem_bw * cost.params("prefill").memory_eff)
    call = cost.framework_call(True, M, "bfloat16", n, 32, 1, "lm", logprob=True, entropy=True)
    assert call.head_s == pytest.approx(per_logit * n * M.vocab)
    fwd = cost.framework_call(False, M, "bfloat16", n, 32, 1, "lm", logprob=True, entropy=False)
    plain = cost.forward(M, "bfloat16", n, 32, 1, head="lm", all_logits=True, head_s_per_logit=0.0).total_s
    # the forward's head sits inside its kernel time: the roofline without the tail's bytes, plus 6 B per logit
    want = plain + fw.LOGPROB_BYTES / (H100.mem_bw * cost.params("prefill").memory_eff) * n * M.vocab
    assert fwd.kernel_s == pytest.approx(want, rel=1e-12)


def test_fsdp_collectives_bytes_and_hooks_by_hand():
    cost = _cost(FW)
    n = 8
    train = cost.framework_call(True, M, "bfloat16", 1024, 4, 1, "lm", fsdp_n=n)
    units = M.layers + 1
    nbytes = (n - 1) / n * M.params("lm") * (2 + 2 + 4)
    assert train.comm_s == pytest.approx(nbytes / cost.link_bw() + units * 3 * LINK_LATENCY_S)
    assert train.comm_exposed_s == pytest.approx(train.comm_s / units)
    assert train.host_s == pytest.approx(M.layers * 4e-3 + units * 3 * 5e-4)
    fwd = cost.framework_call(False, M, "bfloat16", 1024, 4, 1, "lm", fsdp_n=n)
    assert fwd.comm_s == pytest.approx((n - 1) / n * M.params("lm") * 2 / cost.link_bw() + units * LINK_LATENCY_S)
    assert fwd.host_s == pytest.approx(M.layers * 1e-3 + units * 5e-4)
    one = cost.framework_call(False, M, "bfloat16", 1024, 4, 1, "lm", fsdp_n=1)  # wrapped on one GPU: hooks, no bytes
    assert one.comm_s == 0 and one.host_s == pytest.approx(fwd.host_s)


def test_a_cpu_profile_prices_calls_as_before():
    cost = CostModel(get_gpu("cpu"), load_profile("cpu"))
    assert cost.host is None
    call = cost.framework_call(False, M, "bfloat16", 300, 2, 1, "lm", logprob=True, entropy=True)
    assert call.total_s == cost.forward(M, "bfloat16", 300, 2, 1, head="lm", all_logits=True).total_s


@pytest.mark.parametrize("key,value", [("host_forward_per_layer_s", -1.0), ("host_train_per_layer_s", "x"),
                                       ("host_checkpoint_mult", 0.5), ("fsdp_host_per_unit_s", float("inf"))])
def test_bad_framework_sections_are_refused_naming_the_key(key, value):
    prof = copy.deepcopy(load_profile("default"))
    prof["framework"][key] = value
    with pytest.raises(ProfileError) as e:
        validate_profile(prof)
    assert str(e.value).startswith(f"profile.framework.{key}: expected")


def test_per_model_micro_batches_packing_and_padding_in_the_setup():
    d = make_dict("colocated", {"execution": {
        "sharding": "fsdp", "micro_batch": {"log_prob_micro_batch_size_per_gpu": 8, "critic_forward_micro_batch_size_per_gpu": 4,
                                            "ref_log_prob_micro_batch_size_per_gpu": 2, "use_remove_padding": True,
                                            "critic_use_remove_padding": False, "pad_to": "max_length"}}})
    s = build_setup(load_scenario(d))
    assert ex.forward_cuts(s, 1, "actor")[0] == 8 and ex.forward_cuts(s, 1, "critic")[0] == 4
    assert ex.forward_cuts(s, 1, "reference")[0] == 2
    assert ex.packed_of(s, "actor") and not ex.packed_of(s, "critic")
    w = s.scenario.workload
    assert ex.pad_length(s) == w.max_prompt_tokens + w.max_response_tokens
    assert ex.fsdp_shards(s, "actor") == s.pool_of("actor").gpus // s.tp["actor"] and ex.fsdp_shards(s, "reward") == 0

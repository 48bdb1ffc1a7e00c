"""Mixture-of-experts and multi-head latent attention shapes (rlhfsim.models.catalog) and their pricing
(rlhfsim.costs.moe): config.json reading, total against active parameters, the experts a decode step touches, the
latent KV cache, the router and expert imbalance as cost terms, and the routed experts at their own GEMM shape
(expert_gemm). Expected values are composed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlhfsim.costs import moe
from rlhfsim.costs.flops import ShapeCoeffs
from rlhfsim.costs.model import CostModel
from rlhfsim.costs.terms import DECODE_KERNELS, EXPERT_GEMM, EXPERT_IMBALANCE, KERNELS, ROUTER
from rlhfsim.errors import ScenarioError
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import ASSUMED_EXPERT_IMBALANCE, CATALOG, shape_from_hf_config

ROOT = Path(__file__).resolve().parents[2]
FIXED = ROOT / "tests" / "fixtures" / "profiles" / "default.json"

# Qwen/Qwen3-30B-A3B's config.json (the keys that decide cost), as the model's repository publishes it
QWEN3_30B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
             "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
             "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
             "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
             "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False}
# deepseek-ai/DeepSeek-V3's config.json (the keys that decide cost)
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
               "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
               "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1,
               "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536,
               "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "vocab_size": 129280, "max_position_embeddings": 163840, "tie_word_embeddings": False}
MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
           "vocab_size": 32000, "max_position_embeddings": 32768}

COST_FIELDS = ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab", "tied_embeddings", "head_dim",
               "num_experts", "experts_per_token", "moe_intermediate", "moe_layers", "shared_experts",
               "shared_intermediate", "attention", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
               "qk_rope_head_dim", "v_head_dim", "max_positions")


def _read(tmp_path, cfg: dict, name: str = "m"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return shape_from_hf_config(d, "models.actor.model")


@pytest.mark.parametrize("cfg, catalog", [(QWEN3_30B, "qwen3-30b-a3b"), (DEEPSEEK_V3, "deepseek-v3")])
def test_config_json_reads_as_the_catalog_entry(tmp_path, cfg, catalog):
    got, want = _read(tmp_path, cfg), CATALOG[catalog]
    assert {f: getattr(got, f) for f in COST_FIELDS} == {f: getattr(want, f) for f in COST_FIELDS}
    assert got.params() == want.params() and got.expert_imbalance == ASSUMED_EXPERT_IMBALANCE


def test_which_layers_have_experts_follows_each_familys_rule(tmp_path):
    # Qwen: layer i is MoE when i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
    q = _read(tmp_path, {**QWEN3_30B, "decoder_sparse_step": 2, "mlp_only_layers": [1, 2]}, "q")
    assert q.moe_layers == len([i for i in range(48) if i not in (1, 2) and (i + 1) % 2 == 0]) == 23
    # DeepSeek: i >= first_k_dense_replace and i % moe_layer_freq == 0
    d = _read(tmp_path, {**DEEPSEEK_V3, "moe_layer_freq": 2}, "d")
    assert d.moe_layers == len([i for i in range(61) if i >= 3 and i % 2 == 0]) == 29
    # Mixtral: every layer, experts as wide as the dense MLP, grouped-query attention
    x = _read(tmp_path, MIXTRAL, "x")
    assert (x.num_experts, x.experts_per_token, x.moe_intermediate, x.moe_layers, x.attention) == (8, 2, 14336, 32, "gqa")
    # 46.7B total, 12.9B active: Mixtral-8x7B's published counts
    assert x.params() / 1e9 == pytest.approx(46.7, abs=0.05) and x.active_params() / 1e9 == pytest.approx(12.9, abs=0.05)


def test_bad_moe_config_names_the_key(tmp_path):
    with pytest.raises(ScenarioError, match="num_experts_per_tok") as e:
        _read(tmp_path, {**QWEN3_30B, "num_experts_per_tok": 200})
    assert e.value.path == "models.actor.model"
    with pytest.raises(ScenarioError, match="kv_lora_rank"):
        _read(tmp_path, {**DEEPSEEK_V3, "kv_lora_rank": 0}, "z")


def test_dense_shapes_count_as_before():
    """Every dense catalog model: the parameter, FLOP and KV constants of the formulas before MoE, by hand."""
    for m in CATALOG.values():
        if m.is_moe:
            continue
        h, inter, hd = m.hidden, m.intermediate, m.head_dim   # hd: h / heads, unless the config states it (qwen3-32b)
        layer = 2 * h * m.heads * hd + 2 * h * m.kv_heads * hd + (3 if m.gated_mlp else 2) * h * inter
        body = m.layers * layer + m.vocab * h
        assert m.params() == body + (0 if m.tied_embeddings else m.vocab * h), m.name
        assert m.active_params() == m.params() and m.layer_params == layer
        k = ShapeCoeffs.of(m, "bfloat16", "lm")
        assert k.f_linear == 2.0 * (m.layers * layer) and k.f_attn == 4.0 * m.layers * m.heads * hd
        assert k.kv_bytes == 2 * m.layers * m.kv_heads * hd * 2 == m.kv_bytes_per_token("bfloat16")
        assert k.decode_weights_at(64) == k.decode_weight_bytes and (k.n_experts, k.f_router, k.f_imbalance) == (0, 0.0, 0.0)


def test_total_against_active_parameters_by_hand():
    m = CATALOG["qwen3-30b-a3b"]
    h, L, E, k, w = 2048, 48, 128, 8, 768
    attn = 2 * h * (32 * 128) + 2 * h * (4 * 128)
    emb = 2 * 151936 * h   # untied: input embedding and LM head
    assert m.params() == L * (attn + E * 3 * h * w + h * E) + emb
    assert m.active_params() == L * (attn + k * 3 * h * w + h * E) + emb
    assert m.params() / 1e9 == pytest.approx(30.5, abs=0.05) and m.active_params() / 1e9 == pytest.approx(3.35, abs=0.01)
    # FLOPs from the active parameters, the routed experts' share priced at the imbalance
    c = ShapeCoeffs.of(m, "bfloat16", "lm")
    assert c.f_linear == pytest.approx(2.0 * m.active_body_params + 2.0 * L * k * 3 * h * w * (ASSUMED_EXPERT_IMBALANCE - 1))
    assert ShapeCoeffs.of(moe.without_imbalance(m), "bfloat16", "lm").f_linear == 2.0 * m.active_body_params
    assert c.f_router == 2.0 * L * h * E and c.weight_bytes == m.params() * 2
    # DeepSeek-V3: 671B held, 37B met per token (its report's counts; the multi-token prediction layer not counted)
    d = CATALOG["deepseek-v3"]
    assert d.params() / 1e9 == pytest.approx(671, abs=0.5) and d.active_params() / 1e9 == pytest.approx(37.5, abs=0.2)
    assert CATALOG["qwen3-235b-a22b"].params() / 1e9 == pytest.approx(235, abs=0.5)


def test_expected_experts_limits():
    E, k = 128, 8
    assert moe.expected_experts(E, k, 1) == pytest.approx(k)          # one row: its own k experts
    assert moe.expected_experts(E, k, 10_000) == pytest.approx(E)     # many rows: every expert
    assert moe.expected_experts(E, k, 2) == pytest.approx(E * (1 - (1 - k / E) ** 2))
    rows = np.array([1.0, 2.0, 16.0, 256.0])
    got = moe.expected_experts(E, k, rows)
    assert np.all(np.diff(got) > 0) and np.all(got <= E)
    assert [moe.expected_experts(E, k, float(r)) for r in rows] == list(got)   # the array path, the same bits


def test_decode_step_streams_only_the_experts_its_rows_touch():
    m = CATALOG["qwen3-30b-a3b"]
    c = ShapeCoeffs.of(m, "bfloat16", "lm")
    routed = 48 * 128 * 3 * 2048 * 768 * 2
    assert c.routed_bytes == routed
    shared = c.decode_weight_bytes - routed
    assert c.decode_weights_at(1) == pytest.approx(shared + routed * 8 / 128)
    assert c.decode_weights_at(100_000) == pytest.approx(c.decode_weight_bytes)
    cost = CostModel.load(get_gpu("h100-sxm"), str(FIXED))
    one, many = (cost.decode_steps(m, "bfloat16", b, 512 * b, 1, runtime="vllm") for b in (1, 256))
    assert one.total_s < many.total_s


def test_mla_caches_the_latent_not_the_heads():
    d = CATALOG["deepseek-v3"]
    assert d.kv_bytes_per_token("bfloat16") == 61 * (512 + 64) * 2
    assert d.kv_bytes_per_token("bfloat16") < 2 * 61 * 128 * 128 * 2 / 50   # 57x smaller than 128 heads' K and V
    assert ShapeCoeffs.of(d, "bfloat16", "lm").kv_bytes == d.kv_bytes_per_token("bfloat16")
    assert d.attn_flops_per_pair == 2 * 128 * (128 + 64 + 128)
    # the attention weights, by hand: q through its rank-1536 bottleneck, the kv latent and rope key, their
    # decompression, the output
    h = 7168
    assert d.attn_params == (h * 1536 + 1536 * 128 * 192) + h * (512 + 64) + 512 * 128 * (128 + 128) + 128 * 128 * h


def _cost():
    return CostModel.load(get_gpu("h100-sxm"), str(FIXED))


def test_router_and_imbalance_are_terms_that_sum_to_the_price():
    cost, m = _cost(), CATALOG["qwen3-30b-a3b"]
    for p in (cost.train(m, "bfloat16", 16384, 16, tp=2),
              cost.forward(m, "bfloat16", 8192, 8, head="lm"),
              cost.framework_call(True, m, "bfloat16", 16384, 16, fsdp_n=8).price()):
        t = p.terms()
        assert t[ROUTER] > 0 and t[EXPERT_IMBALANCE] > 0 and t[KERNELS] > 0
        assert sum(t.values()) == pytest.approx(p.total_s, rel=1e-12)
    # the imbalance term is the price with it less the price at u = 1
    bal = moe.without_imbalance(m)
    assert cost.train(m, "bfloat16", 16384, 16).terms()[EXPERT_IMBALANCE] == pytest.approx(
        cost.train(m, "bfloat16", 16384, 16).total_s - cost.train(bal, "bfloat16", 16384, 16).total_s)
    assert cost.train(bal, "bfloat16", 16384, 16).terms()[EXPERT_IMBALANCE] == 0.0
    d = cost.decode_steps(m, "bfloat16", 64, 64 * 700, 20, runtime="vllm")
    t = d.terms()
    assert t[ROUTER] > 0 and t[DECODE_KERNELS] > 0 and sum(t.values()) == pytest.approx(d.total_s, rel=1e-12)
    # a dense model has neither
    assert ROUTER not in cost.train(CATALOG["qwen2.5-7b"], "bfloat16", 4096, 4).terms()


def test_scenario_sets_the_imbalance_and_explain_shows_the_terms():
    from rlhfsim.scenario.loader import load_scenario
    from rlhfsim.sim.explain import explain

    path = ROOT / "scenarios" / "examples" / "moe-qwen3-30b-a3b.yaml"
    doc = explain(load_scenario(path, overrides=[("models.actor.expert_imbalance", 1.5)]), profile=str(FIXED), steps=2)
    train = doc["phases"]["actor_train"]["terms_s"]
    assert train[ROUTER] > 0 and train[EXPERT_IMBALANCE] > 0
    lower = explain(load_scenario(path), profile=str(FIXED), steps=2)["phases"]["actor_train"]["terms_s"]
    assert train[EXPERT_IMBALANCE] > lower[EXPERT_IMBALANCE] > 0
    with pytest.raises(ScenarioError, match="models.actor.expert_imbalance"):
        load_scenario(path, overrides=[("models.actor.model", "qwen2.5-7b")])


def test_launch_model_names_map_to_the_moe_shapes():
    from rlhfsim.importers.common import catalog_model

    assert catalog_model("Qwen/Qwen3-30B-A3B")[0] == "qwen3-30b-a3b"
    assert catalog_model("Qwen/Qwen3-235B-A22B")[0] == "qwen3-235b-a22b"
    assert catalog_model("deepseek-ai/DeepSeek-V3")[0] == catalog_model("deepseek-ai/DeepSeek-R1")[0] == "deepseek-v3"


def test_expert_gemm_by_hand_on_the_roofline_and_on_the_curve():
    """Qwen3-30B-A3B, 4096 tokens on one GPU (ep 1): 128 experts of 4096 x 8 / 128 = 256 rows. Without a curve the
    grouped GEMM is priced at the roofline of its shape (256 rows by 2048 x 768: bound by its bytes on these numbers),
    less what the call charged for its FLOPs, plus the permute/unpermute copies; with the H100's curve its FLOPs run
    at the curve's ratio; three GEMM passes and two copy passes in training."""
    m = CATALOG["qwen3-30b-a3b"]
    h, k, w = 2048, 8, 768
    kw = dict(tp=1, peak=1e15, bw=3e12, call_eff=0.5, mem_eff=0.8, ew_eff=0.5)
    copies = 2 * h * 4096 * 2 * (1 + k) / (3e12 * 0.5)          # bf16, forward: read and write around k copies
    flops = 2 * 256.0 * 3 * h * w * 128
    nbytes = 128 * (3 * h * w * 2 + 256 * (2 * h + 3 * w) * 2)   # each expert's weights; its rows in and out
    assert nbytes / (3e12 * 0.8) > flops / (1e15 * 0.5)           # memory-bound at 256 rows
    fwd = moe.expert_gemm_s(m, "bfloat16", 4096.0, training=False, **kw)
    assert fwd == pytest.approx(48 * (nbytes / (3e12 * 0.8) - flops / (1e15 * 0.5) + copies))
    big = dict(kw, bw=3e14)   # compute-bound: the GEMMs cost what the call charged; the copies are left
    assert moe.expert_gemm_s(m, "bfloat16", 4096.0, training=False, **big) == pytest.approx(48 * copies / 100)
    assert moe.expert_gemm_s(m, "bfloat16", 4096.0, training=True, **big) == pytest.approx(2 * 48 * copies / 100)
    # expert parallelism: the received rows are sorted by local expert once more
    assert moe.expert_gemm_s(m, "bfloat16", 4096.0, ep=8, training=False, **big) == pytest.approx(
        48 * 2 * h * 4096 * (2 * (1 + k) + 2 * k) / (3e14 * 0.5))
    ks = CostModel.load(get_gpu("h100-sxm")).by_shape
    ratio = ks.compute_eff(256.0, 3 * h * w) / ks.compute_eff(4096.0, m.layer_params)
    assert 0 < ratio < 0.7   # 256 rows of one expert's weights: well under the call's 4096 tokens of a layer
    gemm = max(flops / (1e15 * 0.5 * ratio), nbytes / (3e12 * 0.8)) - flops / (1e15 * 0.5)
    got = moe.expert_gemm_s(m, "bfloat16", 4096.0, training=True, curve=ks, **kw)
    assert got == pytest.approx(48 * (3 * gemm + 2 * copies))
    # more expert parallelism, more rows per expert: a cheaper grouped GEMM per token
    assert moe.expert_gemm_s(m, "bfloat16", 4096.0, ep=8, training=True, curve=ks, **kw) < got
    assert moe.expert_gemm_s(CATALOG["qwen2.5-7b"], "bfloat16", 4096.0, training=True, **kw) == 0.0


def test_expert_gemm_is_a_term_of_a_gpu_call_that_sums_to_its_price():
    cost = CostModel.load(get_gpu("h100-sxm"))
    for training in (True, False):
        call = cost.framework_call(training, CATALOG["qwen3-30b-a3b"], "bfloat16", 4096, 1, logprob=True)
        t = call.terms()
        assert t[EXPERT_GEMM] > 0 and sum(t.values()) == pytest.approx(call.total_s)
        arr = cost.framework_call(training, CATALOG["qwen3-30b-a3b"], "bfloat16", np.array([4096.0, 8192.0]), 1)
        assert arr.total_s[0] == pytest.approx(cost.framework_call(training, CATALOG["qwen3-30b-a3b"], "bfloat16",
                                                                   4096.0, 1).total_s)
    dense = cost.framework_call(True, CATALOG["qwen2.5-7b"], "bfloat16", 4096, 1).terms()
    assert EXPERT_GEMM not in dense

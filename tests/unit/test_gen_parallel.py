"""Generation under expert parallelism and data-parallel attention (generation.parallel; rlhfsim.costs.genparallel):
the schema's errors, each mechanism composed by hand (the weights a GPU reads, the all-reduces left, the all-to-all
over NVLink and the inter-node link, two-batch overlap, the KV cache), `rlhfsim explain` showing gen_ep_alltoall, and
verl's rollout keys mapping to it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rlhfsim.costs import genparallel as G
from rlhfsim.costs import terms as T
from rlhfsim.costs.model import LINK_EFF, CostModel
from rlhfsim.errors import ScenarioError
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import ACTIVATION_BYTES, load_model
from rlhfsim.scenario.checks import build_setup
from rlhfsim.scenario.loader import load_scenario, parse_set
from rlhfsim.sim.explain import explain

ROOT = Path(__file__).resolve().parents[2]
MOE = ROOT / "scenarios" / "examples" / "moe-qwen3-30b-a3b.yaml"
DENSE = ROOT / "scenarios" / "verl-ppo.yaml"
H100 = get_gpu("h100-sxm")
QWEN = load_model("qwen3-30b-a3b")   # 128 experts, top-8, 48 MoE layers of 48, hidden 2048, 4 KV heads
SMALL = ("workload.prompts_per_step=16", "algorithm.minibatch_size=128", "steps=2")


def _load(path, *sets):
    return load_scenario(path, overrides=[parse_set(s) for s in sets])


def _error(path, *sets) -> str:
    with pytest.raises(ScenarioError) as e:
        _load(path, *sets)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def _lay(tp=1, ep=8, dp=True, redundant=0, fp8=False, overlap=False, domain=8, spans=False):
    return G.GenLayout(tp, ep, dp, redundant, fp8, overlap, domain, spans)


# --- the schema ------------------------------------------------------------------------------------
def test_inconsistent_degrees_are_one_line_errors_naming_the_field():
    assert _error(MOE, "generation.parallel.ep=8").startswith(
        "generation.parallel.ep: expected placement.tp.rollout (4) without dp_attention")
    assert _error(MOE, "generation.parallel.ep=6", "generation.parallel.dp_attention=true").startswith(
        "generation.parallel.ep: expected a multiple of placement.tp.rollout (4)")
    assert _error(MOE, "placement.tp.rollout=2", "generation.parallel.ep=6", "generation.parallel.dp_attention=true"
                  ).startswith("generation.parallel.ep: expected ep to divide the 8 GPUs")
    msg = _error(MOE, "generation.parallel.ep=8", "generation.parallel.dp_attention=true",
                 "generation.parallel.redundant_experts=4")
    assert msg.startswith("generation.parallel.ep: expected ep to divide") and "128 experts + 4 redundant (132)" in msg
    assert _error(MOE, "generation.parallel.dp_attention=true").startswith("generation.parallel.ep: expected ep > 1")
    assert "dense model" in _error(DENSE, "generation.parallel.ep=2")
    assert _error(MOE, "generation.parallel.ep=0").startswith("generation.parallel.ep: expected a number >= 1")


def test_the_defaults_set_no_layout_and_ep_sets_one():
    assert build_setup(_load(MOE)).gen_parallel is None
    lay = build_setup(_load(MOE, "generation.parallel.ep=8", "generation.parallel.dp_attention=true",
                            "placement.tp.rollout=2")).gen_parallel
    assert (lay.tp, lay.ep, lay.dp, lay.nv_group) == (2, 8, 4, 8)


# --- the mechanisms by hand ----------------------------------------------------------------------------
def test_a_gpu_reads_its_share_of_the_experts_touched_by_the_engines_rows():
    cost = CostModel.load(H100, "default")
    k = cost.decoder(QWEN, "bfloat16", 1, "vllm").shape
    lay = _lay(tp=1, ep=8, redundant=8)
    ep = G.decode_shape(k, QWEN, lay)
    share = (128 + 8) / (128 * 8)
    touched = 1 - (1 - 8 / 128) ** (8 * 16)     # the engine's 8 ranks of 16 rows each
    dense = k.decode_weight_bytes - k.routed_bytes
    assert ep.decode_weights_at(16) == pytest.approx(dense + k.routed_bytes * share * touched, rel=1e-12)
    # experts spread over the TP group (ep = tp, no DP): the same bytes per GPU as TP's slices of every expert
    same = G.decode_shape(k, QWEN, _lay(tp=4, ep=4, dp=False))
    assert same.decode_weights_at(16) == pytest.approx(k.decode_weights_at(16), rel=1e-12)
    assert G.engine_weight_bytes(QWEN, 2, lay) < QWEN.params("lm") * 2 / 4   # less than TP 4's slice of everything


def test_the_all_to_all_by_hand_over_nvlink_and_the_inter_node_link():
    cost = CostModel.load(H100, "default")
    a, h, k, m_layers, u = ACTIVATION_BYTES["bfloat16"], QWEN.hidden, 8, QWEN.moe_layers, QWEN.expert_imbalance
    assert u > 1   # the catalog's assumption: the busiest GPU receives u times the mean, and everyone waits for it
    per_dir = 64 * k * h * a * u
    nv, ib = H100.intra_node_bw * LINK_EFF, H100.inter_node_bw * LINK_EFF
    one_node = G.alltoall_s(cost, QWEN, "bfloat16", 64, _lay(ep=8))
    assert one_node == pytest.approx(m_layers * 2 * (per_dir * 7 / 8 / nv + G.LATENCY_S), rel=1e-12)
    two_nodes = G.alltoall_s(cost, QWEN, "bfloat16", 64, _lay(ep=16, spans=True))
    per_call = max(per_dir * 7 / 16 / nv, per_dir * 8 / 16 / ib)   # 7 peers over NVLink, 8 over the NIC, at once
    assert two_nodes == pytest.approx(m_layers * 2 * (per_call + G.LATENCY_S), rel=1e-12)
    fp8 = G.alltoall_s(cost, QWEN, "bfloat16", 64, _lay(ep=16, spans=True, fp8=True))
    assert fp8 == pytest.approx(m_layers * (per_dir * 8 / 16 / ib * (1 + G.FP8_DISPATCH_BYTES / a) + 2 * G.LATENCY_S))
    balanced = G.alltoall_s(cost, replace(QWEN, expert_imbalance=1.0), "bfloat16", 64, _lay(ep=8))
    assert balanced - m_layers * 2 * G.LATENCY_S == pytest.approx((one_node - m_layers * 2 * G.LATENCY_S) / u, rel=1e-12)
    # attention TP splits the tokens a GPU dispatches; none without experts to spread
    assert G.alltoall_s(cost, QWEN, "bfloat16", 64, _lay(tp=2, ep=8)) < one_node
    assert G.alltoall_s(cost, load_model("qwen2.5-7b"), "bfloat16", 64, _lay(ep=8)) == 0.0


def test_a_decode_step_carries_the_all_to_all_and_fewer_all_reduces():
    cost = CostModel.load(H100, "default")
    tp = cost.decoder(QWEN, "bfloat16", 2, "vllm")
    ep = cost.decoder(QWEN, "bfloat16", 2, "vllm", par=_lay(tp=2, ep=8))   # 4 attention ranks of TP 2
    ar_all = cost._tp_comm_s(QWEN, "bfloat16", 64, 2)
    ar_attn = cost._tp_comm_s(QWEN, "bfloat16", 64, 2, calls=G.allreduces(QWEN, ep.par))
    assert G.allreduces(QWEN, ep.par) == 48 and ar_attn < ar_all     # every layer is MoE: attention's alone
    assert ep.comm(64) == pytest.approx(ar_attn + ep.alltoall(64), rel=1e-12) and ep.alltoall(64) > 0
    assert ep._lines(64, 6400)[2] < tp._lines(64, 6400)[2]   # a quarter of the experts, touched by 4 x 64 rows
    price = ep.price(64, 6400, 10)
    terms = price.terms()
    assert terms[T.GEN_EP_ALLTOALL] == pytest.approx(10 * ep.alltoall(64), rel=1e-12)
    assert sum(terms.values()) == pytest.approx(price.total_s, rel=1e-12)


def test_experts_over_the_tp_group_alone_price_as_tp():
    # vLLM runs its all-to-all kernels only across data-parallel ranks (dp_size > 1): with ep = tp every GPU holds the
    # step's tokens, runs its own experts on them and all-reduces the output, the bytes of TP's slices
    cost = CostModel.load(H100, "default")
    tp = cost.decoder(QWEN, "bfloat16", 4, "vllm")
    ep = cost.decoder(QWEN, "bfloat16", 4, "vllm", par=_lay(tp=4, ep=4, dp=False))
    assert G.allreduces(QWEN, ep.par) == 2 * QWEN.layers and ep.alltoall(64) == 0.0
    for a, b in zip(ep.coeffs(64, 6400), tp.coeffs(64, 6400)):
        assert a == pytest.approx(b, rel=1e-12)


def test_a_prefill_reads_its_own_experts_and_sends_its_tokens_through_the_all_to_all():
    cost = CostModel.load(H100, "default")
    lay = _lay(tp=1, ep=8)
    plain = cost.forward(QWEN, "bfloat16", 512, 2, 1, op="prefill", head="lm", gen_runtime="vllm")
    ep = cost.prefill_step(QWEN, "bfloat16", 512, 2, 1, "vllm", par=lay)
    a2a = G.alltoall_s(cost, QWEN, "bfloat16", 512, lay)
    terms = ep.terms()
    assert terms[T.GEN_EP_ALLTOALL] == pytest.approx(a2a, rel=1e-12)
    assert sum(terms.values()) == pytest.approx(ep.total_s, rel=1e-12)
    # its own 16 experts of 128 instead of all of them: fewer bytes, the same FLOPs, so no slower beside the all-to-all
    assert ep.total_s - a2a <= plain.total_s
    k = cost._forward_kernel(QWEN, "bfloat16", 1, "prefill", None, "lm", "vllm", False, par=lay).shape
    full = cost._forward_kernel(QWEN, "bfloat16", 1, "prefill", None, "lm", "vllm").shape
    assert k.weight_bytes == pytest.approx(full.weight_bytes - full.routed_bytes * (1 - 1 / 8), rel=1e-12)
    # a chunk inside a decode step carries its tokens' all-to-alls too
    with_chunk = cost.chunk_in_step_s(QWEN, "bfloat16", 256, 2, 1, "vllm", par=lay)
    assert with_chunk - cost.chunk_in_step_s(QWEN, "bfloat16", 256, 2, 1, "vllm") == pytest.approx(
        G.alltoall_s(cost, QWEN, "bfloat16", 256, lay) + (
            cost._forward_kernel(QWEN, "bfloat16", 1, "prefill", None, "lm", "vllm", False, par=lay).marginal_s(256, 2)
            - cost._forward_kernel(QWEN, "bfloat16", 1, "prefill", None, "lm", "vllm").marginal_s(256, 2)), rel=1e-9)


def test_two_batch_overlap_prices_the_larger_of_device_and_all_to_all():
    cost = CostModel.load(H100, "default")
    m = load_model("deepseek-v3")
    par = _lay(tp=1, ep=72, redundant=32, fp8=True, spans=True)
    serial = cost.decoder(m, "float8", 1, "sglang", par=par)
    overlap = cost.decoder(m, "float8", 1, "sglang", par=replace(par, overlap=True))
    a2a = serial.alltoall(256)
    c0, _, u0, _ = overlap._lines(256, 256 * 2000)
    one = overlap.price(256, 256 * 2000, 1)
    assert a2a > max(c0, u0)     # 72 GPUs over 9 nodes: the all-to-all outlasts the device work it overlaps
    assert one.total_s == pytest.approx(max(c0, u0, a2a, overlap.launch_floor(256), overlap.host(256)[1])
                                        + overlap.coeffs(256, 256 * 2000)[4], rel=1e-12)
    assert one.total_s < serial.price(256, 256 * 2000, 1).total_s
    terms = one.terms()
    assert terms[T.GEN_EP_ALLTOALL] == pytest.approx(a2a - max(c0, u0), rel=1e-9)
    assert sum(terms.values()) == pytest.approx(one.total_s, rel=1e-12) and min(terms.values()) >= 0


def test_the_kv_cache_is_split_as_the_engine_splits_it():
    assert G.kv_shards(load_model("deepseek-v3"), 4) == 1      # one latent per token: whole on each TP rank
    assert G.kv_shards(QWEN, 8) == 4 and G.kv_shards(QWEN, 2) == 2
    cost = CostModel.load(H100, "default")
    m = load_model("deepseek-v3")
    plain = cost.decoder(m, "bfloat16", 2, "sglang")
    ep = cost.decoder(m, "bfloat16", 2, "sglang", par=_lay(tp=2, ep=16, spans=True))
    assert ep.kv_b == pytest.approx(2 * plain.kv_b, rel=1e-12)   # each GPU reads its rank's whole latent cache
    # the scenario's capacity: a GQA cache of 4 KV heads at TP 4 split over the 4 GPUs, as without EP
    base = build_setup(_load(MOE, "generation.parallel.ep=4")).kv_capacity_tokens
    assert base == build_setup(_load(MOE)).kv_capacity_tokens


def test_an_engine_on_its_own_pool_holds_its_share_of_the_experts_and_more_cache():
    pools = ("placement={kind: pools, pools: [{name: train, gpus: 4, roles: [actor]}, {name: gen, gpus: 4, roles: "
             "[rollout]}], tp: {actor: 4, rollout: 1}}", "execution.weight_sync={kind: nccl}")
    tp = build_setup(_load(MOE, *pools))
    ep = build_setup(_load(MOE, *pools, "generation.parallel.ep=4", "generation.parallel.dp_attention=true"))
    routed = QWEN.moe_layers * QWEN.num_experts * QWEN.expert_params
    assert tp.resident_bytes[1] == pytest.approx(QWEN.params("lm") * 2, rel=1e-12)
    assert ep.resident_bytes[1] == pytest.approx((QWEN.params("lm") - routed) * 2 + routed * 2 / 4, rel=1e-12)
    per_token = QWEN.kv_bytes_per_token("bfloat16")
    assert ep.kv_capacity_tokens == int((H100.mem_bytes - ep.resident_bytes[1]) * 0.9 // per_token)
    assert ep.kv_capacity_tokens > 2 * tp.kv_capacity_tokens


# --- the simulator, explain and verl -------------------------------------------------------------------
def test_explain_shows_the_all_to_all_and_dp_attention_halves_the_generate_span():
    tp = explain(_load(MOE, *SMALL, "placement.tp.rollout=1"), steps=2)
    doc = explain(_load(MOE, *SMALL, "placement.tp.rollout=1", "generation.parallel.ep=8",
                        "generation.parallel.dp_attention=true"), steps=2)
    gen = doc["phases"]["generate"]
    assert gen["terms_s"][T.GEN_EP_ALLTOALL] > 0
    assert T.GEN_EP_ALLTOALL not in tp["phases"]["generate"]["terms_s"]
    # eight replicas that each read 1/8 of the experts against eight that each read them all
    assert gen["span_s"] < tp["phases"]["generate"]["span_s"]


def _import_verl(text: str, **kw):
    from rlhfsim.importers import ImportOptions, import_verl
    return import_verl(text, ImportOptions(**{"gpu": "h100-sxm", "mean_response_len": 400, "mean_prompt_len": 200, **kw}))


LAUNCH = ("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B "
          "actor_rollout_ref.rollout.n=8 data.train_batch_size=16 actor_rollout_ref.actor.ppo_mini_batch_size=16 "
          "trainer.nnodes=1 trainer.n_gpus_per_node=8 actor_rollout_ref.actor.fsdp_config.optimizer_offload=True "
          "actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.gpu_memory_utilization=0.6 ")


def test_verls_rollout_degrees_map_and_round_trip():
    from rlhfsim.importers.verl_export import export_verl
    res = _import_verl(LAUNCH + "actor_rollout_ref.rollout.data_parallel_size=4 actor_rollout_ref.rollout.expert_parallel_size=8 "
                       "+actor_rollout_ref.rollout.enable_expert_parallel=True")
    assert res.scenario["generation"]["parallel"] == {"ep": 8, "dp_attention": True}
    status = {s.key: s.status for s in res.settings}
    assert status["actor_rollout_ref.rollout.expert_parallel_size"] == "mapped"
    assert status["actor_rollout_ref.rollout.data_parallel_size"] == "mapped"
    assert status["actor_rollout_ref.rollout.enable_expert_parallel"] == "unmapped"   # listed: the backend's switch
    overrides, opts = export_verl(res.scenario)
    again = _import_verl(" ".join(overrides), **{k: getattr(opts, k) for k in ("gpu", "mean_response_len",
                                                                               "mean_prompt_len", "steps")})
    assert again.scenario["generation"]["parallel"] == res.scenario["generation"]["parallel"]
    assert again.scenario["generation"]["kv_cache_fraction"] == res.scenario["generation"]["kv_cache_fraction"]
    assert "parallel" not in _import_verl(LAUNCH).scenario["generation"]
    # gpu_memory_utilization less the engine's weights per GPU: 1/8 of the experts leave more for the cache
    low = "actor_rollout_ref.rollout.gpu_memory_utilization=0.4 "
    tp_only = _import_verl(LAUNCH + low).scenario["generation"]["kv_cache_fraction"]
    ep = _import_verl(LAUNCH + low + "actor_rollout_ref.rollout.data_parallel_size=4 "
                      "actor_rollout_ref.rollout.expert_parallel_size=8").scenario["generation"]["kv_cache_fraction"]
    assert 0.01 < tp_only < ep


def test_verls_ep_must_equal_tp_times_dp():
    from rlhfsim.importers.common import ImportError_
    with pytest.raises(ImportError_) as e:
        _import_verl(LAUNCH + "actor_rollout_ref.rollout.expert_parallel_size=8")
    assert str(e.value).startswith("actor_rollout_ref.rollout.expert_parallel_size: expected tensor_model_parallel_size"
                                   " x data_parallel_size (2 x 1 = 2")


@pytest.mark.parametrize("setting", ["actor_rollout_ref.rollout.expert_parallel_size=abc",
                                     "actor_rollout_ref.rollout.data_parallel_size=0",
                                     "+actor_rollout_ref.rollout.engine_kwargs.vllm.num_redundant_experts=x"])
def test_a_rollout_degree_that_is_not_a_whole_number_is_a_one_line_error(setting):
    from rlhfsim.importers.common import ImportError_
    extra = "actor_rollout_ref.rollout.expert_parallel_size=2 " if "redundant" in setting else ""
    with pytest.raises(ImportError_) as e:
        _import_verl(LAUNCH + extra + setting)
    key = setting.lstrip("+").split("=")[0]
    assert str(e.value).startswith(f"{key}: expected a whole number") and "\n" not in str(e.value)


def test_an_expert_parallel_prefills_imbalance_holds_none_of_its_all_to_all():
    """The all-to-alls are gen_ep_alltoall's alone: the router and expert_imbalance of an expert-parallel prefill are
    those of the same forward without them (its own experts' bytes), and kernels keeps the rest."""
    cost = CostModel.load(H100, "default")
    lay = _lay(tp=2, ep=8)
    ep = cost.forward(QWEN, "bfloat16", 4096, 8, 2, op="prefill", head="lm", gen_runtime="vllm", par=lay).terms()
    bare = cost.forward(QWEN, "bfloat16", 4096, 8, 2, op="prefill", head="lm", gen_runtime="vllm", par=lay,
                        a2a=False).terms()
    from rlhfsim.costs.moe import without_imbalance

    def total(m):   # the forward's price without its all-to-alls
        return cost.forward(m, "bfloat16", 4096, 8, 2, op="prefill", head="lm", gen_runtime="vllm", par=lay,
                            a2a=False).total_s
    # the imbalance is the forward's own (the busiest GPU's all-to-all bytes are gen_ep_alltoall's, not counted twice)
    assert ep[T.EXPERT_IMBALANCE] == pytest.approx(total(QWEN) - total(without_imbalance(QWEN)), rel=1e-9)
    assert ep[T.EXPERT_IMBALANCE] == pytest.approx(bare[T.EXPERT_IMBALANCE], rel=1e-12)
    assert ep[T.ROUTER] == pytest.approx(bare[T.ROUTER], rel=1e-12)
    assert ep[T.KERNELS] == pytest.approx(bare[T.KERNELS], rel=1e-12)
    assert ep[T.GEN_EP_ALLTOALL] == pytest.approx(G.alltoall_s(cost, QWEN, "bfloat16", 4096, lay), rel=1e-12)

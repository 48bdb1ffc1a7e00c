"""A step as verl and OpenRLHF run it (``execution`` in the scenario; issue 17): every mechanic against
numbers worked by hand, plus the errors that name their YAML path.

Hand numbers use ``tiny-qwen2`` (L = 2, h = 128, intermediate 512, 4 heads, 2 KV heads of 32, vocab
1024, tied): per layer 2 h^2 + 2 h d_kv + 3 h i = 32,768 + 16,384 + 196,608 = 245,760 parameters,
P = 2 x 245,760 + 1024 x 128 = 622,592 with the LM head; W = 2,490,368 bytes in float32, 1,245,184 in
bfloat16. Simulation-level tests compose the expected span from the cost model's own calls (the
roofline is pinned elsewhere); what they check is which calls a phase makes and how they add up.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from conftest import make_dict
from rlhfsim.costs.flops import ShapeCoeffs
from rlhfsim.costs.model import CostModel
from rlhfsim.costs.profile import load_profile, validate_profile
from rlhfsim.costs.stepcosts import STEP_DEFAULTS, packed_attn_pairs
from rlhfsim.errors import ProfileError, ScenarioError
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import load_model
from rlhfsim.contracts import PHASES, VERL_PHASE_KEYS
from rlhfsim.scenario import load_scenario
from rlhfsim.scenario.checks import build_setup
from rlhfsim.sim import microbatch as mb
from rlhfsim.sim.rollouts import Rollout
from rlhfsim.sim.simulation import Simulation, summarize

ROOT = Path(__file__).resolve().parents[2]
CPU_PROFILE = ROOT / "tests" / "fixtures" / "profiles" / "cpu.json"
TINY = load_model("tiny-qwen2", "models.actor.model", ROOT)
P_TINY = 622_592


def test_tiny_shape_by_hand():
    assert TINY.params("lm") == P_TINY
    assert TINY.kv_bytes_per_token("float32") == 2 * 2 * 64 * 4  # 2 (K, V) x L x d_kv x 4 bytes = 1,024


# --- micro-batches --------------------------------------------------------------------------------
def _rows(lengths, prompt=0):
    return [Rollout(i, prompt, n) for i, n in enumerate(lengths)]


def test_pieces_by_rows_padded_and_packed():
    rows = _rows([10, 30, 20, 50, 5])
    # pieces of 2 rows, padded to each piece's longest: 2 x 30, 2 x 50, 1 x 5
    assert mb.pieces(rows, 2) == [mb.Piece(2, 60), mb.Piece(2, 100), mb.Piece(1, 5)]
    # packed: real tokens; causal attention pairs L (L + 1) / 2 per row:
    # 10: 55, 30: 465 -> 520; 20: 210, 50: 1,275 -> 1,485; 5: 15
    assert mb.pieces(rows, 2, packed=True) == [mb.Piece(2, 40, 520.0), mb.Piece(2, 70, 1485.0), mb.Piece(1, 5, 15.0)]
    # no size: one call of every row, padded to 50
    assert mb.pieces(rows, None) == [mb.Piece(5, 250)]


def test_pieces_by_token_budget_greedy():
    rows = _rows([10, 30, 20, 50, 5, 70])
    # budget 60: 10 + 30 + 20 = 60 fits; 50 starts a piece, + 5 = 55; 70 > 60 is a piece of its own
    assert [[r.response_len for r in g] for g in mb.groups(rows, None, 60)] == [[10, 30, 20], [50, 5], [70]]
    assert mb.pieces(rows, 2, 60) == [mb.Piece(3, 90), mb.Piece(2, 100), mb.Piece(1, 70)]  # the budget wins


def test_packed_attention_pairs_replace_the_even_spread():
    k = ShapeCoeffs.of(TINY, "float32", "lm")
    # F_attn = 4 L h x pairs = 4 x 2 x 128 x 520 = 532,480 FLOPs more than with no attention at all
    with_pairs = k.forward(40, 2, 0.0, 40, attn_pairs=520.0).flops
    without = k.forward(40, 2, 0.0, 40, attn_pairs=0.0).flops
    assert with_pairs - without == pytest.approx(532_480)
    assert packed_attn_pairs([10, 30]) == 520.0 and packed_attn_pairs([10, 30], encoder=True) == 1000.0
    # even spread of 40 tokens over 2 rows: 4 L h x 2 x 20 x 21 / 2 = 1,024 x 420 = 430,080 (< 532,480)
    assert k.forward(40, 2, 0.0, 40).flops - without == pytest.approx(430_080)


# --- cost-model terms -----------------------------------------------------------------------------
def test_host_copy_reshard_and_advantage_by_hand():
    cost = CostModel.load(get_gpu("h200"), "default")
    assert cost.gpu.host_link_bw == 64e9  # PCIe Gen5, 128 GB/s both directions
    # 5.12 GB / (64 GB/s x 0.8) = 0.1 s
    assert cost.host_copy_s(5.12e9) == pytest.approx(0.1)
    parts = cost.reshard_parts(TINY, "bfloat16", train_gpus=8, engine_tp=1, kv_bytes=2 * 2**30, shared=True)
    # gather: W (n-1)/n = 1,245,184 x 7/8 = 1,089,536 B over 450 GB/s x 0.7 = 315 GB/s, + 10 us latency
    #         = 3.4588444e-6 + 1e-5 = 1.34588444e-5 s
    assert parts["gather_s"] == pytest.approx(1.34588444e-5)
    # load: 2 W / tp / (4.8 TB/s x 0.7) = 2,490,368 / 3.36e12 = 7.4118095e-7 s
    assert parts["load_s"] == pytest.approx(7.4118095e-7)
    # KV: 0.02 s + 0.002 s/GiB x 2 GiB = 0.024 s
    assert parts["kv_realloc_s"] == pytest.approx(0.024)
    sep = cost.reshard_parts(TINY, "bfloat16", train_gpus=1, engine_tp=1, kv_bytes=0.0, shared=False)
    assert sep["gather_s"] == 0.0 and "kv_realloc_s" not in sep
    assert sep["broadcast_s"] == pytest.approx(cost.weight_sync_s(TINY, "bfloat16", 1))
    # the driver's advantage step (rlhfsim.costs.driver) with the default costs (3.7e-6, 3.3e-9, 1.2e-9, 1.23e-5 s
    # measured, x 1.3492632 for the reference host: 4.9922737e-6, 4.4525684e-9, 1.6191158e-9, 1.6595937e-5 s; an
    # H200's host is the reference), 4 rows padded to 40:
    # GAE, masked loop: 40 x 13 x (4.9922737e-6 + 4 x 4.4525684e-9) + 22 x 160 x 1.6191158e-9
    #                   = 2.60524367e-3 + 5.6992876e-6 s
    assert cost.host_factor == 1.0
    assert cost.advantage_s(4, 40, gae=True) == pytest.approx(2.60524367e-3 + 5.6992876e-6)
    # GRPO: 4 x 1.6595937e-5 + 2 x 160 x 1.6191158e-9 = 6.6383748e-5 + 5.1811706e-7 s
    assert cost.advantage_s(4, 40, gae=False) == pytest.approx(6.6383748e-5 + 5.1811706e-7)


def test_step_scalars_from_profile_or_flagged_defaults(tmp_path):
    doc = load_profile(str(CPU_PROFILE))
    doc = {k: v for k, v in doc.items() if k != "_path"}
    cost = CostModel(get_gpu("cpu"), doc)
    assert cost.step_costs()["host_copy_eff"] == {"value": STEP_DEFAULTS["host_copy_eff"], "source": "default"}
    doc["step"] = {"host_copy_eff": 0.5, "microbatch_train_s": None}
    cost = CostModel(get_gpu("cpu"), validate_profile(doc))
    assert cost.step_costs()["host_copy_eff"] == {"value": 0.5, "source": "profile"}
    assert cost.step_costs()["microbatch_train_s"]["source"] == "default"
    assert cost.host_copy_s(1e9) == pytest.approx(1e9 / (10e9 * 0.5))  # cpu "host link" 10 GB/s
    for bad, msg in (({"host_copy_eff": 0}, "step.host_copy_eff: expected an efficiency"),
                     ({"kv_realloc_s": -1}, "step.kv_realloc_s: expected a finite number")):
        with pytest.raises(ProfileError, match=msg):
            validate_profile({**doc, "step": bad})


# --- simulation: each phase as the sum of its calls -----------------------------------------------
def _tiny(execution: dict, response: int = 64) -> dict:
    """CPU_TINY (GRPO, 4 prompts x 4 = 16 rows, one device), every row 32 + ``response`` tokens."""
    d = make_dict("cpu", {"execution": execution, "steps": 2})
    d["workload"]["response_length"] = {"kind": "fixed", "value": response}
    return d


def _run(d: dict, rollouts=None) -> Simulation:
    setup = build_setup(load_scenario(d))
    cost = CostModel.load(setup.gpu, str(CPU_PROFILE))
    sim = Simulation(setup, cost, rollouts=rollouts)
    sim.run(2)
    return sim


def _fwd(sim, role, tokens, rows, pairs=None):
    s = sim.setup
    return sim.cost.forward(s.shapes[role], s.dtypes[role], tokens, rows, 1, op="prefill",
                                  runtime=sim.forward_runtime(role), head=s.head(role), all_logits=True,
                                  attn_pairs=pairs).total_s


def test_default_execution_records_the_older_step():
    sim = _run(make_dict("cpu", {"steps": 2}))
    rec = sim.rec.steps[1]
    assert set(rec.phases_s) == {"generate", "reward", "reference", "actor_train", "weight_sync"}
    summ = summarize(sim, sim.rec.steps)
    assert summ["step_costs"] == {}
    assert summ["verl_timing"]["timing_s/step"] == summ["step_time_s"]
    assert summ["verl_timing"]["timing_s/ref"] == summ["phases_s"]["reference"]


def test_old_log_prob_in_micro_batches():
    sim = _run(_tiny({"old_log_prob": True, "micro_batch": {"log_prob_micro_batch_size_per_gpu": 4}}))
    # 16 rows of 96 tokens in pieces of 4: four calls of 4 x 96 = 384 tokens each (+ 0 s per piece:
    # microbatch_forward_s defaults to 0)
    want = 4 * _fwd(sim, "actor", 384, 4)
    assert sim.rec.steps[1].phases_s["old_log_prob"] == pytest.approx(want, rel=1e-12)
    # the reference pass uses the same pieces
    assert sim.rec.steps[1].phases_s["reference"] == pytest.approx(4 * _fwd(sim, "reference", 384, 4), rel=1e-12)
    # verl's order: reward, then old_log_prob, then ref
    spans = sim.rec.spans(1)
    assert spans["reward"][1] <= spans["old_log_prob"][0] and spans["old_log_prob"][1] <= spans["reference"][0]


def test_dynamic_batch_by_token_budget_matches_pieces_of_two():
    # budget 200 tokens: 96 + 96 = 192 fits, a third row (288) does not: pieces of 2 rows
    by_budget = _run(_tiny({"old_log_prob": True, "micro_batch": {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 200}}))
    assert by_budget.rec.steps[1].phases_s["old_log_prob"] == pytest.approx(8 * _fwd(by_budget, "actor", 192, 2), rel=1e-12)


def test_remove_padding_prices_real_tokens_and_per_row_attention():
    lengths = [10, 50, 20, 40] * 8  # two steps of 16 rows; prompts of 32
    rollouts = [(32, r) for r in lengths]
    ex = {"old_log_prob": True, "micro_batch": {"log_prob_micro_batch_size_per_gpu": 2, "use_remove_padding": True}}
    sim = _run(_tiny(ex), rollouts=rollouts)
    # step 1's rows in id order, pieces of 2: rows (42, 82) and (52, 72), four times each:
    # (42, 82): 124 tokens, pairs 42 x 43 / 2 + 82 x 83 / 2 = 903 + 3,403 = 4,306
    # (52, 72): 124 tokens, pairs 52 x 53 / 2 + 72 x 73 / 2 = 1,378 + 2,628 = 4,006
    want = 4 * _fwd(sim, "actor", 124, 2, 4306.0) + 4 * _fwd(sim, "actor", 124, 2, 4006.0)
    assert sim.rec.steps[1].phases_s["old_log_prob"] == pytest.approx(want, rel=1e-12)
    padded = _run(_tiny({"old_log_prob": True, "micro_batch": {"log_prob_micro_batch_size_per_gpu": 2}}), rollouts=rollouts)
    # padded: 2 x 82 = 164 and 2 x 72 = 144 tokens per piece: dearer
    assert padded.rec.steps[1].phases_s["old_log_prob"] == pytest.approx(
        4 * _fwd(sim, "actor", 164, 2) + 4 * _fwd(sim, "actor", 144, 2), rel=1e-12)
    assert want < padded.rec.steps[1].phases_s["old_log_prob"]


def test_training_micro_batches_checkpointing_and_optimizer_offload():
    ex = {"micro_batch": {"ppo_micro_batch_size_per_gpu": 2}, "gradient_checkpointing": True,
          "offload": {"actor": {"optimizer": True}}}
    sim = _run(_tiny(ex))
    s, cost = sim.setup, sim.cost
    train = cost.train(TINY, "float32", 192, 2, 1, "lm").total_s
    opt = cost.optimizer(TINY, "float32", 1, 1, "lm", False).total_s
    # 16 rows, minibatch 8, one rank: per minibatch 4 pieces of 2 x 96 = 192 tokens, each x (1 + 1/3)
    # for the recomputed forward, then the optimizer; two minibatches.
    # Optimizer offload: AdamW state 12 B x P = 7,471,104 B loaded and offloaded = 14,942,208 B over the
    # CPU's 10 GB/s x 0.8 = 8 GB/s: 1.867776e-3 s.
    offload = 2 * 12 * P_TINY / 8e9
    assert offload == pytest.approx(1.867776e-3)
    want = 2 * (4 * train * (1 + 1 / 3) + opt) + offload
    assert sim.rec.steps[1].phases_s["actor_train"] == pytest.approx(want, rel=1e-12)
    assert s.resident_bytes[0] < build_setup(load_scenario(_tiny({}))).resident_bytes[0]  # 12 B/param less resident


def test_reshard_weight_sync_and_advantage():
    sim = _run(_tiny({"weight_sync": {"kind": "reshard"}, "advantage": {"enabled": True}}))
    s = sim.setup
    # one device: no gather; load 2 W / (20 GB/s x 0.7) = 4,980,736 / 1.4e10 = 3.5576686e-4 s;
    # KV free/realloc: 0.02 s + 0.002 s/GiB x (kv capacity x 1,024 B) / 2^30
    load = 3.5576686e-4
    kv = 0.02 + 0.002 * s.kv_capacity_tokens * 1024 / 2**30
    assert sim.rec.steps[1].phases_s["weight_sync"] == pytest.approx(load + kv, rel=1e-7)
    # GRPO (no critic), 16 rows padded to the 128-token response cap (the responses are 64): 16 x 1.6595937e-5
    # + 2 x 2,048 x 1.6191158e-9 = 2.6553499e-4 + 6.6318983e-6 s (a CPU device: no host apart, factor 1)
    want = 2.6553499e-4 + 6.6318983e-6
    assert s.scenario.workload.max_response_tokens == 128
    assert sim.rec.steps[1].phases_s["adv"] == pytest.approx(want)
    summ = summarize(sim, sim.rec.steps)
    assert summ["verl_timing"]["timing_s/adv"] == pytest.approx(want)
    assert set(summ["step_costs"]) == {"reshard_eff", "kv_realloc_s", "kv_realloc_s_per_gib", "adv_per_row_s",
                                       "adv_per_element_s"}
    assert all(v["source"] == "default" for v in summ["step_costs"].values())


def test_reference_param_offload_streams_per_call():
    sim = _run(_tiny({"micro_batch": {"log_prob_micro_batch_size_per_gpu": 4}, "offload": {"reference": {"param": True}}}))
    # four calls, each streams W = 2,490,368 B in at 8 GB/s: 4 x 3.11296e-4 s
    want = 4 * _fwd(sim, "reference", 384, 4) + 4 * 2_490_368 / 8e9
    assert sim.rec.steps[1].phases_s["reference"] == pytest.approx(want, rel=1e-12)


# --- names and errors -----------------------------------------------------------------------------
def test_phase_names_have_one_home():
    from rlhfsim.report import figures, load
    from rlhfsim.sim import simulation

    assert simulation.PHASES is PHASES and load.PHASES is PHASES
    assert set(figures.PHASE_COLOURS) == set(PHASES)
    assert VERL_PHASE_KEYS["old_log_prob"] == "timing_s/old_log_prob" and VERL_PHASE_KEYS["critic_fwd"] == "timing_s/values"


@pytest.mark.parametrize("execution, path", [
    ({"micro_batch": {"use_dynamic_bsz": True}}, "execution.micro_batch.ppo_max_token_len_per_gpu"),
    ({"micro_batch": {"ppo_micro_batch_size_per_gpu": 0}}, "execution.micro_batch.ppo_micro_batch_size_per_gpu"),
    ({"offload": {"critic": {"optimizer": True}}}, "execution.offload.critic.optimizer"),
    ({"weight_sync": {"kind": "nccl"}}, "execution.weight_sync.kind"),
    ({"offload": {"actor": {"params": True}}}, "execution.offload.actor.params"),
])
def test_bad_execution_values_name_their_path(execution, path):
    with pytest.raises(ScenarioError) as e:
        build_setup(load_scenario(_tiny(execution)))
    assert str(e.value).startswith(path), str(e.value)
    assert "\n" not in str(e.value)


def test_verl_names_in_the_cli_table(tmp_path):
    from click.testing import CliRunner

    from rlhfsim.cli import main

    d = _tiny({"old_log_prob": True, "advantage": {"enabled": True}})
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(d))  # JSON is YAML
    res = CliRunner().invoke(main, ["simulate", str(path), "--names", "verl", "--profile", str(CPU_PROFILE)])
    assert res.exit_code == 0, res.output
    for name in ("timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv", "timing_s/update_actor",
                 "timing_s/update_weights", "timing_s/step"):
        assert name in res.output
    res = CliRunner().invoke(main, ["simulate", str(path), "--format", "json", "--profile", str(CPU_PROFILE)])
    doc = json.loads(res.output)
    assert doc["verl_timing"]["timing_s/old_log_prob"] == doc["phases_s"]["old_log_prob"]
    assert copy.deepcopy(doc["step_costs"])["adv_per_row_s"]["source"] == "default"


# --- Ulysses sequence parallelism -----------------------------------------------------------------
def test_ulysses_work_and_all_to_all_by_hand():
    from rlhfsim.costs import flops as fl

    # F / sp and the weights whole: Work(100 FLOP, 50 B of which 20 B weights) over 2 GPUs -> (50, 20 + 30/2)
    w = fl.sequence_parallel(fl.Work(100.0, 50.0, 0.0, 2), 20.0, 2)
    assert (w.flops, w.bytes) == (50.0, 35.0)
    # 1,000 tokens of tiny-qwen2 in bf16 over sp = 2: 4 all-to-alls x L = 2 x 500 tokens x h = 128 x 2 B
    # x (sp - 1)/sp = 1/2 = 512,000 B per GPU per pass
    assert fl.ulysses_bytes(TINY, "bfloat16", 1000, 2) == 512_000
    # on an H200: 512,000 / 315 GB/s + 4 x 2 calls x 10 us = 1.6254e-6 + 8e-5 = 8.16254e-5 s
    cost = CostModel.load(get_gpu("h200"), "default")
    assert cost._ulysses_comm_s(TINY, "bfloat16", 1000, 2) == pytest.approx(8.16254e-5, rel=1e-5)


def test_ulysses_groups_share_pieces():
    d = make_dict("colocated", {"execution": {"ulysses_sequence_parallel_size": 2}, "steps": 2})
    rollouts = [(64, 100)] * 64
    setup = build_setup(load_scenario(d))
    # the roofline alone (no host dispatch: a tiny model's calls would all cost their launch-bound host time)
    profile = {k: v for k, v in copy.deepcopy(load_profile("default")).items() if k != "framework"}
    sim = Simulation(setup, CostModel(setup.gpu, profile), rollouts=rollouts)
    sim.run(2)
    # 4 GPUs, reference at TP 1 in groups of 2: 2 replicas of 2 GPUs; 16 rows -> 8 each, one piece of
    # generation.max_batch = 8 rows x 164 tokens, priced as one GPU of the group
    want = sim.cost.forward(setup.shapes["reference"], "bfloat16", 8 * 164, 8, 1, op="prefill",
                                  runtime=sim.forward_runtime("reference"), head="lm", all_logits=True, sp=2).total_s
    assert sim.rec.steps[1].phases_s["reference"] == pytest.approx(want, rel=1e-12)
    ref = [iv for iv in sim.rec.intervals if iv.step == 1 and iv.phase == "reference"]
    assert sorted((iv.gpu0, iv.n_gpus) for iv in ref) == [(0, 2), (2, 2)]
    alone = sim.cost.forward(setup.shapes["reference"], "bfloat16", 4 * 164, 4, 1, op="prefill",
                                   runtime=sim.forward_runtime("reference"), head="lm", all_logits=True).total_s
    assert want != alone  # not the same as 4 replicas with half the rows each


def test_engine_sleep_moves_the_engine_weights_to_host_and_back():
    sim = _run(_tiny({"weight_sync": {"kind": "reshard", "engine_sleep": True}}))
    parts = summarize(sim, sim.rec.steps)["weight_sync_parts_s"]
    s = sim.setup
    w = s.shapes["actor"].params("lm") * {"float32": 4, "bfloat16": 2}[s.dtypes["actor"]] / s.tp["rollout"]  # the engine's shard
    assert parts["sleep_wake_s"] == pytest.approx(2 * w / (s.gpu.host_link_bw * sim.cost.step_scalar("host_copy_eff")))
    plain = summarize(_run(_tiny({"weight_sync": {"kind": "reshard"}})), sim.rec.steps)["weight_sync_parts_s"]
    assert "sleep_wake_s" not in plain


def test_ulysses_must_divide_the_pool():
    with pytest.raises(ScenarioError) as e:
        build_setup(load_scenario(make_dict("gpu", {"execution": {"ulysses_sequence_parallel_size": 2}})))
    assert str(e.value).startswith("execution.ulysses_sequence_parallel_size: expected TP x sp (1 x 2) to divide the 3 GPUs")


def test_reshard_parts_in_the_summary():
    sim = _run(_tiny({"weight_sync": {"kind": "reshard"}, "offload": {"actor": {"param": True}}}))
    parts = summarize(sim, sim.rec.steps)["weight_sync_parts_s"]
    # one device: gather 0; load 3.5576686e-4 s (as above); param offload: loaded and offloaded,
    # 2 x 2,490,368 B / 8 GB/s = 6.22592e-4 s
    assert parts["gather_s"] == 0.0 and parts["load_s"] == pytest.approx(3.5576686e-4)
    assert parts["offload_s"] == pytest.approx(6.22592e-4)
    assert sim.rec.steps[1].phases_s["weight_sync"] == pytest.approx(sum(parts.values()), rel=1e-12)
    plain = _run(_tiny({}))
    assert summarize(plain, plain.rec.steps)["weight_sync_parts_s"] is None


def test_measured_piece_scalars_price_every_call_of_the_default_step(tmp_path):
    """A profile that measured the framework's host time per piece charges it on every forward and
    training call, with or without ``execution.micro_batch`` (every framework computes log-probs and the
    PPO loss this way, not with the fitted call's ``labels=`` loss); the summary lists the two scalars as
    measured. Without them (the fixture profile) the default step is unchanged and lists nothing."""
    doc = {k: v for k, v in load_profile(str(CPU_PROFILE)).items() if k != "_path"}
    doc["step"] = {"microbatch_forward_s": 0.002, "microbatch_train_s": 0.01}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(validate_profile(doc)))
    d = make_dict("cpu", {"steps": 2})
    base = _run(d)
    setup = build_setup(load_scenario(d))
    piece = Simulation(setup, CostModel.load(setup.gpu, str(path)))
    piece.run(2)
    sc = setup.scenario
    rows = sc.workload.prompts_per_step * sc.algorithm.group_size
    minibatches = sc.algorithm.ppo_epochs * -(-rows // sc.algorithm.minibatch_size)
    forward_pieces = -(-rows // sc.generation.max_batch)
    a, b = base.rec.steps[1].phases_s, piece.rec.steps[1].phases_s
    assert b["actor_train"] - a["actor_train"] == pytest.approx(0.01 * minibatches, rel=1e-9)
    assert b["reference"] - a["reference"] == pytest.approx(0.002 * forward_pieces, rel=1e-9)
    assert summarize(piece, piece.rec.steps)["step_costs"] == {
        "microbatch_forward_s": {"value": 0.002, "source": "profile"},
        "microbatch_train_s": {"value": 0.01, "source": "profile"}}

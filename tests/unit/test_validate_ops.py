"""Validate's per-call prices (``calibrate.validation.compare``: each call the executor timed inside a real
step, priced at its shape) are what the simulator charges for the same call: a generate() call, a prefill
and the decode steps of a static batch, a forward piece and a training minibatch of the sequential phases,
and a scorer call under intra-step streaming. Both sides read ``rlhfsim.costs.price``; these tests pin that
the simulator's own spans equal validate's prices, so the two cannot drift. No torch needed."""

from __future__ import annotations

import copy

import pytest

from calibrate.validation.compare import price_op, price_phase_op, price_scorer_op
from rlhfsim.costs import terms as T
from rlhfsim.costs.model import CostModel
from rlhfsim.errors import RlhfsimError
from rlhfsim.scenario import load_scenario
from rlhfsim.scenario.checks import build_setup

ROWS = [(32, 20)] * 4   # one static batch of 4 equal rows: every phase is one call


def _one_batch(scenario_dict, generation: dict | None = None, **over) -> dict:
    """A GRPO group of 4 rows: one generate() batch, one forward piece per role, one training minibatch."""
    d = scenario_dict("cpu", {"generation": {"engine": "static", "max_batch": 4, "runtime": "hf_generate",
                                             **(generation or {})}, **over})
    d["workload"]["prompts_per_step"] = 1
    d["algorithm"]["minibatch_size"] = 4
    return d


def _framework_cost(setup, **step) -> CostModel:
    """The bundled CPU profile plus a framework section (as GPU profiles carry): every forward and training
    piece then pays the host's dispatch, and log-prob heads their element-wise passes."""
    prof = copy.deepcopy(CostModel.load(setup.gpu).profile)
    prof["framework"] = {"host_forward_per_layer_s": 0.05, "host_train_per_layer_s": 0.2, "host_checkpoint_mult": 2.0}
    prof.setdefault("step", {}).update(step)
    return CostModel(setup.gpu, prof)


def test_one_static_call_is_what_the_engine_charges(scenario_dict, tracked):
    run = tracked(_one_batch(scenario_dict), steps=1, rollouts=ROWS)
    s = run.sim.setup
    m, dt = s.shapes["actor"], s.dtypes["actor"]
    call = price_op(run.sim.cost, m, dt, "hf_generate", "generate_call", {"rows": 4, "width": 32, "steps": 20, "first": True}).total_s
    assert run.sim.cost.call_overhead_s("hf_generate") > 0    # the bundled cpu profile measured it
    assert run.records[0].phases_s["generate"] == pytest.approx(call, rel=1e-9)


def test_a_prefill_and_its_decode_steps_sum_to_the_engines_generate_span(scenario_dict, tracked):
    # kv_decoder logs the batch's prefill and each decode step: priced one by one, they sum to the
    # engine's closed-form segment (4 rows of 32 prompt tokens, 19 steps after the prefill's token)
    d = _one_batch(scenario_dict, {"runtime": "kv_decoder", "sampling_logprobs": True})
    run = tracked(d, steps=1, rollouts=ROWS)
    cost, s = run.sim.cost, run.sim.setup
    m, dt = s.shapes["actor"], s.dtypes["actor"]
    ops = [price_op(cost, m, dt, "kv_decoder", "prefill", {"n_tokens": 4 * 32, "n_seqs": 4}, True).total_s]
    ops += [price_op(cost, m, dt, "kv_decoder", "decode", {"batch": 4, "kv0": 4 * (33 + i)}, True).total_s for i in range(19)]
    assert run.records[0].phases_s["generate"] == pytest.approx(cost.call_overhead_s("kv_decoder") + sum(ops), rel=1e-9)
    with pytest.raises(RlhfsimError, match="expected prefill, decode or generate_call"):
        price_op(cost, m, dt, "kv_decoder", "train", {}).total_s


def test_a_padded_static_call_is_what_the_engine_charges(scenario_dict, tracked):
    # One batch of 4 rows of unequal prompts (longest 32): left-padded, so each of its 19 decode steps
    # pays the padding term, in the engine and in the executor's call priced by price_op alike.
    sc = load_scenario(_one_batch(scenario_dict))
    setup = build_setup(sc)
    prof = copy.deepcopy(CostModel.load(setup.gpu).profile)
    prof["generation"]["hf_generate"].update(pad_step_s=0.003, pad_step_per_row_s=0.0005, pad_prefill_s=0.02)
    cost = CostModel(setup.gpu, prof)
    run = tracked(sc, steps=1, rollouts=[(32, 20), (30, 20), (25, 20), (32, 20)], cost=cost)
    m, dt = setup.shapes["actor"], setup.dtypes["actor"]
    shape = {"rows": 4, "width": 32, "steps": 20, "first": True}
    plain = price_op(cost, m, dt, "hf_generate", "generate_call", shape).total_s
    padded = price_op(cost, m, dt, "hf_generate", "generate_call", {**shape, "padded": True}).total_s
    assert padded - plain == pytest.approx(0.02 + 19 * (0.003 + 4 * 0.0005))
    assert run.records[0].phases_s["generate"] == pytest.approx(padded, rel=1e-9)
    cont = {"rows": 4, "width": 48, "steps": 8, "first": False}
    assert (price_op(cost, m, dt, "hf_generate", "generate_call", {**cont, "padded": True}).total_s
            - price_op(cost, m, dt, "hf_generate", "generate_call", cont).total_s) == pytest.approx(8 * 0.005)


@pytest.mark.parametrize("execution", [{}, {"entropy": True, "gradient_checkpointing": True}])
def test_forward_and_training_calls_are_what_the_stages_charge(scenario_dict, tracked, execution):
    # Each sequential phase is one call here: the reward and reference forward pieces of 4 rows x 52
    # tokens, and one training minibatch (its piece, the framework's host time per piece, AdamW). With a
    # framework section the pieces pay the host's dispatch and the log-prob head, which a price written
    # apart from the simulator's (kernels alone) would miss.
    sc = load_scenario(_one_batch(scenario_dict, execution=execution))
    setup = build_setup(sc)
    cost = _framework_cost(setup, microbatch_forward_s=0.004, microbatch_train_s=0.011, checkpoint_extra_frac=0.3)
    run = tracked(sc, steps=1, rollouts=ROWS, cost=cost)
    spans = run.records[0].phases_s
    for phase, role in (("reward", "reward"), ("reference", "reference")):
        shape = {"role": role, "phase": phase, "index": 0, "rows": 4, "width": 52}
        priced = price_phase_op(cost, setup, "forward_call", shape).total_s
        assert spans[phase] == pytest.approx(priced, rel=1e-12)
        kernels = cost.forward(setup.shapes[role], setup.dtypes[role], 4 * 52, 4, all_logits=True,
                                     head=setup.head(role), runtime="eager").total_s
        assert priced > kernels + 0.004   # the host's dispatch (launch-bound here) counts
    shape = {"role": "actor", "phase": "actor_train", "index": 0, "rows": 4, "width": 52}
    assert spans["actor_train"] == pytest.approx(price_phase_op(cost, setup, "train_call", shape).total_s, rel=1e-12)
    with pytest.raises(RlhfsimError, match="price_phase_op"):
        price_phase_op(cost, setup, "decode", shape).total_s


@pytest.mark.parametrize("streaming,op,prefix", [("incremental", "chunk_prefill", 40), ("reencode", "rescore", 0)])
def test_a_scorer_call_is_what_the_chunk_scorer_charges(scenario_dict, tracked, streaming, op, prefix):
    # Under intra-step streaming the executor's scorer thread times each call alone; the simulator's chunk
    # scorer prices a call alone before any co-running slowdown (ChunkScorer._price)
    d = _one_batch(scenario_dict, schedule={"kind": "oppo", "intra": {"chunk_tokens": 8}, "inter": {"enabled": False}},
                   models={"reward": {"streaming": streaming}})
    run = tracked(d, steps=1, rollouts=ROWS)
    cost, setup = run.sim.cost, run.sim.setup
    scorer = run.sim.scorer("reward")
    assert scorer.strategy.NAME == streaming
    for tokens in (8, 24, 52):
        shape = {"tokens": tokens, "prefix": prefix, "retokenize": setup.retokenize}
        assert price_scorer_op(cost, setup, op, shape).total_s == scorer._price(tokens, 1, prefix)[0]
    with pytest.raises(RlhfsimError, match="price_scorer_op"):
        price_scorer_op(cost, setup, "forward_call", {"tokens": 8}).total_s


@pytest.mark.parametrize("profile", ["cpu", "default"])
def test_each_priced_call_by_cost_term_sums_to_its_price(scenario_dict, profile):
    # validate's per-call tables show each prediction by cost term (a Price's terms): every
    # term is a registry term and they sum to the price, for the generation runtime's calls (first, padded,
    # a continuation), a prefill and a decode step, the sequential phases' calls and the scorer's calls
    from rlhfsim.costs.terms import BY_NAME

    sc = load_scenario(_one_batch(scenario_dict, schedule={"kind": "oppo", "intra": {"chunk_tokens": 8},
                                                           "inter": {"enabled": False}}))
    setup = build_setup(sc)
    from rlhfsim.hardware.catalog import get_gpu

    cost = CostModel.load(setup.gpu) if profile == "cpu" else CostModel.load(get_gpu("h200"), "default")
    prof = copy.deepcopy(cost.profile)
    prof["generation"]["hf_generate"].update(pad_step_s=0.003, pad_step_per_row_s=0.0005, pad_prefill_s=0.02)
    cost = CostModel(cost.gpu, prof)
    m, dt = setup.shapes["actor"], setup.dtypes["actor"]
    cases = [(price_op(cost, m, dt, "hf_generate", n, sh, lp).total_s, price_op(cost, m, dt, "hf_generate", n, sh, lp).terms())
             for n, sh, lp in (("generate_call", {"rows": 4, "width": 32, "steps": 20, "first": True}, False),
                               ("generate_call", {"rows": 4, "width": 32, "steps": 20, "first": True, "padded": True}, True),
                               ("generate_call", {"rows": 4, "width": 48, "steps": 8, "first": False, "padded": True}, False),
                               ("prefill", {"n_tokens": 128, "n_seqs": 4}, True), ("decode", {"batch": 4, "kv0": 140}, False))]
    for name in ("forward_call", "train_call"):
        for role, phase in (("reward", "reward"), ("reference", "reference"), ("actor", "actor_train")):
            if (name == "train_call") != (phase == "actor_train"):
                continue
            shape = {"role": role, "phase": phase, "index": 0, "rows": 4, "width": 52}
            cases.append((price_phase_op(cost, setup, name, shape).total_s, price_phase_op(cost, setup, name, shape).terms()))
    for op, prefix in (("chunk_prefill", 40), ("rescore", 0)):
        shape = {"tokens": 24, "prefix": prefix, "retokenize": True}
        cases.append((price_scorer_op(cost, setup, op, shape).total_s, price_scorer_op(cost, setup, op, shape).terms()))
    for priced, terms in cases:
        assert set(terms) <= set(BY_NAME), set(terms) - set(BY_NAME)
        assert sum(terms.values()) == pytest.approx(priced, rel=1e-9)
    first = price_op(cost, m, dt, "hf_generate", "generate_call",
                           {"rows": 4, "width": 32, "steps": 20, "first": True, "padded": True}).terms()
    assert first[T.LEFT_PADDING] == pytest.approx(0.02 + 19 * (0.003 + 4 * 0.0005))
    assert first[T.GEN_CALL_OVERHEAD] == cost.call_overhead_s("hf_generate")
    with pytest.raises(RlhfsimError, match="price_phase_op"):
        price_phase_op(cost, setup, "decode", {"role": "actor", "rows": 1, "width": 1}).terms()

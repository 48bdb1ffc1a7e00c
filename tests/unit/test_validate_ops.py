"""``calibrate.validate.price_op``: an in-step generation operation priced at its shape is what the
simulator's engine charges for the same work (one static batch of equal rows: one generate() call)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from calibrate.validate import price_op  # noqa: E402
from rlhfsim.errors import RlhfsimError  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it


def test_one_static_call_is_what_the_engine_charges(scenario_dict, tracked):
    d = scenario_dict("cpu", {"generation": {"engine": "static", "max_batch": 4, "runtime": "hf_generate"}})
    d["workload"]["prompts_per_step"] = 1            # GRPO group of 4: one batch of 4 rows
    d["algorithm"]["minibatch_size"] = 4
    run = tracked(d, steps=1, rollouts=[(32, 20)] * 4)
    s = run.sim.setup
    m, dt = s.shapes["actor"], s.dtypes["actor"]
    call = price_op(run.sim.cost, m, dt, "hf_generate", "generate_call", {"rows": 4, "width": 32, "steps": 20, "first": True})
    assert run.sim.cost.call_overhead_s("hf_generate") > 0    # the bundled cpu profile measured it
    assert run.records[0].phases_s["generate"] == pytest.approx(call, rel=1e-9)


def test_decode_and_prefill_price_the_simulators_calls(scenario_dict, tracked):
    d = scenario_dict("cpu")
    run = tracked(d, steps=1)
    cost, s = run.sim.cost, run.sim.setup
    m, dt = s.shapes["actor"], s.dtypes["actor"]
    assert price_op(cost, m, dt, "kv_decoder", "decode", {"batch": 4, "kv0": 400}) == pytest.approx(
        cost.decode_steps_s(m, dt, 4, 400, 1, runtime="kv_decoder"))
    assert price_op(cost, m, dt, "kv_decoder", "prefill", {"n_tokens": 64, "n_seqs": 2}) == pytest.approx(
        cost.forward_s(m, dt, 64, 2, 1, op="prefill", head="lm", gen_runtime="kv_decoder"))
    with pytest.raises(RlhfsimError, match="price_op"):
        price_op(cost, m, dt, "kv_decoder", "train", {})


def test_a_padded_static_call_is_what_the_engine_charges(scenario_dict, tracked):
    # One batch of 4 rows of unequal prompts (longest 32): left-padded, so each of its 19 decode steps
    # pays the padding term, in the engine and in the executor's call priced by price_op alike.
    import copy

    from rlhfsim.costs.model import CostModel
    from rlhfsim.scenario import load_scenario
    from rlhfsim.scenario.checks import build_setup

    d = scenario_dict("cpu", {"generation": {"engine": "static", "max_batch": 4, "runtime": "hf_generate"}})
    d["workload"]["prompts_per_step"] = 1
    d["algorithm"]["minibatch_size"] = 4
    sc = load_scenario(d)
    setup = build_setup(sc)
    prof = copy.deepcopy(CostModel.load(setup.gpu).profile)
    prof["generation"]["hf_generate"].update(pad_step_s=0.003, pad_step_per_row_s=0.0005, pad_prefill_s=0.02)
    cost = CostModel(setup.gpu, prof)
    run = tracked(sc, steps=1, rollouts=[(32, 20), (30, 20), (25, 20), (32, 20)], cost=cost)
    m, dt = setup.shapes["actor"], setup.dtypes["actor"]
    shape = {"rows": 4, "width": 32, "steps": 20, "first": True}
    plain = price_op(cost, m, dt, "hf_generate", "generate_call", shape)
    padded = price_op(cost, m, dt, "hf_generate", "generate_call", {**shape, "padded": True})
    assert padded - plain == pytest.approx(0.02 + 19 * (0.003 + 4 * 0.0005))
    assert run.records[0].phases_s["generate"] == pytest.approx(padded, rel=1e-9)
    cont = {"rows": 4, "width": 48, "steps": 8, "first": False}
    assert (price_op(cost, m, dt, "hf_generate", "generate_call", {**cont, "padded": True})
            - price_op(cost, m, dt, "hf_generate", "generate_call", cont)) == pytest.approx(8 * 0.005)

"""``calibrate.validate.price_op``: an in-step generation operation priced at its shape is what the
simulator's engine charges for the same work (one static batch of equal rows: one generate() call)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from calibrate.validate import price_op  # noqa: E402
from rlhfsim.errors import RlhfsimError  # noqa: E402


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

"""``schedule.intra.resume: reprefill`` (rlhfsim/sim/engines/static.py): each chunk boundary's next
generate() call prefills the whole batch again, less the decode step its token replaces. And
``schedule.intra.stop_at: call`` (the tests at the end): rows that end inside a call count towards OPPO's
first B only when the call returns, so the step stops only between calls.

One replica of 8 rows (a Qwen2.5-7B actor, whose batch prefill costs more than a decode step), every prompt 128 tokens and every response 400 (fixed), chunks of 100: the
batch's boundaries are at positions 100, 200 and 300 (the batch ends at 400, where nothing restarts).
The generation span under ``reprefill`` exceeds the one under ``cached`` by exactly

    sum over P in (100, 200, 300) of prefill(8 x (128 + P) tokens, 8 rows) - one decode step(8 rows, 8 x (128 + P))

priced by the cost model directly (not by the engine's helpers).
"""

from __future__ import annotations

import pytest

from rlhfsim.costs.model import CostModel, decode_sum
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.scenario import load_scenario
from rlhfsim.scenario.checks import build_setup
from rlhfsim.sim.simulation import Simulation

GPU, ROWS, PROMPT, RESPONSE, CHUNK = "h200", 8, 128, 400, 100


def profile() -> dict:
    def op(compute_eff, memory_eff, overhead_s, per_layer_s):
        return {"compute_eff": compute_eff, "memory_eff": memory_eff, "overhead_s": overhead_s,
                "overhead_per_layer_s": per_layer_s}

    return {
        "schema_version": 1, "name": "reprefill", "gpu": GPU, "dtype": "bfloat16", "provenance": {"source": "derived"},
        "operations": {"prefill": op(0.55, 0.7, 0.001, 3e-5), "chunk_prefill": op(0.45, 0.7, 0.002, 0.0),
                       "decode": op(0.5, 0.75, 0.002, 2.5e-4), "train": op(0.4, 0.6, 0.005, 1e-4),
                       "optimizer": op(0.5, 0.6, 0.001, 0.0)},
        "interference": {"decode_slowdown": 1.0, "prefill_slowdown": 1.0},
        "generation": {"hf_generate": {"handoff_s": 0.01, "handoff_per_row_s": 0.0, "call_overhead_s": 0.0}},
    }


def scenario(resume: str, chunk: int = CHUNK) -> dict:
    return {
        "name": "reprefill",
        "models": {"actor": {"model": "qwen2.5-7b"}, "reward": {"model": "qwen2.5-0.5b"}},
        "cluster": {"gpu": GPU, "nodes": 1, "gpus_per_node": 2},
        "placement": {"kind": "dedicated_reward", "reward_gpus": 1},
        "algorithm": {"kind": "grpo", "group_size": 1, "minibatch_size": ROWS},
        "workload": {"prompts_per_step": ROWS, "prompt_length": {"kind": "fixed", "value": PROMPT},
                     "response_length": {"kind": "fixed", "value": RESPONSE}, "max_response_tokens": 1024},
        "generation": {"engine": "static", "max_batch": ROWS},
        "schedule": {"kind": "oppo", "intra": {"chunk_tokens": chunk, "resume": resume}, "inter": {"enabled": False}},
        "steps": 1, "warmup_steps": 0, "seed": 0,
    }


def generate_span(resume: str, chunk: int = CHUNK) -> float:
    setup = build_setup(load_scenario(scenario(resume, chunk)))
    sim = Simulation(setup, CostModel(get_gpu(GPU), profile()))
    sim.run(1)
    spans = [(iv.start_s, iv.end_s) for iv in sim.rec.intervals if iv.phase == "generate"]
    return max(e for _, e in spans) - min(s for s, _ in spans)


def expected_extra() -> float:
    setup = build_setup(load_scenario(scenario("reprefill")))
    cost = CostModel(get_gpu(GPU), profile())
    m, dtype, tp = setup.shapes["actor"], setup.dtypes["actor"], setup.tp["rollout"]
    g = setup.scenario.generation
    dec = cost.decoder(m, dtype, tp, g.resolved_runtime, g.sampling_logprobs)
    extra = 0.0
    for pos in range(CHUNK, RESPONSE, CHUNK):
        width = PROMPT + pos
        pre, _ = cost.forward(m, dtype, width * ROWS, ROWS, tp, op="prefill", head="lm",
                                    gen_runtime=g.resolved_runtime, gen_logprobs=g.sampling_logprobs)
        step, _ = decode_sum(dec.coeffs(ROWS, ROWS * width, g.step_overhead_s), 1)
        extra += pre - step
    return extra


def test_reprefill_adds_the_batch_prefill_at_every_boundary_less_one_decode_step():
    extra = generate_span("reprefill") - generate_span("cached")
    want = expected_extra()
    assert want > 0
    assert extra == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_reprefill_costs_more_the_smaller_the_chunk_and_nothing_without_a_boundary():
    extras = [generate_span("reprefill", c) - generate_span("cached", c) for c in (50, 100, 200)]
    assert extras[0] > extras[1] > extras[2] > 0
    # a chunk longer than every response: the batch's one call returns at its end, nothing restarts
    assert generate_span("reprefill", 512) == generate_span("cached", 512)


def test_resume_is_checked_with_its_path():
    from rlhfsim.errors import ScenarioError
    with pytest.raises(ScenarioError, match=r"schedule.*resume"):
        load_scenario(scenario("keep"))


# -- schedule.intra.stop_at: call --------------------------------------------------------------------
def overcommitted(stop_at: str, chunk: int, seed: int = 0) -> dict:
    """8 prompts trained per step, 4 more in flight (OPPO's delta), one replica whose one batch holds all
    12; lognormal responses (median 200, p99 2,000), so the first 8 end well before the longest."""
    d = scenario("cached", chunk)
    d["workload"].update({"response_length": {"kind": "lognormal", "median": 200, "p99": 2000},
                          "max_response_tokens": 2048})
    d["generation"]["max_batch"] = 16
    d["schedule"] = {"kind": "oppo", "intra": {"chunk_tokens": chunk, "stop_at": stop_at},
                     "inter": {"delta": 4}}
    d["seed"] = seed
    return d


def step_records(d: dict, steps: int = 1):
    setup = build_setup(load_scenario({**d, "steps": steps}))
    return Simulation(setup, CostModel(get_gpu(GPU), profile())).run(steps)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stop_at_call_cannot_cut_a_call_that_never_returns(seed):
    # A chunk longer than every response: the batch's one call returns only when its longest row ends,
    # so under stop_at: call the step decodes every row to its end and waits for the batch; under token
    # it stops once 8 rows have ended, the other 4 unfinished. Either way the first 8 to end are trained.
    call = step_records(overcommitted("call", 4096, seed))[0]
    token = step_records(overcommitted("token", 4096, seed))[0]
    assert call.trained_rollouts == token.trained_rollouts == 8
    assert call.generated_tokens > token.generated_tokens
    assert call.step_time_s > token.step_time_s
    # ...and the whole batch ran: as many tokens as with no overcommitment stop at all (delta 0, 12 prompts)
    d = overcommitted("call", 4096, seed)
    d["workload"]["prompts_per_step"] = 12
    d["algorithm"]["minibatch_size"] = 12
    d["schedule"]["inter"] = {"enabled": False}
    assert call.generated_tokens == step_records(d)[0].generated_tokens


def test_stop_at_call_stops_at_a_chunk_boundary_and_rows_count_when_their_call_returns():
    # With chunks of 64 the stop comes at the first boundary by which 8 rows have ended: the step still
    # trains 8 and leaves rows unfinished, having decoded up to that boundary: more tokens than stopping
    # at the 8th row's last token, fewer than running the batch out.
    call = step_records(overcommitted("call", 64))[0]
    token = step_records(overcommitted("token", 64))[0]
    whole = step_records(overcommitted("call", 4096))[0]
    assert call.trained_rollouts == 8 and call.deferred > 0
    assert token.generated_tokens < call.generated_tokens < whole.generated_tokens


def test_reprefill_passes_only_the_rows_still_generating(monkeypatch):
    # Given a row that already ended, generate() would continue it past its EOS, so the next call of a
    # reprefill boundary takes only the rows still generating, left-padded to the longest of them.
    from rlhfsim.sim.engines.static import StaticEngine

    seen = []
    real = StaticEngine._reprefill

    def spy(self, clock, st):
        seen.append((st.P, st.ctx0, [(r.prompt_len, r.generated, r.response_len) for r in st.rows]))
        return real(self, clock, st)

    monkeypatch.setattr(StaticEngine, "_reprefill", spy)
    d = overcommitted("token", 64)
    d["schedule"] = {"kind": "oppo", "intra": {"chunk_tokens": 64, "resume": "reprefill"}, "inter": {"enabled": False}}
    d["workload"]["prompt_length"] = {"kind": "lognormal", "median": 100, "p99": 400}
    d["workload"]["max_prompt_tokens"] = 512
    step_records(d)
    assert len(seen) >= 2
    sizes = [len(rows) for _, _, rows in seen]
    assert sizes[0] < ROWS and sizes == sorted(sizes, reverse=True)   # rows leave as they end
    for P, ctx0, rows in seen:
        assert all(g < n for _, g, n in rows)                          # none of them has ended
        assert ctx0 + P == max(p + g for p, g, _ in rows)              # padded to the longest of them

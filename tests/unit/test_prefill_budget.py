"""The continuous engine's per-step token budget (``generation.max_num_batched_tokens``) and chunked prefill
(``generation.chunked_prefill``): prefills batched into engine steps, chunks carried inside decode steps, priced by
hand; the event clock and the detached plan alike (rlhfsim.sim.engines.continuous, CostModel.prefill_step,
CostModel.chunk_in_step_s)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfsim.costs import terms as T
from rlhfsim.costs.model import CostModel, decode_sum, roofline_kernel_s
from rlhfsim.costs.profile import load_profile
from rlhfsim.hardware.catalog import GPUS
from rlhfsim.models.catalog import CATALOG
from rlhfsim.scenario.loader import load_scenario
from rlhfsim.sim.engines.base import Engine
from rlhfsim.sim.engines.continuous import ContinuousEngine
from rlhfsim.sim.explain import explain
from rlhfsim.sim.run import simulate

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = str(ROOT / "tests" / "fixtures" / "profiles" / "default.json")
H100 = GPUS["h100-sxm"]
M = CATALOG["qwen2.5-0.5b"]


def _scenario(prompts: int, max_batch: int, budget: int | None, chunked: bool, prompt: int = 300, response: dict | None = None,
              group: int = 1, kv: float = 0.9) -> dict:
    gen = {"engine": "continuous", "runtime": "vllm", "max_batch": max_batch, "kv_cache_fraction": kv}
    if budget is not None:
        gen.update({"max_num_batched_tokens": budget, "chunked_prefill": chunked})
    return {"name": "budget", "models": {"actor": {"model": "qwen2.5-0.5b"}, "reward": {"kind": "rule"}},
            "cluster": {"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 1}, "placement": {"kind": "colocated"},
            "algorithm": {"kind": "grpo", "group_size": group, "minibatch_size": prompts * group},
            "workload": {"prompts_per_step": prompts, "prompt_length": {"kind": "fixed", "value": prompt},
                         "response_length": response or {"kind": "fixed", "value": 50}, "max_prompt_tokens": 512,
                         "max_response_tokens": 800},
            "generation": gen, "schedule": {"kind": "sync"}, "steps": 2, "warmup_steps": 1, "seed": 0}


class _Eng:   # the parts of an engine ``_steps`` reads
    def __init__(self, budget, chunked):
        self.budget_tokens, self.chunked = budget, chunked


def test_steps_pack_whole_prompts_or_split_them_at_the_budget():
    steps = ContinuousEngine._steps
    assert steps(_Eng(512, False), [300, 300, 300, 300]) == [(300, 1), (300, 1), (300, 1), (300, 1)]
    assert steps(_Eng(512, False), [100, 200, 300, 600]) == [(300, 2), (300, 1), (600, 1)]   # a longer row alone
    assert steps(_Eng(512, True), [300, 300, 300, 300]) == [(512, 2), (512, 3), (176, 1)]


def test_a_wave_of_admissions_costs_its_budgeted_steps_then_the_decode():
    # 4 rows of 300 prompt tokens and 50 response tokens on one GPU: prefill steps, then 49 decode steps of 4 rows
    cost = CostModel(H100, load_profile(FIXTURE))
    for chunked, steps in ((False, [(300, 1)] * 4), (True, [(512, 2), (512, 3), (176, 1)])):
        gen = simulate(load_scenario(_scenario(4, 8, 512, chunked)), profile=FIXTURE).steps[-1].phases_s["generate"]
        pre = sum(cost.prefill_step(M, "bfloat16", t, r, 1, "vllm").total_s for t, r in steps)
        dec = decode_sum(cost.decoder(M, "bfloat16", 1, runtime="vllm").coeffs(4, 4 * 301.0), 49)[0]
        assert gen == pytest.approx(pre + dec, rel=1e-12), chunked
    # without a budget: one call per row, each with the prefill's fixed overhead (the older model)
    gen = simulate(load_scenario(_scenario(4, 8, None, False)), profile=FIXTURE).steps[-1].phases_s["generate"]
    one = cost.forward(M, "bfloat16", 300, 1, op="prefill", head="lm", gen_runtime="vllm").total_s
    assert gen == pytest.approx(4 * one + dec, rel=1e-12)


def test_a_chunk_inside_a_decode_step_is_its_work_beyond_the_weights():
    cost = CostModel(H100, load_profile(FIXTURE))
    p = cost.ops["prefill:vllm"]
    k = cost._forward_kernel(M, "bfloat16", 1, "prefill", None, "lm", "vllm")
    w = k.shape.forward(700, 3, 0.0, 3, None)
    want = roofline_kernel_s(w.flops, w.bytes - k.shape.weight_bytes, H100.peak("bfloat16"), H100.mem_bw, p.compute_eff,
                             p.memory_eff)
    assert cost.chunk_in_step_s(M, "bfloat16", 700, 3, 1, "vllm") == pytest.approx(want, rel=1e-12)
    # never more than the same tokens' own prefill kernel (compute-bound at 700 tokens: equal); a small chunk's is far less
    # (it reads no weights: the step it rides in streams them)
    for tokens, rows in ((700, 3), (16, 1)):
        own = cost.forward(M, "bfloat16", tokens, rows, op="prefill", head="lm", gen_runtime="vllm").active_s
        got = cost.chunk_in_step_s(M, "bfloat16", tokens, rows, 1, "vllm")
        assert got <= own and (tokens > 100 or got < 0.2 * own)


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("kv", [0.9, 0.0004])   # 0.0004: a cache of ~2,900 tokens, rows preempted and readmitted
def test_detached_equals_event_clock(chunked, kv, monkeypatch):
    sc = load_scenario(_scenario(24, 6, 512, chunked, prompt=200, group=2, kv=kv,
                                 response={"kind": "lognormal", "median": 120, "p99": 600}))
    a = simulate(sc, profile=FIXTURE)
    monkeypatch.setattr(Engine, "DETACH", False)
    b = simulate(sc, profile=FIXTURE)
    assert [r.__dict__ for r in a.steps] == [r.__dict__ for r in b.steps]
    assert a.summary["step_time_s"] == b.summary["step_time_s"] and a.summary["gpu_active"] == b.summary["gpu_active"]


def test_chunked_prefill_lets_the_running_rows_decode_and_explain_names_it():
    response = {"kind": "lognormal", "median": 120, "p99": 600}
    plain = simulate(load_scenario(_scenario(24, 6, 512, False, prompt=200, response=response)), profile=FIXTURE)
    sc = load_scenario(_scenario(24, 6, 512, True, prompt=200, response=response))
    mixed = simulate(sc, profile=FIXTURE)
    # the same rows: a refill's prefill rides in the decode steps instead of pausing them
    assert mixed.summary["phases_s"]["generate"] < plain.summary["phases_s"]["generate"]
    doc = explain(sc, profile=FIXTURE, steps=2)
    g = doc["phases"]["generate"]
    assert g["terms_s"][T.PREFILL_CHUNK] > 0 and set(g["terms_s"]) <= set(T.BY_NAME)
    assert sum(g["terms_s"].values()) + g.get("waiting_s", 0.0) == pytest.approx(g["span_s"], rel=1e-9)


def test_the_budget_belongs_to_the_continuous_engine():
    d = _scenario(4, 8, 512, False)
    d["generation"] = {"engine": "static", "max_num_batched_tokens": 512}
    with pytest.raises(Exception, match="max_num_batched_tokens: expected it .* only with engine 'continuous'"):
        load_scenario(d)
    d["generation"] = {"engine": "continuous", "chunked_prefill": True}
    with pytest.raises(Exception, match="chunked_prefill: expected max_num_batched_tokens"):
        load_scenario(d)


# --- a prompt's samples share its prefill (generation.prefix_caching) and go to one replica (dispatch: prompts) ----
def _shared(budget: int | None, dispatch: str = "prompts", prompts: int = 1, gpus: int = 1) -> dict:
    d = _scenario(prompts, 8, budget, False, prompt=100, group=4)
    d["cluster"]["gpus_per_node"] = gpus
    d["generation"].update({"prefix_caching": True, "dispatch": dispatch})
    return d


def test_a_prompts_samples_prefill_it_once_then_its_last_partial_block():
    # 4 samples of a 100-token prompt: the first prefills 100 tokens, the others 100 - 96 = 4 (six full blocks of 16 hit)
    cost = CostModel(H100, load_profile(FIXTURE))
    dec = decode_sum(cost.decoder(M, "bfloat16", 1, runtime="vllm").coeffs(4, 4 * 101.0), 49)[0]
    one = lambda t: cost.forward(M, "bfloat16", t, 1, op="prefill", head="lm", gen_runtime="vllm").total_s  # noqa: E731
    gen = simulate(load_scenario(_shared(None)), profile=FIXTURE).steps[-1].phases_s["generate"]
    assert gen == pytest.approx(one(100) + 3 * one(4) + dec, rel=1e-12)
    gen = simulate(load_scenario(_shared(512)), profile=FIXTURE).steps[-1].phases_s["generate"]
    assert gen == pytest.approx(cost.prefill_step(M, "bfloat16", 112, 4, 1, "vllm").total_s + dec, rel=1e-12)


def test_dispatch_by_prompts_keeps_a_prompts_samples_together():
    sim_rows = simulate(load_scenario(_shared(None, "rows", prompts=4, gpus=2)), profile=FIXTURE)
    sim_prompts = simulate(load_scenario(_shared(None, "prompts", prompts=4, gpus=2)), profile=FIXTURE)
    # dealt by row, each replica holds 2 samples of each of 4 prompts (4 full prefills); by prompt, 2 whole prompts
    # (2 full prefills): the same rows, less prefill
    assert sim_prompts.summary["phases_s"]["generate"] < sim_rows.summary["phases_s"]["generate"]


@pytest.mark.parametrize("budget, chunked", [(None, False), (512, False), (512, True)])
def test_prefix_caching_detached_equals_event_clock(budget, chunked, monkeypatch):
    d = _scenario(24, 6, budget, chunked, prompt=200, group=4, response={"kind": "lognormal", "median": 120, "p99": 600})
    d["cluster"]["gpus_per_node"] = 2
    d["generation"].update({"prefix_caching": True, "dispatch": "prompts"})
    sc = load_scenario(d)
    a = simulate(sc, profile=FIXTURE)
    monkeypatch.setattr(Engine, "DETACH", False)
    b = simulate(sc, profile=FIXTURE)
    assert [r.__dict__ for r in a.steps] == [r.__dict__ for r in b.steps]
    assert a.summary["step_time_s"] == b.summary["step_time_s"]


@settings(max_examples=20, deadline=None)
@given(lengths=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 600)), min_size=1, max_size=40),
       max_batch=st.integers(1, 10), kv_fraction=st.sampled_from([0.0001, 0.0005, 0.9]),
       step_tokens=st.sampled_from([16, 300, 2048]), chunked=st.booleans(), share=st.booleans(),
       token_budget=st.sampled_from([None, 7, 64]))
def test_detached_equals_event_clock_on_random_rows(lengths, max_batch, kv_fraction, step_tokens, chunked, share,
                                                     token_budget, scenario_dict, tracked):
    # Any rows, slots, cache, step budget, chunking, sharing and partial-rollout budget: the deferred clock replays
    # the event clock exactly (rows, their ends, the busy intervals).
    gen = {"engine": "continuous", "max_batch": max_batch, "kv_cache_fraction": kv_fraction,
           "max_num_batched_tokens": step_tokens, "chunked_prefill": chunked, "prefix_caching": share,
           "dispatch": "prompts" if share else "rows"}
    d = scenario_dict("gpu", {"generation": gen}, schedule="sync" if token_budget is None else "partial")
    if token_budget is not None:
        d["schedule"]["token_budget"] = token_budget
    d["workload"]["prompts_per_step"] = max(len(lengths) // 2, 1)
    d["algorithm"]["minibatch_size"] = d["workload"]["prompts_per_step"]
    sc = load_scenario(d)
    rows = lengths * (300 // len(lengths) + 1)
    a = tracked(sc, steps=2, rollouts=rows)
    Engine.DETACH = False
    try:
        b = tracked(sc, steps=2, rollouts=rows)
    finally:
        Engine.DETACH = True
    assert [r.__dict__ for r in a.records] == [r.__dict__ for r in b.records]
    assert a.sim.rec.intervals == b.sim.rec.intervals
    key = [(r.id, r.generated, r.finished_at, r.kv_resident, r.paused, r.tokens_by_step) for r in a.taken]
    assert key == [(r.id, r.generated, r.finished_at, r.kv_resident, r.paused, r.tokens_by_step) for r in b.taken]

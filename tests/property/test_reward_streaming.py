"""Reward streaming strategies (rlhfsim.sim.streaming) with an encoder reward model: ``reencode`` never prices
less scoring work than ``final_only`` for the same responses, and its total grows super-linearly in the
response length; the same holds for the scored tokens of whole simulated steps."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FIXTURES, make_dict
from rlhfsim.costs.model import CostModel
from rlhfsim.hardware.catalog import GPUS
from rlhfsim.models.catalog import CATALOG
from rlhfsim.scenario import load_scenario
from rlhfsim.sim.run import simulate
from rlhfsim.sim.streaming import STREAMING

ENCODERS = st.sampled_from(sorted(n for n, m in CATALOG.items() if m.arch == "encoder"))
# the GPUs' datasheet-derived profile by name (constant efficiencies, which these properties assume)
COSTS = {"h200": CostModel.load(GPUS["h200"], "default"), "a100-80gb": CostModel.load(GPUS["a100-80gb"], "default"),
         "cpu": CostModel.load(GPUS["cpu"], str(FIXTURES / "profiles" / "cpu.json")),
         "cpu-bundled": CostModel.load(GPUS["cpu"])}
DEVICES = st.sampled_from(sorted(COSTS))


@dataclass
class _Row:
    """The fields of a Rollout that the strategies read."""

    prompt_len: int
    response_len: int
    generated: int = 0
    scored: dict = field(default_factory=dict)


def scoring_s(strategy: str, cost, model, prompt: int, response: int, chunk: int) -> tuple[float, int]:
    """(seconds, tokens) the reward scorer is priced for one response handed over every ``chunk`` tokens
    and when it finishes, as the engines hand it over."""
    s = STREAMING[strategy]
    r = _Row(prompt, response)
    total, tokens = 0.0, 0
    marks = list(range(chunk, response, chunk)) + [response]
    for g in marks:
        r.generated = g
        job = s.job(r, r.scored.get("reward", 0))
        if job is None:
            continue
        r.scored["reward"] = g
        t, prefix = job
        total += s.price(cost, model, "bfloat16" if cost.gpu.kind != "cpu" else "float32", t, 1, prefix, 1,
                         "value", "eager" if "eager" in cost.runtimes else None)[0]
        tokens += t
    return total, tokens


@given(model=ENCODERS, dev=DEVICES, prompt=st.integers(1, 256), response=st.integers(1, 2048),
       chunk=st.integers(1, 512))
def test_reencode_never_prices_less_than_final_only(model, dev, prompt, response, chunk):
    cost, m = COSTS[dev], CATALOG[model]
    re_s, re_tok = scoring_s("reencode", cost, m, prompt, response, chunk)
    fo_s, fo_tok = scoring_s("final_only", cost, m, prompt, response, chunk)
    assert fo_tok == prompt + response
    assert re_tok >= fo_tok
    assert re_s >= fo_s * (1 - 1e-12)
    if response > chunk:   # at least one speculative pass before the last: strictly more
        assert re_s > fo_s and re_tok > fo_tok


@given(model=ENCODERS, dev=DEVICES, prompt=st.integers(1, 128), passes=st.integers(1, 32),
       chunk=st.integers(1, 128))
def test_reencode_total_grows_super_linearly(model, dev, prompt, passes, chunk):
    """Doubling a response of ``passes`` full chunks more than doubles its re-encode work (tokens: by
    chunk x passes^2 exactly; seconds: every pass costs more the longer its prefix), while final_only
    stays linear in tokens."""
    cost, m = COSTS[dev], CATALOG[model]
    r = passes * chunk
    one_s, one_tok = scoring_s("reencode", cost, m, prompt, r, chunk)
    two_s, two_tok = scoring_s("reencode", cost, m, prompt, 2 * r, chunk)
    assert two_tok - 2 * one_tok == chunk * passes * passes
    assert two_s > 2 * one_s
    f1, t1 = scoring_s("final_only", cost, m, prompt, r, chunk)
    f2, t2 = scoring_s("final_only", cost, m, prompt, 2 * r, chunk)
    assert t2 - 2 * t1 == -prompt


def _encoder_scenario(strategy: str, chunk: int, seed: int):
    d = make_dict("cpu", {"models": {"reward": {"model": "tiny-deberta", "streaming": strategy}},
                          "workload": {"max_response_tokens": 256}, "seed": seed},
                  schedule="oppo-intra")
    d["schedule"]["intra"]["chunk_tokens"] = chunk
    return load_scenario(d)


@settings(max_examples=12, deadline=None)
@given(chunk=st.sampled_from([4, 16, 48, 128]), seed=st.integers(0, 1000))
def test_simulated_steps_score_more_under_reencode(chunk, seed):
    prof = str(FIXTURES / "profiles" / "cpu.json")
    re = simulate(_encoder_scenario("reencode", chunk, seed), profile=prof)
    fo = simulate(_encoder_scenario("final_only", chunk, seed), profile=prof)
    # same sampled responses (the schedule never changes the stream), so the same trained rows
    assert [r.trained_ids for r in re.steps] == [r.trained_ids for r in fo.steps]
    for a, b in zip(re.steps, fo.steps):
        assert a.scored_tokens >= b.scored_tokens
        assert a.chunks_scored >= b.chunks_scored
    if any(resp > chunk for r in re.steps for _, _, resp in r.lengths):   # a speculative pass was made
        assert sum(r.scored_tokens for r in re.steps) > sum(r.scored_tokens for r in fo.steps)
    else:
        assert sum(r.scored_tokens for r in re.steps) == sum(r.scored_tokens for r in fo.steps)


def test_incremental_into_an_encoder_is_refused_at_load():
    from rlhfsim.errors import ScenarioError
    from rlhfsim.scenario import build_setup

    with pytest.raises(ScenarioError, match=r"^models\.reward\.streaming: expected reencode or final_only"):
        build_setup(_encoder_scenario("incremental", 16, 0))
    assert build_setup(_encoder_scenario(None, 16, 0)).reward_streaming == "final_only"   # the encoder default

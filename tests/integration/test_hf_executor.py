"""The real executor generating with HF ``generate()`` on the actor (``gen_runtime="hf_generate"``): exact
per-row lengths, the right counts, OPPO intra-step streaming in chunks continued on the cache (same
tokens as one call), inter-step carries re-prefilled, and the sampling log-probs it records. Also the
compiled static-cache runtime's correctness check (slow: it compiles). No timing thresholds."""

from __future__ import annotations

import math
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from calibrate.executor import PHASES, ExecConfig, run_steps  # noqa: E402
from calibrate.executor.generation import HfGeneration, Sequence  # noqa: E402
from calibrate.executor.timing import Clock, StepLog  # noqa: E402
from calibrate.genruntimes import GEN_RUNTIMES_IMPL, GumbelNoise, check_prompts, check_runtime, eager_greedy  # noqa: E402
from calibrate.measuring.models import PAD_ID, build_hf_model  # noqa: E402
from rlhfsim.errors import RlhfsimError  # noqa: E402
from rlhfsim.models.catalog import CATALOG  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it

TINY = CATALOG["tiny-qwen2"]
B = 4
CHUNK = 8
_rng = random.Random(0)
ROLLOUTS = [(_rng.randint(4, 12), _rng.randint(5, 40)) for _ in range(40)]
ROLLOUTS[1] = (6, 40)       # a long one in the first batch: generation outlasts the first chunks


def _cfg(**kw) -> ExecConfig:
    base = dict(device="cpu", dtype="float32", actor=TINY, critic=TINY, reference=TINY, reward=TINY,
                rule_reward_s=0.0, algorithm="ppo", group_size=1, prompts_per_step=B, ppo_epochs=1,
                minibatch_size=2, engine="static", max_batch=B, schedule="sync", intra=False,
                chunk_tokens=CHUNK, inter=False, delta=0, keep_kv=False, steps=2, rollouts=ROLLOUTS,
                seed=0, threads=1)
    base.update(kw)
    return ExecConfig(**base)


def _check_phases(results, sync: bool):
    for r in results:
        assert tuple(p for p in PHASES if p in r.phases) == PHASES
        assert r.phases["generate"][0] == 0.0 and r.step_time_s == max(b for _, b in r.phases.values())
        for name, (a, b) in r.phases.items():
            assert 0.0 <= a <= b <= r.step_time_s + 1e-9, (name, a, b)
        if sync:   # strictly one after another, in the contracted order
            spans = [r.phases[p] for p in PHASES]
            assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))


def _resp(rids):
    return sum(ROLLOUTS[i][1] for i in rids)


def _hf(**kw):
    return _cfg(gen_runtime="hf_generate", **kw)


def test_sync_generates_exact_lengths_in_one_call_per_batch():
    res = run_steps(_hf())
    _check_phases(res, sync=True)
    for k, r in enumerate(res):
        assert r.rollout_ids == sorted(range(k * B, (k + 1) * B), key=lambda i: (ROLLOUTS[i][1], i))
        assert r.generated_tokens == _resp(r.rollout_ids)              # every row exactly its length
        longest = max(ROLLOUTS[i][1] for i in r.rollout_ids)
        assert r.prefill_calls == 1 and r.decode_steps == longest - 1 and r.decoded_tokens == B * longest
        assert r.prefill_tokens == sum(ROLLOUTS[i][0] for i in r.rollout_ids)
        assert sum(1 for i in r.intervals if i[1] == "generate") == 1    # one generate() call
        calls = [shape for name, _, shape in r.ops if name == "generate_call"]
        prompts = {ROLLOUTS[i][0] for i in r.rollout_ids}
        assert len(calls) == 1 and calls[0]["padded"] == (len(prompts) > 1)   # left-padded when they differ
        a, b = r.phases["weight_sync"]                                    # nothing to copy: ~0 s
        assert b - a < 0.01
        assert len(r.rewards) == B and all(math.isfinite(x) for x in r.rewards)


def test_intra_streams_chunks_continued_on_the_cache():
    steps = 2
    res = run_steps(_hf(schedule="oppo", intra=True, steps=steps))
    sync = run_steps(_hf(steps=1))
    _check_phases(res, sync=False)
    for r in res:
        assert r.chunks_scored == sum(math.ceil(ROLLOUTS[i][1] / CHUNK) for i in r.rollout_ids)
        assert r.scored_tokens == r.generated_tokens == _resp(r.rollout_ids)
        longest = max(ROLLOUTS[i][1] for i in r.rollout_ids)
        calls = sum(1 for i in r.intervals if i[1] == "generate")
        assert calls == math.ceil(longest / CHUNK)                         # one call per chunk boundary
        assert r.prefill_calls == 1 and r.decode_steps == longest - 1     # the same forwards as one call
        assert r.phases["reward"][0] < r.phases["generate"][1]            # scored while generating
    # the run's RNG goes on from call to call: chunked generation samples the one call's tokens
    assert res[0].rollout_ids == sync[0].rollout_ids
    assert max(abs(a - b) for a, b in zip(res[0].rewards, sync[0].rewards)) < 1e-4


def test_inter_carries_are_re_prefilled():
    delta, steps = 2, 3
    res = run_steps(_hf(schedule="oppo", intra=True, inter=True, delta=delta, keep_kv=False,
                        max_batch=B + delta, steps=steps))
    _check_phases(res, sync=False)
    trained = [i for r in res for i in r.rollout_ids]
    assert len(trained) == len(set(trained)) == steps * B
    assert set(trained) | set(res[-1].deferred_ids) == set(range(steps * B + delta))
    carried_prev: list[int] = []
    for k, r in enumerate(res):
        assert len(r.rollout_ids) == B and r.deferred_out == delta
        new = [i for i in r.rollout_ids + r.deferred_ids if i not in carried_prev]
        prev_tokens = res[k - 1].deferred_tokens if k else 0
        assert r.prefill_tokens == (sum(ROLLOUTS[i][0] for i in new) + sum(ROLLOUTS[i][0] for i in carried_prev)
                                    + prev_tokens)
        carried_prev = r.deferred_ids
    assert sum(r.generated_tokens for r in res) == _resp(trained) + res[-1].deferred_tokens


def test_bad_hf_generate_configs_name_the_field():
    with pytest.raises(RlhfsimError, match=r"ExecConfig\.engine: expected 'static' with gen_runtime 'hf_generate'"):
        run_steps(_hf(engine="continuous"))
    with pytest.raises(RlhfsimError, match=r"ExecConfig\.keep_kv: expected False with gen_runtime 'hf_generate'"):
        run_steps(_hf(schedule="oppo", inter=True, delta=1, keep_kv=True))
    run_steps(_hf(keep_kv=True, steps=1))           # keep_kv without inter carries nothing: accepted
    with pytest.raises(RlhfsimError, match=r"ExecConfig\.gen_runtime: expected kv_decoder or hf_generate"):
        run_steps(_cfg(gen_runtime="vllm"))


def test_recorded_logprobs_are_the_actors_and_stopping_is_per_row():
    cfg = _hf(max_batch=3)
    actor = build_hf_model(TINY, "lm", "float32", "cpu", 0)
    gen = HfGeneration(cfg, actor, Clock(torch.device("cpu")), seed=0, max_len=128, on_token=None)
    pool = [Sequence(rid=i, group=i, prompt=list(range(5 + 2 * i, 12 + 3 * i)), response_len=r)
            for i, r in enumerate([3, 9, 6])]
    done = gen.generate(pool, 3, StepLog(0.0))
    assert [s.rid for s in done] == [0, 2, 1]                          # in the order they ended
    for s in pool:
        assert len(s.tokens) == len(s.logprobs) == s.response_len and PAD_ID not in s.tokens
        ids = torch.tensor([s.prompt + s.tokens])
        logits = actor(input_ids=ids).logits[0, len(s.prompt) - 1:-1].float()
        logits[:, PAD_ID] = float("-inf")                              # never sampled, as in the decoder
        ref = logits.log_softmax(-1).gather(-1, torch.tensor(s.tokens)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(s.logprobs), ref, atol=1e-4), (s.logprobs, ref.tolist())


@pytest.mark.slow
def test_hf_static_compiles_and_matches_eager():
    """The compiled static-cache runtime against eager (one compilation, ~25 s on two CPU cores)."""
    rt = GEN_RUNTIMES_IMPL["hf_static"]()
    ok, why = rt.available("cpu")
    if not ok:
        pytest.skip(why)
    model = build_hf_model(TINY, "lm", "float32", "cpu", 0)
    ids, mask = check_prompts(TINY.vocab, 4, "cpu")
    noise = GumbelNoise(8, 4, TINY.vocab, "cpu")
    ref, ref_logits = eager_greedy(model, ids, mask, 8, noise)
    rt.load(model, TINY, max_batch=4, max_len=64)
    try:
        res = check_runtime(rt, ids, mask, ref, ref_logits, "float32", noise)
    finally:
        rt.unload()
    assert res["valid"] and res["tokens_match_eager"] and res["chunked_match"], res
    assert "forward" not in vars(model)                                # unload restores the eager forward

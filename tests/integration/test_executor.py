"""The real executor end to end on tiny models: it must do what the scenario says (token counts, chunks
scored, rollouts carried and trained once). No timing thresholds."""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from calibrate.executor import PHASES, ExecConfig, run_interleaved, run_steps  # noqa: E402
from rlhfsim.errors import RlhfsimError  # noqa: E402
from rlhfsim.models.catalog import CATALOG  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it

TINY = CATALOG["tiny-qwen2"]
B = 4
CHUNK = 8


def _rollouts(n: int, seed: int = 0) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    out = [(rng.randint(4, 12), rng.randint(5, 40)) for _ in range(n)]
    out[1] = (6, 40)          # a long one in the first batch: generation outlasts the first chunks
    return out


ROLLOUTS = _rollouts(40)


def _cfg(**kw) -> ExecConfig:
    base = dict(device="cpu", dtype="float32", actor=TINY, critic=TINY, reference=TINY, reward=TINY,
                rule_reward_s=0.0, algorithm="ppo", group_size=1, prompts_per_step=B, ppo_epochs=1,
                minibatch_size=2, engine="static", max_batch=B, schedule="sync", intra=False,
                chunk_tokens=CHUNK, inter=False, delta=0, keep_kv=True, steps=2, rollouts=ROLLOUTS,
                seed=0, threads=1)
    base.update(kw)
    return ExecConfig(**base)


def _check_phases(results, sync: bool, expected: tuple[str, ...] = PHASES):
    for r in results:
        assert tuple(p for p in PHASES if p in r.phases) == expected
        for name, (a, b) in r.phases.items():
            assert 0.0 <= a <= b <= r.step_time_s + 1e-9, (name, a, b)
        assert r.phases["generate"][0] == 0.0
        assert r.step_time_s == max(b for _, b in r.phases.values())
        for role, phase, a, b in r.intervals:
            assert phase in PHASES and a <= b
        if sync:   # strictly one after another, in the contracted order
            spans = [r.phases[p] for p in expected]
            assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))


def _resp(rids):
    return sum(ROLLOUTS[i][1] for i in rids)


def test_sync_static():
    res = run_steps(_cfg(engine="static"))
    _check_phases(res, sync=True)
    for k, r in enumerate(res):
        assert r.rollout_ids == sorted(range(k * B, (k + 1) * B), key=lambda i: (ROLLOUTS[i][1], i))
        assert r.generated_tokens == _resp(r.rollout_ids)
        # one batch of B: prefilled once, then decoded in lockstep until its longest response ends
        longest = max(ROLLOUTS[i][1] for i in r.rollout_ids)
        assert r.decoded_tokens == B * longest
        assert r.prefill_calls == 1 and r.decode_steps == longest - 1
        assert r.prefill_tokens == sum(ROLLOUTS[i][0] for i in r.rollout_ids)
        assert r.chunks_scored == 0 and r.scored_tokens == r.generated_tokens
        assert r.deferred_in == r.deferred_out == 0
        assert len(r.rewards) == B and all(math.isfinite(x) for x in r.rewards)
        mbs = math.ceil(B / 2)
        assert sum(1 for i in r.intervals if i[1] == "actor_train") == mbs
        assert sum(1 for i in r.intervals if i[1] == "critic_train") == mbs


def _continuous_schedule(rids: list[int], slots: int) -> tuple[list[int], int]:
    """Finish order and decode calls of a continuous batcher: lowest free slot first, a freed slot is
    refilled (one prefill, which samples the first token) before the next decode step."""
    free, resident, waiting, order, steps = list(range(slots)), {}, deque(rids), [], 0
    while waiting or resident:
        while free and waiting:
            rid = waiting.popleft()
            resident[free.pop(0)] = [rid, ROLLOUTS[rid][1] - 1]
        steps += 1
        for slot in sorted(resident):
            resident[slot][1] -= 1
            if resident[slot][1] == 0:
                order.append(resident.pop(slot)[0])
                free = sorted(free + [slot])
    return order, steps


def test_sync_continuous():
    res = run_steps(_cfg(engine="continuous", max_batch=2, ppo_epochs=2))
    _check_phases(res, sync=True)
    for k, r in enumerate(res):
        order, steps = _continuous_schedule(list(range(k * B, (k + 1) * B)), slots=2)
        assert r.rollout_ids == order                                    # slots refilled as rollouts end
        assert r.decode_steps == steps
        assert r.generated_tokens == r.decoded_tokens == _resp(order)    # no padding rows
        assert r.prefill_calls == B                                      # one prefill per admission
        assert sum(1 for i in r.intervals if i[1] == "actor_train") == 2 * math.ceil(B / 2)


def test_oppo_intra_scores_chunks_during_generation():
    steps = 2
    res = run_steps(_cfg(schedule="oppo", intra=True, steps=steps))
    sync = run_steps(_cfg(schedule="sync", steps=1))
    _check_phases(res, sync=False)
    for r in res:
        assert r.chunks_scored == sum(math.ceil(ROLLOUTS[i][1] / CHUNK) for i in r.rollout_ids)
        assert r.scored_tokens == r.generated_tokens == _resp(r.rollout_ids)
        assert r.scored_prompt_tokens == sum(ROLLOUTS[i][0] for i in r.rollout_ids)
        assert sum(1 for i in r.intervals if i[1] == "reward") == r.chunks_scored
        gen_end = r.phases["generate"][1]
        assert r.phases["reward"][0] < gen_end          # scoring started while the actor decoded
        assert r.phases["reference"][0] >= r.phases["reward"][1]
    # same seed, same sampled tokens: chunked incremental scoring gives the HF reward model's scores
    assert res[0].rollout_ids == sync[0].rollout_ids
    assert max(abs(a - b) for a, b in zip(res[0].rewards, sync[0].rewards)) < 1e-4


@pytest.mark.parametrize("engine,keep_kv", [("continuous", True), ("continuous", False), ("static", True)])
def test_oppo_inter_carries_unfinished(engine, keep_kv):
    delta, steps = 2, 3
    res = run_steps(_cfg(engine=engine, schedule="oppo", intra=True, inter=True, delta=delta,
                         keep_kv=keep_kv, max_batch=B + delta, steps=steps))
    _check_phases(res, sync=False)
    trained = [i for r in res for i in r.rollout_ids]
    assert len(trained) == len(set(trained)) == steps * B               # each rollout trained once
    seen = set(trained) | set(res[-1].deferred_ids)
    assert seen == set(range(steps * B + delta))                        # nothing lost
    carried_prev: list[int] = []
    for k, r in enumerate(res):
        assert len(r.rollout_ids) == B
        assert r.deferred_out == len(r.deferred_ids) == delta
        assert r.deferred_in == len(carried_prev)
        new = [i for i in r.rollout_ids + r.deferred_ids if i not in carried_prev]
        prompts_new = sum(ROLLOUTS[i][0] for i in new)
        if keep_kv:   # carried rollouts resume from their cache: only new prompts are prefilled
            assert r.prefill_tokens == prompts_new
        else:         # carried rollouts are re-prefilled with prompt + the tokens they already have
            prev_tokens = res[k - 1].deferred_tokens if k else 0
            assert r.prefill_tokens == prompts_new + sum(ROLLOUTS[i][0] for i in carried_prev) + prev_tokens
        carried_prev = r.deferred_ids
    # every token generated for a trained rollout was generated exactly once, in some step
    total = sum(r.generated_tokens for r in res)
    assert total == _resp(trained) + res[-1].deferred_tokens
    assert res[0].deferred_in == 0 and all(r.deferred_in == delta for r in res[1:])


def test_grpo_rule_reward_no_critic():
    cfg = _cfg(algorithm="grpo", group_size=2, prompts_per_step=2, critic=None, reward=None,
               rule_reward_s=0.002, steps=1, engine="continuous")
    (r,) = run_steps(cfg)
    _check_phases([r], sync=True, expected=("generate", "reward", "reference", "actor_train", "weight_sync"))
    assert sorted(r.rollout_ids) == [0, 1, 2, 3]
    assert r.generated_tokens == _resp(r.rollout_ids)
    assert r.score_calls == 4 and r.scored_tokens == 0
    assert all(-1.0 <= x <= 1.0 for x in r.rewards)


def test_bad_config_names_the_field():
    with pytest.raises(RlhfsimError, match=r"ExecConfig\.rollouts: expected at least 14"):
        run_steps(_cfg(rollouts=ROLLOUTS[:10], steps=3, schedule="oppo", inter=True, delta=2))
    with pytest.raises(RlhfsimError, match=r"ExecConfig\.engine"):
        run_steps(_cfg(engine="paged"))
    with pytest.raises(RlhfsimError, match=r"ExecConfig\.reward"):
        run_steps(_cfg(schedule="oppo", intra=True, reward=CATALOG["tiny-deberta"]))
    with pytest.raises(RlhfsimError, match=r"ExecConfig\.schedule"):
        run_steps(replace(_cfg(), intra=True))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_oppo_intra_inter_bf16():
    res = run_steps(_cfg(device="cuda", dtype="bfloat16", engine="continuous", schedule="oppo", intra=True,
                         inter=True, delta=2, max_batch=B + 2, steps=3, threads=None))
    _check_phases(res, sync=False)
    trained = [i for r in res for i in r.rollout_ids]
    assert len(set(trained)) == len(trained) == 3 * B
    assert sum(r.generated_tokens for r in res) == _resp(trained) + res[-1].deferred_tokens
    for r in res:
        assert r.deferred_out == 2
        assert all(math.isfinite(x) for x in r.rewards)


def test_interleaved_runs_do_what_separate_runs_do():
    # Round-robin over two executors changes when their steps run, not what they do.
    a = _cfg(engine="static", steps=2)
    b = _cfg(engine="continuous", schedule="oppo", intra=True, inter=True, delta=2, steps=3)
    ra, rb = run_interleaved([a, b])
    assert (len(ra), len(rb)) == (2, 3)
    for cfg, res in ((a, ra), (b, rb)):
        alone = run_steps(cfg)
        for x, y in zip(res, alone):
            assert (x.rollout_ids, x.generated_tokens, x.chunks_scored, x.deferred_ids) == \
                (y.rollout_ids, y.generated_tokens, y.chunks_scored, y.deferred_ids)
            assert x.rewards == pytest.approx(y.rewards, rel=1e-4, abs=1e-5)
    with pytest.raises(ValueError, match="one thread count"):
        run_interleaved([a, replace(b, threads=2)])


DEBERTA = CATALOG["tiny-deberta"]
SMALL = CATALOG["small-qwen2"]


@pytest.mark.parametrize("streaming", ["reencode", "final_only"])
def test_oppo_intra_into_an_encoder(streaming):
    """An encoder reward model under intra-step streaming: ``reencode`` scores the whole prefix at every
    chunk boundary, ``final_only`` each response once when it has finished; every trained rollout gets
    the reward of its whole response (re-tokenized for DeBERTa's tokenizer)."""
    cfg = _cfg(schedule="oppo", intra=True, reward=DEBERTA, reward_streaming=streaming, retokenize=True)
    res = run_steps(cfg)
    for r in res:
        resp = [ROLLOUTS[i][1] for i in r.rollout_ids]
        chunks = sum(math.ceil(n / CHUNK) for n in resp)
        assert r.chunks_scored == (chunks if streaming == "reencode" else len(resp))
        if streaming == "final_only":   # one whole-response pass per rollout
            assert r.scored_tokens == sum(resp)
        else:                          # every pass re-encodes the prefix: more than the responses
            assert r.scored_tokens >= sum(resp)
        assert len(r.rewards) == B and all(math.isfinite(x) for x in r.rewards)
        assert "retokenize" not in r.phases    # under streaming it is inside each scorer call


def test_another_vocabulary_retokenizes_as_its_own_phase():
    """GRPO with a 4,096-token actor and tiny-deberta (1,024): the issue's traceback (ids beyond the reward
    model's embedding) is gone; the batch is re-tokenized once, as phase ``retokenize``, before scoring."""
    cfg = _cfg(actor=SMALL, reference=SMALL, critic=None, reward=DEBERTA, algorithm="grpo", group_size=2,
               prompts_per_step=2, retokenize=True)
    res = run_steps(cfg)
    for r in res:
        assert r.phases["retokenize"][1] <= r.phases["reward"][0] + 1e-9
        assert len(r.rewards) == 4 and all(math.isfinite(x) for x in r.rewards)


def test_unpaired_vocabulary_is_one_line():
    with pytest.raises(RlhfsimError, match=r"^ExecConfig\.reward: expected a vocabulary holding the actor's token ids"):
        run_steps(_cfg(actor=SMALL, reference=SMALL, critic=None, reward=DEBERTA, algorithm="grpo", group_size=2,
                       prompts_per_step=2))
    with pytest.raises(RlhfsimError, match=r"^ExecConfig\.reward_streaming: expected reencode or final_only"):
        run_steps(_cfg(schedule="oppo", intra=True, reward=DEBERTA, retokenize=True))

"""Streaming strategies: how OPPO's intra-step overlap hands a response to the reward model while the actor
decodes (``models.reward.streaming``). One registry, ``STREAMING``; each strategy says which reward
architectures can run it, which scorer call a rollout emits when the engine hands its new tokens over,
and how that call is priced.

A rollout has P prompt tokens; the engine hands over its tokens at its chunk boundaries (every
``chunk_tokens`` generated tokens, or per static batch) and when it finishes. With g tokens generated at a
hand-over and d already handed over before it:

* ``incremental`` (decoders): one call prefilling the g - d new tokens (plus the prompt on the first call)
  on top of the reward model's KV cache of the P + d tokens before them (``CostModel.chunk_prefill``).
  Total work over a response of R tokens in chunks of c: about one prefill of P + R tokens.
* ``reencode`` (encoders and decoders): one call encoding all P + g tokens from scratch
  (``CostModel.rescore``): bidirectional attention changes every earlier token's representation
  when a chunk arrives, so nothing can be reused. Only the last call's score counts; the earlier calls
  are speculative work that keeps the scorer warm. Total over k = ceil(R / c) calls:
  sum_{i=1..k} (P + min(i c, R)) tokens, about k P + c k^2 / 2: it grows with the square of R.
* ``final_only`` (encoders and decoders): no call until the rollout has finished, then one call
  encoding its P + R tokens (verl-style per-sample reward overlap): total one pass of P + R tokens.

So for the same responses ``reencode`` prices at least the work of ``final_only`` (its last call is the
same pass, and every earlier one is extra), and more as responses grow (``tests/property``).

A strategy's ``price`` is a ``Price`` (``rlhfsim.costs.terms``), whose terms (for ``rlhfsim explain``) are a
forward's (``CostModel.forward``) and, for a call that re-encodes tokens earlier calls scored, ``reencode_prefix``:
the call's price less the price of its ``new`` tokens alone, what re-scoring costs against ``incremental``.
"""

from __future__ import annotations

from functools import partial
from typing import ClassVar

from rlhfsim.costs.terms import REENCODE_PREFIX, Price


class Streaming:
    """One way of streaming a response to the reward model. Subclasses set ``NAME`` and ``ARCHS``."""

    NAME: ClassVar[str]
    ARCHS: ClassVar[tuple[str, ...]]   # reward-model architectures (ModelShape.arch) that can run it

    @staticmethod
    def job(r, done: int) -> tuple[int, int] | None:
        """(tokens, cached prefix tokens) of the call ``r`` emits now with ``done`` response tokens
        handed over before, or None when it emits nothing (its hand-over mark then stays at ``done``)."""
        raise NotImplementedError

    @staticmethod
    def price(cost, model, dtype: str, tokens: float, n_seqs: int, prefix: float, tp: int, head: str,
              runtime: str | None, new: float | None = None) -> Price:
        """One scorer call of ``n_seqs`` rows, ``tokens`` and ``prefix`` summed; ``new``, for its terms: the call's
        tokens that no earlier call of its rollouts scored (None: all of them)."""
        raise NotImplementedError


class Incremental(Streaming):
    """Each chunk prefilled on top of the reward model's cached prefix (OPPO's own; needs a causal model)."""

    NAME = "incremental"
    ARCHS = ("decoder",)

    @staticmethod
    def job(r, done):
        new = r.generated - done
        if new <= 0:
            return None
        first = done == 0
        return new + (r.prompt_len if first else 0), (0 if first else r.prompt_len + done)

    @staticmethod
    def price(cost, model, dtype, tokens, n_seqs, prefix, tp, head, runtime, new=None):
        return cost.chunk_prefill(model, dtype, tokens, n_seqs, prefix, tp, head)


class Reencode(Streaming):
    """Each chunk re-encodes the whole prefix so far, from scratch (no cache)."""

    NAME = "reencode"
    ARCHS = ("decoder", "encoder")

    @staticmethod
    def job(r, done):
        if r.generated <= done:
            return None
        return r.prompt_len + r.generated, 0

    @staticmethod
    def price(cost, model, dtype, tokens, n_seqs, prefix, tp, head, runtime, new=None):
        whole = cost.rescore(model, dtype, tokens, n_seqs, tp, runtime)
        if new is None or new >= tokens:   # nothing scored before: one plain pass
            return whole
        return Price(whole.total_s, whole.active_s,
                     partial(_reencoded, cost.rescore(model, dtype, new, n_seqs, tp, runtime), whole.total_s))


def _reencoded(alone: Price, total_s: float) -> dict[str, float]:
    """A re-encoding call's terms: its new tokens' pass alone, and the rest of its price as ``reencode_prefix``."""
    out = alone.terms()
    out[REENCODE_PREFIX] = total_s - sum(out.values())
    return out


class FinalOnly(Streaming):
    """Nothing streams; each response is scored whole as soon as it has finished."""

    NAME = "final_only"
    ARCHS = ("decoder", "encoder")

    @staticmethod
    def job(r, done):
        if r.generated < r.response_len or r.generated <= done:
            return None
        return r.prompt_len + r.generated, 0

    price = Reencode.price   # its one call per rollout re-encodes nothing: ``new`` is all its tokens


STREAMING: dict[str, type[Streaming]] = {cls.NAME: cls for cls in (Incremental, Reencode, FinalOnly)}
DEFAULT_STREAMING = {"decoder": "incremental", "encoder": "final_only"}  # per reward architecture

"""Real generation with a static per-slot KV cache (``StaticKVDecoder``), two engines.

Both engines decode with the actor's generation decoder, ``max_batch`` slots, sampling at temperature 1
(the pad id is never sampled) and exact response lengths: rollout i decodes exactly ``response_len``
tokens (EOS is ignored). The first response token is sampled from the prefill's logits, so a rollout of
R tokens costs one prefill plus R - 1 decode positions.

- ``static`` (HF ``generate``-like): the pool is cut, in order, into batches of ``max_batch``; a batch is
  prefilled in ONE padded call (right padding, width = its longest prompt) and then decoded in lockstep
  until its longest response ends; finished rows keep decoding as padding (counted in ``decoded_tokens``,
  not in ``generated_tokens``; a fresh batch has decoded_tokens = rows x longest response, the prefill's
  sampled token included). Batches run one after another.
- ``continuous``: ``max_batch`` slots; each admission is ONE prefill call of that rollout alone (the
  initial fill too); a slot freed by a finished rollout is refilled before the next decode step; each
  decode step runs every unfinished resident rollout.

Per step the pool holds the carried rollouts first (their previous order), then new ones in arrival
order. Generation stops as soon as ``target`` rollouts have finished (finish order = order of the calls
that produced their last token, rows within a call in slot order; rollouts finished in an earlier step
come first). Carried unfinished rollouts keep their slot and cache when ``keep_kv``; otherwise the slot
is freed and the rollout is re-prefilled (prompt + generated tokens, one prefill) when admitted again.
In the static engine a step always opens a new batch: the resident carried rollouts plus waiting ones.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch

from calibrate.decoder import StaticKVDecoder, sample_next
from calibrate.executor.timing import Clock, StepLog
from calibrate.models import PAD_ID


@dataclass(eq=False)
class Sequence:
    """One rollout in flight: its prompt, the tokens generated so far and their sampling logprobs."""

    rid: int
    group: int
    prompt: list[int]
    response_len: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    slot: int | None = None          # actor KV slot while resident
    queued: int = 0                  # response tokens handed to the scorer (intra)
    reward: float | None = None

    @property
    def finished(self) -> bool:
        return len(self.tokens) >= self.response_len


class Generator:
    """The decode loop of one run: owns the generation decoder's slots and the sampling RNG."""

    def __init__(self, decoder: StaticKVDecoder, engine: str, clock: Clock, seed: int,
                 on_token: Callable[[Sequence], None] | None = None):
        self.dec = decoder
        self.clock = clock
        self.on_token = on_token
        self.free = list(range(decoder.max_slots))
        self.resident: dict[int, Sequence] = {}
        self.rng = torch.Generator(device=decoder.device).manual_seed(seed)
        self.engine = ENGINES[engine](self)

    # ------------------------------------------------------------------------------------ one step
    def generate(self, pool: list[Sequence], target: int, log: StepLog) -> list[Sequence]:
        """Decode until ``target`` rollouts of ``pool`` have finished; returns the finished ones in finish
        order (possibly more than ``target`` when several finish in the same call)."""
        finished = [s for s in pool if s.finished]
        waiting = deque(s for s in pool if not s.finished and s.slot is None)
        self.engine.start_step()
        while len(finished) < target:
            self.engine.admit(waiting, finished, target, log)
            if len(finished) >= target:
                break
            rows = self.engine.rows()
            if rows:
                self._decode(rows, finished, log)
            elif not waiting and not self.resident:
                raise RuntimeError(f"generation stalled: {len(finished)} of {target} rollouts finished and nothing left to decode")
        return finished

    def end_step(self, carried: list[Sequence], keep_kv: bool) -> None:
        """Free every slot except those of carried unfinished rollouts when ``keep_kv``."""
        keep = {id(s) for s in carried if keep_kv and not s.finished}
        for slot, s in list(self.resident.items()):
            if id(s) not in keep:
                self._release(s)
        self.engine.start_step()

    # ------------------------------------------------------------------------------------- helpers
    def _assign(self, s: Sequence) -> None:
        s.slot = self.free.pop(0)
        self.resident[s.slot] = s
        self.dec.reset(torch.tensor([s.slot]))

    def _release(self, s: Sequence) -> None:
        if s.slot is not None:
            del self.resident[s.slot]
            self.free.append(s.slot)
            self.free.sort()
            s.slot = None

    def _sample(self, logits: torch.Tensor) -> tuple[list[int], list[float]]:
        return sample_next(logits, self.rng, PAD_ID)   # .tolist() inside waits for the decode stream

    def _append(self, rows: list[Sequence], toks: list[int], lps: list[float], finished: list[Sequence],
                log: StepLog) -> None:
        for s, t, lp in zip(rows, toks, lps):
            if s.finished:          # a static batch's finished row decoding as padding
                continue
            s.tokens.append(t)
            s.logprobs.append(lp)
            log.count(generated_tokens=1)
            if self.on_token is not None:
                self.on_token(s)
            if s.finished:
                finished.append(s)
                self.engine.on_finish(s)

    def prefill(self, seqs: list[Sequence], finished: list[Sequence], log: StepLog) -> None:
        """One prefill call for ``seqs`` (new slots): prompt + already generated tokens, right-padded."""
        for s in seqs:
            self._assign(s)
        rows = [s.prompt + s.tokens for s in seqs]
        lens = [len(r) for r in rows]
        ids = torch.full((len(rows), max(lens)), PAD_ID, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r)
        slots = torch.tensor([s.slot for s in seqs])
        start = self.clock.now()
        logits = self.dec.extend(slots, ids.to(self.dec.device), lengths=torch.tensor(lens) if len(set(lens)) > 1 else None)
        toks, lps = self._sample(logits)
        end = self.clock.now()
        log.add("actor", "generate", start, end, prefill_calls=1, prefill_tokens=sum(lens), decoded_tokens=len(seqs))
        self._append(seqs, toks, lps, finished, log)

    def _decode(self, rows: list[Sequence], finished: list[Sequence], log: StepLog) -> None:
        ids = torch.tensor([[s.tokens[-1]] for s in rows], device=self.dec.device)
        slots = torch.tensor([s.slot for s in rows])
        start = self.clock.now()
        logits = self.dec.extend(slots, ids)
        toks, lps = self._sample(logits)
        end = self.clock.now()
        log.add("actor", "generate", start, end, decode_steps=1, decoded_tokens=len(rows))
        self._append(rows, toks, lps, finished, log)


class _Engine:
    NAME: ClassVar[str]

    def __init__(self, gen: Generator):
        self.gen = gen

    def start_step(self) -> None:
        """Called at each step's start and end."""

    def admit(self, waiting: deque, finished: list[Sequence], target: int, log: StepLog) -> None:
        raise NotImplementedError

    def rows(self) -> list[Sequence]:
        raise NotImplementedError

    def on_finish(self, s: Sequence) -> None:
        """A rollout produced its last token."""


class StaticEngine(_Engine):
    """Batches of ``max_batch`` decoded in lockstep until the batch's longest response ends."""

    NAME = "static"

    def start_step(self) -> None:
        self.batch: list[Sequence] | None = None

    def admit(self, waiting, finished, target, log) -> None:
        if self.batch is not None:
            return
        batch = sorted(self.gen.resident.values(), key=lambda s: s.slot)
        new = []
        while waiting and len(batch) + len(new) < self.gen.dec.max_slots:
            new.append(waiting.popleft())
        self.batch = batch + new
        if new:
            self.gen.prefill(new, finished, log)

    def rows(self) -> list[Sequence]:
        if self.batch is None:
            return []
        if any(not s.finished for s in self.batch):
            return sorted(self.batch, key=lambda s: s.slot)
        for s in self.batch:         # the whole batch is done: free its slots for the next batch
            self.gen._release(s)
        self.batch = None
        return []


class ContinuousEngine(_Engine):
    """Slots refilled one prefill per admission as soon as a rollout finishes."""

    NAME = "continuous"

    def admit(self, waiting, finished, target, log) -> None:
        while self.gen.free and waiting and len(finished) < target:
            self.gen.prefill([waiting.popleft()], finished, log)

    def rows(self) -> list[Sequence]:
        return [s for _, s in sorted(self.gen.resident.items()) if not s.finished]

    def on_finish(self, s: Sequence) -> None:
        self.gen._release(s)


ENGINES = {"static": StaticEngine, "continuous": ContinuousEngine}

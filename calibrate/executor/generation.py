"""Real generation: the generation runtimes of the executor (``ExecConfig.gen_runtime``, registry
``EXEC_RUNTIMES``), ``kv_decoder`` (default) and ``hf_generate``.

``kv_decoder``: a static per-slot KV cache (``StaticKVDecoder``) holding a copy of the actor's weights
(``weight_sync`` copies them after training), two engines:

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

``hf_generate`` (``HfGeneration``; engine ``static`` only): transformers ``generate()`` on the actor's
own HF ``*ForCausalLM``, the model training updates, as TRL generates (so ``weight_sync`` has nothing to
copy: its interval is still recorded, microseconds long). The pool is cut, in order, into batches of
``max_batch``; a batch's prompts (prompt + tokens already generated, for carried rollouts) are
LEFT-padded, as TRL pads them, and generated with TRL's arguments (``calibrate.genruntimes.hf_generate``)
at temperature 1: one ``generate()`` call per batch, or under OPPO intra-step streaming one call per
``chunk_tokens`` tokens, each continuing on the previous call's cache, each row's new tokens handed to
the scorer at every boundary. Exact lengths: a per-row ``RowStop`` criterion ends row i after its
remaining tokens (HF then fills the row with pad, as after an EOS); the pad/EOS id is never sampled
(``min_new_tokens`` masks it), and the sampled tokens' log-probs come from ``LogprobRecorder``. A batch
runs until its longest remaining response ends, or until the step at which ``target`` rollouts have
finished (rows finishing at that same step all count; the rest are carried). Finish order: by the step
a row's last token came in, rows in batch order. HF's cache lives for one batch, so carried rollouts
are always re-prefilled (``keep_kv`` under inter is rejected). Counts per call: the first call of a batch
is one prefill (``prefill_tokens`` = the batch's real prompt tokens) plus steps - 1 decode steps, a
continuation call is ``steps`` decode steps (it feeds the previous call's last token); ``decoded_tokens``
= rows x steps; one ``generate`` interval per call. Sampling RNG: ``generate`` draws from torch's global
generator; each call runs with the run's own generator state swapped in (seeded once from the run's
seed, carried from call to call), so a run is reproducible, a batch draws the same tokens whether it is
generated in one call or in chunks, and the process's RNG is left as it was.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch

from calibrate.measuring.decoder import StaticKVDecoder, sample_next
from calibrate.executor.timing import Clock, StepLog
from calibrate.genruntimes import left_pad
from calibrate.genruntimes.hf_generate import HfGenerate, LogprobRecorder, RowStop
from calibrate.measuring.models import PAD_ID
from rlhfsim.errors import RlhfsimError


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
        # priced as the simulator prices it: one call padded to its longest row
        log.op("prefill", end - start, n_tokens=len(seqs) * max(lens), n_seqs=len(seqs))
        self._append(seqs, toks, lps, finished, log)

    def _decode(self, rows: list[Sequence], finished: list[Sequence], log: StepLog) -> None:
        ids = torch.tensor([[s.tokens[-1]] for s in rows], device=self.dec.device)
        slots = torch.tensor([s.slot for s in rows])
        ctx = [len(s.prompt) + len(s.tokens) for s in rows]
        start = self.clock.now()
        logits = self.dec.extend(slots, ids)
        toks, lps = self._sample(logits)
        end = self.clock.now()
        log.add("actor", "generate", start, end, decode_steps=1, decoded_tokens=len(rows))
        # kv0 as the simulator counts it: a static batch at its padded width, continuous rows as they are
        kv0 = len(rows) * max(ctx) if self.engine.NAME == "static" else sum(ctx)
        log.op("decode", end - start, batch=len(rows), kv0=kv0, kv_padded=len(rows) * max(ctx))
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


# -- generation runtimes of the executor ------------------------------------------------------------------
class KvGeneration:
    """``kv_decoder``: the engines above over a ``StaticKVDecoder`` with a copy of the actor's weights."""

    NAME: ClassVar[str] = "kv_decoder"

    @staticmethod
    def validate(cfg) -> None:
        """Every engine and schedule combination is supported."""

    def __init__(self, cfg, actor, clock: Clock, seed: int, max_len: int,
                 on_token: Callable[[Sequence], None] | None):
        p = next(actor.parameters())
        self.decoder = StaticKVDecoder(cfg.actor, dtype=p.dtype, device=str(p.device), max_slots=cfg.max_batch,
                                       max_len=max_len, head="lm", seed=seed)
        self.decoder.load_hf_state_dict(actor.state_dict())
        self.gen = Generator(self.decoder, cfg.engine, clock, seed, on_token=on_token)

    def generate(self, pool: list[Sequence], target: int, log: StepLog) -> list[Sequence]:
        return self.gen.generate(pool, target, log)

    def end_step(self, carried: list[Sequence], keep_kv: bool) -> None:
        self.gen.end_step(carried, keep_kv)

    def sync_weights(self, actor) -> None:
        self.decoder.load_hf_state_dict(actor.state_dict())


class HfGeneration:
    """``hf_generate``: HF ``generate()`` on the actor itself, static batches (see the module docstring)."""

    NAME: ClassVar[str] = "hf_generate"

    @staticmethod
    def validate(cfg) -> None:
        if cfg.engine != "static":
            raise RlhfsimError(f"ExecConfig.engine: expected 'static' with gen_runtime 'hf_generate' "
                               f"(generate() batches statically), got {cfg.engine!r}")
        if cfg.inter and cfg.keep_kv:
            raise RlhfsimError("ExecConfig.keep_kv: expected False with gen_runtime 'hf_generate' under inter-step "
                               "overcommitment (generate()'s cache lives for one batch; carried rollouts are re-prefilled; "
                               "kv_decoder keeps them), got True")

    def __init__(self, cfg, actor, clock: Clock, seed: int, max_len: int,
                 on_token: Callable[[Sequence], None] | None):
        self.rt = HfGenerate()
        self.rt.load(actor, cfg.actor, max_batch=cfg.max_batch, max_len=max_len)
        self.device = next(actor.parameters()).device
        self.clock, self.on_token = clock, on_token
        self.max_batch = cfg.max_batch
        self.chunk = cfg.chunk_tokens if cfg.intra else None
        self.cuda = self.device.type == "cuda"
        self.rng_devices = [self.device.index or 0] if self.cuda else []
        with torch.random.fork_rng(devices=self.rng_devices):
            torch.manual_seed(seed)
            self.rng = self._rng_state()

    def _rng_state(self):
        return torch.get_rng_state(), torch.cuda.get_rng_state(self.device) if self.cuda else None

    def end_step(self, carried: list[Sequence], keep_kv: bool) -> None:
        """Nothing is resident between steps: carried rollouts are re-prefilled."""

    def sync_weights(self, actor) -> None:
        """Generation runs on the actor itself: nothing to copy."""

    def generate(self, pool: list[Sequence], target: int, log: StepLog) -> list[Sequence]:
        finished = [s for s in pool if s.finished]
        waiting = deque(s for s in pool if not s.finished)
        while len(finished) < target:
            if not waiting:
                raise RuntimeError(f"generation stalled: {len(finished)} of {target} rollouts finished and "
                                   "nothing left to decode")
            batch = [waiting.popleft() for _ in range(min(self.max_batch, len(waiting)))]
            self._batch(batch, finished, target, log)
        return finished

    def _call(self, seq, mask, k: int, state, more: bool, remaining: list[int]):
        rec = LogprobRecorder()
        stop = RowStop(remaining, self.device, recorder=rec)
        with torch.random.fork_rng(devices=self.rng_devices):
            torch.set_rng_state(self.rng[0])
            if self.cuda:
                torch.cuda.set_rng_state(self.rng[1], self.device)
            gen = self.rt.generate(seq, mask, k, state=state, keep_state=more, stopping=(stop,), processors=(rec,))
            steps = gen.sequences.shape[1] - seq.shape[1]
            toks = gen.sequences[:, seq.shape[1]:].tolist()     # the new tokens, handed to the host
            lps = rec.logprobs()
            self.rng = self._rng_state()
        return gen, steps, toks, lps

    def _batch(self, rows: list[Sequence], finished: list[Sequence], target: int, log: StepLog) -> None:
        rem = [s.response_len - len(s.tokens) for s in rows]
        need = target - len(finished)
        by_end = sorted(rem)
        total = by_end[need - 1] if need <= len(rows) else by_end[-1]   # the step at which this batch ends
        seq, mask = left_pad([s.prompt + s.tokens for s in rows], self.device)
        padded = len({len(s.prompt) + len(s.tokens) for s in rows}) > 1   # the mask has zeros at every step
        prompt_tokens = int(mask.sum())
        state, done = None, 0
        while done < total:
            k = min(self.chunk or total, total - done)
            start = self.clock.now()
            gen, steps, toks, lps = self._call(seq, mask, k, state, done + k < total, [r - done for r in rem])
            end = self.clock.now()
            first = done == 0
            log.add("actor", "generate", start, end, prefill_calls=int(first),
                    prefill_tokens=prompt_tokens if first else 0, decode_steps=steps - 1 if first else steps,
                    decoded_tokens=len(rows) * steps)
            log.op("generate_call", end - start, rows=len(rows), width=int(seq.shape[1]), steps=steps, first=first,
                   padded=padded)
            ended = []
            for i, s in enumerate(rows):
                n = max(0, min(steps, rem[i] - done))
                if n == 0:
                    continue
                s.tokens.extend(toks[i][:n])
                s.logprobs.extend(lps[i][:n])
                log.count(generated_tokens=n)
                if self.on_token is not None:
                    self.on_token(s)
                if s.finished:
                    ended.append((rem[i], i, s))
            finished.extend(s for _, _, s in sorted(ended, key=lambda x: x[:2]))
            seq, mask, state, done = gen.sequences, gen.mask, gen.state, done + steps


EXEC_RUNTIMES = {"kv_decoder": KvGeneration, "hf_generate": HfGeneration}

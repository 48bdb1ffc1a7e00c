"""OPPO intra-step scoring: a scorer thread fed by the decode loop through a FIFO queue.

Chunking: for a response of R tokens and chunk size c, the decode loop queues an item when the rollout's
k-th chunk of c tokens is complete (after token k*c) and the final partial chunk when the rollout ends:
ceil(R / c) items. The first item carries the prompt too (prompt + first chunk in one call). The scorer
takes items one at a time, in queue order, and prefills each on top of that rollout's cached prefix with
``StaticKVDecoder(head="value").extend`` (batch 1, one call per item); the score returned with the final
chunk is the rollout's reward. A rollout holds a reward-cache slot from its first chunk to its final one,
across steps if it is carried (the reward cache is kept even when the actor's is not).

Rule reward (no reward model): nothing to prefill, so one item per rollout when it ends, scored by
``rule_reward`` on the CPU in the scorer thread.

On CUDA the scorer runs on its own stream and synchronises only that stream before reading the clock.
At the end of generation the step waits until the queue is empty (every queued item scored, including
chunks of rollouts that will be carried); that is the end of the reward phase, and of the step's
scorer thread (each step's first item starts a new one: ``Scorer.drain`` says why).

Streaming strategies (``ExecConfig.reward_streaming``, ``rlhfsim.sim.streaming``): the above is
``incremental``. ``reencode`` queues at the same chunk boundaries, but each item is the whole prefix so far
(prompt + every response token up to the boundary), scored from scratch by the Hugging Face reward model
(batch 1, no cache: an encoder's bidirectional attention leaves nothing to reuse); the final item's score
is the reward. ``final_only`` queues one item per rollout, when it has finished: prompt + response scored
whole, batch 1. When the reward model reads another tokenizer (``ExecConfig.retokenize``), each item's
ids are decoded and tokenized again (``calibrate.measuring.retokenize.Retokenizer``) inside the timed call.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time

import torch

from calibrate.measuring.decoder import StaticKVDecoder
from calibrate.executor.timing import Clock, StepLog
from calibrate.cpu.threadpool import one_thread_here, scorer_threads


def rule_reward(prompt: list[int], tokens: list[int], cost_s: float) -> float:
    """A deterministic rule-based checker standing in for a verifier: a score in [-1, 1] from a hash of
    the response, keeping the CPU busy (holding the GIL, like a Python checker) for ``cost_s``."""
    def digest() -> int:
        acc = len(prompt)
        for t in tokens:
            acc = (acc * 1000003 + t) & 0xFFFFFFFF
        return acc

    deadline = time.perf_counter() + cost_s
    acc = digest()
    while time.perf_counter() < deadline:
        digest()
    return ((acc % 2001) - 1000) / 1000.0


class Scorer:
    """The intra-step scorer thread. ``offer(seq)`` is called by the decode loop after every token."""

    def __init__(self, decoder: StaticKVDecoder | None, chunk_tokens: int, rule_reward_s: float, clock: Clock,
                 strategy: str = "incremental", model=None, retok=None):
        self.dec = decoder
        self.model = model           # the HF reward model (reencode, final_only)
        self.strategy = "rule" if decoder is None and model is None else strategy
        self.retok = retok
        self.chunk = chunk_tokens
        self.rule_reward_s = rule_reward_s
        self.clock = clock
        self.log: StepLog | None = None
        self.error: BaseException | None = None
        self.free = list(range(decoder.max_slots)) if decoder is not None else []
        self.slot_of: dict[int, int] = {}
        self.q: queue.Queue = queue.Queue()
        self.score_item = {"rule": self._score_rule, "incremental": self._score_incremental,
                           "reencode": self._score_whole, "final_only": self._score_whole}[self.strategy]
        self.stream = torch.cuda.Stream(device=clock.device) if clock.cuda else None
        self.omp_threads = scorer_threads(clock.cuda)   # 1 on a CPU: the thread owns no OpenMP team (``_run``)
        self.thread: threading.Thread | None = None

    def _put(self, item) -> None:
        """Queue an item, starting the step's scorer thread on its first one (see ``drain``)."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="rlhf-scorer", daemon=True)
            self.thread.start()
        self.q.put(item)

    # ------------------------------------------------------------------------- decode-loop side
    def offer(self, seq) -> None:
        n = len(seq.tokens)
        final = n >= seq.response_len
        if self.strategy in ("rule", "final_only"):   # one item per rollout, when it has finished
            if final and n > seq.queued:
                self._put((seq, seq.queued, n, seq.queued == 0, True, list(seq.tokens[:n])))
                seq.queued = n
            return
        if n - seq.queued >= self.chunk or (final and n > seq.queued):
            first = seq.queued == 0
            toks = seq.tokens[:n] if self.strategy == "reencode" else seq.tokens[seq.queued:n]
            self._put((seq, seq.queued, n, first, final, list(toks)))
            seq.queued = n

    def drain(self) -> None:
        """Block until every queued item is scored, then end the step's scorer thread (the next step's first
        item starts a new one); re-raise a scorer failure here.

        The thread lives for one step's scoring only: a scorer thread that ran torch ops and stayed alive kept its own
        OpenMP team while it waited, and on a CPU that idle team slowed the main thread's training that followed by
        9-31% (median 15%; ``lab/diagnostics/scorer_thread.py`` measures it on a quiet 2-core VM), while a thread that had
        ended left no such cost (median 1.4%): a CPU artifact that a scorer on its own GPU, which this thread stands
        in for, does not have. (The idle team used no CPU: it put libgomp's count of workers past the CPUs, and
        libgomp then lets every worker spin only 100 times before it sleeps, so each of the main thread's parallel
        regions woke a sleeping worker; ``lab/diagnostics/decode_threadpool.py``.) On a CPU the thread now runs one
        OpenMP thread and owns no team (``_run``, ``calibrate.cpu.threadpool``); it still ends here, so nothing of a
        step's scoring outlives its reward phase."""
        self.q.join()
        self.close()
        if self.error is not None:
            err, self.error = self.error, None
            raise err

    def close(self) -> None:
        if self.thread is not None:
            self.q.put(None)
            self.thread.join()
            self.thread = None

    # ----------------------------------------------------------------------------- thread side
    def _run(self) -> None:
        if self.omp_threads == 1:
            one_thread_here()    # no OpenMP team of its own: idle, it costs the actor's pool nothing
        ctx = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        with ctx:
            while True:
                item = self.q.get()
                try:
                    if item is None:
                        return
                    if self.error is None:
                        self.score_item(*item)
                except BaseException as e:   # noqa: BLE001 - handed to the main thread by drain()
                    self.error = e
                finally:
                    self.q.task_done()

    def _score_rule(self, seq, a: int, b: int, first: bool, final: bool, toks: list[int]) -> None:
        start = self.clock.now()
        seq.reward = rule_reward(seq.prompt, toks, self.rule_reward_s)
        self.log.add("reward", "reward", start, self.clock.now(), score_calls=1)

    def _score_incremental(self, seq, a: int, b: int, first: bool, final: bool, toks: list[int]) -> None:
        log = self.log
        if first:
            slot = self.free.pop(0)
            self.slot_of[seq.rid] = slot
            self.dec.reset(torch.tensor([slot]))
            ids = seq.prompt + toks
        else:
            slot = self.slot_of[seq.rid]
            ids = toks
        start = self.clock.now()
        if self.retok is not None:
            ids = self.retok([ids])[0]
        out = self.dec.extend(torch.tensor([slot]), torch.tensor([ids], device=self.dec.device))
        if final:
            seq.reward = float(out[0])
        end = self.clock.now()
        log.op("chunk_prefill", end - start, tokens=len(ids), prefix=0 if first else len(seq.prompt) + a,
               retokenize=self.retok is not None)
        if final:
            self.free.append(self.slot_of.pop(seq.rid))
        log.add("reward", "reward", start, end, score_calls=1, chunks_scored=1, scored_tokens=b - a,
                scored_prompt_tokens=len(seq.prompt) if first else 0)

    def _score_whole(self, seq, a: int, b: int, first: bool, final: bool, toks: list[int]) -> None:
        """reencode / final_only: prompt + the response's first ``b`` tokens scored from scratch."""
        start = self.clock.now()
        ids = seq.prompt + toks
        if self.retok is not None:
            ids = self.retok([ids])[0]
        dev = next(self.model.parameters()).device
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([ids], device=dev),
                             attention_mask=torch.ones((1, len(ids)), dtype=torch.long, device=dev)).logits[0, 0]
            score = float(out)
        if final:
            seq.reward = score
        end = self.clock.now()
        self.log.op("rescore", end - start, tokens=len(ids), retokenize=self.retok is not None)
        self.log.add("reward", "reward", start, end, score_calls=1, chunks_scored=1, scored_tokens=b,
                     scored_prompt_tokens=len(seq.prompt))

"""Rollouts (one prompt's response in flight) and the seeded stream they are drawn from."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # for the annotation only (the scenario side imports nothing of the simulator)
    from rlhfsim.scenario.checks import Setup


@dataclass(eq=False, slots=True)
class Rollout:
    """One response being generated. ``generated`` counts decoded tokens; ``scored`` counts response
    tokens the reward model has prefilled under chunked scoring; ``kv_resident`` says whether its KV
    cache survived a deferral (else it pays a re-prefill of prompt + generated tokens)."""

    id: int
    prompt_len: int
    response_len: int
    admitted_step: int = -1
    generated: int = 0
    scored: dict = field(default_factory=dict)  # role -> response tokens prefilled by that role's chunks
    kv_resident: bool = False
    tokens_by_step: dict = field(default_factory=dict)  # step -> tokens decoded in that step
    finished_at: float | None = None
    paused: bool = False  # spent this step's token budget (partial rollouts)
    step_budget_used: int = 0
    # The engines' event clock (rlhfsim.sim.engines.clock): generated = replica step - clock_offset.
    clock_offset: int = 0
    budget_at: int = 0
    heap_version: int = 0

    @property
    def remaining(self) -> int:
        return self.response_len - self.generated

    @property
    def done(self) -> bool:
        return self.generated >= self.response_len


def truncated(rows: list[Rollout], cap: int) -> list[Rollout]:
    """``rows`` as a model that takes at most ``cap`` tokens per row reads them (a reward model with an
    absolute position table, ``Setup.reward_max_tokens``): a row longer than ``cap`` becomes a copy cut on
    the right (its prompt first, then as much of its response as fits: the frameworks' ``truncation=
    "right"``), for pricing only; shorter rows are the same objects."""
    out = []
    for r in rows:
        if r.prompt_len + r.response_len <= cap:
            out.append(r)
        else:
            p = min(r.prompt_len, cap)
            out.append(replace(r, prompt_len=p, response_len=cap - p))
    return out


class RolloutStream:
    """Rollouts in arrival order, drawn lazily from the scenario's length distributions with the
    simulation's generator. GRPO groups share one prompt (and its length). An explicit list of
    (prompt_len, response_len) replaces sampling (used by validation to replay a real run's lengths); so
    does a ``trace`` length source (``setup.trace``), which starts over when the run outlasts it.

    Drawn lengths wait in a deque, so taking n rollouts costs O(n) however many are buffered."""

    def __init__(self, setup: Setup, rng: np.random.Generator, fixed: list[tuple[int, int]] | None = None):
        self.setup = setup
        self.rng = rng
        self.group = setup.scenario.algorithm.group_size
        self.fixed = fixed if fixed is not None else setup.trace
        self.cycle = fixed is None and setup.trace is not None
        self.next_id = 0
        self._buf: deque[tuple[int, int]] = deque()

    def _refill(self, n_prompts: int) -> None:
        p = self.setup.prompt_sampler(self.rng, n_prompts)
        r = self.setup.response_sampler(self.rng, n_prompts * self.group)
        # prompt i's length for each of its group's responses, as Python ints
        self._buf.extend(zip(np.repeat(p, self.group).tolist(), r[:n_prompts * self.group].tolist()))

    def take(self, n: int, step: int) -> list[Rollout]:
        first = self.next_id
        if self.fixed is not None:
            m = len(self.fixed)
            if first + n > m and not self.cycle:
                raise IndexError(f"the replayed rollout list has only {m} entries")
            lengths = [self.fixed[i % m] for i in range(first, first + n)]
        else:
            buf = self._buf
            while len(buf) < n:  # the same draws as refilling whenever the buffer runs dry
                self._refill(max(64, self.setup.scenario.workload.prompts_per_step))
            lengths = [buf.popleft() for _ in range(n)]
        self.next_id = first + n
        return [Rollout(first + i, pl, rl, step) for i, (pl, rl) in enumerate(lengths)]

"""Rollouts (one prompt's response in flight) and the seeded stream they are drawn from."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlhfsim.scenario.checks import Setup


@dataclass(eq=False)
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


class RolloutStream:
    """Rollouts in arrival order, drawn lazily from the scenario's length distributions with the
    simulation's generator. GRPO groups share one prompt (and its length). An explicit list of
    (prompt_len, response_len) replaces sampling (used by validation to replay a real run's lengths)."""

    def __init__(self, setup: Setup, rng: np.random.Generator, fixed: list[tuple[int, int]] | None = None):
        self.setup = setup
        self.rng = rng
        self.group = setup.scenario.algorithm.group_size
        self.fixed = fixed
        self.next_id = 0
        self._buf: list[tuple[int, int]] = []

    def _refill(self, n_prompts: int) -> None:
        p = self.setup.prompt_sampler(self.rng, n_prompts)
        r = self.setup.response_sampler(self.rng, n_prompts * self.group)
        for i in range(n_prompts):
            for j in range(self.group):
                self._buf.append((int(p[i]), int(r[i * self.group + j])))

    def take(self, n: int, step: int) -> list[Rollout]:
        out = []
        for _ in range(n):
            if self.fixed is not None:
                if self.next_id >= len(self.fixed):
                    raise IndexError(f"the replayed rollout list has only {len(self.fixed)} entries")
                pl, rl = self.fixed[self.next_id]
            else:
                if not self._buf:
                    self._refill(max(64, self.setup.scenario.workload.prompts_per_step))
                pl, rl = self._buf.pop(0)
            out.append(Rollout(self.next_id, pl, rl, admitted_step=step))
            self.next_id += 1
        return out

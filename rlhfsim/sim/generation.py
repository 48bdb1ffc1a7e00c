"""Generation on the rollout pool: data-parallel replicas, each a SimPy process running either a static
batch (Hugging Face ``generate``/TRL: a batch is formed, prefilled, and decoded until its longest member
ends; finished rows keep decoding as padding) or continuous batching (vLLM/SGLang-like: a finished
sequence's slot is refilled at once, KV-cache capacity respected, recompute preemption on overflow).

No event per token: between two events (a completion, a chunk boundary for streaming, a per-step token
budget, a KV-capacity limit) the batch membership is fixed, so the replica advances in one timeout whose
length is the closed-form sum of its decode steps (``CostModel.decode_steps_s``). A global stop (OPPO's
"first B finished") interrupts every replica; the steps already done in the interrupted segment are
recovered by inverting the same sum (bisection).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import simpy

from rlhfsim.sim.rollouts import Rollout


@dataclass
class GenRequest:
    """What one step asks of generation."""

    step: int
    rollouts: list[Rollout]  # carried first, then new, in admission order
    stop_after: int | None = None  # stop all replicas once this many rollouts have finished
    token_budget: int | None = None  # max tokens a rollout may decode in this step (partial rollouts)
    stream: dict = field(default_factory=dict)  # role -> chunk tokens, for chunked scoring during decode


@dataclass
class GenResult:
    finished: list[Rollout]
    unfinished: list[Rollout]
    generated_tokens: int
    start_s: float
    end_s: float


class Generation:
    """Runs one step's generation over the replicas of the rollout pool."""

    def __init__(self, sim, req: GenRequest):
        self.sim = sim
        self.env: simpy.Environment = sim.env
        self.req = req
        s = sim.setup
        self.static = s.scenario.generation.engine == "static"
        self.max_batch = s.scenario.generation.max_batch
        self.n_rep = s.replicas
        self.tp = s.tp["rollout"]
        self.model = s.shapes["actor"]
        self.dtype = s.dtypes["actor"]
        self.kv_cap = max(s.kv_capacity_tokens, 1)
        self.overhead = s.scenario.generation.step_overhead_s
        self.pool = s.pool_of("rollout")
        self.finished: list[Rollout] = []
        self.generated = 0
        self.stopped = False
        self.procs: list[simpy.Process] = []
        self.unfinished: list[Rollout] = []
        self.step_tokens: dict[int, int] = {}
        if self.static:
            # Batches of max_batch in admission order, dealt round-robin to replicas.
            self.queues = [deque() for _ in range(self.n_rep)]
            rs = req.rollouts
            for j in range(0, len(rs), self.max_batch):
                self.queues[(j // self.max_batch) % self.n_rep].append(rs[j:j + self.max_batch])
        else:
            # Each data-parallel engine gets its share up front, dealt round-robin (verl and OpenRLHF
            # split the batch over their engines). One shared queue would let the first replicas take
            # max_batch rows each and leave the others idle whenever rollouts < replicas x max_batch.
            self.shared = [deque(req.rollouts[i::self.n_rep]) for i in range(self.n_rep)]

    def run(self):
        """Process: start the replicas, wait for all of them, return a GenResult."""
        start = self.env.now
        self.procs = [self.env.process(self._replica(i)) for i in range(self.n_rep)]
        yield simpy.AllOf(self.env, self.procs)
        if self.static:
            for q in self.queues:
                for batch in q:
                    self.unfinished.extend(batch)
        else:
            for q in self.shared:
                self.unfinished.extend(q)
        return GenResult(self.finished, self.unfinished, self.generated, start, self.env.now)

    # -- helpers -----------------------------------------------------------------------------------
    def _stop_all(self):
        if self.stopped:
            return
        self.stopped = True
        me = self.env.active_process
        for p in self.procs:
            if p is not me and p.is_alive:
                p.interrupt("stop")

    def _on_finish(self, r: Rollout):
        r.finished_at = self.env.now
        self.finished.append(r)
        for role in self.req.stream:
            self.sim.scorers[role].emit(self.req.step, r, final=True)
        if self.req.stop_after is not None and len(self.finished) >= self.req.stop_after:
            self._stop_all()

    def _decode_s(self, batch: int, kv0: float, n: int) -> float:
        t = self.sim.cost.decode_steps_s(self.model, self.dtype, batch, kv0, n, self.tp, self.overhead)
        if self.sim.corun(self.pool.name, "decode"):
            t *= self.sim.cost.decode_slowdown
        return t

    def _steps_done(self, batch: int, kv0: float, n: int, elapsed: float) -> int:
        """Largest k <= n whose k decode steps fit in ``elapsed`` seconds (interrupted segment)."""
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._decode_s(batch, kv0, mid) <= elapsed + 1e-12:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _prefill(self, rows: list[Rollout], pad_to: int | None):
        """Process: prefill rows whose KV is not resident (prompt plus any tokens generated earlier).
        Static: one call padded to ``pad_to`` tokens per row. Continuous: one call per admitted row.
        A fresh row's first response token comes from the prefill's logits (as in real engines), so a
        response of R tokens costs one prefill and R - 1 decode steps."""
        need = [r for r in rows if not r.kv_resident]
        if not need:
            return
        cost = self.sim.cost
        if pad_to is not None:
            t = cost.forward_s(self.model, self.dtype, pad_to * len(need), len(need), self.tp, op="prefill", head="lm")
        else:
            t = sum(cost.forward_s(self.model, self.dtype, r.prompt_len + r.generated, 1, self.tp, op="prefill", head="lm")
                    for r in need)
        # No interference factor: that applies to chunk (scoring) prefills meeting decode on the same pool
        # (docs/cost-model.md); this replica's own decode flag is always up here and must not count.
        yield self.env.timeout(t)
        fresh = [r for r in need if r.generated == 0]
        for r in need:
            r.kv_resident = True
        for r in self._advance(fresh, 1, self.req.stream):
            self._on_finish(r)

    def _advance(self, rows: list[Rollout], n: int, stream: dict) -> list[Rollout]:
        """Apply n decode steps to the unfinished rows; emit chunks; return rows that finished.
        (The hot loop of the simulator: once per row per event, so properties are inlined.)"""
        step = self.req.step
        budget = self.req.token_budget
        done = []
        added = 0
        for r in rows:
            g = r.generated
            if g >= r.response_len or r.paused:
                continue
            g += n
            r.generated = g
            r.step_budget_used += n
            tbs = r.tokens_by_step
            tbs[step] = tbs.get(step, 0) + n
            added += n
            finished = g >= r.response_len
            if stream and not finished:
                for role, c in stream.items():
                    if g % c == 0:
                        self.sim.scorers[role].emit(step, r, final=False)
            if finished:
                done.append(r)
            elif budget is not None and r.step_budget_used >= budget:
                r.paused = True
        self.generated += added
        return done

    def _retire(self, rows: list[Rollout]) -> list[Rollout]:
        """Drop finished rows and hand paused ones (budget spent) to the carry list; keep live rows.
        A static batch is retired whole, so nothing stays."""
        keep = []
        for r in rows:
            if r.generated >= r.response_len:
                continue
            if r.paused:
                self.unfinished.append(r)
            else:
                keep.append(r)
        return [] if self.static else keep

    def _next_event(self, live: list[Rollout], stream: dict, kv: float) -> int:
        """Decode steps until the next event of the live (unfinished, unpaused) rows: a completion,
        a spent token budget, a chunk boundary, or (continuous) a full KV cache."""
        n = min([r.response_len - r.generated for r in live])
        if self.req.token_budget is not None:
            n = min(n, min([self.req.token_budget - r.step_budget_used for r in live]))
        for c in stream.values():
            n = min(n, min([c - r.generated % c for r in live]))
        if not self.static:
            room = int((self.kv_cap - kv) // max(len(live), 1))
            n = min(n, max(room, 1))
        return max(n, 1)

    # -- the replica process -------------------------------------------------------------------------
    def _replica(self, idx: int):
        env, sim = self.env, self.sim
        gpu0 = idx * self.tp
        start = env.now
        rows: list[Rollout] = []
        ctx0 = 0  # static: padded context length at batch start
        steps_in_batch = 0
        sim.active[(self.pool.name, "decode")] += 1
        try:
            while not self.stopped:
                # Admission.
                admitted: list[Rollout] = []
                if self.static:
                    if not rows:
                        if not self.queues[idx]:
                            break
                        rows = list(self.queues[idx].popleft())
                        for r in rows:
                            r.paused, r.step_budget_used = False, 0
                        ctx0 = max(r.prompt_len + r.generated for r in rows)
                        # The prefill gives fresh rows their first token: the padded batch is then one
                        # position past ctx0 (as the continuous engine's prompt + generated counts it).
                        steps_in_batch = 1 if any(r.generated == 0 for r in rows) else 0
                        admitted = rows
                else:
                    rows = self._retire(rows)
                    # Count one token of room per row already in, as the preemption test below does;
                    # otherwise a preempted sequence is readmitted at once and preempted again (livelock).
                    kv = sum([r.prompt_len + r.generated for r in rows]) + len(rows)
                    queue = self.shared[idx]
                    while queue and len(rows) < self.max_batch:
                        r = queue[0]
                        need = r.prompt_len + r.generated + 1
                        if rows and kv + need > self.kv_cap:
                            break
                        queue.popleft()
                        r.paused, r.step_budget_used = False, 0
                        rows.append(r)
                        admitted.append(r)
                        kv += need
                    if not rows:
                        break
                if admitted:
                    try:
                        yield from self._prefill(admitted, ctx0 if self.static else None)
                    except simpy.Interrupt:
                        break
                live = []
                kv0 = 0  # continuous: the cached tokens of the live rows
                for r in rows:
                    if r.generated < r.response_len and not r.paused:
                        live.append(r)
                        kv0 += r.prompt_len + r.generated
                if not live:
                    rows = self._retire(rows)
                    continue
                batch = len(rows) if self.static else len(live)
                if self.static:
                    kv0 = batch * (ctx0 + steps_in_batch)
                if not self.static and kv0 + len(live) > self.kv_cap and len(live) > 1:
                    # Recompute preemption (vLLM): the newest sequence gives up its cache and requeues.
                    victim = live[-1]
                    victim.kv_resident = False
                    rows.remove(victim)
                    self.shared[idx].appendleft(victim)
                    continue
                n = self._next_event(live, self.req.stream, kv0)
                dur = self._decode_s(batch, kv0, n)
                t0 = env.now
                try:
                    yield env.timeout(dur)
                except simpy.Interrupt:
                    k = self._steps_done(batch, kv0, n, env.now - t0)
                    if k:
                        # Rows that finish exactly at the stop (k == n) are finished, not dropped.
                        for r in self._advance(rows, k, self.req.stream):
                            self._on_finish(r)
                    break
                steps_in_batch += n
                for r in self._advance(rows, n, self.req.stream):
                    self._on_finish(r)
                if self.static and all(r.done or r.paused for r in rows):
                    rows = self._retire(rows)  # the batch ends when its longest member ends
        finally:
            sim.active[(self.pool.name, "decode")] -= 1
            for r in rows:
                if not r.done:
                    self.unfinished.append(r)
            end = env.now
            if end > start:
                sim.rec.busy(self.req.step, self.pool.name, gpu0, self.tp, "rollout", "generate", start, end)

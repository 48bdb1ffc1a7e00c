"""Generation on the rollout pool: data-parallel replicas, each a SimPy process running either a static
batch (Hugging Face ``generate``/TRL: a batch is formed, prefilled, and decoded until its longest member
ends; finished rows keep decoding as padding) or continuous batching (vLLM/SGLang-like: a finished
sequence's slot is refilled at once, KV-cache capacity respected, recompute preemption on overflow).

No event per token: between two events (a completion, a chunk boundary for streaming, a per-step token
budget, a KV-capacity limit) the batch membership is fixed, so the replica advances in one timeout whose
length is the closed-form sum of its decode steps (``CostModel.decode_steps_s``). A global stop (OPPO's
"first B finished") interrupts every replica; the steps already done in the interrupted segment are
recovered by inverting the same sum (bisection).

Co-running (colocated OPPO intra-step): a decode segment runs at the speed in force when it starts,
``decode_slowdown`` x slower while a chunk prefill runs on one of its GPUs. When the chunk prefills on a
GPU start or stop (``Simulation.interference_changed``), every replica in a decode segment on that GPU
is interrupted with cause ``"rate"``: it books the whole steps done and the fraction of the step in progress (its
``credit``), and continues at the new speed. So the slowdown applies to exactly the time both run.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

import simpy

from rlhfsim.costs.model import decode_sum
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

    def _factor(self, gpus: range) -> float:
        """How much slower decode runs now: ``decode_slowdown`` while a chunk prefill shares its GPUs."""
        return self.sim.cost.decode_slowdown if self.sim.corun(self.pool.name, "decode", gpus) else 1.0

    def _decode_s(self, batch: int, kv0: float, n: int, factor: float = 1.0) -> float:
        return factor * self.sim.cost.decode_steps_s(self.model, self.dtype, batch, kv0, n, self.tp, self.overhead)

    def _steps_done(self, batch: int, kv0: float, n: int, elapsed: float, factor: float = 1.0) -> tuple[int, float]:
        """(k, frac): the largest k <= n whose k decode steps fit in ``elapsed`` seconds (an interrupted
        segment), and the fraction of step k + 1 done in the time left over (0 when k = n)."""
        coeffs = self.sim.cost.decode_coeffs(self.model, self.dtype, batch, kv0, self.tp, self.overhead)

        def t(k: int) -> float:   # == self._decode_s(batch, kv0, k, factor)
            return factor * decode_sum(coeffs, k)

        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if t(mid) <= elapsed + 1e-12:
                lo = mid
            else:
                hi = mid - 1
        if lo >= n:
            return lo, 0.0
        done = t(lo)
        step = t(lo + 1) - done
        return lo, min(max((elapsed - done) / step, 0.0), 1.0 - 1e-9) if step > 0 else 0.0

    def _prefill(self, rows: list[Rollout], pad_to: int | None):
        """Process: prefill rows whose KV is not resident (prompt plus any tokens generated earlier).
        Static: one call padded to ``pad_to`` tokens per row. Continuous: one call per admitted row.
        Returns the fresh rows (nothing generated yet): the caller gives each its first response token
        from the prefill's logits (as real engines do), so a response of R tokens costs one prefill and
        R - 1 decode steps."""
        need = [r for r in rows if not r.kv_resident]
        if not need:
            return []
        cost = self.sim.cost
        if pad_to is not None:
            t = cost.forward_s(self.model, self.dtype, pad_to * len(need), len(need), self.tp, op="prefill", head="lm")
        else:
            t = sum(cost.forward_s(self.model, self.dtype, r.prompt_len + r.generated, 1, self.tp, op="prefill", head="lm")
                    for r in need)
        # No interference factor: that applies to chunk (scoring) prefills meeting decode on the same pool
        # (docs/cost-model.md); this replica's own decode flag is always up here and must not count.
        yield self.env.timeout(t)
        for r in need:
            r.kv_resident = True
        return [r for r in need if r.generated == 0]

    # -- the event clock -----------------------------------------------------------------------------
    # A replica counts its decode steps in T. A live row's generated tokens are T - r.clock_offset, so
    # advancing the batch by n steps touches no row: only rows with an event at the new T (completion,
    # chunk boundary, spent budget) are popped from a heap and brought up to date. O(log batch) per
    # event instead of O(batch).
    def _sync(self, r: Rollout, T: int) -> None:
        """Bring a live row's counters up to replica step T."""
        g = T - r.clock_offset
        d = g - r.generated
        if d:
            r.generated = g
            r.step_budget_used += d
            tbs = r.tokens_by_step
            tbs[self.req.step] = tbs.get(self.req.step, 0) + d

    def _push(self, heap: list, r: Rollout, T: int) -> None:
        """Schedule a live row's next event after step T."""
        off = r.clock_offset
        ev = off + r.response_len
        g = T - off
        for c in self.req.stream.values():
            b = off + (g // c + 1) * c
            if b < ev:
                ev = b
        if r.budget_at < ev:
            ev = r.budget_at
        r.heap_version += 1
        heapq.heappush(heap, (ev, r.id, r.heap_version, r))

    def _activate(self, heap: list, r: Rollout, T: int) -> bool:
        """Start the clock of a row joining the live batch at step T. Returns False if the row has
        nothing to decode in this step (it finished on its first token, or its budget is spent)."""
        r.clock_offset = T - r.generated
        budget = self.req.token_budget
        r.budget_at = T + (budget - r.step_budget_used) if budget is not None else 1 << 62
        if r.generated >= r.response_len or r.budget_at <= T:
            return False
        self._push(heap, r, T)
        return True

    def _first_token(self, r: Rollout) -> None:
        """The token a fresh row gets from its prefill."""
        step = self.req.step
        r.generated += 1
        r.step_budget_used += 1
        r.tokens_by_step[step] = r.tokens_by_step.get(step, 0) + 1
        self.generated += 1
        if r.generated < r.response_len:
            for role, c in self.req.stream.items():
                if r.generated % c == 0:
                    self.sim.scorers[role].emit(step, r, final=False)

    def _events(self, heap: list, T: int) -> list[tuple[Rollout, str]]:
        """Pop every row whose event is at or before T; emit chunks; returns (row, "done"|"paused")
        for rows that leave the live batch."""
        out = []
        step = self.req.step
        stream = self.req.stream
        while heap and heap[0][0] <= T:
            _, _, ver, r = heapq.heappop(heap)
            if ver != r.heap_version:
                continue  # stale: the row left the batch (preempted) after this was pushed
            self._sync(r, T)
            if r.generated >= r.response_len:
                out.append((r, "done"))
            elif T >= r.budget_at:
                r.paused = True
                out.append((r, "paused"))
            else:
                for role, c in stream.items():
                    if r.generated % c == 0:
                        self.sim.scorers[role].emit(step, r, final=False)
                self._push(heap, r, T)
        return out

    # -- the replica process -------------------------------------------------------------------------
    def _replica(self, idx: int):
        env, sim = self.env, self.sim
        gpu0 = idx * self.tp
        start = env.now
        T = 0  # decode steps this replica has run in this step
        heap: list = []
        live: dict[int, Rollout] = {}  # admission order (continuous preempts the newest)
        rows: list[Rollout] = []  # static: the whole batch, finished rows included (they pad)
        kv_live = 0  # continuous: cached tokens of the live rows at step T
        ctx0 = 0  # static: padded context length at batch start
        steps_in_batch = 0
        credit = 0.0  # fraction of the next decode step already done (a segment cut by a rate change)
        me = env.active_process
        gpus = range(gpu0, gpu0 + self.tp)
        sim.set_active(self.pool.name, "decode", gpus, +1)
        try:
            while not self.stopped:
                # Admission.
                admitted: list[Rollout] = []
                if self.static:
                    if not live:
                        for r in rows:  # the batch ends when its longest member ends
                            if r.paused and r.generated < r.response_len:
                                self.unfinished.append(r)
                        rows = []
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
                    queue = self.shared[idx]
                    # Count one token of room per row already in, as the preemption test below does;
                    # otherwise a preempted sequence is readmitted at once and preempted again (livelock).
                    kv = kv_live + len(live)
                    while queue and len(live) + len(admitted) < self.max_batch:
                        r = queue[0]
                        need = r.prompt_len + r.generated + 1
                        if (live or admitted) and kv + need > self.kv_cap:
                            break
                        queue.popleft()
                        r.paused, r.step_budget_used = False, 0
                        admitted.append(r)
                        kv += need
                    if not live and not admitted:
                        break
                if admitted:
                    if not self.static:
                        rows = admitted  # held here so that a stop during the prefill carries them
                    try:
                        fresh = yield from self._prefill(admitted, ctx0 if self.static else None)
                    except simpy.Interrupt:
                        break
                    for r in fresh:
                        self._first_token(r)
                    for r in admitted:
                        if self._activate(heap, r, T):
                            live[r.id] = r
                            kv_live += r.prompt_len + r.generated
                        elif r.generated >= r.response_len:
                            self._on_finish(r)
                        else:
                            r.paused = True
                            if not self.static:
                                self.unfinished.append(r)
                    if not self.static:
                        rows = []
                    if self.stopped:
                        break
                if not live:
                    continue
                n_live = len(live)
                if self.static:
                    batch = len(rows)
                    kv0 = batch * (ctx0 + steps_in_batch)
                else:
                    batch = n_live
                    kv0 = kv_live
                    if kv0 + n_live > self.kv_cap and n_live > 1:
                        # Recompute preemption (vLLM): the newest sequence gives up its cache and requeues.
                        victim = live.pop(next(reversed(live)))
                        self._sync(victim, T)
                        victim.heap_version += 1  # its heap entry is stale now
                        kv_live -= victim.prompt_len + victim.generated
                        victim.kv_resident = False
                        self.shared[idx].appendleft(victim)
                        continue
                n = heap[0][0] - T
                if not self.static:
                    room = int((self.kv_cap - kv0) // n_live)
                    n = min(n, max(room, 1))
                factor = self._factor(gpus)
                head = credit * self._decode_s(batch, kv0, 1, factor)  # time already spent on step 1
                dur = self._decode_s(batch, kv0, n, factor) - head
                credit = 0.0
                t0 = env.now
                sim.decoding[self.pool.name][me] = gpus
                try:
                    yield env.timeout(dur)
                except simpy.Interrupt as why:
                    n, credit = self._steps_done(batch, kv0, n, env.now - t0 + head, factor)
                    if why.cause != "rate":
                        credit = 0.0
                        if not n:
                            break
                finally:
                    sim.decoding[self.pool.name].pop(me, None)
                T += n
                steps_in_batch += n
                self.generated += n * n_live
                kv_live += n * n_live
                for r, what in self._events(heap, T):
                    del live[r.id]
                    if not self.static:
                        kv_live -= r.prompt_len + r.generated
                    if what == "done":
                        # Rows that finish exactly at a stop (the interrupted segment) count as finished.
                        self._on_finish(r)
                    elif not self.static:
                        self.unfinished.append(r)
        finally:
            sim.set_active(self.pool.name, "decode", gpus, -1)
            for r in live.values():
                self._sync(r, T)
                r.heap_version += 1
            carried = rows if self.static else list(live.values()) + rows
            for r in carried:
                if r.generated < r.response_len:
                    self.unfinished.append(r)
            end = env.now
            if end > start:
                sim.rec.busy(self.req.step, self.pool.name, gpu0, self.tp, "rollout", "generate", start, end)

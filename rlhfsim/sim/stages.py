"""The stages of a step after (or beside) generation, as SimPy processes on their pools.

Forward passes (reward scoring, reference log-probs, critic values) run data-parallel over the replicas
of their pool (pool GPUs / TP), in padded micro-batches of ``generation.max_batch`` sequences (Hugging
Face style: every sequence padded to the longest in its micro-batch). Training runs ``ppo_epochs`` passes
of minibatches of ``minibatch_size`` sequences (a seeded shuffle per epoch) dealt round-robin over the
data-parallel ranks, each rank padding to its own longest row; a minibatch takes the slowest rank's
forward+backward plus a gradient all-reduce and an AdamW step. The chunk scorer serves OPPO's intra-step
overlap: each streamed chunk is prefilled on top of that sequence's cached prefix.

Every interval records its active (kernel) seconds beside its span: the cost model's roofline part
without host overheads (``CostModel.*_parts``). A data-parallel rank that finishes its rows first waits
inside the gradient all-reduce, whose (NCCL) kernel is already running: active, as nvidia-smi counts it.
"""

from __future__ import annotations

import math

import simpy

from rlhfsim.models.catalog import DTYPE_BYTES
from rlhfsim.sim.rollouts import Rollout

ROLE_PHASE = {"reward": "reward", "reference": "reference", "critic": "critic_fwd"}


def _replicas(sim, role: str) -> tuple[int, int]:
    pool = sim.setup.pool_of(role)
    tp = sim.setup.tp[role]
    return max(pool.gpus // tp, 1), tp


def _kernel_share(span_s: float, parts: tuple[float, float]) -> float:
    """Active seconds of an interval of ``span_s`` priced as ``parts`` = (total_s, active_s): the same
    kernel share of the span (a slowdown stretches kernels and host time alike)."""
    total, active = parts
    return span_s * active / total if total > 0 else 0.0


def _padded_microbatches(rows: list[Rollout], mb: int):
    for i in range(0, len(rows), mb):
        part = rows[i:i + mb]
        yield len(part), max(r.prompt_len + r.response_len for r in part)


def forward_pass(env, sim, step: int, role: str, rows: list[Rollout]):
    """Process: one forward pass of ``role`` over every row (prompt + response), padded micro-batches,
    rows dealt round-robin over the pool's replicas; each replica records its busy interval."""
    if not rows:
        return
    s = sim.setup
    n_rep, tp = _replicas(sim, role)
    pool = s.pool_of(role)
    mb = s.scenario.generation.max_batch
    model, dtype = s.shapes[role], s.dtypes[role]
    with sim.locks[pool.name].request() as req:
        yield req
        start = env.now
        durs = []
        for k in range(n_rep):
            mine = rows[k::n_rep]
            t = active = 0.0
            for n, length in _padded_microbatches(mine, mb):
                total, kernel = sim.cost.forward_parts(model, dtype, n * length, n, tp, op="prefill",
                                                       runtime=sim.forward_runtime(role), head=s.head(role),
                                                       all_logits=True)
                t += total
                active += kernel
            durs.append(t)
            if t > 0:
                sim.rec.busy(step, pool.name, k * tp, tp, role, ROLE_PHASE[role], start, start + t, active_s=active)
        yield env.timeout(max(durs))


def rule_reward(env, sim, step: int, rows: list[Rollout]):
    """Process: a rule-based checker on CPU workers (no GPU); recorded on the pseudo-pool ``cpu``."""
    rule = sim.setup.rule_reward
    t = math.ceil(len(rows) / rule.workers) * rule.cpu_s_per_sample
    start = env.now
    yield env.timeout(t)
    if t > 0:  # no GPU work: the pseudo-pool is never counted in GPU utilization
        sim.rec.busy(step, "cpu", 0, 1, "reward", "reward", start, env.now, active_s=0.0)


def train(env, sim, step: int, role: str, rows: list[Rollout]):
    """Process: ``ppo_epochs`` x minibatches of forward+backward, all-reduce and optimizer step.

    A minibatch's rows are dealt round-robin over the ``dp`` ranks in the shuffled order (as a
    DistributedSampler deals them); rank k runs its rows padded to its own longest (prompt + response):
    t_k = train_s(n_k x L_k, n_k). The minibatch takes max_k t_k + optimizer_s (the all-reduce waits for
    the slowest rank). Active: the slowest rank's kernel time plus the optimizer's; every rank shares it,
    since a faster rank waits inside the all-reduce kernel and the host overhead is the same per call."""
    s = sim.setup
    alg = s.scenario.algorithm
    pool = s.pool_of(role)
    tp = s.tp[role]
    dp = max(pool.gpus // tp, 1)
    model, dtype, head = s.shapes[role], s.dtypes[role], s.head(role)
    phase = "actor_train" if role == "actor" else "critic_train"
    with sim.locks[pool.name].request() as req:
        yield req
        start = env.now
        t = active = 0.0
        opt, opt_active = sim.cost.optimizer_parts(model, dtype, tp, dp, head, pool.spans_nodes)
        for _ in range(alg.ppo_epochs):
            # PPO trainers shuffle the batch each epoch; padding per rank depends on who lands together.
            order = [rows[j] for j in sim.shuffle_rng.permutation(len(rows))]
            for i in range(0, len(order), alg.minibatch_size):
                part = order[i:i + alg.minibatch_size]
                slowest = (0.0, 0.0)
                for k in range(min(dp, len(part))):
                    mine = part[k::dp]
                    length = max(r.prompt_len + r.response_len for r in mine)
                    slowest = max(slowest, sim.cost.train_parts(model, dtype, len(mine) * length, len(mine), tp, head))
                t += slowest[0] + opt
                active += slowest[1] + opt_active
        yield env.timeout(t)
        if t > 0:
            sim.rec.busy(step, pool.name, 0, pool.gpus, role, phase, start, env.now, active_s=active)


def weight_sync(env, sim, step: int):
    """Process: the trained actor's weights reach the generation engine: a copy through device memory
    when it shares the actor's pool (read + write), a broadcast over the interconnect when separate."""
    s = sim.setup
    a, r = s.pool_of("actor"), s.pool_of("rollout")
    model, dtype = s.shapes["actor"], s.dtypes["actor"]
    nbytes = model.params("lm") * DTYPE_BYTES[dtype] / s.tp["rollout"]
    if a is r:
        t = 2 * nbytes / (s.gpu.mem_bw * sim.cost.ops["prefill"].memory_eff)
    else:
        t = sim.cost.weight_sync_s(model, dtype, s.tp["rollout"], a.spans_nodes or r.spans_nodes)
    with sim.locks[r.name].request() as req:
        yield req
        start = env.now
        yield env.timeout(t)
        # A device-memory copy or a link transfer: the device works throughout.
        sim.rec.busy(step, r.name, 0, r.gpus, "rollout", "weight_sync", start, env.now, active_s=t)


class ChunkScorer:
    """OPPO intra-step overlap for one role (reward, or reference/critic when streamed): chunks queued by
    the decode loop are prefilled on top of each sequence's cached prefix, first in, first out. Each replica
    of the role's pool takes up to ``intra.max_chunk_batch`` queued chunks as one batched chunk prefill
    (default 1: one call per chunk, as the real executor does). The first chunk of a sequence includes
    its prompt."""

    def __init__(self, sim, role: str):
        self.sim = sim
        self.env: simpy.Environment = sim.env
        self.role = role
        self.queue: list = []
        self.wakeup = self.env.event()
        self.outstanding = 0
        self.drained = self.env.event()
        self.chunks = 0
        self.tokens = 0
        n_rep, self.tp = _replicas(sim, role)
        self.pool = sim.setup.pool_of(role)
        for k in range(n_rep):
            self.env.process(self._serve(k))

    def emit(self, step: int, r: Rollout, final: bool) -> None:
        done = r.scored.get(self.role, 0)
        new = r.generated - done
        if new <= 0:
            return
        first = done == 0
        tokens = new + (r.prompt_len if first else 0)
        prefix = 0 if first else r.prompt_len + done
        r.scored[self.role] = r.generated
        self.queue.append((step, tokens, prefix))
        self.outstanding += 1
        if self.drained.triggered:
            self.drained = self.env.event()
        if not self.wakeup.triggered:
            self.wakeup.succeed()

    def wait_drained(self):
        """An event that fires when every chunk emitted so far has been prefilled."""
        if self.outstanding == 0:
            ev = self.env.event()
            ev.succeed()
            return ev
        return self.drained

    def _serve(self, k: int):
        env, sim = self.env, self.sim
        s = sim.setup
        model, dtype = s.shapes[self.role], s.dtypes[self.role]
        mb = s.scenario.schedule.intra.max_chunk_batch
        gpus = range(k * self.tp, (k + 1) * self.tp)
        serving = False  # counted in sim.active from the start of a busy period to its end
        while True:
            if not self.queue and serving:
                # A busy period ends (back-to-back calls are one period: decode is re-timed only when
                # the co-running state of these GPUs really changes, not twice per chunk).
                serving = False
                sim.set_active(self.pool.name, "prefill", gpus, -1)
            while not self.queue:
                if self.wakeup.triggered:
                    self.wakeup = env.event()
                yield self.wakeup
            jobs, self.queue = self.queue[:mb], self.queue[mb:]
            step = jobs[0][0]
            tokens = sum(j[1] for j in jobs)
            prefix = sum(j[2] for j in jobs)
            t = sim.cost.chunk_prefill_s(model, dtype, tokens, len(jobs), prefix, self.tp, s.head(self.role))
            if sim.corun(self.pool.name, "prefill", gpus):
                t *= sim.cost.prefill_slowdown
            if not serving:
                serving = True
                sim.set_active(self.pool.name, "prefill", gpus, +1)
            start = env.now
            yield env.timeout(t)
            sim.rec.busy(step, self.pool.name, k * self.tp, self.tp, self.role, ROLE_PHASE[self.role], start, env.now,
                         active_s=_kernel_share(env.now - start, sim.cost.chunk_prefill_parts(
                             model, dtype, tokens, len(jobs), prefix, self.tp, s.head(self.role))))
            self.chunks += len(jobs)
            self.tokens += tokens
            self.outstanding -= len(jobs)
            if self.outstanding == 0 and not self.drained.triggered:
                self.drained.succeed()

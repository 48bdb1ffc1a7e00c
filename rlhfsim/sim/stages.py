"""The stages of a step after (or beside) generation, as SimPy processes on their pools.

Forward passes (reward scoring, reference log-probs, critic values) run data-parallel over the replicas
of their pool (pool GPUs / TP), in padded micro-batches of ``generation.max_batch`` sequences (Hugging
Face style: every sequence padded to the longest in its micro-batch). Training runs ``ppo_epochs`` passes
of minibatches of ``minibatch_size`` sequences (a seeded shuffle per epoch) dealt round-robin over the
data-parallel ranks, each rank padding to its own longest row; a minibatch takes the slowest rank's
forward+backward plus a gradient all-reduce and an AdamW step. The chunk scorer serves OPPO's intra-step
overlap: each streamed chunk is prefilled on top of that sequence's cached prefix.

The scenario's ``execution`` block changes how passes are cut and what they move (``rlhfsim.sim.execution``,
``rlhfsim.sim.microbatch``): verl's micro-batches, packing, checkpointing, offload, Ulysses groups, the
actor's old-log-prob pass, advantages and the resharding weight update.

Every interval records its active (kernel) seconds beside its span: the cost model's roofline part
without host overheads (``CostModel.*_parts``). A data-parallel rank that finishes its rows first waits
inside the gradient all-reduce, whose (NCCL) kernel is already running: active, as nvidia-smi counts it.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np
import simpy

from rlhfsim.contracts import CPU_POOL
from rlhfsim.costs import parallel, price
from rlhfsim.costs.driver import AdvantageCode
from rlhfsim.costs.genruntimes import SHARES_TRAINING_WEIGHTS
from rlhfsim.costs.hostswap import host_swap_s
from rlhfsim.costs.terms import (ADVANTAGE, FRAMEWORK_PIECE, HOST_SWAP, OFFLOAD, OPTIMIZER, PIPELINE_BUBBLE, POOL_WEIGHT_TRANSFER, RETOKENIZE,
                                 RULE_REWARD, WEIGHT_SYNC, add_terms)
from rlhfsim.scenario.checks import pools_span_nodes
from rlhfsim.sim import execution as ex
from rlhfsim.sim import microbatch as mb
from rlhfsim.sim.balance import balanced_ranks
from rlhfsim.sim.engines.clock import wait_until
from rlhfsim.sim.rollouts import Rollout, truncated
from rlhfsim.sim.streaming import STREAMING

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


def _row_tokens(rows: list[Rollout]) -> np.ndarray:
    """Each row's prompt + response tokens, as int64 (read once; padding is then computed on arrays)."""
    return np.fromiter([r.prompt_len + r.response_len for r in rows], dtype=np.int64, count=len(rows))


def _padded_microbatches(tokens: np.ndarray, mb: int) -> list[tuple[int, int]]:
    """(rows, longest row's tokens) of each micro-batch of ``mb`` consecutive rows."""
    if not len(tokens):
        return []
    starts = np.arange(0, len(tokens), mb)
    sizes = np.minimum(len(tokens) - starts, mb)
    return list(zip(sizes.tolist(), np.maximum.reduceat(tokens, starts).tolist()))


def _rank_longest(tokens: np.ndarray, mb: int, dp: int) -> tuple[list[list[int]], list[list[int]]]:
    """For each minibatch of ``mb`` consecutive rows dealt round-robin over ``dp`` ranks (rank k takes
    rows k, k + dp, ...): the rows each rank gets and its longest row's tokens, ranks without rows left
    out. Computed on a zero-padded (minibatches x rows-per-rank x dp) array (lengths are positive)."""
    n = len(tokens)
    n_mb = -(-n // mb)
    per_rank = -(-mb // dp)
    grid = np.zeros((n_mb, per_rank * dp), dtype=np.int64)
    grid[:, :mb] = np.concatenate([tokens, np.zeros(n_mb * mb - n, dtype=np.int64)]).reshape(n_mb, mb)
    longest = grid.reshape(n_mb, per_rank, dp).max(axis=1).tolist()
    counts, lengths = [], []
    for m in range(n_mb):
        size = min(mb, n - m * mb)
        ranks = min(dp, size)
        counts.append([(size - k + dp - 1) // dp for k in range(ranks)])
        lengths.append(longest[m][:ranks])
    return counts, lengths


def forward_pass(env, sim, step: int, role: str, rows: list[Rollout], phase: str | None = None):
    """Process: one forward pass of ``role`` over every row (prompt + response), rows dealt round-robin
    over the pool's replicas, each replica's rows cut into calls (``rlhfsim.sim.microbatch``: pieces of
    ``generation.max_batch`` rows, padded, unless ``execution.micro_batch`` says otherwise), each call
    paying the framework's host time per piece (``microbatch_forward_s``); each replica records its busy
    interval. ``phase``: the phase recorded (default: the role's; ``old_log_prob``
    for the actor's recompute pass). Offloaded parameters cross the host link (``execution.offload_s``)."""
    if not rows:
        return
    s = sim.setup
    if role == "reward" and s.reward_max_tokens is not None:  # the framework truncates to the encoder's positions
        rows = truncated(rows, s.reward_max_tokens)
    tp, _, sp, n_rep, lay = ex.data_ranks(s, role)   # lay: Megatron's pp, cp, ep (None: none; rlhfsim.costs.parallel)
    # a Ulysses group of sp x TP GPUs per replica, or a pipeline of tp x pp x cp GPUs; token budgets cover a cp group
    width = tp * sp if lay is None else tp * lay.pp * lay.cp
    pool = s.pool_of(role)
    size, budget, packed = ex.forward_cuts(s, sp if lay is None else lay.cp, role)
    pad_len = None if packed else ex.pad_length(s)
    model = s.shapes[role]
    per_call_s = price.piece_s(sim.cost, False)   # every call is a framework's piece
    phase = phase or ROLE_PHASE[role]
    runtime = sim.forward_runtime(role)
    fsdp_n = ex.fsdp_shards(s, role)
    with sim.locks[pool.name].request() as req:
        yield req
        start = env.now
        durs = []
        tokens = _row_tokens(rows) if budget is None and not packed else None
        if tokens is not None and pad_len is not None:
            tokens = np.full(len(rows), pad_len, dtype=np.int64)
        # verl's balance_batch: each replica an equal share of the tokens (rlhfsim.sim.balance); else rows round-robin
        shares = balanced_ranks(_row_tokens(rows), n_rep) if ex.balanced(s) and n_rep > 1 else None
        terms = sim.rec.terms is not None   # rlhfsim explain: the slowest replica's seconds by cost term
        worst: tuple[float, dict] = (-1.0, {})
        for k in range(n_rep):
            mine = rows[k::n_rep] if shares is None else [rows[j] for j in shares[k].tolist()]
            t = active = 0.0
            mine_terms: dict[str, float] = {}
            if tokens is None:
                calls = mb.pieces(mine, size, budget, packed, model.arch == "encoder", pad_len)
            else:  # padded pieces of ``size`` rows, on arrays (issue 12): the same pieces as mb.pieces
                calls = [mb.Piece(n, n * length) for n, length in _padded_microbatches(
                    tokens[k::n_rep] if shares is None else tokens[shares[k]], size)]
            for p in calls:
                # a framework call (rlhfsim.costs.framework): the roofline, the log-prob head, FSDP's
                # gathers and, on a GPU, the host's dispatch where the call is launch-bound
                call = price.forward_call(sim.cost, s, role, p.tokens, p.rows, runtime=runtime, tp=tp,
                                          attn_pairs=p.attn_pairs, sp=sp, fsdp_n=fsdp_n, inter_node=pool.spans_nodes,
                                          layout=lay)
                t += call.total_s + per_call_s
                active += call.active_s
                if terms:
                    add_terms(mine_terms, call.terms())
                    add_terms(mine_terms, {FRAMEWORK_PIECE: per_call_s})
            if lay is not None and lay.pp > 1 and calls:   # the pipeline's fill and drain of forwards: idle
                bubble = parallel.bubble_s(t, len(calls), lay.pp, lay.vpp)
                t += bubble
                if terms:
                    add_terms(mine_terms, {PIPELINE_BUBBLE: bubble})
            if mine:
                off = ex.offload_s(sim, role, "forward", len(calls))
                t += off
                if terms:
                    add_terms(mine_terms, {OFFLOAD: off})
            if terms and t > worst[0]:
                worst = (t, mine_terms)
            durs.append(t)
            if t > 0:
                sim.rec.busy(step, pool.name, k * width, width, role, phase, start, start + t, active_s=active)
        if terms:
            sim.rec.add_terms(step, phase, worst[1])
        yield env.timeout(max(durs))


def advantage(env, sim, step: int, rows: list[Rollout]):
    """Process: advantage computation on the driver's CPU (``CostModel.advantage_s``; GAE when a critic
    gives values) over every row padded to the response cap, as verl holds them, recorded as phase ``adv`` on
    the pseudo-pool ``cpu`` (no GPU works meanwhile)."""
    if not rows:
        return
    sc = sim.setup.scenario
    code = AdvantageCode(sc.execution.advantage.gae_loop, sc.execution.advantage.rollout_metrics)
    t = sim.cost.advantage_s(len(rows), sc.workload.max_response_tokens, "critic" in sim.setup.shapes, code)
    start = env.now
    yield env.timeout(t)
    if t > 0:
        sim.rec.busy(step, CPU_POOL, 0, 1, "actor", "adv", start, env.now, active_s=0.0)
        if sim.rec.terms is not None:
            sim.rec.add_terms(step, "adv", {ADVANTAGE: t})


def retokenize(env, sim, step: int, rows: list[Rollout]):
    """Process: the reward model reads another tokenizer than the actor's, so the driver decodes every
    row's prompt + response ids to text and tokenizes the texts for the reward model, in one call over the
    batch before the scoring pass (TRL's ``reward_processing_classes``): ``CostModel.retokenize_s(1,
    tokens)``, host CPU work recorded as phase ``retokenize`` on the pseudo-pool ``cpu``. The text keeps
    the actor's token count (docs/cost-model.md), so the scoring pass that follows is priced as before."""
    if not rows:
        return
    t = sim.cost.retokenize_s(1, sum(r.prompt_len + r.response_len for r in rows))
    start = env.now
    yield env.timeout(t)
    if t > 0:
        sim.rec.busy(step, CPU_POOL, 0, 1, "reward", "retokenize", start, env.now, active_s=0.0)
        if sim.rec.terms is not None:
            sim.rec.add_terms(step, "retokenize", {RETOKENIZE: t})


def rule_reward(env, sim, step: int, rows: list[Rollout]):
    """Process: a rule-based checker on CPU workers (no GPU); recorded on the pseudo-pool ``cpu``."""
    rule = sim.setup.rule_reward
    t = sim.cost.rule_reward_s(len(rows), rule.cpu_s_per_sample, rule.workers)
    start = env.now
    yield env.timeout(t)
    if t > 0:  # no GPU work: the pseudo-pool is never counted in GPU utilization
        sim.rec.busy(step, CPU_POOL, 0, 1, "reward", "reward", start, env.now, active_s=0.0)
        if sim.rec.terms is not None:
            sim.rec.add_terms(step, "reward", {RULE_REWARD: t})


def train(env, sim, step: int, role: str, rows: list[Rollout]):
    """Process: ``ppo_epochs`` x minibatches of forward+backward, all-reduce and optimizer step.

    A minibatch's rows are dealt round-robin over the ``dp`` ranks in the shuffled order (as a
    DistributedSampler deals them); rank k runs its rows padded to its own longest (prompt + response):
    t_k = train_s(n_k x L_k, n_k). The minibatch takes max_k t_k + optimizer_s (the all-reduce waits for
    the slowest rank). Active: the slowest rank's kernel time plus the optimizer's; every rank shares it,
    since a faster rank waits inside the all-reduce kernel and the host overhead is the same per call.

    Every call pays the framework's host time per piece beyond the fitted ``train`` call
    (``microbatch_train_s``: log-probs through a log-softmax and a gather, the PPO loss, where the fit's
    call is Hugging Face's ``labels=`` loss; 0 in profiles that did not measure it). With
    ``execution.micro_batch`` a rank's rows run as several calls (``rlhfsim.sim.microbatch``) with
    gradient accumulation: t_k = sum over its pieces of (train_s(piece) + microbatch_train_s); with
    ``gradient_checkpointing`` each piece's train_s is x (1 + checkpoint_extra_frac). Offload adds its
    host-link traffic once per phase (``execution.offload_s``); a Ulysses group of sp GPUs is one rank."""
    s = sim.setup
    alg = s.scenario.algorithm
    pool = s.pool_of(role)
    # ranks: data-parallel ranks that take different rows (a Ulysses group shares them; a Megatron pipeline of pp
    # stages and its cp group is one rank, its token budgets cover the cp group)
    tp, dp, sp, ranks, lay = ex.data_ranks(s, role)
    phase = "actor_train" if role == "actor" else "critic_train"
    size, budget, packed = ex.train_cuts(s, sp if lay is None else lay.cp, role)
    pad_len = None if packed else ex.pad_length(s)
    per_call_s = price.piece_s(sim.cost, True)   # every call is a framework's piece
    ckpt_frac = sim.cost.step_scalar("checkpoint_extra_frac")
    fsdp_n = ex.fsdp_shards(s, role)
    with sim.locks[pool.name].request() as req:
        yield req
        start = env.now
        t = active = 0.0
        # under FSDP every call reduce-scatters its gradients (framework_call): the optimizer step has no all-reduce
        opt, opt_active = price.optimizer_step(sim.cost, s, role, tp, dp, pool.spans_nodes, fsdp_n, lay)
        tokens = _row_tokens(rows) if size is None and budget is None and not packed else None
        if tokens is not None and pad_len is not None:
            tokens = np.full(len(rows), pad_len, dtype=np.int64)

        def balanced_minibatches():
            """verl's balance_batch: rank k holds its balanced share in verl's order (rlhfsim.sim.balance) and takes
            the m-th slice of it in minibatch m (verl splits each rank's share; no shuffle)."""
            shares = balanced_ranks(_row_tokens(rows), ranks)
            per = -(-alg.minibatch_size // ranks)
            for i in range(0, max(len(sh) for sh in shares), per):
                idx = [sh[i:i + per] for sh in shares if len(sh) > i]
                if tokens is not None:
                    yield [[(len(j) * int(tokens[j].max()), len(j), None)] for j in idx]
                else:
                    yield [[(p.tokens, p.rows, p.attn_pairs) for p in mb.pieces([rows[x] for x in j.tolist()], size,
                                                                               budget, packed, pad_len=pad_len)]
                           for j in idx]

        def minibatches(perm):
            """Each minibatch as its ranks' pieces, (tokens, rows, attention pairs) per call."""
            if ex.balanced(s) and ranks > 1:
                yield from balanced_minibatches()
                return
            if tokens is not None:  # one padded call per rank, on arrays (issue 12): as mb.pieces would cut
                for counts, lengths in zip(*_rank_longest(tokens[perm], alg.minibatch_size, ranks)):
                    yield [[(n * length, n, None)] for n, length in zip(counts, lengths)]
                return
            for i in range(0, len(rows), alg.minibatch_size):
                part = [rows[j] for j in perm[i:i + alg.minibatch_size]]
                yield [[(p.tokens, p.rows, p.attn_pairs) for p in mb.pieces(part[k::ranks], size, budget, packed,
                                                                           pad_len=pad_len)]
                       for k in range(min(ranks, len(part)))]

        terms = sim.rec.terms is not None   # rlhfsim explain: the slowest rank's seconds by cost term
        phase_terms: dict[str, float] = {}
        for _ in range(alg.ppo_epochs):
            # PPO trainers shuffle the batch each epoch; padding per rank depends on who lands together.
            for per_rank in minibatches(sim.shuffle_rng.permutation(len(rows))):
                slowest = (0.0, 0.0)
                slowest_terms: dict[str, float] = {}
                for pieces in per_rank:
                    rank = (0.0, 0.0)
                    rank_terms: dict[str, float] = {}
                    for n_tokens, n_rows, pairs in pieces:
                        call = price.train_call(sim.cost, s, role, n_tokens, n_rows, tp=tp, attn_pairs=pairs, sp=sp,
                                                fsdp_n=fsdp_n, inter_node=pool.spans_nodes, ckpt_frac=ckpt_frac,
                                                layout=lay)
                        rank = (rank[0] + call.total_s + per_call_s, rank[1] + call.active_s)  # 0.0 + x == x: one call, as before
                        if terms:
                            add_terms(rank_terms, call.terms())
                            add_terms(rank_terms, {FRAMEWORK_PIECE: per_call_s})
                    if lay is not None and lay.pp > 1:   # 1F1B's fill and drain: idle, not device work
                        bubble = parallel.bubble_s(rank[0], len(pieces), lay.pp, lay.vpp)
                        rank = (rank[0] + bubble, rank[1])
                        if terms:
                            add_terms(rank_terms, {PIPELINE_BUBBLE: bubble})
                    if rank > slowest:
                        slowest, slowest_terms = rank, rank_terms
                t += slowest[0] + opt
                active += slowest[1] + opt_active
                if terms:
                    add_terms(phase_terms, slowest_terms)
                    add_terms(phase_terms, {OPTIMIZER: opt})
        off = ex.offload_s(sim, role, "train")
        t += off
        yield env.timeout(t)
        if t > 0:
            sim.rec.busy(step, pool.name, 0, pool.gpus, role, phase, start, env.now, active_s=active)
            if terms:
                add_terms(phase_terms, {OFFLOAD: off})
                sim.rec.add_terms(step, phase, phase_terms)


def weight_sync(env, sim, step: int, feed=None, in_flight: bool = False):
    """Process: the trained actor's weights reach the generation engine. ``execution.weight_sync.kind``:

    * ``copy``: a copy through device memory when the engine shares the actor's pool (read + write:
      2 W / tp_rollout / (mem_bw x memory_eff[prefill])), a broadcast over the interconnect when separate;
      nothing to copy when the runtime generates with the trained model itself on its own pool
      (``SHARES_TRAINING_WEIGHTS``: HF ``generate()`` as TRL calls it): a zero-length phase;
    * ``reshard``: ``CostModel.reshard_parts``: the FSDP shards all-gathered, loaded into the engine's
      layout, and on a shared pool the KV cache freed and allocated again (separate pools: the
      broadcast instead), plus the actor's parameter offload (loaded for the sync and offloaded after);
    * ``nccl`` (separate pools, verl's one_step_off and fully_async recipes): ``CostModel.nccl_sync_parts``, the
      tensors gathered whole on the training pool, broadcast whole over the link the two pools span, loaded.
    Recorded as one interval holding the generation pool; the training pool waits for it too, since every schedule
    trains the next batch after the sync (neither verl recipe overlaps the transfer with generation or training).
    Its active share is the gather, load and broadcast (the KV allocator and host copies are not kernels). In
    ``rlhfsim explain`` the crossing between pools is the term pool_weight_transfer, the rest weight_sync.

    ``feed`` (``rlhfsim.sim.feed.GroupFeed``, schedule async with generator ``groups``): no group starts during the
    update, which then waits until no group is in flight, or with ``in_flight`` goes ahead at once while the groups
    running pause their decode for its length (NeMo RL's prepare_for_refit / refit / resume_after_refit); then one
    weight version more and groups start again."""
    s = sim.setup
    a, r = s.pool_of("actor"), s.pool_of("rollout")
    model, dtype = s.shapes["actor"], s.dtypes["actor"]
    if s.scenario.execution.weight_sync.kind in ("reshard", "nccl"):
        parts = weight_sync_parts(sim)
        cross = parts.get("broadcast_s", 0.0)
        active = parts["gather_s"] + parts["load_s"] + cross
        t = sum(parts.values())
        off = parts["offload_s"]
        swap = parts.get("host_swap_s", 0.0)
    else:
        t = sim.cost.weight_sync_s(model, dtype, s.tp["rollout"], a.spans_nodes or r.spans_nodes, same_pool=a is r,
                                   shares_weights=s.scenario.generation.resolved_runtime in SHARES_TRAINING_WEIGHTS)
        active = t  # a device-memory copy or a link transfer: the device works throughout
        cross = 0.0 if a is r else t
        off = ex.offload_s(sim, "actor", "sync")
        swap = host_swap_s(sim)   # NeMo RL's host swap whatever the update's kind (0 unless offload.megatron_swap)
        t += off + swap
    if feed is not None:
        feed.pause()
        if not in_flight:
            yield feed.wait_drained()
        start = env.now
        feed.hold(t)
        yield env.timeout(t)
        _record_sync(sim, step, r, start, t, active, cross, off, swap)
        feed.updated()
        return
    with sim.locks[r.name].request() as req:
        yield req
        start = env.now
        yield env.timeout(t)
        _record_sync(sim, step, r, start, t, active, cross, off, swap)


def _record_sync(sim, step: int, r, start: float, t: float, active: float, cross: float, off: float,
                 swap: float = 0.0) -> None:
    """The weight update's busy interval on the generation pool, and in ``rlhfsim explain`` its terms."""
    sim.rec.busy(step, r.name, 0, r.gpus, "rollout", "weight_sync", start, sim.env.now, active_s=active)
    if t > 0 and sim.rec.terms is not None:   # rlhfsim explain: the update's parts are weight_sync's
        terms = {WEIGHT_SYNC: t - off - cross - swap, POOL_WEIGHT_TRANSFER: cross, OFFLOAD: off}
        if swap:
            terms[HOST_SWAP] = swap
        sim.rec.add_terms(step, "weight_sync", terms)


def weight_sync_parts(sim) -> dict[str, float]:
    """Named parts (seconds) of a ``reshard`` (``CostModel.reshard_parts``) or ``nccl`` (``CostModel.nccl_sync_parts``)
    weight update, plus ``offload_s`` (the actor's parameter offload, 0 when off); the same every step."""
    s = sim.setup
    a, r = s.pool_of("actor"), s.pool_of("rollout")
    model, dtype = s.shapes["actor"], s.dtypes["actor"]
    ws = s.scenario.execution.weight_sync
    if ws.kind == "nccl":
        across = pools_span_nodes(a, r, s.gpu.link_domain(s.scenario.cluster.gpus_per_node))
        if ws.packed:
            parts = sim.cost.packed_sync_parts(model, dtype, parallel.layout_of(s, "actor"), a.gpus, a.spans_nodes,
                                               s.tp["rollout"], across)
        else:
            parts = sim.cost.nccl_sync_parts(model, dtype, a.gpus, a.spans_nodes, s.tp["rollout"], across)
    else:
        kv_bytes = s.kv_capacity_tokens * model.kv_bytes_per_token(dtype) / s.tp["rollout"]
        parts = sim.cost.reshard_parts(model, dtype, a.gpus, s.tp["rollout"], kv_bytes, a is r,
                                       a.spans_nodes or r.spans_nodes, s.scenario.execution.weight_sync.engine_sleep)
    parts["offload_s"] = ex.offload_s(sim, "actor", "sync")
    if s.scenario.execution.offload.megatron_swap:   # NeMo RL's whole-step host traffic (rlhfsim.costs.hostswap)
        parts["host_swap_s"] = host_swap_s(sim)
    return parts


class ChunkScorer:
    """OPPO intra-step overlap for one role (reward, or reference/critic when streamed): chunks queued by
    the decode loop are prefilled on top of each sequence's cached prefix, first in, first out. Each replica
    of the role's pool takes up to ``intra.max_chunk_batch`` queued chunks as one batched chunk prefill
    (default 1: one call per chunk, as the real executor does). The first chunk of a sequence includes
    its prompt. That is the ``incremental`` strategy; the reward model streams by its own
    (``models.reward.streaming``, ``rlhfsim.sim.streaming``): ``reencode`` queues the whole prefix so far
    at every hand-over and prices it from scratch, ``final_only`` queues each rollout once, when it has
    finished. A reward model of another tokenizer adds each call's re-tokenizing as host time.

    Calls are priced one by one (each costs what it would alone, times the co-running slowdown when decode
    runs on the replica's GPUs at the call's start, plus the seconds it adds: ``Simulation.prefill_rate``), but each replica runs a *chain* of back-to-back calls
    in one timeout and one busy interval, planned when it looks at the queue: with one chunk per call
    (the default), every queued call goes to the replica that would take it call by call, the one free
    first (free replicas in the order they became free), appended to its chain; so a burst of chunks
    made ready by one decode segment costs one event per replica instead of one per chunk. With
    ``max_chunk_batch`` > 1 a chain only grows by full calls that start strictly before every other
    replica is free (chunks arriving before a partial call starts would join it). If decode starts or
    stops on the pool (``decode_changed``), every chain is cut back to its call in progress and the rest
    goes back to the head of the queue, to be priced again at the new rate."""

    def __init__(self, sim, role: str):
        self.sim = sim
        self.env: simpy.Environment = sim.env
        self.role = role
        self.queue: deque = deque()
        self.wakeup = self.env.event()
        self.outstanding = 0
        self.drained = self.env.event()
        self.chunks = 0
        self.tokens = 0
        n_rep, self.tp = _replicas(sim, role)
        self.pool = sim.setup.pool_of(role)
        s = sim.setup
        self.model, self.dtype, self.head = s.shapes[role], s.dtypes[role], s.head(role)
        self.mb = sim.schedule.max_chunk_batch
        # The reward model streams by its strategy (models.reward.streaming); streamed reference and critic
        # passes are decoders extending their caches. A reward model of another tokenizer re-tokenizes each
        # call's tokens on the host first (CostModel.retokenize_s).
        self.strategy = STREAMING[s.reward_streaming if role == "reward" else "incremental"]
        self.runtime = sim.forward_runtime(role)
        self.retokenize = role == "reward" and s.retokenize
        self.cap = s.reward_max_tokens if role == "reward" else None  # an encoder's calls truncated (prefix 0)
        self.prices: dict[tuple, tuple[float, float]] = {}  # _price's, by (tokens, n, prefix)
        self.by_term: dict[tuple, dict[str, float]] = {}  # _terms', by (tokens, n, prefix, new): rlhfsim explain
        self.reps = [_Chain(range(k * self.tp, (k + 1) * self.tp), k - n_rep) for k in range(n_rep)]
        self.live = self.closing = False  # live beside generation; the step's generation is over
        self.emitted = 0  # chunks emitted so far
        self.planned = 0  # calls planned so far
        for rep in self.reps:
            rep.proc = self.env.process(self._serve(rep))

    def emit(self, step: int, r: Rollout, final: bool) -> None:
        done = r.scored.get(self.role, 0)
        job = self.strategy.job(r, done)
        if job is None:
            return
        self.closing = False
        if not self.live and self.sim.slows_decode == "live":
            self._set_live(True)
        tokens, prefix = job
        new = r.generated - done + (r.prompt_len if done == 0 else 0)  # tokens no earlier call scored
        if self.cap is not None:
            tokens = min(tokens, self.cap)
        r.scored[self.role] = r.generated
        # (step, tokens, prefix, place in the queue, new tokens)
        self.queue.append((step, tokens, prefix, self.emitted, min(new, tokens)))
        self.emitted += 1
        self.outstanding += 1
        if self.drained.triggered:
            self.drained = self.env.event()
        if not self.wakeup.triggered:
            self.wakeup.succeed()

    def wait_drained(self):
        """An event that fires when every chunk emitted so far has been prefilled. The step's generation
        is over: the scorer stops being live once drained (unless more chunks come first)."""
        self.closing = True
        if self.outstanding == 0:
            self._set_live(False)
            ev = self.env.event()
            ev.succeed()
            return ev
        return self.drained

    def _set_live(self, live: bool) -> None:
        """The scorer is live beside generation (window ``live``, ``Simulation.decode_factor``) from the
        step's first hand-over to its drain after the step's generation, as the executor's scorer thread
        lives: decode sharing its GPUs runs at the hand-over slowdown meanwhile."""
        if live == self.live:
            return
        self.live = live
        for rep in self.reps:
            self.sim.set_active(self.pool.name, "live", rep.gpus, +1 if live else -1)

    def decode_changed(self, pool: str, gpus: range) -> None:
        """Decode started or stopped on ``gpus`` of ``pool`` (an engine's replica began or ended): calls
        chained but not started are priced at the old rate and were chained against free times that may
        move, so every chain goes back to its call in progress and the rest returns to the queue."""
        if pool != self.pool.name or not self.sim.prefill_corun:
            return
        now = self.env.now
        back = []
        for rep in self.reps:
            i = rep.in_progress(now)
            if i is not None and i + 1 < len(rep.calls):
                back.extend(job for call in rep.calls[i + 1:] for job in call)
                rep.cut(i + 1)
                rep.proc.interrupt("decode")
        if back:
            self.queue.extendleft(sorted(back, key=lambda j: j[3], reverse=True))  # back in queue order
            if not self.wakeup.triggered:
                self.wakeup.succeed()

    def _take(self, rep: "_Chain") -> None:
        """``rep`` looks at the queue (its chain is over): plan the queued calls (``_plan``), or with
        ``max_chunk_batch`` > 1 start a chain of the first call and more full calls while the next would
        start strictly before every other replica is free."""
        if self.mb == 1:
            self._plan(rep)
            return
        env = self.env
        q, mb, now = self.queue, self.mb, env.now
        others = min((o.free_at if o.free_at > now else now for o in self.reps if o is not rep), default=math.inf)
        slow, add = self._slow(rep)
        rep.start(now)
        t = now
        while q and (not rep.calls or (t < others and len(q) >= mb)):
            call = [q.popleft() for _ in range(min(mb, len(q)))]
            parts = self._price(sum(j[1] for j in call), len(call), sum(j[2] for j in call))
            rep.add(call, parts, parts[0] * slow + add)
            t = rep.free_at

    def _plan(self, looking: "_Chain") -> None:
        """Every queued call (one chunk each) to the replica that would take it call by call: the first free
        (busy replicas at the end of their chain, ``looking`` at the end of the chain it has just run; the
        others now), appended to its chain at the rate of decode on its GPUs now."""
        env = self.env
        q, now = self.queue, env.now
        reps = self.reps

        def first_free(o: _Chain):
            # Free at the same time, call by call: replicas whose last call ends then look first, the one
            # whose call started first before the others (SimPy runs same-time events in the order they
            # were scheduled; calls starting together start in planning order); replicas already waiting
            # for work look after them, in the order they began to wait (the same order, at the time
            # their last call ended).
            if o.calls or (o is looking and o.free_at == now):
                return max(o.free_at, now), 0, o.last_start, o.last_seq
            return now, 1, o.free_at, o.last_start, o.last_seq  # the order they began to wait in

        # Only the replica that takes a call changes its place, and nothing changes what runs on the GPUs
        # while the calls are planned: a heap of (key, index) gives min(reps, key=first_free) (the first of
        # the earliest), and each replica's rate is asked once.
        order = [(first_free(o), i) for i, o in enumerate(reps)]
        heapq.heapify(order)
        slow: dict[int, tuple[float, float]] = {}
        while q:
            i = order[0][1]
            rep = reps[i]
            if not rep.calls:
                rep.start(now)
            job = q.popleft()
            parts = self._price(job[1], 1, job[2])
            f = slow.get(i)
            if f is None:
                f = slow[i] = self._slow(rep)
            rep.add([job], parts, parts[0] * f[0] + f[1])
            self.planned += 1
            rep.last_seq = self.planned  # calls starting at the same time start in this order
            heapq.heapreplace(order, (first_free(rep), i))

    def _price(self, tokens: float, n: int, prefix: float) -> tuple[float, float]:
        """(total_s, active_s) of one call of ``n`` chunks: the strategy's price, plus the host's
        re-tokenizing of the call's tokens when the reward model reads another tokenizer (host time).
        Kept per (tokens, n, prefix): about half the calls of a step repeat an earlier call's numbers."""
        key = (tokens, n, prefix)
        parts = self.prices.get(key)
        if parts is None:
            parts = self.prices[key] = tuple(price.scorer_call(self.sim.cost, self.strategy, self.model, self.dtype, tokens,
                                                               n, prefix, self.tp, self.head, self.runtime, self.retokenize))
        return parts

    def _terms(self, tokens: float, n: int, prefix: float, new: float) -> dict[str, float]:
        """``_price``'s total by cost term (``rlhfsim.costs.price.scorer_call``'s terms with the call's ``new``
        tokens), kept per (tokens, n, prefix, new)."""
        key = (tokens, n, prefix, new)
        got = self.by_term.get(key)
        if got is None:
            got = self.by_term[key] = price.scorer_call(self.sim.cost, self.strategy, self.model, self.dtype, tokens, n,
                                                        prefix, self.tp, self.head, self.runtime, self.retokenize,
                                                        new).terms()
        return got

    def _book_terms(self, rep: "_Chain") -> None:
        """rlhfsim explain: each call of a finished chain by cost term, on its replica's account for the call's
        step (``Recorder.add_streamed``); the co-running slowdown is the call's seconds beyond its price alone."""
        rec, phase, t = self.sim.rec, ROLE_PHASE[self.role], rep.t0
        for call, parts, dur in zip(rep.calls, rep.parts, rep.durs):
            t += dur
            terms = self._terms(sum(j[1] for j in call), len(call), sum(j[2] for j in call), sum(j[4] for j in call))
            rec.add_streamed(call[0][0], phase, rep.gpus.start, t, terms, interference=dur - parts[0])

    def _slow(self, rep: "_Chain") -> tuple[float, float]:
        """(factor, seconds added) of a call starting now on ``rep`` (``Simulation.prefill_rate``)."""
        return self.sim.prefill_rate(self.pool.name, rep.gpus)

    def _serve(self, rep: "_Chain"):
        env, sim = self.env, self.sim
        pool = self.pool.name
        serving = False  # counted in sim.active from the start of a busy period to its end
        while True:
            if not self.queue and not rep.calls and serving:
                # A busy period ends (back-to-back calls are one period: decode is re-timed only when
                # the co-running state of these GPUs really changes, not twice per chunk).
                serving = False
                sim.set_active(pool, "prefill", rep.gpus, -1)
            while not self.queue and not rep.calls:
                if self.wakeup.triggered:
                    self.wakeup = env.event()
                yield self.wakeup
            if not rep.calls:
                self._take(rep)
                if not rep.calls:
                    continue  # another replica's plan took them all
            if not serving:
                serving = True
                sim.set_active(pool, "prefill", rep.gpus, +1)
            while env.now < rep.free_at:  # the chain may grow (_plan) or be cut (decode_changed) meanwhile
                try:
                    yield from wait_until(env, rep.free_at)
                except simpy.Interrupt:
                    pass
            self._record(rep)
            rep.calls = []

    def _record(self, rep: "_Chain") -> None:
        """Book a finished chain: one busy interval per run of calls of the same step (kernel time: each
        call's kernel share of its span), then the scorer's counters and the drained event."""
        sim = self.sim
        calls, parts, durs = rep.calls, rep.parts, rep.durs
        if sim.rec.terms is not None:
            self._book_terms(rep)
        if len(calls) == 1 and len(calls[0]) == 1:  # the usual chain: one call of one chunk
            job, t0 = calls[0][0], rep.t0
            t = t0 + durs[0]
            sim.rec.busy(job[0], self.pool.name, rep.gpus.start, self.tp, self.role, ROLE_PHASE[self.role], t0, t,
                         active_s=0.0 + _kernel_share(t0 + durs[0] - t0, parts[0]))
            self.chunks += 1
            self.tokens += job[1]
            self.outstanding -= 1
            if self.outstanding == 0 and not self.drained.triggered:
                self._drained()
            return
        i, t = 0, rep.t0
        while i < len(calls):
            step, t0, active = calls[i][0][0], t, 0.0
            while i < len(calls) and calls[i][0][0] == step:
                active += _kernel_share(t + durs[i] - t, parts[i])  # the span as the clock measures it
                t += durs[i]
                i += 1
            sim.rec.busy(step, self.pool.name, rep.gpus.start, self.tp, self.role, ROLE_PHASE[self.role], t0, t,
                         active_s=active)
        n = sum(len(c) for c in calls)
        self.chunks += n
        self.tokens += sum(j[1] for c in calls for j in c)
        self.outstanding -= n
        if self.outstanding == 0 and not self.drained.triggered:
            self._drained()

    def _drained(self) -> None:
        """Every chunk emitted so far is scored: the drained event, and the end of the scorer's live window
        when the step's generation is over (``wait_drained``)."""
        if self.closing:
            self._set_live(False)
        self.drained.succeed()


class _Chain:
    """One replica of a chunk scorer and the chain of calls it runs: the calls, their (total_s, active_s)
    parts and durations, the chain's start, its end (``free_at``: when the replica is free again) and its
    last call's start and rank among the calls planned (``last_start``, ``last_seq``: which of the
    replicas free at the same time looks first; before any call, the replicas' order)."""

    __slots__ = ("gpus", "proc", "calls", "parts", "durs", "t0", "free_at", "last_start", "last_seq")

    def __init__(self, gpus: range, seq: int):
        self.gpus, self.proc = gpus, None
        self.calls: list[list] = []
        self.parts: list[tuple[float, float]] = []
        self.durs: list[float] = []
        self.t0 = self.free_at = self.last_start = 0.0
        self.last_seq = seq

    def start(self, now: float) -> None:
        self.calls, self.parts, self.durs = [], [], []
        self.t0 = self.free_at = now

    def add(self, call: list, parts: tuple[float, float], dur: float) -> None:
        self.calls.append(call)
        self.parts.append(parts)
        self.durs.append(dur)
        self.last_start = self.free_at
        self.free_at += dur  # call after call, as SimPy's clock would add them

    def in_progress(self, now: float) -> int | None:
        """Index of the call running at ``now`` (None when the chain is over or not started)."""
        t = self.t0
        for i, d in enumerate(self.durs):
            if t + d > now:
                return i if t <= now else None
            t += d
        return None

    def cut(self, n: int) -> None:
        """Keep the first ``n`` calls."""
        del self.calls[n:], self.parts[n:], self.durs[n:]
        t = self.t0
        for d in self.durs:
            self.last_start = t
            t += d
        self.free_at = t

"""The parallelism search's fast path: configurations that differ only in how the trained models are laid out share
their generation, so each distinct generation is simulated once and each configuration's steps are rebuilt from it
with the training phases priced per layout, by the simulator's own pricing functions called on all pieces at once.

Under the synchronous schedule a step is its phases in a row (``rlhfsim.sim.schedules.base.after_generation``)::

    step_k = generate_k + reward_k + old_log_prob_k + reference_k + critic_fwd_k + adv_k + train_k + weight_sync

* ``generate_k``: a simulation of generation alone (the same ``Simulation``, its post-generation pipeline left out),
  shared by every configuration with the same generation setup (``generation_key``: the scenario less the trained
  roles' layouts) whose KV capacity the generation shows it did not need (below). The rows each step trains come from
  the same run.
* a forward pass: each replica's pieces (``rlhfsim.sim.microbatch``, the same cuts as ``stages.forward_pass``) priced
  with ``price.forward_call`` over numpy arrays (the same arithmetic elementwise, so each piece's price equals the
  scalar call's), summed per replica in the stage's order with the framework's per-piece time, the pipeline bubble
  added; the slowest replica's sum;
* ``train_k``: ``stages.train``'s minibatches (the same seeded permutations: ``Simulation.shuffle_rng``, drawn in the
  same order), each the slowest rank's pieces plus the optimizer step; the actor and critic in a row on one pool,
  side by side on two;
* reward (a rule), advantage and the weight update: the cost model's own functions, as the stages call them.

The KV capacity per replica depends on the layout (the weights resident beside the cache), so configurations of one
generation setup differ in it. A continuous engine reads its capacity only at three decisions (admission under the
watermark, preemption, a decode segment's length: ``rlhfsim.sim.engines.continuous``), each a demand compared with the
capacity or with the limit under the watermark, and records the largest demands it met (``kv_need``, ``kv_room``).
A generation simulated at capacity C whose demands C met (no refusal, no preemption, no segment cut short) is the
same, bit for bit, at every capacity C' that meets them too (``Generation.covers``): each decision compares the same
demand with a limit at least as large. So each group is simulated at its largest capacity first and shared by every
member it covers; the largest capacity left is simulated next, and so on (``share``). A static engine reads no
capacity: one generation covers its group.

It is exact where it applies (``tests/unit/test_parallel_search.py`` compares it with ``simulate`` on a sample, to
1e-9 relative, and ``tests/unit/test_kv_sharing.py`` across KV capacities); a configuration outside it (``eligible`` says why) is simulated in full. Each row says which
(``results.csv``'s ``method``: ``simulated`` or ``shared-generation``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from rlhfsim.costs import parallel, price
from rlhfsim.costs.hostswap import host_swap_s
from rlhfsim.costs.genruntimes import SHARES_TRAINING_WEIGHTS
from rlhfsim.scenario.checks import Setup
from rlhfsim.sim import execution as ex
from rlhfsim.sim import microbatch as mb
from rlhfsim.sim.engines.continuous import ContinuousEngine
from rlhfsim.sim.simulation import Simulation, forward_runtime
from rlhfsim.sim.stages import _rank_longest, _row_tokens, weight_sync_parts

FAST, FULL = "shared-generation", "simulated"


def eligible(setup: Setup, cost) -> str | None:
    """Why a configuration cannot take the fast path (None: it can)."""
    sc = setup.scenario
    e = sc.execution
    if sc.schedule.kind != "sync":
        return f"schedule {sc.schedule.kind} (only sync's phases run in a row)"
    if cost.cpu is not None:
        return "a CPU profile"
    if e.balance_batch:
        return "execution.balance_batch"
    off = e.offload
    if any(getattr(getattr(off, r), f) for r, fs in (("actor", ("param", "grad", "optimizer")),
                                                     ("critic", ("param", "grad", "optimizer")),
                                                     ("reference", ("param",))) for f in fs):
        return "execution.offload"
    if setup.rule_reward is None and (setup.retokenize or setup.reward_max_tokens is not None):
        return "a reward model re-tokenizing or truncating its rows"
    for r in ("actor", "critic", "reference"):   # an uneven pipeline's call is its slowest stage's, chosen per call
        lay = parallel.layout_of(setup, r) if r in setup.shapes else None
        if lay is not None and lay.uneven:
            return f"execution.megatron.{r}: uneven pipeline stages"
    return None


def kv_limits(capacity: int) -> tuple[int, int]:
    """A continuous engine's capacity and admission limit (the capacity less its watermark) at ``capacity`` tokens per
    replica, as ``ContinuousEngine`` computes them."""
    cap = max(capacity, 1)
    return cap, cap - int(ContinuousEngine.WATERMARK * cap)


def generation_key(setup: Setup) -> str:
    """What the generation of a configuration depends on, but for its KV capacity (``share``): its scenario less the
    trained roles' parallelism (the engine's TP resolved)."""
    doc = setup.scenario.model_dump(mode="json")
    doc["execution"].pop("megatron", None)
    doc["execution"].pop("weight_sync", None)
    tp = doc["placement"]["tp"]
    for r in ("actor", "critic", "reference"):
        tp[r] = 0
    tp["rollout"] = setup.tp["rollout"]
    doc["name"] = doc["description"] = ""
    return json.dumps(doc, sort_keys=True)


class _GenerationOnly(Simulation):
    """A Simulation whose post-generation pipeline is left out: each step's generation and the rows it trains."""

    def __init__(self, setup, cost):
        super().__init__(setup, cost)
        self.trained: list[list] = []
        self.kv_demands: list[tuple[int, int]] = []   # a continuous engine's (kv_need, kv_room) per step

    def after_generation(self, step, rows, streamed=()):
        self.trained.append(sorted(rows, key=lambda r: r.id))
        return _nothing()


def _nothing():
    return
    yield  # a generator that ends at once (env.process needs one)


@dataclass
class Generation:
    """One simulated generation, shared by the configurations with its key."""

    gen_s: list[float]                 # per step: the step's time up to the end of its generation
    generated: list[int]               # tokens generated per step
    rows: list[list]                   # per step: the rows trained, in id order
    perms: list[list[np.ndarray]]      # per step: the shuffle permutations train draws (actor's epochs, then critic's)
    memo: dict = field(default_factory=dict)   # (phase key) -> per-step seconds; shared by generations of the same rows
    capacity: int = 0                  # the KV capacity per replica it was simulated at
    kv_need: int = 0                   # the largest demand met against the admission limit (0: none, or a static engine)
    kv_room: int = 0                   # the largest demand met against the capacity

    def covers(self, capacity: int) -> bool:
        """Is this generation the one a configuration of the same ``generation_key`` at ``capacity`` tokens per replica
        simulates (module docstring)? Its own capacity, or one meeting every demand its own capacity met."""
        if capacity == self.capacity:
            return True
        cap, limit = kv_limits(self.capacity)
        if self.kv_need > limit or self.kv_room > cap:   # the capacity bound a decision: it holds for this one only
            return False
        cap, limit = kv_limits(capacity)
        return self.kv_need <= limit and self.kv_room <= cap


def simulate_generation(setup: Setup, cost, memos: dict | None = None) -> Generation:
    """Generation alone (module docstring). ``memos``: phase prices by the rows trained, shared across generations
    (a sync step trains every row it generated: generations of other engine layouts train the same rows)."""
    sim = _GenerationOnly(setup, cost)
    recs = sim.run(setup.scenario.steps)
    rows = sim.trained
    sc = setup.scenario
    trained = [r for r in ("actor", "critic") if r in setup.shapes]
    rng = np.random.default_rng([sim.seed, 2])   # Simulation.shuffle_rng: train draws from it, nothing else does
    perms = [[rng.permutation(len(rs)) for _ in trained for _ in range(sc.algorithm.ppo_epochs)] if rs else []
             for rs in rows]
    rows_key = tuple(tuple((r.id, r.prompt_len, r.response_len) for r in rs) for rs in rows)
    memo = {} if memos is None else memos.setdefault(rows_key, {})
    need = max((d[0] for d in sim.kv_demands), default=0)
    room = max((d[1] for d in sim.kv_demands), default=0)
    return Generation([r.step_time_s for r in recs], [r.generated_tokens for r in recs], rows, perms, memo,
                      setup.kv_capacity_tokens, need, room)


def share(members: list, cost, memos: dict | None = None):
    """The generations of ``members`` ((configuration, Setup) pairs of one ``generation_key``): yields (Generation, or
    the RlhfsimError its simulation raised, and the members it covers). The largest capacity left is simulated each
    time, so that one generation covers as many as the demands allow (module docstring)."""
    from rlhfsim.errors import RlhfsimError

    left = sorted(members, key=lambda m: -m[1].kv_capacity_tokens)
    while left:
        top = left[0][1]
        try:
            gen = simulate_generation(top, cost, memos)
        except RlhfsimError as e:
            mine = [m for m in left if m[1].kv_capacity_tokens == top.kv_capacity_tokens]
            left = left[len(mine):]
            yield e, mine
            continue
        mine = [m for m in left if gen.covers(m[1].kv_capacity_tokens)]
        left = [m for m in left if not gen.covers(m[1].kv_capacity_tokens)]
        yield gen, mine


def _sum_forward(prices: list[float], per_call_s: float) -> float:
    t = 0.0
    for c in prices:
        t += c + per_call_s
    return t


def _sum_train(prices: list[float], per_call_s: float) -> float:
    t = 0.0
    for c in prices:
        t = t + c + per_call_s
    return t


def forward_s(cost, s: Setup, role: str, rows: list, cache: dict | None = None, step: int = -1) -> float:
    """``stages.forward_pass``'s span of ``role`` over ``rows`` (module docstring; no offload, no balancing).
    ``cache``: the step's pieces by how its rows are cut (the same for every layout with as many data-parallel ranks),
    with ``step`` the rows' step (a ``Generation.memo``: its rows are the same)."""
    cache = {} if cache is None else cache
    if not rows:
        return 0.0
    pool = s.pool_of(role)
    tp, _, sp, n_rep, lay = ex.data_ranks(s, role)
    size, budget, packed = ex.forward_cuts(s, sp if lay is None else lay.cp, role)
    pad_len = None if packed else ex.pad_length(s)
    per_call_s = price.piece_s(cost, False)
    encoder = s.shapes[role].arch == "encoder"
    key = ("fwd-pieces", step, n_rep, size, budget, packed, pad_len, encoder)
    got = cache.get(key)
    if got is None:
        cuts = [mb.pieces(rows[k::n_rep], size, budget, packed, encoder, pad_len) for k in range(n_rep)]
        flat = [p for c in cuts for p in c]
        if not flat:
            return 0.0
        arrays = (np.array([p.tokens for p in flat], dtype=np.float64), np.array([p.rows for p in flat], dtype=np.float64),
                  np.array([p.attn_pairs for p in flat], dtype=np.float64) if flat[0].attn_pairs is not None else None)
        got = cache[key] = ([len(c) for c in cuts], arrays)
    lens, (tokens, n_rows, pairs) = got
    call = price.forward_call(cost, s, role, tokens, n_rows, runtime=forward_runtime(cost, role, s.scenario), tp=tp,
                              attn_pairs=pairs, sp=sp, fsdp_n=ex.fsdp_shards(s, role), inter_node=pool.spans_nodes,
                              layout=lay)
    totals = np.broadcast_to(call.total_s, tokens.shape).tolist()
    worst, i = 0.0, 0
    for n in lens:
        t = _sum_forward(totals[i:i + n], per_call_s)
        i += n
        if lay is not None and lay.pp > 1 and n:
            t += parallel.bubble_s(t, n, lay.pp, lay.vpp)
        worst = max(worst, t)
    return worst


def train_s(cost, s: Setup, role: str, rows: list, perms: list[np.ndarray], cache: dict | None = None,
            step: int = -1) -> float:
    """``stages.train``'s span of ``role`` (module docstring; no offload, no balancing); ``cache``, ``step``: as
    ``forward_s``'s (``perms`` the step's own)."""
    cache = {} if cache is None else cache
    alg = s.scenario.algorithm
    pool = s.pool_of(role)
    tp, dp, sp, ranks, lay = ex.data_ranks(s, role)
    size, budget, packed = ex.train_cuts(s, sp if lay is None else lay.cp, role)
    pad_len = None if packed else ex.pad_length(s)
    per_call_s = price.piece_s(cost, True)
    fsdp_n = ex.fsdp_shards(s, role)
    opt = price.optimizer_step(cost, s, role, tp, dp, pool.spans_nodes, fsdp_n, lay).total_s
    tokens = _row_tokens(rows) if size is None and budget is None and not packed else None
    if tokens is not None and pad_len is not None:
        tokens = np.full(len(rows), pad_len, dtype=np.int64)
    key = ("train-pieces", step, role, ranks, size, budget, packed, pad_len)
    got = cache.get(key)
    if got is None:
        minibatches = []   # each: per rank, its pieces as (tokens, rows, attention pairs)
        for perm in perms:
            if tokens is not None:
                for counts, lengths in zip(*_rank_longest(tokens[perm], alg.minibatch_size, ranks)):
                    minibatches.append([[(n * length, n, None)] for n, length in zip(counts, lengths)])
                continue
            for i in range(0, len(rows), alg.minibatch_size):
                part = [rows[j] for j in perm[i:i + alg.minibatch_size]]
                minibatches.append([[(p.tokens, p.rows, p.attn_pairs) for p in mb.pieces(part[k::ranks], size, budget,
                                                                                           packed, pad_len=pad_len)]
                                    for k in range(min(ranks, len(part)))])
        flat = [p for m in minibatches for rank in m for p in rank]
        if not flat:
            return 0.0
        arrays = (np.array([p[0] for p in flat], dtype=np.float64), np.array([p[1] for p in flat], dtype=np.float64),
                  np.array([p[2] for p in flat], dtype=np.float64) if flat[0][2] is not None else None)
        got = cache[key] = ([[len(r) for r in m] for m in minibatches], arrays)
    shape, (n_tok, n_rows, pairs) = got
    call = price.train_call(cost, s, role, n_tok, n_rows, tp=tp, attn_pairs=pairs, sp=sp, fsdp_n=fsdp_n,
                            inter_node=pool.spans_nodes, ckpt_frac=cost.step_scalar("checkpoint_extra_frac"), layout=lay)
    totals = np.broadcast_to(call.total_s, n_tok.shape).tolist()
    t, i = 0.0, 0
    for m in shape:
        slowest = 0.0
        for n in m:
            r = _sum_train(totals[i:i + n], per_call_s)
            i += n
            if lay is not None and lay.pp > 1:
                r = r + parallel.bubble_s(r, n, lay.pp, lay.vpp)
            slowest = max(slowest, r)
        t += slowest + opt
    return t


class _Ctx:
    """What ``stages.weight_sync_parts`` and ``execution.offload_s`` read of a simulation."""

    def __init__(self, setup, cost):
        self.setup, self.cost = setup, cost


def weight_sync_s(cost, s: Setup) -> float:
    """``stages.weight_sync``'s seconds (no offload)."""
    a, r = s.pool_of("actor"), s.pool_of("rollout")
    if s.scenario.execution.weight_sync.kind in ("reshard", "nccl"):
        return sum(weight_sync_parts(_Ctx(s, cost)).values())
    return cost.weight_sync_s(s.shapes["actor"], s.dtypes["actor"], s.tp["rollout"], a.spans_nodes or r.spans_nodes,
                              same_pool=a is r, shares_weights=s.scenario.generation.resolved_runtime in SHARES_TRAINING_WEIGHTS
                              ) + host_swap_s(_Ctx(s, cost))


def _layout_key(s: Setup, role: str) -> tuple:
    """What a role's phase price depends on beyond its rows: its TP, pool and the whole Megatron block (every degree,
    etp and the stage split, so that no two layouts share a price by accident)."""
    pool = s.pool_of(role)
    meg = getattr(s.scenario.execution.megatron, role) if role in ("actor", "critic", "reference") else None
    return (role, s.tp[role], pool.gpus, pool.spans_nodes, None if meg is None else tuple(meg.model_dump().items()))


def steps(gen: Generation, s: Setup, cost) -> tuple[list[float], dict[str, list[float]]]:
    """Each step's time and each phase's seconds per step (module docstring)."""
    sc = s.scenario
    e = sc.execution
    phases: dict[str, list[float]] = {}

    def per_step(name: str, key: tuple, fn) -> list[float]:
        got = gen.memo.get(key)
        if got is None:
            got = gen.memo[key] = [fn(k, rows) if rows else 0.0 for k, rows in enumerate(gen.rows)]
        phases[name] = got
        return got

    parts: list[list[float]] = []
    if s.rule_reward is not None:
        rule = s.rule_reward
        parts.append(per_step("reward", ("rule",), lambda k, rows: cost.rule_reward_s(len(rows), rule.cpu_s_per_sample,
                                                                                       rule.workers)))
    else:
        parts.append(per_step("reward", ("fwd",) + _layout_key(s, "reward"),
                              lambda k, rows: forward_s(cost, s, "reward", rows, gen.memo, k)))
    if e.old_log_prob:
        parts.append(per_step("old_log_prob", ("fwd",) + _layout_key(s, "actor"),
                              lambda k, rows: forward_s(cost, s, "actor", rows, gen.memo, k)))
    for role, ph in (("reference", "reference"), ("critic", "critic_fwd")):
        if role in s.shapes:
            parts.append(per_step(ph, ("fwd",) + _layout_key(s, role), lambda k, rows, r=role: forward_s(cost, s, r, rows, gen.memo, k)))
    if e.advantage.enabled:
        from rlhfsim.costs.driver import AdvantageCode

        code = AdvantageCode(e.advantage.gae_loop, e.advantage.rollout_metrics)
        parts.append(per_step("adv", ("adv",), lambda k, rows: cost.advantage_s(len(rows), sc.workload.max_response_tokens,
                                                                                 "critic" in s.shapes, code)))
    trained = [r for r in ("actor", "critic") if r in s.shapes]
    epochs = sc.algorithm.ppo_epochs
    by_pool: dict[str, list[list[float]]] = {}
    for j, role in enumerate(trained):
        got = per_step(f"{role}_train", ("train",) + _layout_key(s, role),
                       lambda k, rows, r=role, j=j: train_s(cost, s, r, rows, gen.perms[k][j * epochs:(j + 1) * epochs],
                                                            gen.memo, k))
        by_pool.setdefault(s.pool_of(role).name, []).append(got)
    ws = weight_sync_s(cost, s)
    n = len(gen.rows)
    phases["weight_sync"] = [ws] * n
    times = []
    for k in range(n):
        t = gen.gen_s[k]
        for p in parts:
            t = t + p[k]
        t = t + max(sum(x[k] for x in lst) for lst in by_pool.values())   # pools train side by side
        times.append(t + ws)
    return times, phases


def metrics(gen: Generation, s: Setup, cost) -> dict:
    """The numbers a row of results.csv needs, as ``rlhfsim.plan.backends.run_one`` gives them (utilization is not
    rebuilt: empty)."""
    times, phases = steps(gen, s, cost)
    sc = s.scenario
    warm = min(sc.warmup_steps, max(len(times) - 1, 0))
    steady = np.array(times[warm:])
    gen_steady = [g for g in gen.gen_s[warm:]]
    ph = {"generate": float(np.mean(gen_steady))}
    for name, per in phases.items():
        vals = per[warm:]
        if any(vals) or name == "weight_sync":
            ph[name] = float(np.mean(vals))
    return {"step_time_s": float(steady.mean()), "step_time_p90_s": float(np.percentile(steady, 90)),
            "tokens_per_s": sum(gen.generated[warm:]) / max(float(steady.sum()), 1e-12), "off_policy_token_frac": 0.0,
            "phases_s": ph, "utilization": {}, "active": {}, "step_time_interval_s": None}

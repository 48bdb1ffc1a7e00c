"""The Simulation: owns its SimPy environment, its random generators and its recorder (no global state;
same seed, same result, bit for bit). A Schedule drives the steps; this module holds the per-step
pipeline that sync, OPPO and partial rollouts share, and the summary statistics."""

from __future__ import annotations

import dataclasses
import gc
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import simpy

from rlhfsim.contracts import PHASES, verl_timing
from rlhfsim.costs.genruntimes import logprob_tail_priced
from rlhfsim.costs.model import CostModel
from rlhfsim.scenario.checks import Setup
from rlhfsim.sim import execution, stages
from rlhfsim.sim.generation import GenRequest, Generation
from rlhfsim.sim.recorder import Recorder, StepRecord
from rlhfsim.sim.rollouts import Rollout, RolloutStream
from rlhfsim.words import article


def scoring_runtime(sc) -> str | None:
    """The scoring runtime a scenario names for its reward model (``models.reward.runtime``; None for a
    rule reward, which has none)."""
    return None if sc.models.reward.kind == "rule" else sc.models.reward.runtime


def forward_runtime(cost, role: str, sc) -> str | None:
    """Which fitted costs price a role's full forward pass (reward, reference, critic) in scenario ``sc``:
    its scoring runtime for the reward model when it names one (``scoring_runtime``); otherwise ``eager``
    when the profile measured it (these passes run in the training framework, an eager forward over a
    padded batch, not in the generation engine), else the generation prefill's costs (``None``)."""
    if role == "reward" and scoring_runtime(sc) is not None:
        return scoring_runtime(sc)
    return "eager" if "eager" in cost.runtimes else None


class Simulation:
    """One simulated training run of ``steps`` steps of a scenario under its schedule."""

    def __init__(self, setup: Setup, cost: CostModel, *, seed: int | None = None,
                 rollouts: list[tuple[int, int]] | None = None):
        from rlhfsim.sim.schedules import SCHEDULES

        self.setup = setup
        self.cost = cost
        sc = setup.scenario
        self.seed = sc.seed if seed is None else seed
        self.env = simpy.Environment()
        # Separate streams so that changing the schedule never changes the sampled lengths.
        self.rng = np.random.default_rng([self.seed, 0])
        self.reward_rng = np.random.default_rng([self.seed, 1])
        self.shuffle_rng = np.random.default_rng([self.seed, 2])
        self.rec = Recorder()
        self.stream = RolloutStream(setup, self.rng, rollouts)
        self.locks = {p.name: simpy.Resource(self.env, capacity=1) for p in setup.pools}
        self.active: dict = defaultdict(int)     # (pool, "decode"|"prefill", gpu) -> running calls
        self.decoding: dict = defaultdict(dict)  # pool -> {replica process inside a decode segment: its GPUs}
        self.scorers: dict[str, stages.ChunkScorer] = {}
        # Co-running of intra-step scoring and decode on shared GPUs (CostModel.corun_factors): measured in
        # the hand-over pattern for the generation runtime (window "live": decode is slower while a scorer
        # is live beside it), else the busy-loop slowdowns (window "overlap": while a call runs).
        # Where the profile fitted the time the hand-over pattern adds (CostModel.corun_added), an operation
        # beside a live scorer takes t x slow + add (add per decode step, per chunk call); else add is 0.
        shapes = setup.shapes
        self.decode_slow, self.decode_add, self.prefill_slow, self.prefill_add, window = cost.corun(
            sc.generation.resolved_runtime, shapes["actor"], shapes.get("reward"))
        # Where the profile measured the actor's speed beside a waiting and beside a computing scorer
        # (CostModel.corun_overlap), decode runs at idle_x while the scorer is live and waits, and at busy_x
        # while one of its calls runs on the same GPUs (a CPU's cores): the factor follows the scorer's busy
        # time, as measured, instead of one factor over the whole live window.
        self.decode_busy: float | None = None
        overlap = cost.corun_overlap(sc.generation.resolved_runtime, shapes["actor"], shapes.get("reward"))
        if overlap is not None:
            self.decode_slow, self.decode_add = overlap[0], 0.0
            self.decode_busy = overlap[1]
            window = "live"
        # does co-running change decode at all
        self.decode_corun = self.decode_slow != 1.0 or self.decode_add > 0 or self.decode_busy not in (None, 1.0)
        self.prefill_corun = self.prefill_slow != 1.0 or self.prefill_add > 0
        self.slows_decode = "live" if window == "live" else "prefill"   # the sim.active kind that slows decode
        self.schedule = SCHEDULES[sc.schedule.kind](self, sc.schedule)

    def corun(self, pool: str, kind: str, gpus: range) -> bool:
        """Is the other kind of work (decode vs chunk prefill) running on any of these GPUs of the pool?
        Interference is per device: a chunk prefill slows the decode replica that shares its GPUs."""
        other = "prefill" if kind == "decode" else "decode"
        return any(self.active[(pool, other, g)] > 0 for g in gpus)

    def decode_factor(self, pool: str, gpus: range) -> float:
        """How much slower decode on these GPUs of ``pool`` runs now: ``decode_slow`` while a chunk call
        runs on one of them (window ``overlap``) or while a scorer is live on one of them (window ``live``:
        from its step's first hand-over to its drain, ``ChunkScorer``), else 1."""
        return self.decode_rate(pool, gpus)[0]

    def decode_rate(self, pool: str, gpus: range) -> tuple[float, float]:
        """(factor, seconds added per decode step) of decode on these GPUs of ``pool`` now:
        (``decode_busy``, 0) while a chunk call runs on one of them where the profile measured it
        (``CostModel.corun_overlap``), else (``decode_slow``, ``decode_add``) while co-running
        (``decode_factor``), else (1, 0)."""
        if self.decode_busy is not None and any(self.active[(pool, "prefill", g)] > 0 for g in gpus):
            return self.decode_busy, 0.0
        kind = self.slows_decode
        if any(self.active[(pool, kind, g)] > 0 for g in gpus):
            return self.decode_slow, self.decode_add
        return 1.0, 0.0

    def prefill_rate(self, pool: str, gpus: range) -> tuple[float, float]:
        """A chunk call on these GPUs of ``pool`` starting now takes ``t x factor + added`` for its price
        ``t`` alone: (``prefill_slow``, ``prefill_add``) while decode runs on one of them, else (1, 0)."""
        return (self.prefill_slow, self.prefill_add) if self.corun(pool, "prefill", gpus) else (1.0, 0.0)

    def set_active(self, pool: str, kind: str, gpus: range, delta: int) -> None:
        """Count work of ``kind`` starting (+1) or ending (-1) on these GPUs; when chunk prefills start
        or stop on a GPU, the decode there is re-timed (``interference_changed``)."""
        changed = False
        for g in gpus:
            k = (pool, kind, g)
            before = self.active[k]
            self.active[k] = before + delta
            changed |= (before == 0) != (before + delta == 0)
        if changed and (kind == self.slows_decode or (kind == "prefill" and self.decode_busy is not None)):
            self.interference_changed(pool, gpus)

    def forward_runtime(self, role: str) -> str | None:
        """``forward_runtime`` of this scenario and profile."""
        return forward_runtime(self.cost, role, self.setup.scenario)

    def interference_changed(self, pool: str, gpus: range) -> None:
        """A chunk prefill (or, window ``live``, a live scorer) started or ended on these GPUs of ``pool``:
        decode segments sharing any of them re-time themselves at the new speed (``Generation``);
        nothing to do when co-running leaves decode as it is."""
        if not self.decode_corun:
            return
        decoding = self.decoding[pool]
        if not decoding:
            return
        me = self.env.active_process
        for proc, mine in list(decoding.items()):
            if proc.is_alive and proc is not me and _overlap(mine, gpus):
                proc.interrupt("rate")

    def scorer(self, role: str) -> stages.ChunkScorer:
        if role not in self.scorers:
            self.scorers[role] = stages.ChunkScorer(self, role)
        return self.scorers[role]

    def run(self, steps: int | None = None) -> list[StepRecord]:
        """Run ``steps`` steps (the scenario's own by default) with the cyclic garbage collector paused
        (``collector_paused``); returns every step record so far."""
        steps = steps or self.setup.scenario.steps
        proc = self.env.process(self.schedule.run(steps))
        with collector_paused():
            self.env.run(until=proc)
        return self.rec.steps

    # -- the shared step pipeline --------------------------------------------------------------------
    def generate(self, req: GenRequest):
        """Process: run one step's generation; returns a GenResult."""
        if not req.rollouts and req.feed is None:
            from rlhfsim.sim.generation import GenResult

            return GenResult([], [], 0, self.env.now, self.env.now)
        gen = Generation(self, req)
        result = yield self.env.process(gen.run())
        return result

    def after_generation(self, step: int, rows: list[Rollout], streamed: tuple[str, ...] = ()):
        """Process: the post-generation pipeline, as the schedule runs it (``Schedule.after_generation``:
        scoring, the actor's old-log-prob pass, reference and critic passes, advantages, training, weight
        sync, in verl's order by default)."""
        return self.schedule.after_generation(step, rows, streamed)

    def record_step(self, step: int, start: float, trained: list[Rollout], generated: int, **extra) -> StepRecord:
        # One pass over the rows: at 65,536 rollouts they lie scattered in memory (finishing order).
        lengths: list[tuple[int, int, int]] = []
        ages: list[int] = []
        add_length, add_age = lengths.append, ages.append
        off = 0
        for r in trained:
            add_length((r.id, r.prompt_len, r.response_len))
            a = r.admitted_step
            add_age(step - a)
            if a < step:  # a row decodes no token before the step that took it from the stream
                off += sum([n for k, n in r.tokens_by_step.items() if k < step])
        rec = StepRecord(step=step, start_s=start, end_s=self.env.now, generated_tokens=generated,
                         trained_rollouts=len(trained), trained_ids=[x[0] for x in lengths],
                         off_policy_tokens=off, response_tokens=sum([x[2] for x in lengths]), deferral_ages=ages,
                         lengths=lengths, **extra)
        rec.phases_s = {ph: e - s for ph, (s, e) in self.rec.spans(step).items()}
        self.rec.steps.append(rec)
        return rec


@contextmanager
def collector_paused():
    """Pause Python's cyclic garbage collector (reference counting goes on), restoring its state after.

    A large step holds tens of thousands of live rollouts; while they are alive the collector's passes
    walk them again and again and find nothing to free (rows hold no reference cycles, and no engine
    keeps one holding its rows: a finished step's rows are freed by reference counting). That was about
    a sixth of a 65,536-rollout step's CPU time (three full passes, ~115 ms of ~700 ms). What a run leaves
    for the collector is small and does not grow with the rollouts: 120 to 720 objects per simulated run
    of the bundled scenarios (5 to 20 steps), collected as usual once the collector runs again."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass
class SimResult:
    """A finished simulation: step records, busy intervals and the summary."""

    setup: Setup
    steps: list[StepRecord]
    intervals: list
    summary: dict
    cost: CostModel | None = None  # the cost model that priced it


def _step_costs(sim) -> dict:
    """The step scalars that priced this scenario's step, with their values and sources."""
    costs = sim.cost.step_costs()
    measured = tuple(k for k, v in costs.items() if v["source"] == "profile")
    used = execution.step_scalars_used(sim.setup, measured)
    return {k: v for k, v in costs.items() if k in used}


def summarize(sim: Simulation, steps: list[StepRecord]) -> dict:
    """The summary of a run over its steady steps (after ``warmup_steps``). Two utilizations per pool, as
    fractions of GPU-time in the steady window: ``gpu_busy`` (work assigned to the GPU; also written as
    ``gpu_utilization``, its older name) and ``gpu_active`` (kernels executing: the cost model's roofline
    part, without host overheads; what nvidia-smi / DCGM "GPU utilization" reports). active <= busy."""
    s = sim.setup
    sc = s.scenario
    warm = min(sc.warmup_steps, max(len(steps) - 1, 0))
    steady = steps[warm:]
    times = np.array([r.step_time_s for r in steady])
    t0, t1 = steady[0].start_s, steady[-1].end_s
    window = max(t1 - t0, 1e-12)
    phases = {ph: float(np.mean([r.phases_s.get(ph, 0.0) for r in steady])) for ph in PHASES
              if any(ph in r.phases_s for r in steady)}
    busy, active = pool_utilization(sim, t0, t1)
    gen_tokens = sum(r.generated_tokens for r in steady)
    ages = Counter(a for r in steady for a in r.deferral_ages)
    stal = Counter(r.staleness for r in steady)
    stats = {
        "deferred_per_step": [r.deferred for r in steps],
        "deferral_age_hist": {str(k): v for k, v in sorted(ages.items())},
        "off_policy_token_frac": float(np.mean([r.off_policy_token_frac for r in steady])),
        "staleness_hist": {str(k): v for k, v in sorted(stal.items())},
        # the staleness reached (steps between the policy that generated a batch and the one it trains), over the
        # steady steps: what an async schedule's max_staleness allowed versus what the pools' speeds let it use
        "staleness_mean": float(np.mean([r.staleness for r in steady])),
        "staleness_max": max(r.staleness for r in steady),
        "chunk_tokens": [r.chunk_tokens for r in steps],
        "delta": [r.delta for r in steps],
        "chunks_scored": int(sum(r.chunks_scored for r in steps)),
    }
    return {
        "scenario": sc.name,
        "schedule": sc.schedule.kind,
        "profile": sim.cost.name,
        "profile_source": sim.cost.profile["provenance"].get("source"),
        "generation_runtime": generation_runtime(sim),
        "reward_scoring": reward_scoring(sim),
        "steps": len(steps),
        "warmup_steps": warm,
        "steady_steps": len(steady),
        "step_time_s": float(times.mean()),
        "step_time_p50_s": float(np.percentile(times, 50)),
        "step_time_p90_s": float(np.percentile(times, 90)),
        "phases_s": phases,
        "verl_timing": verl_timing(phases, float(times.mean())),
        "step_costs": _step_costs(sim),
        "weight_sync_parts_s": stages.weight_sync_parts(sim) if sc.execution.weight_sync.kind in ("reshard", "nccl") else None,
        "gpu_utilization": busy,
        "gpu_busy": dict(busy),
        "gpu_active": active,
        "tokens_per_s": gen_tokens / window,
        "pools": {p.name: {"gpus": p.gpus, "roles": list(p.roles)} for p in s.pools},
        "schedule_stats": stats,
    }


def reward_scoring(sim: Simulation) -> dict | None:
    """How the reward model scored (None for a rule reward): whether responses streamed to it during
    generation (``streamed``: a schedule handed it chunks, e.g. OPPO intra-step) and by which strategy
    (``streaming``, ``rlhfsim.sim.streaming``; ``streaming_source``: named by ``models.reward.streaming``
    or the default for its architecture: an encoder takes ``final_only``); whether responses are
    re-tokenized for it; and ``truncated_to_tokens``, the tokens each row is truncated to when prompt +
    response can exceed an absolute-position encoder's positions (None: rows scored whole)."""
    s = sim.setup
    if "reward" not in s.shapes:
        return None
    rm = s.shapes["reward"]
    named = s.scenario.models.reward.streaming is not None
    return {"model": rm.name, "arch": rm.arch, "streamed": "reward" in sim.scorers, "streaming": s.reward_streaming,
            "streaming_source": "models.reward.streaming" if named else f"default for {article(rm.arch)} reward model",
            "retokenize": s.retokenize, "truncated_to_tokens": s.reward_max_tokens}


def generation_runtime(sim: Simulation) -> dict:
    """Which runtime priced generation, and whether the profile had costs of its own for it
    (``fallback``: priced with the plain prefill/decode of our own decoder, no call overhead or handoff)."""
    rt = sim.setup.scenario.generation.resolved_runtime
    own = sim.cost.has_gen_runtime(rt)
    return {"runtime": rt, "fallback": not own and rt != "kv_decoder",
            "call_overhead_s": sim.cost.call_overhead_s(rt), "handoff_s": sim.cost.gen_scalar(rt, "handoff_s"),
            "handoff_per_row_s": sim.cost.gen_scalar(rt, "handoff_per_row_s"),
            "pad_step_s": sim.cost.gen_scalar(rt, "pad_step_s"),
            "pad_step_per_row_s": sim.cost.gen_scalar(rt, "pad_step_per_row_s"),
            "pad_prefill_s": sim.cost.gen_scalar(rt, "pad_prefill_s"),
            "sampling_logprobs": sim.setup.scenario.generation.sampling_logprobs,
            "logprobs_priced": logprob_tail_priced(rt, sim.cost.generation, sim.cost.own_gen_op("decode", rt)),
            # the engine's host work per step and CUDA-graph limit (genruntimes.engine_host; zeros: priced as before)
            "engine_host": dataclasses.asdict(sim.cost.engine_host(rt))}


def pool_utilization(sim: Simulation, t0: float, t1: float) -> tuple[dict[str, float], dict[str, float]]:
    """(busy, active): fractions of each pool's GPU-time in [t0, t1] that its GPUs had work assigned
    (the union of overlapping intervals per GPU) and that they executed kernels (``gpu_busy_active``)."""
    per_gpu: dict[tuple[str, int], list] = defaultdict(list)
    for iv in sim.rec.intervals:
        if iv.pool not in sim.locks or iv.end_s <= t0 or iv.start_s >= t1:
            continue
        a, b = max(iv.start_s, t0), min(iv.end_s, t1)
        span = iv.end_s - iv.start_s
        active = iv.active * (b - a) / span if span > 0 else 0.0  # the clipped share of its kernel time
        for g in range(iv.gpu0, iv.gpu0 + iv.n_gpus):
            per_gpu[(iv.pool, g)].append((a, b, active))
    busy: dict[str, float] = defaultdict(float)
    active: dict[str, float] = defaultdict(float)
    for (pool, _), ivs in per_gpu.items():
        gpu_busy, gpu_active = gpu_busy_active(ivs)
        busy[pool] += gpu_busy
        active[pool] += gpu_active
    span = max(t1 - t0, 1e-12)
    pools = sim.setup.pools
    return ({p.name: busy[p.name] / (p.gpus * span) for p in pools},
            {p.name: active[p.name] / (p.gpus * span) for p in pools})


def gpu_busy_active(ivs: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(busy_s, active_s) of one GPU from its intervals (start_s, end_s, active_s), already clipped to
    the window: busy is the length of the union of [start, end]; active is the sum of the intervals'
    active seconds, capped by busy (overlapping work cannot keep a device more than 100% active)."""
    if not ivs:
        return 0.0, 0.0
    ivs = sorted(ivs)
    busy = 0.0
    cur_s, cur_e = ivs[0][0], ivs[0][1]
    for a, b, _ in ivs[1:]:
        if a > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    busy += cur_e - cur_s
    return busy, min(sum(x[2] for x in ivs), busy)


def _overlap(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop

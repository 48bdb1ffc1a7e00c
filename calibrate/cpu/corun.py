"""Co-running in the hand-over pattern, per generation runtime (``interference`` points of strategy
``handover``; grid field ``Grid.handover``).

The plain ``interference`` points (``calibrate.measuring.bench.measure_interference``) time two loops of our own
decoder that are busy all the time. An intra-step OPPO step does not run like that: the actor generates
with its runtime (HF ``generate()`` calls of one chunk each, or our decoder's steps) and hands each
row's new chunk to a scorer thread at the chunk boundary; the scorer wakes for one short call at a time
and sleeps in between, from the step's first hand-over until the end of its generation (the executor's
``Scorer``: one thread per step's scoring). On a shared CPU both sides slow by more than the busy
loops say (``lab/diagnostics/corun_pattern.py``: a ``generate()`` call 1.45x, a chunk call
2.81x in this pattern against 1.65x for the busy loops, with a scorer thread that owned an OpenMP team
of its own: that team, idle or not, put libgomp's workers past the CPUs, so every worker slept between
parallel regions). So the scorer thread runs one OpenMP thread on a CPU
(``calibrate.cpu.threadpool``), as the executor's does: it owns no team and costs the actor nothing while it
waits; the two still share the cores while it computes, and the host's Python interpreter.

A point ``(runtime, batch b, prompt p, chunk c)``, actor and reward shapes from ``Grid.handover_models``
(default: the first decoder as both):

* **actor interval**: what the actor does between two hand-overs: ``hf_generate`` (and every runtime
  with a ``generate()``): one call of c new tokens at batch b continuing on the previous call's cache,
  as ``calibrate.executor.generation.HfGeneration`` runs it under streaming; ``kv_decoder``: c decode
  steps of b rows (``StaticKVDecoder.extend`` + ``sample_next``, the executor's continuous engine), its
  b rows' boundaries spread evenly over the c steps, as rows admitted at different times have them.
* **scorer call**: one row's chunk as the executor's scorer scores it: a decoder reward model prefills
  the c tokens on that row's cached prefix (batch 1, value head; the prompt was prefilled first,
  untimed); an encoder reward model scores prompt + chunk from scratch (batch 1, the HF model).
* **rounds** (``HANDOVER_ROUNDS``, conditions alternating so drift hits both): ``alone``: ``CALLS``
  intervals with no scorer thread, then the same number of chunk calls with no actor; ``handover``: a
  fresh scorer thread per round, each interval's chunks queued to it as they become ready, the thread
  drained and ended after the round (one step's scoring).

Every actor operation of the kept intervals is stamped on the host clock, and so is every scorer call
(``overlap_fit``): a ``kv_decoder`` decode step, and each decode step inside a ``generate()`` call, from one
forward's start to the next (forward pre-hooks on the model, ``call_steps``: stamped whole, a call is one
operation, which the scorer's calls never cover by half, so no ``generate()`` runtime would get a fit).

Recorded, each with its alone samples (``alone_*``: ``calibrate.measuring.measure.alone_fields``): side
``decode`` (the actor intervals after the first hand-over of each round: the first runs before the
scorer has anything to do, as the step's first chunk does) and side ``prefill`` (the scorer's calls),
``slowdown`` = median beside / median alone (medians: a round of a few calls on a shared CPU now and then
holds a call of seconds, which a trimmed mean of 15 samples keeps). The profile keeps them per generation runtime
(``interference.handover``, ``calibrate.fitting.assemble.interference_summary``) with a fit of the time the pattern
adds to one operation by its model's layers and its time alone (``added``,
``calibrate.fitting.assemble.handover_added_fit``), and the simulator applies that fit (else the slowdowns) over
the window in which a scorer is live beside generation (``rlhfsim.sim.simulation``), since that is
the window they were measured over.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time

import numpy as np

import torch

from calibrate.measuring.decoder import sample_next
from calibrate.measuring.genbench import runtime_key
from calibrate.genruntimes import GEN_RUNTIMES_IMPL, left_pad
from calibrate.measuring.measure import Clock, Measurement, alone_fields, summarize
from calibrate.running.session import Session, point_key
from calibrate.cpu.threadpool import one_thread_here, scorer_threads
from rlhfsim.models.catalog import ModelShape

HANDOVER_ROUNDS = 3
CALLS = 6          # actor intervals per round (the first of a handover round is not kept)
SIDES = ("decode", "prefill")


def _omp_tag(s: Session) -> str:
    """``:omp1`` in a point's strategy when its scorer thread ran one OpenMP thread (on a CPU),
    so a journal or cached calibration whose scorer thread owned a team is measured again."""
    return ":omp1" if scorer_threads(torch.device(s.device).type == "cuda") == 1 else ""   # s.device: tests pass a namespace


def _steps_tag(rt: str) -> str:
    """``:steps`` in a point's strategy when a ``generate()`` runtime's calls were stamped per decode step
    (``call_steps``), so a journal whose calls were stamped whole, and so gave no ``overlap_fit``, is
    measured again."""
    return "" if rt == "kv_decoder" else ":steps"


def _strategy_tag(s: Session, rt: str) -> str:
    """The tags a hand-over point's strategy ends with (``_omp_tag``, ``_steps_tag``): its keys
    (``handover_keys``) and its recorded fields (``measure_handover``) alike."""
    return _omp_tag(s) + _steps_tag(rt)


def handover_keys(s: Session, rt: str, actor: ModelShape, reward: ModelShape, b: int, p: int, c: int) -> dict[str, str]:
    tag = _strategy_tag(s, rt)
    return {"decode": point_key("interference", actor.name, s.dtype, batch=b, seq_len=c, prefix_len=p, head="lm",
                                runtime=rt, strategy=f"handover:{reward.name}{tag}"),
            "prefill": point_key("interference", reward.name, s.dtype, batch=1, seq_len=c, prefix_len=p,
                                 head="value", runtime=rt, strategy=f"handover:{actor.name}:b{b}{tag}")}


class _Actor:
    """One actor interval at a time (module docstring); ``begin()`` starts a round from the prompts."""

    def __init__(self, s: Session, rt: str, shape: ModelShape, b: int, p: int, c: int, max_len: int):
        self.s, self.b, self.c = s, b, c
        # kv_decoder: the rows whose chunk boundary falls on each of an interval's c steps, spread evenly
        self.due: dict[int, list[int]] = {}
        for i in range(b):
            self.due.setdefault((i * c) // b, []).append(i)
        g = torch.Generator().manual_seed(43 * b + p)
        prompts = torch.randint(1, shape.vocab, (b, p), generator=g).tolist()
        self.ids0, self.mask0 = left_pad(prompts, s.device)
        if rt == "kv_decoder":
            self.dec = s.decoder(shape, "lm", b, max_len)
            self.slots = torch.arange(b)
            self.rng = torch.Generator(device=s.device).manual_seed(0)
            self.model = None
        else:
            self.model = s.hf_model(shape, "lm")
            self.rt = GEN_RUNTIMES_IMPL[rt]()
            self.rt.load(self.model, shape, max_batch=b, max_len=max_len)
            # each forward's start on the host clock: a call's decode steps, one for one (``interval``)
            self.starts: list[float] = []
            self.hook = self.model.register_forward_pre_hook(lambda module, args: self.starts.append(time.perf_counter()))

    def begin(self) -> None:
        if self.model is None:
            self.dec.reset(self.slots)
            toks, _ = sample_next(self.dec.extend(self.slots, self.ids0), self.rng)
            self.last = torch.tensor(toks, device=self.s.device).view(-1, 1)
        else:
            self.seq, self.mask, self.state = self.ids0, self.mask0, None

    def interval(self, hand, ops: list | None = None) -> None:
        """c tokens per row; ``hand(row)`` at each row's chunk boundary. ``ops``: each of the actor's
        operations gets its (start, end) on the host clock appended (``kv_decoder``: every decode step,
        ``sample_next`` included; a runtime with a ``generate()``: each decode step of the call, from
        forward hooks, ``call_steps``)."""
        now = time.perf_counter
        if self.model is None:
            for j in range(self.c):
                t0 = now()
                toks, _ = sample_next(self.dec.extend(self.slots, self.last), self.rng)
                self.last = torch.tensor(toks, device=self.s.device).view(-1, 1)
                if ops is not None:
                    ops.append((t0, now()))
                for i in self.due.get(j, ()):
                    hand(i)
            return
        self.starts.clear()
        t0 = now()
        gen = self.rt.generate(self.seq, self.mask, self.c, state=self.state, keep_state=True)
        gen.sequences[:, -self.c:].tolist()    # the new tokens, handed to the host
        if ops is not None:
            ops.extend(call_steps(t0, self.starts, now(), self.c))
        self.seq, self.mask, self.state = gen.sequences, gen.mask, gen.state
        for i in range(self.b):
            hand(i)

    def close(self) -> None:
        if self.model is not None:
            self.hook.remove()
            self.rt.unload()


def call_steps(t0: float, starts: list[float], t1: float, steps: int) -> list[tuple[float, float]]:
    """A ``generate()`` call of ``steps`` new tokens that began at ``t0`` and ended at ``t1`` (its tokens on
    the host), as its decode steps: from each forward's start to the next one's, the last to the call's end
    (the sampling tail and the host's work between forwards belong to the step before). The call's setup
    before its first forward is in no step. A call whose forwards were not seen one per token (a runtime
    that runs them elsewhere, or a hook that did not fire) is one operation, ``(t0, t1)``."""
    if len(starts) != steps or not starts:
        return [(t0, t1)]
    return [(a, b) for a, b in zip(starts, [*starts[1:], t1])]


class _Scorer:
    """One row's chunk per call (module docstring)."""

    def __init__(self, s: Session, shape: ModelShape, b: int, p: int, c: int, max_len: int):
        self.c = c
        g = torch.Generator().manual_seed(47 * p + c)
        self.prompt = torch.randint(1, shape.vocab, (1, p), generator=g).to(s.device)
        self.chunk = torch.randint(1, shape.vocab, (1, c), generator=g).to(s.device)
        self.encoder = shape.arch == "encoder"
        if self.encoder:
            self.model = s.hf_model(shape, "value")
            self.whole = torch.cat([self.prompt, self.chunk], 1)
        else:
            self.dec = s.decoder(shape, "value", b, max_len)
            self.max_len = max_len

    def call(self, row: int) -> None:
        if self.encoder:
            self.model(input_ids=self.whole).logits.float().tolist()
            return
        slot = torch.tensor([row])
        self.dec.extend(slot, self.chunk).float().tolist()

    def prepare(self, row: int) -> None:
        """Untimed: an empty slot gets its prompt; a full one starts again."""
        if self.encoder:
            return
        slot = torch.tensor([row])
        if int(self.dec.positions[row]) + self.c > self.max_len - 1:
            self.dec.reset(slot)
        if int(self.dec.positions[row]) == 0:
            self.dec.extend(slot, self.prompt)


def _round_alone(actor: _Actor, scorer: _Scorer, clock: Clock, out: dict, ops: list | None = None) -> None:
    """``ops``: the (start, end) of the actor's operations after the first interval (``_Actor.interval``)."""
    actor.begin()
    for k in range(CALLS):
        mine: list = []
        t = clock.call(lambda: actor.interval(lambda i: None, mine))[0]
        if k:
            out["decode"].append(t)
            if ops is not None:
                ops.extend(mine)
    for k in range(CALLS * actor.b):
        row = k % actor.b
        scorer.prepare(row)
        out["prefill"].append(clock.call(lambda: scorer.call(row))[0])


def _round_handover(actor: _Actor, scorer: _Scorer, clock: Clock, out: dict, device: str,
                    stamps: dict | None = None) -> None:
    """``stamps``: ``ops``, the (start, end) of the actor's operations after the first interval, and ``calls``,
    of every scorer call, on the host clock (``overlap_fit``)."""
    q: queue.Queue = queue.Queue()
    errors: list[BaseException] = []
    calls: list[float] = []
    spans: list[tuple[float, float]] = []

    def serve():
        if scorer_threads(clock.cuda) == 1:
            one_thread_here()    # as the executor's Scorer thread runs on a CPU
        stream = torch.cuda.Stream(torch.device(device)) if clock.cuda else None
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with ctx, torch.inference_mode():
            while True:
                row = q.get()
                try:
                    if row is None:
                        return
                    if not errors:
                        scorer.prepare(row)
                        t0 = time.perf_counter()
                        calls.append(clock.call(lambda: scorer.call(row))[0])
                        spans.append((t0, time.perf_counter()))
                except BaseException as e:  # re-raised in the caller's thread
                    errors.append(e)
                finally:
                    q.task_done()

    thread = None

    def hand(i: int) -> None:
        nonlocal thread
        if thread is None:   # the step's first hand-over starts its scorer thread (executor's Scorer)
            thread = threading.Thread(target=serve, daemon=True)
            thread.start()
        q.put(i)

    actor.begin()
    for k in range(CALLS):
        mine: list = []
        t = clock.call(lambda: actor.interval(hand, mine))[0]
        if k:
            out["decode"].append(t)
            if stamps is not None:
                stamps["ops"].extend(mine)
    if thread is not None:
        q.join()
        q.put(None)
        thread.join()
    if errors:
        raise errors[0]
    out["prefill"].extend(calls)
    if stamps is not None:
        stamps["calls"].extend(spans)


OVERLAP_MIN_OPS = 12     # actor operations a fit of ``overlap_fit`` needs
OVERLAP_SPAN = (0.1, 0.5)   # ... at least one of them overlapped at most this much by scorer calls, one at least this much


def _overlapped(t0: float, t1: float, calls: list[tuple[float, float]]) -> float:
    """Seconds of [t0, t1] during which a scorer call ran (the scorer runs one call at a time)."""
    return sum(max(0.0, min(t1, c1) - max(t0, c0)) for c0, c1 in calls)


def overlap_fit(alone_ops: list[tuple[float, float]], ops: list[tuple[float, float]],
                calls: list[tuple[float, float]]) -> dict | None:
    """The actor's speed beside an idle and beside a computing scorer, from one point's hand-over rounds.

    Each actor operation of the hand-over rounds (``_Actor.interval``: a decode step, or a ``generate()`` call)
    took ``T`` seconds, ``B`` of which a scorer call ran; alone the same operations took ``A`` seconds on
    average (trimmed mean). If the actor runs at ``1 / idle_x`` of its alone speed while the scorer waits and
    at ``1 / busy_x`` while it computes, ``(T - B) / idle_x + B / busy_x = A``, that is
    ``(T - B) / A = idle_x - (idle_x / busy_x) B / A``: a least-squares line through the operations'
    (B / A, (T - B) / A), in seconds, so that the operations' total time weighs as a step's does. On the
    2-core VM the actor took 1.00-1.11x its alone time while the scorer waited and lost 0.56-0.89 of each
    call's time while it computed, more the smaller the actor (tiny-qwen2 0.75-0.89 beside scorers of
    0.6-4.8M parameters, small-qwen2 0.56; ``lab/diagnostics/handover_overlap.py``): the scorer's
    busy time, not its mere presence, is what costs the actor.

    Returns ``{idle_x, busy_x, duty, n_ops, alone_op_s}`` (both factors at least 1, ``busy_x`` at least
    ``idle_x``; ``duty`` the share of the operations' time a call ran), or None with fewer than
    ``OVERLAP_MIN_OPS`` operations, without one operation at most ``OVERLAP_SPAN[0]`` and one at least
    ``OVERLAP_SPAN[1]`` overlapped (a line through a narrow span says nothing of its ends), or where the line
    does not fall with the overlap (the actor made no progress at all beside a call, or noise)."""
    from calibrate.measuring.measure import trimmed_mean

    if len(ops) < OVERLAP_MIN_OPS or not alone_ops:
        return None
    a = trimmed_mean([t1 - t0 for t0, t1 in alone_ops])
    if not a > 0:
        return None
    dur = np.array([t1 - t0 for t0, t1 in ops])
    over = np.array([_overlapped(t0, t1, calls) for t0, t1 in ops])
    f = over / np.maximum(dur, 1e-12)
    if f.min() > OVERLAP_SPAN[0] or f.max() < OVERLAP_SPAN[1]:
        return None
    slope, intercept = np.polyfit(over / a, (dur - over) / a, 1)   # intercept idle_x, slope -idle_x / busy_x
    if not (intercept > 0 and slope < 0):
        return None       # no progress beside a call (or noise): not this model
    idle = max(1.0, float(intercept))
    busy = max(idle, float(-intercept / slope))
    return {"idle_x": idle, "busy_x": busy, "duty": float(np.sum(over) / np.sum(dur)), "n_ops": int(len(ops)),
            "alone_op_s": float(a)}


def handover_rounds(s, rt: str, actor: ModelShape, reward: ModelShape, b: int, p: int, c: int,
                    rounds: int = HANDOVER_ROUNDS) -> tuple[dict, dict, dict, dict | None]:
    """One point pair's rounds (module docstring): a warm-up round of each condition, then ``rounds`` alone
    and hand-over rounds alternating. Returns the (alone, beside, warm-up) samples per side and, on a CPU,
    ``overlap_fit`` of the rounds' stamps (on a GPU both sides' work is queued: the host's clock does not
    say when either computes). ``s``: what a calibration session gives (``device``, ``decoder``,
    ``hf_model``)."""
    max_len = p + c * (CALLS + 2) + 2
    clock = Clock(s.device)
    a = _Actor(s, rt, actor, b, p, c, max_len)
    sc = _Scorer(s, reward, b, p, c, max_len)
    try:
        with torch.inference_mode():
            warm = {"decode": [], "prefill": []}
            _round_alone(a, sc, clock, warm)      # first calls, allocations, compilation
            _round_handover(a, sc, clock, warm, s.device)
            alone = {"decode": [], "prefill": []}
            beside = {"decode": [], "prefill": []}
            alone_ops: list = []
            stamps: dict = {"ops": [], "calls": []}
            for _ in range(rounds):
                _round_alone(a, sc, clock, alone, alone_ops)
                _round_handover(a, sc, clock, beside, s.device, stamps)
            ov = None if clock.cuda else overlap_fit(alone_ops, stamps["ops"], stamps["calls"])
            return alone, beside, warm, ov
    finally:
        a.close()


def measure_handover(s: Session, rt: str, actor: ModelShape, reward: ModelShape, b: int, p: int, c: int) -> None:
    """One hand-over point pair (module docstring); skipped with the reason when the runtime is not
    valid for ``actor`` in this calibration (its check journaled invalid, or not run)."""
    keys = handover_keys(s, rt, actor, reward, b, p, c)
    if s.all_done(list(keys.values())):
        return
    tag = _strategy_tag(s, rt)
    base = {"op": "interference", "runtime": rt, "chunk": c, "corun_pattern": "handover",
            "scorer_threads": 1 if _omp_tag(s) else None}
    fields = {"decode": {**base, "model": actor.name, "shape": actor.to_dict(), "head": "lm", "batch": b,
                         "seq_len": c, "prefix_len": p, "tokens": b * c, "side": "decode", "partner": reward.name,
                         "strategy": f"handover:{reward.name}{tag}"},
              "prefill": {**base, "model": reward.name, "shape": reward.to_dict(), "head": "value", "batch": 1,
                          "seq_len": c, "prefix_len": p, "tokens": c, "side": "prefill", "partner": actor.name,
                          "strategy": f"handover:{actor.name}:b{b}{tag}", "partner_batch": b}}
    if rt != "kv_decoder":
        known = s.journal.get(runtime_key(rt, actor.name))
        if known is None:
            why = f"generation runtime {rt} not checked on {actor.name} in this calibration"
        elif not known.get("valid"):
            why = known.get("reason") or f"generation runtime {rt} invalid on {actor.name}"
        else:
            why = None
        if why:
            for side in SIDES:
                if s.pending(keys[side]):
                    s.record(keys[side], fields[side], skipped=why)
            return
    alone, beside, warm, ov = s.guarded(lambda: handover_rounds(s, rt, actor, reward, b, p, c))

    for side in SIDES:
        if not s.pending(keys[side]):
            continue
        first = warm[side][0] if warm[side] else 0.0
        a = Measurement(alone[side], first)
        timing = summarize(beside[side], first)
        extra = {"overlap": ov} if side == "decode" and ov is not None else {}
        s.record(keys[side], {**fields[side], **alone_fields(a), "slowdown": timing["median_s"] / a.median_s,
                              "rounds": HANDOVER_ROUNDS, **extra}, timing=timing)
    s.free()



def handover_plan(grid, models: list[ModelShape], actors: list[ModelShape]) -> list[tuple]:
    """``Grid.handover`` with its model names resolved: (runtime, actor shape, reward shape, batch, prompt,
    chunk). "" is the first actor decoder (actor) or the first decoder (reward); none without a decoder."""
    from rlhfsim.errors import RlhfsimError

    decoders = [m for m in models if m.arch == "decoder"]
    if not decoders or not actors:
        return []
    by_name = {m.name: m for m in models}
    out = []
    for rt, a, r, b, p, c in grid.handover:
        for name, role in ((a, "actor"), (r, "reward")):
            if name and name not in by_name:
                raise RlhfsimError(f"grid.handover: expected a calibrated model as the {role}, got {name!r} "
                                   f"(calibrated: {', '.join(sorted(by_name))})")
        actor = by_name[a] if a else actors[0]
        if actor.arch != "decoder":
            raise RlhfsimError(f"grid.handover: expected a decoder as the actor, got {actor.name!r} ({actor.arch})")
        out.append((rt, actor, by_name[r] if r else decoders[0], b, p, c))
    return out

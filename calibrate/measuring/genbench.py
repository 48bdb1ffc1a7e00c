"""Generation-runtime measurements (runtimes: ``calibrate.genruntimes``; grid: ``Grid.gen_*``, ``handoff``).

Per runtime and decoder model, after the correctness check (``calibrate.genruntimes.base.check_runtime``,
journaled as a ``runtime`` record with ``family: generation``; an invalid or unavailable runtime is
journaled with its reason and its points are not measured):

* ``prefill`` (batch, prompt n), field ``runtime`` = RT: one ``generate()`` call producing one new token
  on ``batch`` prompts of ``n`` tokens, its token handed to the host. Inside the call a ``ForwardProbe``
  times the forward through to the sampled token (forward pre-hook to the first stopping-criteria call).
  The point's samples are those in-call times (what ``prefill:RT`` prices); ``call_samples_s`` keeps the
  whole calls, and ``call_overhead_s`` = trimmed mean of the calls - trimmed mean of the in-call times:
  the host cost of a ``generate()`` call beyond its forward and sampling (argument handling, the cache
  and logits-processor set-up, the output). Runtimes without a forward hook (vllm, sglang) keep the whole
  calls as samples and no call overhead.
* ``decode`` (batch, context c): calls of 1 and 1 + K new tokens (K = ``gen_decode_steps``, sampling,
  ``min_new_tokens`` = the count so EOS never ends one early) on the same prompts of
  c0 = c - (K - 1) // 2 tokens, measured in pairs; each sample is (t_long - t_short) / K, one decode step
  with its sampling and stopping checks. Step j of the K has c0 + j - 1 cached tokens per row, so the
  point's ``prefix_len`` is their mean c0 + (K - 1) / 2, the form the ``decode`` fit prices. Raw call
  times: ``short_samples_s``, ``long_samples_s``.
* ``handoff`` (batch, prompt p, N, k): N new tokens in N/k calls of k, each continuing on the previous
  call's cache and copying its k new tokens per row to the host, against one call of N tokens (its
  tokens copied once), in pairs; each sample is (t_chunked - t_one) / (N/k - 1), the cost of one chunk
  boundary. Raw: ``one_samples_s``, ``chunked_samples_s``. ``assemble`` fits
  handoff_s + handoff_per_row_s x batch to these points.
* ``pad`` (batch, prompt width n; runtimes that take an attention mask, ``GenRuntime.LEFT_PADDED``): the
  ``decode`` pair (calls of 1 and 1 + K new tokens) on uniform prompts of n tokens and on left-padded
  prompts of the same width (real lengths from n down to n/2, ``pad_lengths``), in one round; each sample
  is ((t_long - t_short) padded - (t_long - t_short) uniform) / K, what a left-padded batch adds to
  each decode step (HF builds and applies the padding mask at every step, where a batch without padding
  runs unmasked causal attention). Raw: ``short_samples_s``, ``long_samples_s``,
  ``padded_short_samples_s``, ``padded_long_samples_s``; ``prefill_pad_s``: what padding adds to the
  one-token call (the prefill). ``assemble`` fits pad_step_s + pad_step_per_row_s x batch to the samples
  and takes the median ``prefill_pad_s`` as pad_prefill_s.

Timing: host clock, the device synchronized before each reading. A point: one first round timed on its
own (compilation lands there), ``warmup`` rounds, then rounds until ``min_iters`` are taken and their
durations sum past ``gen_point_budget_s`` (default ``point_budget_s``; at most ``max_iters``), in
``bursts`` bursts ``burst_gap_s`` apart. ``kv_decoder`` measures nothing here: its prefill and decode are the plain points
(``calibrate.measuring.bench``) and it has no call boundary.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

from calibrate.genruntimes import GEN_RUNTIMES_IMPL, GenRuntime, GumbelNoise, check_prompts, check_runtime, eager_greedy
from calibrate.genruntimes.base import CHECK_TOKENS, left_pad
from calibrate.genruntimes.hf_generate import ForwardProbe
from calibrate.measuring.measure import summarize, trimmed_mean
from calibrate.running.session import Session, point_key
from rlhfsim.models.catalog import ModelShape

CHECK_BATCH = 4
NO_POINTS = ("kv_decoder",)   # measured as the plain prefill/decode operations


@dataclass(frozen=True)
class GenPoint:
    """One generation-runtime point: ``op`` prefill|decode|handoff, ``batch`` rows of ``prompt`` tokens,
    ``new_tokens`` per row in the (longer) call, ``chunk`` tokens per call (handoff), ``context`` the
    grid's mean context (decode)."""

    op: str
    batch: int
    prompt: int
    new_tokens: int
    chunk: int = 0
    context: int = 0

    def key(self, runtime: str, model: str, dtype: str) -> str:
        if self.op == "prefill":
            return point_key("prefill", model, dtype, batch=self.batch, seq_len=self.prompt, head="lm", runtime=runtime)
        if self.op == "decode":
            return point_key("decode", model, dtype, batch=self.batch, seq_len=1, prefix_len=self.context,
                             head="lm", runtime=runtime)
        if self.op == "pad":
            return point_key("pad", model, dtype, batch=self.batch, seq_len=1, prefix_len=self.prompt,
                             head="lm", runtime=runtime, strategy=f"n{self.new_tokens}")
        return point_key("handoff", model, dtype, batch=self.batch, seq_len=self.chunk, prefix_len=self.prompt,
                         head="lm", runtime=runtime, strategy=f"n{self.new_tokens}")

    def fields(self, runtime: str, shape: ModelShape) -> dict:
        f = {"op": self.op, "model": shape.name, "shape": shape.to_dict(), "head": "lm", "runtime": runtime,
             "batch": self.batch}
        if self.op == "prefill":
            return {**f, "seq_len": self.prompt, "prefix_len": 0, "tokens": self.batch * self.prompt, "new_tokens": 1}
        if self.op == "decode":
            k = self.new_tokens - 1
            return {**f, "seq_len": 1, "prefix_len": self.prompt + (k - 1) / 2, "tokens": self.batch,
                    "context": self.context, "prompt_len": self.prompt, "steps": k}
        if self.op == "pad":
            k = self.new_tokens - 1
            return {**f, "strategy": f"n{self.new_tokens}", "seq_len": 1, "prefix_len": self.prompt + (k - 1) / 2,
                    "tokens": self.batch, "prompt_len": self.prompt, "steps": k,
                    "padded_lengths": pad_lengths(self.batch, self.prompt)}
        return {**f, "strategy": f"n{self.new_tokens}", "seq_len": self.chunk, "prefix_len": self.prompt,
                "tokens": self.batch * self.new_tokens, "new_tokens": self.new_tokens, "chunk": self.chunk,
                "boundaries": self.new_tokens // self.chunk - 1}


def pad_lengths(batch: int, width: int) -> list[int]:
    """The real prompt lengths of a ``pad`` point's left-padded batch: from ``width`` (row 0, which sets
    the width) evenly down to half of it (the last row), as prompts of one dataset vary."""
    if batch < 2:
        return [width]
    return [width - (i * (width // 2)) // (batch - 1) for i in range(batch)]


def runtime_points(grid, compiled: bool, left_padded: bool = False, host: bool = True) -> list[GenPoint]:
    """Every point a runtime measures on one model (compiled runtimes: only ``gen_compiled_batch``;
    ``pad`` points only for a runtime that takes an attention mask, ``GenRuntime.LEFT_PADDED``; ``host``:
    the handoff and pad points too, on the grid's first ``gen_host_models`` decoders)."""
    k = grid.gen_decode_steps
    pts = [GenPoint("prefill", b, n, 1) for b, n in grid.gen_prefill]
    pts += [GenPoint("decode", b, max(1, c - (k - 1) // 2), 1 + k, context=c) for b, c in grid.gen_decode]
    if host:
        pts += [GenPoint("handoff", b, p, n, chunk=c) for b, p, n, c in grid.handoff]
    if left_padded and host:
        pts += [GenPoint("pad", b, n, 1 + k) for b, n in grid.gen_pad]
    if compiled and grid.gen_compiled_batch is not None:
        pts = [p for p in pts if p.batch == grid.gen_compiled_batch]
    return pts


def plan(grid, decoders: list[ModelShape]) -> list[tuple[str, ModelShape, list[GenPoint]]]:
    """(runtime, model, points) in measuring order: models outer, runtimes inner."""
    out = []
    for i, shape in enumerate(decoders):
        for name in grid.gen_runtimes:
            compiled = GEN_RUNTIMES_IMPL[name].COMPILED
            if compiled and grid.gen_compiled_models is not None and i >= grid.gen_compiled_models:
                continue
            impl = GEN_RUNTIMES_IMPL[name]
            host = grid.gen_host_models is None or i < grid.gen_host_models
            out.append((name, shape, [] if name in NO_POINTS else runtime_points(grid, compiled, impl.LEFT_PADDED, host)))
    return out


def plan_size(grid, decoders: list[ModelShape]) -> int:
    return sum(len(pts) for _, _, pts in plan(grid, decoders))


def runtime_key(name: str, model: str) -> str:
    return f"genruntime|{name}|{model}"


# -- timing ---------------------------------------------------------------------------------------------
def _now(device: str) -> float:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def rounds(s: Session, one_round: Callable[[], tuple], cost: Callable[[tuple], float] = sum) -> tuple[list[tuple], tuple]:
    """(timed rounds, the first round) under the grid's discipline (see the module docstring); ``cost``
    of a round: the wall time it counts against the budget."""
    g = s.grid
    first = one_round()
    for _ in range(g.warmup):
        one_round()
    bursts = max(1, min(int(g.bursts), g.max_iters))
    out: list[tuple[float, ...]] = []
    for k in range(bursts):
        if k:
            time.sleep(g.burst_gap_s)
            one_round()            # re-warm after the pause, untimed
        hi, lo = math.ceil(g.max_iters / bursts), math.ceil(g.min_iters / bursts)
        total = g.point_budget_s if g.gen_point_budget_s is None else g.gen_point_budget_s
        budget, spent, taken = total / bursts, 0.0, 0
        while taken < hi and len(out) < g.max_iters:
            r = one_round()
            out.append(r)
            taken += 1
            spent += cost(r)
            if taken >= lo and spent >= budget:
                break
    return out, first


def _prompts(shape: ModelShape, batch: int, n: int, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, shape.vocab, (batch, n), generator=g).to(device)
    return ids, torch.ones_like(ids)


def _prefill_round(rt: GenRuntime, probe: ForwardProbe | None, ids, mask, device: str):
    def one():
        stopping = ()
        if probe is not None:
            probe.reset()
            stopping = (probe,)
        t0 = _now(device)
        gen = rt.generate(ids, mask, 1, stopping=stopping)
        gen.sequences[:, -1].tolist()
        t1 = _now(device)
        return t1 - t0, probe.elapsed_s() if probe is not None else None
    return one


def _decode_round(rt: GenRuntime, ids, mask, steps: int, device: str):
    def one():
        t0 = _now(device)
        rt.generate(ids, mask, 1).sequences[:, -1:].tolist()
        t1 = _now(device)
        rt.generate(ids, mask, 1 + steps).sequences[:, ids.shape[1]:].tolist()
        return t1 - t0, _now(device) - t1
    return one


def _handoff_round(rt: GenRuntime, ids, mask, n: int, k: int, device: str):
    width = ids.shape[1]

    def one():
        t0 = _now(device)
        rt.generate(ids, mask, n).sequences[:, width:].tolist()
        t1 = _now(device)
        seq, m, state = ids, mask, None
        for c in range(n // k):
            gen = rt.generate(seq, m, k, state=state, keep_state=c < n // k - 1)
            gen.sequences[:, -k:].tolist()          # the chunk's new tokens, handed downstream
            seq, m, state = gen.sequences, gen.mask, gen.state
        return t1 - t0, _now(device) - t1
    return one


def _pad_round(rt: GenRuntime, uniform: tuple, padded: tuple, steps: int, device: str):
    """Calls of 1 and 1 + ``steps`` new tokens on uniform prompts, then the same on left-padded prompts of
    the same width: (short, long, short padded, long padded)."""
    def one():
        out = []
        for ids, mask in (uniform, padded):
            t0 = _now(device)
            rt.generate(ids, mask, 1).sequences[:, -1:].tolist()
            t1 = _now(device)
            rt.generate(ids, mask, 1 + steps).sequences[:, ids.shape[1]:].tolist()
            out += [t1 - t0, _now(device) - t1]
        return tuple(out)
    return one


def _left_padded(shape: ModelShape, batch: int, width: int, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(1, shape.vocab, (n,), generator=g).tolist() for n in pad_lengths(batch, width)]
    return left_pad(rows, device)


def measure_point(s: Session, rt: GenRuntime, shape: ModelShape, pt: GenPoint, probe: ForwardProbe | None) -> None:
    key, fields = pt.key(rt.NAME, shape.name, s.dtype), pt.fields(rt.NAME, shape)
    if not s.pending(key):
        return
    if pt.op == "handoff" and (pt.chunk < 1 or pt.new_tokens % pt.chunk or pt.new_tokens // pt.chunk < 2):
        s.record(key, fields, skipped=f"handoff needs N a multiple of k with N/k >= 2, "
                                      f"got N={pt.new_tokens}, k={pt.chunk}")
        return
    if pt.op == "pad" and pt.batch < 2:
        s.record(key, fields, skipped=f"pad needs a batch of 2 rows or more (one row has nothing to pad), got {pt.batch}")
        return
    ids, mask = _prompts(shape, pt.batch, pt.prompt, s.device, 7 * pt.batch + pt.prompt)
    one = {"prefill": lambda: _prefill_round(rt, probe, ids, mask, s.device),
           "decode": lambda: _decode_round(rt, ids, mask, pt.new_tokens - 1, s.device),
           "handoff": lambda: _handoff_round(rt, ids, mask, pt.new_tokens, pt.chunk, s.device),
           "pad": lambda: _pad_round(rt, (ids, mask), _left_padded(shape, pt.batch, pt.prompt, s.device, 19 * pt.batch + pt.prompt),
                                     pt.new_tokens - 1, s.device)}[pt.op]()
    cost = (lambda r: r[0]) if pt.op == "prefill" else sum    # the in-call time lies inside the call
    try:
        taken, first = s.guarded(lambda: rounds(s, one, cost))
    except torch.cuda.OutOfMemoryError as e:
        s.free()
        s.record(key, fields, skipped=f"out of memory ({str(e).splitlines()[0][:120]})")
        return
    except Exception as e:  # noqa: BLE001 - a runtime failing on one shape is journaled, never faked
        s.record(key, fields, skipped=f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        return
    a = [r[0] for r in taken]
    b = [r[1] for r in taken]
    if pt.op == "prefill":
        if probe is not None and None not in b and first[1] is not None:
            fields.update(call_samples_s=a, call_tmean_s=trimmed_mean(a), call_first_s=first[0],
                          call_overhead_s=trimmed_mean(a) - trimmed_mean(b),
                          timed="forward and sampling inside generate()")
            timing = summarize(b, first[1])
        else:
            fields.update(call_samples_s=a, call_overhead_s=None, timed="the whole generate() call")
            timing = summarize(a, first[0])
    elif pt.op == "pad":
        k = pt.new_tokens - 1
        c = [r[2] for r in taken]
        d = [r[3] for r in taken]
        fields.update(short_samples_s=a, long_samples_s=b, padded_short_samples_s=c, padded_long_samples_s=d,
                      prefill_pad_s=trimmed_mean(c) - trimmed_mean(a))
        timing = summarize([((w - z) - (y - x)) / k for x, y, z, w in zip(a, b, c, d)],
                           ((first[3] - first[2]) - (first[1] - first[0])) / k)
    elif pt.op == "decode":
        k = pt.new_tokens - 1
        fields.update(short_samples_s=a, long_samples_s=b)
        timing = summarize([(y - x) / k for x, y in zip(a, b)], (first[1] - first[0]) / k)
    else:
        nb = pt.new_tokens // pt.chunk - 1
        fields.update(one_samples_s=a, chunked_samples_s=b)
        timing = summarize([(y - x) / nb for x, y in zip(a, b)], (first[1] - first[0]) / nb)
    s.record(key, fields, timing=timing)


# -- one runtime on one model ---------------------------------------------------------------------------
def _skip_points(s: Session, name: str, shape: ModelShape, pts: list[GenPoint], why: str) -> None:
    for pt in pts:
        s.progress.advance(f"{pt.op} {shape.name} {name}: {why}", skipped=True)


def _error(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:200]}" if msg else type(e).__name__


class _References:
    """Eager greedy references per (check batch, with noise) for one model, computed on first use."""

    def __init__(self, model, shape: ModelShape, device: str):
        self.model, self.shape, self.device = model, shape, device
        self.cache: dict[tuple[int, bool], tuple] = {}

    def get(self, batch: int, noisy: bool):
        k = (batch, noisy)
        if k not in self.cache:
            ids, mask = check_prompts(self.shape.vocab, batch, self.device)
            noise = GumbelNoise(CHECK_TOKENS, batch, self.shape.vocab, self.device) if noisy else None
            toks, logits = eager_greedy(self.model, ids, mask, CHECK_TOKENS, noise)
            self.cache[k] = (ids, mask, noise, toks, logits)
        return self.cache[k]


def measure_runtime_model(s: Session, name: str, shape: ModelShape, pts: list[GenPoint], model,
                          refs: _References) -> None:
    """The check and the points of runtime ``name`` on one model (see the module docstring)."""
    rkey = runtime_key(name, shape.name)
    known = s.journal.get(rkey)
    if known is not None and not known["valid"]:
        _skip_points(s, name, shape, pts, known["reason"])
        return
    if known is not None and s.all_done([p.key(name, shape.name, s.dtype) for p in pts]):
        return
    rt = GEN_RUNTIMES_IMPL[name]()
    base = {"kind": "runtime", "family": "generation", "key": rkey, "runtime": name, "model": shape.name,
            "semantics": rt.semantics}
    ok, why = rt.available(s.device)
    if not ok:
        s.journal.append({**base, "available": False, "valid": False, "reason": why, "tokens_match_eager": None})
        s.progress.note(f"generation runtime {name} skipped on {shape.name}: {why}")
        _skip_points(s, name, shape, pts, why)
        return
    g = s.grid
    cb = g.gen_compiled_batch if rt.COMPILED and g.gen_compiled_batch is not None else CHECK_BATCH
    ids, mask, noise, ref_toks, ref_logits = refs.get(cb, noisy=rt.TAKES_PROCESSORS)
    lens = [p.prompt + p.new_tokens for p in pts] + [ids.shape[1] + CHECK_TOKENS]
    t0 = time.perf_counter()
    try:
        rt.load(model, shape, max_batch=max([p.batch for p in pts] + [cb]), max_len=max(lens) + 1)
        load_s = time.perf_counter() - t0
        if known is None:
            t1 = time.perf_counter()
            check = check_runtime(rt, ids, mask, ref_toks, ref_logits, s.dtype, noise)
            rec = {**base, "available": True, **check, "load_s": load_s, "check_s": time.perf_counter() - t1}
            s.journal.append(rec)
            if not rec["valid"]:
                s.progress.note(f"generation runtime {name} invalid on {shape.name}: {rec['reason']}")
                _skip_points(s, name, shape, pts, rec["reason"])
                return
        probe = ForwardProbe(s.device) if rt.PROBES_FORWARD else None
        if probe is not None:
            probe.attach(model)
        try:
            for pt in pts:
                measure_point(s, rt, shape, pt, probe)
        finally:
            if probe is not None:
                probe.detach()
    except Exception as e:  # noqa: BLE001 - a runtime that cannot load or compile is invalid, with the reason
        if known is not None or s.journal.get(rkey) is not None:
            raise     # measure_point journals a failing point itself: this is not a load or check failure
        why = _error(e)
        s.journal.append({**base, "available": True, "valid": False, "reason": why, "tokens_match_eager": None})
        s.progress.note(f"generation runtime {name} invalid on {shape.name}: {why}")
        _skip_points(s, name, shape, pts, why)
    finally:
        rt.unload()
        s.free()


def measure_gen_runtimes(s: Session, decoders: list[ModelShape]) -> None:
    """Every generation runtime of the grid on every decoder model (``plan``)."""
    by_model: dict[str, list] = {}
    for name, shape, pts in plan(s.grid, decoders):
        by_model.setdefault(shape.name, []).append((name, shape, pts))
    for jobs in by_model.values():
        keys = [p.key(name, shape.name, s.dtype) for name, shape, pts in jobs for p in pts]
        if all(s.journal.get(runtime_key(name, shape.name)) is not None for name, shape, _ in jobs) and s.all_done(keys):
            continue
        shape = jobs[0][1]
        model = s.hf_model(shape, "lm")
        refs = _References(model, shape, s.device)
        for name, _, pts in jobs:
            measure_runtime_model(s, name, shape, pts, model, refs)
        del model, refs
        s.free()

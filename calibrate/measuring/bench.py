"""Generation, chunked scoring, training and interference measurements.

* ``prefill``: ``StaticKVDecoder(head="lm").extend(slots, ids[batch, n])`` on emptied slots, then
  ``sample_next`` on its logits: time to fill the KV cache with ``batch`` prompts of ``n`` tokens and
  hand each row's first sampled token to the host.
* ``decode``: one iteration of the executor's decode loop (``Generator._decode``) over ``batch`` rows with
  ``prefix_len`` tokens already cached per sequence (the cache is filled once, untimed; each timed step
  rewinds the slots to ``prefix_len``): the input ids built from the rows' last tokens, one ``extend``,
  ``sample_next``, the tokens handed back to the rows. An engine's whole decode step, sampling and host
  bookkeeping included (on a tiny model on a CPU, sampling is ~15% of the step and the host work ~5%).
* ``chunk_prefill``: ``StaticKVDecoder(head="value").extend`` of a ``seq_len``-token chunk on top of a
  ``prefix_len``-token cached prefix (rewound before each call), against one-shot prefill (prefix 0) of
  prefix + chunk tokens; the chunked score is checked against the one-shot score of the same tokens.
* ``train``: forward + backward of an HF model (``*ForCausalLM`` actor with the LM loss, value-head critic
  with a squared loss) over ``batch x n`` tokens; ``optimizer``: ``torch.optim.AdamW.step()`` on its
  gradients, timed separately. Master weights are float32; on CUDA the forward/backward run under
  bfloat16 autocast (mixed precision, as in RLHF trainers); on CPU everything is float32.
* ``interference``: actor decode steps and reward-model chunk prefills first alone, then co-running on
  the same device from two threads (separate CUDA streams on GPU) for a fixed wall time. Each side's
  slowdown = co-running trimmed mean / alone trimmed mean (``calibrate.measuring.measure``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

import torch

from calibrate.measuring.decoder import sample_next
from calibrate.executor.generation import Generator, Sequence
from calibrate.executor.timing import Clock as ExecClock
from calibrate.executor.timing import StepLog
from calibrate.measuring.measure import Clock, alone_fields, summarize, time_calls
from calibrate.running.session import Session, point_key
from rlhfsim.models.catalog import ModelShape

TRAIN_MEMORY_FRACTION = 0.8  # skip training a model whose fp32 weights+grads+AdamW state exceed this


def _ids(s: Session, vocab: int, batch: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (batch, n), generator=g).to(s.device)


def _fields(op: str, shape: ModelShape, head: str, batch: int, seq_len: int, prefix_len: int, tokens: int) -> dict:
    return {"op": op, "model": shape.name, "shape": shape.to_dict(), "head": head, "batch": batch,
            "seq_len": seq_len, "prefix_len": prefix_len, "tokens": tokens}


# -- generation -----------------------------------------------------------------------------------------
def free_bytes(s: Session) -> float:
    """Memory the next decoder's KV cache may use: free device memory on CUDA, available RAM on CPU."""
    if s.cuda:
        return float(torch.cuda.mem_get_info(torch.device(s.device))[0])
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return float("inf")


def cache_groups(needs: list[tuple[int, int]], per_slot_token: float, budget: float) -> list[list[int]]:
    """Split points (slots, tokens per slot) into groups whose shared static cache (max slots x max
    tokens x ``per_slot_token`` bytes) fits ``budget``: large batches and long contexts rarely need one
    cache together. A point that does not fit alone ends up in a group of its own."""
    def split(idx: list[int]) -> list[list[int]]:
        slots = max(needs[i][0] for i in idx)
        length = max(needs[i][1] for i in idx)
        if len(idx) == 1 or slots * length * per_slot_token <= budget:
            return [idx]
        idx = sorted(idx, key=lambda i: (needs[i][1], needs[i][0]))
        half = len(idx) // 2
        return split(idx[:half]) + split(idx[half:])

    return split(list(range(len(needs)))) if needs else []


def grouped_decoders(s: Session, shape: ModelShape, head: str, items: list[tuple[int, int, str, dict]]):
    """Yield (decoder or None, item) for each item (slots, tokens, key, fields) still to measure, building
    one decoder per cache group (``cache_groups``); None when the item alone exceeds the memory budget
    (it is then journaled as skipped)."""
    per_tok = shape.kv_bytes_per_token(s.dtype)
    budget = 0.7 * free_bytes(s) - shape.params(head) * torch.tensor([], dtype=s.tdtype).element_size()
    todo = []
    for it in items:
        if s.journal.has(it[2]):
            s.pending(it[2])  # counted as done
        else:
            todo.append(it)
    for group in cache_groups([(b, n) for b, n, _, _ in todo], per_tok, budget):
        members = [todo[i] for i in group]
        slots, length = max(m[0] for m in members), max(m[1] for m in members)
        if slots * length * per_tok > budget:
            for _, _, key, fields in members:
                s.record(key, fields, skipped=f"KV cache of {slots} x {length} tokens needs "
                         f"{slots * length * per_tok / 2**30:.1f} GiB, over the memory budget")
            continue
        dec = s.decoder(shape, head, slots, length)
        for m in members:
            yield dec, m
        del dec
        s.free()


def measure_generation(s: Session, shape: ModelShape) -> None:
    g = s.grid
    extra = g.max_iters + g.warmup + 2
    items = [(b, n, point_key("prefill", shape.name, s.dtype, batch=b, seq_len=n, head="lm"),
              _fields("prefill", shape, "lm", b, n, 0, b * n)) for b, n in g.prefill]
    items += [(b, c + extra, point_key("decode", shape.name, s.dtype, batch=b, seq_len=1, prefix_len=c, head="lm"),
               _fields("decode", shape, "lm", b, 1, c, b)) for b, c in g.decode]
    if s.all_done([it[2] for it in items]):
        return
    rng = torch.Generator(device=s.device).manual_seed(0)
    for model, (b, _, key, f) in grouped_decoders(s, shape, "lm", items):
        slots = torch.arange(b)
        if f["op"] == "prefill":
            n = f["seq_len"]
            ids = _ids(s, shape.vocab, b, n, 11 * b + n)
            s.measure(key, f, lambda m=model, slots=slots, ids=ids: sample_next(m.extend(slots, ids), rng),
                      setup=lambda m=model, slots=slots: m.reset(slots))
            continue
        c = f["prefix_len"]
        model.reset(slots)
        model.extend(slots, _ids(s, shape.vocab, b, c, 13 * b + c))
        call, rewind = decode_loop(model, slots, c, _ids(s, shape.vocab, b, 1, 17 * b + c)[:, 0].tolist(), s.device)
        s.measure(key, f, call, setup=rewind)


def decode_loop(dec, slots, context: int, first_tokens: list[int], device):
    """(call, rewind): one iteration of the executor's own decode loop (``Generator._decode``: the next input ids
    built from the rows' last tokens, extend, ``sample_next``, the tokens and log-probs appended to the rows) on
    ``dec``, whose rows ``slots`` hold ``context`` cached tokens (prefilled by the caller) and start from
    ``first_tokens``; and the rewind to ``context`` cached tokens to run before every call."""
    gen = Generator(dec, "static", ExecClock(torch.device(device)), seed=0)
    rows = [Sequence(rid=i, group=i, prompt=[], response_len=1 << 40, tokens=[int(t)], slot=i)
            for i, t in enumerate(first_tokens)]
    log = StepLog(0.0)

    def rewind():
        dec.positions[slots] = context
        for r in rows:           # keep the rows (and the step log) from growing without bound
            del r.tokens[1:], r.logprobs[:]
        log.intervals.clear()

    return (lambda: gen._decode(rows, [], log)), rewind


# -- chunked scoring ------------------------------------------------------------------------------------
def measure_chunks(s: Session, shape: ModelShape) -> None:
    items = [(b, p + c, point_key("chunk_prefill", shape.name, s.dtype, batch=b, seq_len=c, prefix_len=p, head="value"),
              _fields("chunk_prefill", shape, "value", b, c, p, b * c)) for b, p, c in s.grid.chunk_points()]
    if s.all_done([it[2] for it in items]):
        return
    for model, (b, _, key, f) in grouped_decoders(s, shape, "value", items):
        p, c = f["prefix_len"], f["seq_len"]
        slots = torch.arange(b)
        full = _ids(s, shape.vocab, b, p + c, 19 * b + p + c)
        model.reset(slots)
        oneshot = model.extend(slots, full).float().cpu()
        chunk = full[:, p:]
        if p:
            model.reset(slots)
            model.extend(slots, full[:, :p])

        def rewind(m=model, slots=slots, p=p):
            m.positions[slots] = p

        s.measure(key, f, lambda m=model, slots=slots, chunk=chunk: m.extend(slots, chunk), setup=rewind,
                  extra=lambda r, ref=oneshot: {"max_abs_diff_vs_oneshot": float((r.output.float().cpu() - ref).abs().max())})


# -- training -------------------------------------------------------------------------------------------
def measure_training(s: Session, shape: ModelShape, head: str) -> None:
    g = s.grid
    train = [(b, n, point_key("train", shape.name, s.dtype, batch=b, seq_len=n, head=head)) for b, n in g.train]
    opt_key = point_key("optimizer", shape.name, s.dtype, batch=1, seq_len=0, head=head)
    if s.all_done([k for *_, k in train] + [opt_key]):
        return
    if s.cuda:
        need = 16 * shape.params(head)
        have = torch.cuda.get_device_properties(torch.device(s.device)).total_memory
        if need > TRAIN_MEMORY_FRACTION * have:
            why = f"float32 weights + grads + AdamW state need ~{need / 2**30:.0f} GiB of {have / 2**30:.0f} GiB"
            for b, n, key in train:
                if s.pending(key):
                    s.record(key, _fields("train", shape, head, b, n, 0, b * n), skipped=why)
            if s.pending(opt_key):
                s.record(opt_key, _fields("optimizer", shape, head, 1, 0, 0, 0), skipped=why)
            return
    model = s.hf_model(shape, head, dtype="float32").train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    autocast = (lambda: torch.autocast("cuda", dtype=s.tdtype)) if s.cuda and s.dtype != "float32" else contextlib.nullcontext

    def step_fn(ids):
        def step():
            model.zero_grad(set_to_none=True)
            with autocast():
                out = model(input_ids=ids, labels=ids) if head == "lm" else model(input_ids=ids)
                loss = out.loss if head == "lm" else out.logits.float().pow(2).mean()
            loss.backward()
            return loss.detach()
        return step

    for b, n, key in train:
        s.measure(key, _fields("train", shape, head, b, n, 0, b * n), step_fn(_ids(s, shape.vocab, b, n, 23 * b + n)))
    if s.journal.has(opt_key):
        s.pending(opt_key)
    else:
        if next(model.parameters()).grad is None:  # every train point came from the journal
            step_fn(_ids(s, shape.vocab, 1, 16, 29))()
        s.measure(opt_key, {**_fields("optimizer", shape, head, 1, 0, 0, 0), "optimizer_impl": "torch.optim.AdamW"},
                  lambda: opt.step())
    del model, opt
    s.free()


# -- interference ---------------------------------------------------------------------------------------
def _corun(s: Session, sides: dict, duration_s: float) -> dict[str, list[float]]:
    """Run each side's (fn, setup) in its own thread (own CUDA stream on GPU) for ``duration_s``; returns
    the durations of the calls each side made while co-running."""
    barrier = threading.Barrier(len(sides))
    out: dict[str, list[float]] = {}
    errors: list[BaseException] = []

    def worker(name, fn, setup):
        try:
            stream = torch.cuda.Stream(torch.device(s.device)) if s.cuda else None
            ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
            clock = Clock(s.device)
            samples: list[float] = []
            with ctx:
                barrier.wait()
                end = time.perf_counter() + duration_s
                while time.perf_counter() < end or len(samples) < 3:
                    setup()
                    samples.append(clock.call(fn)[0])
            out[name] = samples
        except BaseException as e:  # re-raised in the caller's thread
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(n, f, st), daemon=True) for n, (f, st) in sides.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def measure_interference(s: Session, actor: ModelShape, reward: ModelShape) -> None:
    g = s.grid
    for db, dc, pb, pl in g.interference:
        kd = point_key("interference", actor.name, s.dtype, batch=db, seq_len=1, prefix_len=dc, head="lm", strategy="decode")
        kp = point_key("interference", reward.name, s.dtype, batch=pb, seq_len=pl, head="value", strategy="prefill")
        if s.all_done([kd, kp]):
            continue
        dec = s.decoder(actor, "lm", db, dc + 2)
        rm = s.decoder(reward, "value", pb, pl)
        dslots, pslots = torch.arange(db), torch.arange(pb)
        dec.reset(dslots)
        dec.extend(dslots, _ids(s, actor.vocab, db, dc, 31 * db + dc))
        tok = _ids(s, actor.vocab, db, 1, 37)
        chunk = _ids(s, reward.vocab, pb, pl, 41 * pb + pl)

        rng = torch.Generator(device=s.device).manual_seed(0)

        def d_fn():
            return sample_next(dec.extend(dslots, tok), rng)

        def d_setup():
            dec.positions[dslots] = dc

        def p_fn():
            return rm.extend(pslots, chunk)

        def p_setup():
            rm.reset(pslots)

        def both():
            alone_d = time_calls(d_fn, device=s.device, warmup=g.warmup, iters=g.max_iters, min_iters=g.min_iters,
                                 budget_s=g.point_budget_s, setup=d_setup)
            alone_p = time_calls(p_fn, device=s.device, warmup=g.warmup, iters=g.max_iters, min_iters=g.min_iters,
                                 budget_s=g.point_budget_s, setup=p_setup)
            duration = max(g.interference_s, 10 * max(alone_d.median_s, alone_p.median_s))
            co = _corun(s, {"decode": (d_fn, d_setup), "prefill": (p_fn, p_setup)}, duration)
            return alone_d, alone_p, duration, co

        alone_d, alone_p, duration, co = s.guarded(both)
        for side, key, shape, alone, (b, n, p), partner in (
                ("decode", kd, actor, alone_d, (db, 1, dc), reward.name),
                ("prefill", kp, reward, alone_p, (pb, pl, 0), actor.name)):
            timing = summarize(co[side], alone.first_call_s)
            fields = {**_fields("interference", shape, "lm" if side == "decode" else "value", b, n, p, b * n),
                      "strategy": side, "side": side, "partner": partner, "corun_s": duration,
                      **alone_fields(alone), "slowdown": timing["tmean_s"] / alone.tmean_s}
            if s.journal.has(key):
                s.pending(key)
                continue
            s.record(key, fields, timing=timing)
        del dec, rm
        s.free()

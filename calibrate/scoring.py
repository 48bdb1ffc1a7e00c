"""Reward-model scoring: runtimes against eager, and batching strategies.

Runtime points: a right-padded batch of ``batch`` sequences of ``seq_len`` tokens, timed by each runtime's
``time_scoring``; every point is checked against eager's scores on the same inputs (``max_abs_diff``).
Tolerance: ``1e-3 x s`` in float32 and ``5e-2 x s`` in bfloat16/float16, with s = max(1, max |eager|).
A runtime whose first point is beyond tolerance is marked invalid for that model and not measured
further; one that cannot run (not installed, no export) is recorded unavailable with the reason.

Batching strategies (eager, the same model): ``batch`` sequences with lengths drawn uniformly from
[max/8, max] (seeded), scored as
  padded    one call, every row padded to the longest;
  bucketed  sorted by length, split into min(4, batch) buckets, one call per bucket padded to its longest;
  packed    sequences packed first-fit-decreasing into rows of the longest length, block-diagonal
            attention inside each row (causal for decoders; per-sequence position ids), padding-free
            except the rows' tails; scores read at each sequence's last (decoder) / first (encoder) token.
All three return the same scores (checked: ``max_abs_diff`` against padded). ``tokens`` counts real tokens,
``padded_tokens`` the tokens actually computed.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from calibrate.measure import iters_for, summarize
from calibrate.models import PAD_ID, random_batch
from calibrate.runtimes.base import Runtime, eager_scores
from calibrate.session import Session, point_key
from rlhfsim.errors import RlhfsimError
from rlhfsim.models.catalog import ModelShape

STRATEGIES = ("padded", "bucketed", "packed")


def tolerance(dtype: str, ref: torch.Tensor) -> float:
    scale = max(1.0, float(ref.abs().max()))
    return (1e-3 if dtype == "float32" else 5e-2) * scale


def _seed(batch: int, n: int) -> int:
    return 7919 * batch + n


# -- runtimes -------------------------------------------------------------------------------------------
def runtime_key(name: str, model: str) -> str:
    return f"runtime|{name}|{model}"


def score_point(s: Session, rt: Runtime, model, shape: ModelShape, batch: int, n: int) -> dict | None:
    """One runtime point (see the module docstring); None if it was already in the journal."""
    key = point_key("score", shape.name, s.dtype, batch=batch, seq_len=n, head="value", runtime=rt.NAME,
                    strategy="padded")
    if not s.pending(key):
        return None
    fields = {"op": "score", "model": shape.name, "shape": shape.to_dict(), "head": "value", "runtime": rt.NAME,
              "strategy": "padded", "batch": batch, "seq_len": n, "prefix_len": 0, "tokens": batch * n}
    ids, mask = random_batch(shape.vocab, [n] * batch, s.device, _seed(batch, n))
    s.sync()
    t0 = time.perf_counter()
    ref = eager_scores(model, ids, mask)
    estimate = time.perf_counter() - t0
    g = s.grid
    iters = iters_for(estimate, g.point_budget_s, g.min_iters, g.max_iters)
    try:
        tm = s.guarded(lambda: rt.time_scoring(model, ids, mask, device=s.device, warmup=g.warmup, iters=iters,
                                               cache_dir=s.cache_dir))
    except torch.cuda.OutOfMemoryError as e:
        s.free()
        return s.record(key, fields, skipped=f"out of memory ({str(e).splitlines()[0][:120]})")
    diff = float((tm.output.reshape(-1) - ref.reshape(-1)).abs().max())
    tol = tolerance(s.dtype, ref)
    fields.update(max_abs_diff=diff, tolerance=tol, valid=diff <= tol, setup_s=tm.setup_s)
    return s.record(key, fields, timing=summarize(tm.samples_s, tm.first_call_s))


def measure_runtime(s: Session, rt: Runtime, model, shape: ModelShape, shapes) -> None:
    """All points of one runtime on one reward model, stopping at the first invalid one."""
    rkey = runtime_key(rt.NAME, shape.name)
    known = s.journal.get(rkey)
    if known is not None and not known["valid"]:
        for _ in shapes:
            s.progress.advance(f"score {shape.name} {rt.NAME}: {known['reason']}", skipped=True)
        return
    ok, why = rt.available(s.device)
    if not ok:
        s.journal.append({"kind": "runtime", "key": rkey, "runtime": rt.NAME, "model": shape.name,
                          "available": False, "valid": False, "reason": why})
        s.progress.note(f"runtime {rt.NAME} skipped on {shape.name}: {why}")
        for _ in shapes:
            s.progress.advance(f"score {shape.name} {rt.NAME}", skipped=True)
        return
    note = ""
    for i, (b, n) in enumerate(shapes):
        try:
            rec = score_point(s, rt, model, shape, b, n)
        except RlhfsimError as e:
            for _ in shapes[i:]:
                s.progress.advance(f"score {shape.name} {rt.NAME}", skipped=True)
            if not _has_points(s, rt.NAME, shape.name):
                s.journal.append({"kind": "runtime", "key": rkey, "runtime": rt.NAME, "model": shape.name,
                                  "available": False, "valid": False, "reason": str(e)})
                s.progress.note(f"runtime {rt.NAME} unavailable on {shape.name}: {e}")
                return
            note = f"stopped at batch {b}, length {n}: {e}"  # the shapes before it stand
            s.progress.note(f"runtime {rt.NAME} on {shape.name} {note}")
            break
        if rec is not None and "skipped" not in rec and not rec["valid"]:
            reason = (f"max abs diff {rec['max_abs_diff']:.3g} vs eager exceeds tolerance {rec['tolerance']:.3g} "
                      f"(batch {b}, length {n})")
            s.journal.append({"kind": "runtime", "key": rkey, "runtime": rt.NAME, "model": shape.name,
                              "available": True, "valid": False, "reason": reason})
            s.progress.note(f"runtime {rt.NAME} invalid on {shape.name}: {reason}")
            for _ in shapes[i + 1:]:
                s.progress.advance(f"score {shape.name} {rt.NAME}", skipped=True)
            return
    if known is None:
        s.journal.append({"kind": "runtime", "key": rkey, "runtime": rt.NAME, "model": shape.name,
                          "available": True, "valid": True, "reason": note})


def _has_points(s: Session, runtime: str, model: str) -> bool:
    return any(p["op"] == "score" and p.get("runtime") == runtime and p["model"] == model and "skipped" not in p
               for p in s.journal.points())


# -- batching strategies --------------------------------------------------------------------------------
def draw_lengths(batch: int, max_len: int) -> list[int]:
    rng = np.random.default_rng(_seed(batch, max_len))
    return [int(x) for x in rng.integers(max(1, max_len // 8), max_len + 1, size=batch)]


def _buckets(lengths: list[int]) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [list(map(int, part)) for part in np.array_split(order, min(4, len(lengths))) if len(part)]


def _pack(lengths: list[int]) -> list[list[int]]:
    """First-fit decreasing into rows of capacity max(lengths): lists of sequence indices per row."""
    cap = max(lengths)
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, f in enumerate(free):
            if lengths[i] <= f:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(cap - lengths[i])
    return rows


def packed_inputs(ids: torch.Tensor, lengths: list[int], causal: bool):
    """(input_ids [R, C], position_ids [R, C], mask, gather index [batch] into R*C, padded tokens). The
    mask is bool [R, 1, C, C] (decoders) or int [R, C, C] (encoders); padding tokens see only themselves."""
    rows = _pack(lengths)
    cap = max(lengths)
    r_ids = torch.full((len(rows), cap), PAD_ID, dtype=torch.long)
    pos = torch.zeros((len(rows), cap), dtype=torch.long)
    seg = torch.empty((len(rows), cap), dtype=torch.long)
    where = torch.empty(len(lengths), dtype=torch.long)
    src = ids.cpu()
    for r, members in enumerate(rows):
        seg[r] = -1 - torch.arange(cap)
        off = 0
        for i in members:
            n = lengths[i]
            r_ids[r, off:off + n] = src[i, :n]
            pos[r, off:off + n] = torch.arange(n)
            seg[r, off:off + n] = i
            where[i] = r * cap + (off + n - 1 if causal else off)
            off += n
    same = seg[:, :, None] == seg[:, None, :]
    if causal:
        mask = (same & (torch.arange(cap)[:, None] >= torch.arange(cap)[None, :]))[:, None]
    else:
        mask = same.long()
    dev = ids.device
    return r_ids.to(dev), pos.to(dev), mask.to(dev), where.to(dev), len(rows) * cap


def _packed_decoder(model, ids, pos, mask, where):
    h = model.model(input_ids=ids, position_ids=pos, attention_mask=mask).last_hidden_state
    return model.score(h.reshape(-1, h.shape[-1])[where])[:, 0]


def _packed_encoder(model, ids, pos, mask, where):
    emb = model.deberta.embeddings(input_ids=ids, mask=torch.ones_like(ids))
    h = model.deberta.encoder(emb, mask, output_hidden_states=False, return_dict=True).last_hidden_state
    first = h.reshape(-1, h.shape[-1])[where][:, None]
    return model.classifier(model.pooler(first))[:, 0]


PACKED = {"decoder": _packed_decoder, "encoder": _packed_encoder}


def strategy_calls(model, shape: ModelShape, lengths: list[int], device: str):
    """{strategy: (call returning scores [batch] in input order, padded tokens)}."""
    ids, mask = random_batch(shape.vocab, lengths, device, _seed(len(lengths), max(lengths)))
    calls = {}

    def padded():
        return model(input_ids=ids, attention_mask=mask).logits[:, 0]

    calls["padded"] = (padded, len(lengths) * max(lengths))
    buckets = [(torch.tensor(b, device=device), max(lengths[i] for i in b)) for b in _buckets(lengths)]

    def bucketed():
        out = torch.empty(len(lengths), dtype=next(model.parameters()).dtype, device=device)
        for idx, w in buckets:
            out[idx] = model(input_ids=ids[idx, :w], attention_mask=mask[idx, :w]).logits[:, 0]
        return out

    calls["bucketed"] = (bucketed, sum(len(idx) * w for idx, w in buckets))
    p_ids, pos, p_mask, where, p_tokens = packed_inputs(ids, lengths, causal=shape.arch == "decoder")
    fn = PACKED[shape.arch]

    def packed():
        return fn(model, p_ids, pos, p_mask, where)

    calls["packed"] = (packed, p_tokens)
    return calls


def measure_strategies(s: Session, model, shape: ModelShape, batch: int, max_len: int) -> None:
    keys = {st: point_key("score", shape.name, s.dtype, batch=batch, seq_len=max_len, head="value",
                          runtime="eager", strategy=st) for st in STRATEGIES}
    if all(s.journal.has(k) for k in keys.values()):
        for k in keys.values():
            s.pending(k)  # counts them as done in the progress display
        return
    lengths = draw_lengths(batch, max_len)
    calls = strategy_calls(model, shape, lengths, s.device)
    with torch.inference_mode():
        ref = calls["padded"][0]().float().cpu()
    for st in STRATEGIES:
        fn, padded_tokens = calls[st]

        def call(fn=fn):
            with torch.inference_mode():
                return fn()

        fields = {"op": "score", "model": shape.name, "shape": shape.to_dict(), "head": "value", "runtime": "eager",
                  "strategy": st, "varlen": True, "lengths": lengths, "batch": batch, "seq_len": max_len,
                  "prefix_len": 0, "tokens": sum(lengths), "padded_tokens": padded_tokens}
        rec = s.measure(keys[st], fields, call, extra=lambda m: {
            "max_abs_diff": float((m.output.float().cpu() - ref).abs().max())})
        if rec is not None and "skipped" not in rec and rec["max_abs_diff"] > tolerance(s.dtype, ref):
            s.progress.note(f"warning: strategy {st} on {shape.name} disagrees with padded by {rec['max_abs_diff']:.3g}")

"""Reward-model scoring: runtimes against eager, and batching strategies.

Runtime points: a right-padded batch of ``batch`` sequences of ``seq_len`` tokens; the runtimes of one
(batch, length) are timed together in interleaved rounds (``measure_runtimes``); every point is checked against eager's scores on the same inputs (``max_abs_diff``).
Tolerance: ``1e-3 x s`` in float32 and ``5e-2 x s`` in bfloat16/float16, with s = max(1, max |eager|).
A runtime whose first point is beyond tolerance is marked invalid for that model and not measured
further; one that cannot run (not installed, no export) is recorded unavailable with the reason.

Batching strategies (eager, the same model): ``batch`` sequences with lengths drawn uniformly from
[max/8, max] (seeded), scored as
  batch1    one call per sequence at its own length (no padding): the baseline the study compares with;
  padded    one call, every row padded to the longest;
  bucketed  sorted by length, split into min(4, batch) buckets, one call per bucket padded to its longest;
  packed    sequences packed first-fit-decreasing into rows of the longest length, block-diagonal
            attention inside each row (causal for decoders; per-sequence position ids), padding-free
            except the rows' tails; scores read at each sequence's last (decoder) / first (encoder) token.
All four return the same scores (checked: ``max_abs_diff`` against padded). ``tokens`` counts real tokens,
``padded_tokens`` the tokens actually computed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from calibrate.measuring.interleave import InProcessSampler, interleave
from calibrate.measuring.measure import summarize
from calibrate.measuring.models import PAD_ID, random_batch
from calibrate.runtimes.base import Runtime, eager_scores
from calibrate.running.session import Session, point_key
from rlhfsim.errors import RlhfsimError
from rlhfsim.models.catalog import ModelShape

STRATEGIES = ("batch1", "padded", "bucketed", "packed")


def tolerance(dtype: str, ref: torch.Tensor) -> float:
    scale = max(1.0, float(ref.abs().max()))
    return (1e-3 if dtype == "float32" else 5e-2) * scale


def _seed(batch: int, n: int) -> int:
    return 7919 * batch + n


# -- runtimes -------------------------------------------------------------------------------------------
def runtime_key(name: str, model: str) -> str:
    return f"runtime|{name}|{model}"


def score_key(s: Session, name: str, shape: ModelShape, batch: int, n: int) -> str:
    return point_key("score", shape.name, s.dtype, batch=batch, seq_len=n, head="value", runtime=name,
                     strategy="padded")


def score_fields(name: str, shape: ModelShape, batch: int, n: int) -> dict:
    return {"op": "score", "model": shape.name, "shape": shape.to_dict(), "head": "value", "runtime": name,
            "strategy": "padded", "batch": batch, "seq_len": n, "prefix_len": 0, "tokens": batch * n}


def interleaved_point(model, rts: dict[str, Runtime], ids, mask, *, device: str, dtype: str, warmup: int,
                      rounds: int, per_round: int, cache_dir, round_offset: int = 0) -> dict[str, dict]:
    """Every runtime of ``rts`` at one operating point, interleaved (``calibrate.measuring.interleave``), each checked
    against eager's scores after its first call (an invalid one takes no rounds). Returns per runtime
    either the timing fields or ``{"error": why}`` (cannot run: export, build, load failed)."""
    ref = eager_scores(model, ids, mask)
    tol = tolerance(dtype, ref)
    samplers, out = {}, {}
    for name, rt in rts.items():
        try:
            smp = rt.sampler(model, ids, mask, device=device, warmup=warmup, cache_dir=cache_dir)
            first = smp.first()
        except RlhfsimError as e:
            out[name] = {"error": str(e)}
            continue
        diff = float((smp.output.detach().float().cpu().reshape(-1) - ref.reshape(-1)).abs().max())
        out[name] = {"first_call_s": first, "max_abs_diff": diff, "tolerance": tol, "valid": diff <= tol,
                     "peak_mem_mb": smp.peak_mem_mb, "peak_mem_extra_mb": smp.peak_mem_extra_mb}
        if diff <= tol:
            samplers[name] = smp
    got = interleave(samplers, rounds, per_round, round_offset, {n: out[n]["first_call_s"] for n in samplers})
    for name, smp in samplers.items():
        out[name].update(samples_s=got[name].samples_s, rounds_of=got[name].rounds_of, setup_s=smp.setup_s)
    return out


def measure_runtimes(s: Session, rts: dict[str, Runtime], model, shape: ModelShape, shapes: dict[str, tuple]) -> None:
    """All scoring points of one reward model: at every (batch, length) the runtimes that measure it
    (``shapes[name]``) are timed together in interleaved rounds (``Grid.rounds`` x ``Grid.per_round``
    calls, in ``Grid.launches`` separate process launches when > 1). A runtime that cannot run is
    recorded unavailable with its reason; one whose first point is beyond tolerance is invalid and
    measured no further; one that fails after some shapes keeps them."""
    live: dict[str, Runtime] = {}
    for name, rt in rts.items():
        rkey = runtime_key(name, shape.name)
        known = s.journal.get(rkey)
        if known is not None and not known["valid"]:
            for _ in shapes.get(name, ()):
                s.progress.advance(f"score {shape.name} {name}: {known['reason']}", skipped=True)
            continue
        ok, why = rt.available(s.device)
        if not ok:
            s.journal.append({"kind": "runtime", "key": rkey, "runtime": name, "model": shape.name,
                              "available": False, "valid": False, "reason": why})
            s.progress.note(f"runtime {name} skipped on {shape.name}: {why}")
            for _ in shapes.get(name, ()):
                s.progress.advance(f"score {shape.name} {name}", skipped=True)
            continue
        live[name] = rt
    notes: dict[str, str] = {}
    closed: set[str] = set()
    order_of = list(dict.fromkeys(x for name in live for x in shapes.get(name, ())))
    for b, n in order_of:
        here = {name: rt for name, rt in live.items() if (b, n) in shapes.get(name, ()) and name not in notes}
        todo = {name: rt for name, rt in here.items() if s.pending(score_key(s, name, shape, b, n))}
        if not todo:
            continue
        try:
            res = s.guarded(lambda: _measure_point(s, todo, model, shape, b, n), attempts=1)
        except torch.cuda.OutOfMemoryError as e:
            s.free()
            for name in todo:
                s.record(score_key(s, name, shape, b, n), score_fields(name, shape, b, n),
                         skipped=f"out of memory ({str(e).splitlines()[0][:120]})")
            continue
        for name in todo:
            r = res[name]
            key, fields = score_key(s, name, shape, b, n), score_fields(name, shape, b, n)
            if "error" in r:
                s.progress.advance(f"score {shape.name} {name}", skipped=True)
                if not _has_points(s, name, shape.name):
                    s.journal.append({"kind": "runtime", "key": runtime_key(name, shape.name), "runtime": name,
                                      "model": shape.name, "available": False, "valid": False, "reason": r["error"]})
                    s.progress.note(f"runtime {name} unavailable on {shape.name}: {r['error']}")
                    notes[name] = "unavailable"
                else:
                    notes[name] = f"stopped at batch {b}, length {n}: {r['error']}"  # the shapes before it stand
                    s.progress.note(f"runtime {name} on {shape.name} {notes[name]}")
                continue
            if not r["valid"]:
                reason = (f"max abs diff {r['max_abs_diff']:.3g} vs eager exceeds tolerance {r['tolerance']:.3g} "
                          f"(batch {b}, length {n})")
                s.record(key, {**fields, **{k: r[k] for k in ("max_abs_diff", "tolerance", "valid")}},
                         skipped=f"invalid: {reason}")
                s.journal.append({"kind": "runtime", "key": runtime_key(name, shape.name), "runtime": name,
                                  "model": shape.name, "available": True, "valid": False, "reason": reason})
                s.progress.note(f"runtime {name} invalid on {shape.name}: {reason}")
                notes[name] = "invalid"
                continue
            timing = summarize(r["samples_s"], r["first_call_s"])
            extra = {k: r[k] for k in ("max_abs_diff", "tolerance", "valid", "setup_s", "peak_mem_mb",
                                       "peak_mem_extra_mb", "rounds_of")}
            extra.update(interleaved_with=sorted(todo), rounds=s.grid.rounds, per_round=s.grid.per_round,
                         launches=max(int(s.grid.launches), 1), launch_of=r.get("launch_of"))
            s.record(key, {**fields, **extra}, timing=timing)
        # the later shapes of a runtime that just failed or became invalid are skipped (counted as done)
        for name in [x for x in todo if x in notes and x not in closed]:
            closed.add(name)
            for _ in [x for x in shapes.get(name, ()) if order_of.index(x) > order_of.index((b, n))]:
                s.progress.advance(f"score {shape.name} {name}", skipped=True)
            if notes[name] in ("invalid", "unavailable"):
                del live[name]
    for name in live:
        if s.journal.get(runtime_key(name, shape.name)) is None and _has_points(s, name, shape.name):
            s.journal.append({"kind": "runtime", "key": runtime_key(name, shape.name), "runtime": name,
                              "model": shape.name, "available": True, "valid": True, "reason": notes.get(name, "")})


LAUNCH_TIMEOUT_S = 3600


def run_launches(s, names: list[str], shape, batch: int, n: int, launches: int) -> dict[str, dict]:
    """``launches`` child processes of one operating point (``calibrate.measuring.launch``), pooled (see that
    module's docstring)."""
    g = s.grid
    per: list[dict] = []
    for k in range(launches):
        spec = {"shape": shape.to_dict(), "checkpoint": str(s.checkpoints[shape.name]) if shape.name in s.checkpoints else None,
                "runtimes": names, "batch": batch, "seq_len": n, "device": s.device, "dtype": s.dtype,
                "threads": torch.get_num_threads(), "warmup": g.warmup, "rounds": g.rounds,
                "per_round": g.per_round, "cache_dir": str(s.cache_dir), "round_offset": k * g.rounds}
        with tempfile.TemporaryDirectory(prefix="rlhfsim-launch-") as td:
            sp, op = Path(td) / "spec.json", Path(td) / "out.json"
            sp.write_text(json.dumps(spec))
            proc = subprocess.run([sys.executable, "-m", "calibrate.measuring.launch", str(sp), str(op)], capture_output=True,
                                  text=True, timeout=LAUNCH_TIMEOUT_S)
            if proc.returncode != 0:
                last = ([ln for ln in proc.stderr.splitlines() if ln.strip()] or ["no message"])[-1]
                raise RlhfsimError(f"launch {k + 1}/{launches} of {shape.name} b={batch} n={n} failed: {last}")
            per.append(json.loads(op.read_text()))
    out: dict[str, dict] = {}
    for name in names:
        runs = [p[name] for p in per]
        err = next((r["error"] for r in runs if "error" in r), None)
        if err is not None:
            out[name] = {"error": err}
            continue
        first = runs[0]
        rec = {k: first[k] for k in ("first_call_s", "tolerance")}
        rec["max_abs_diff"] = max(r["max_abs_diff"] for r in runs)
        rec["valid"] = all(r["valid"] for r in runs)
        peaks = [r["peak_mem_mb"] for r in runs if r.get("peak_mem_mb") is not None]
        rec["peak_mem_mb"] = max(peaks) if peaks else None
        extra = [r["peak_mem_extra_mb"] for r in runs if r.get("peak_mem_extra_mb") is not None]
        rec["peak_mem_extra_mb"] = max(extra) if extra else None
        if rec["valid"]:
            rec["samples_s"] = [x for r in runs for x in r["samples_s"]]
            rec["rounds_of"] = [x for r in runs for x in r["rounds_of"]]
            rec["launch_of"] = [k for k, r in enumerate(runs) for _ in r["samples_s"]]
            rec["setup_s"] = first["setup_s"]
            rec["first_call_s_by_launch"] = [r["first_call_s"] for r in runs]
        out[name] = rec
    return out


def _measure_point(s: Session, todo: dict[str, Runtime], model, shape: ModelShape, b: int, n: int) -> dict:
    ids, mask = random_batch(shape.vocab, [n] * b, s.device, _seed(b, n))
    g = s.grid
    launches = max(int(g.launches), 1)
    if launches == 1:
        return interleaved_point(model, todo, ids, mask, device=s.device, dtype=s.dtype, warmup=g.warmup,
                                 rounds=g.rounds, per_round=g.per_round, cache_dir=s.cache_dir)
    return run_launches(s, list(todo), shape, b, n, launches)


def measure_runtime(s: Session, rt: Runtime, model, shape: ModelShape, shapes) -> None:
    """One runtime alone on one reward model (``measure_runtimes`` with a single contender)."""
    measure_runtimes(s, {rt.NAME: rt}, model, shape, {rt.NAME: tuple(shapes)})


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


def _packed_electra(model, ids, pos, mask, where):
    # additive mask [R, 1, C, C]: 0 inside a sequence's block, the dtype's minimum elsewhere
    dtype = next(model.parameters()).dtype
    add = (1.0 - mask[:, None].to(dtype)) * torch.finfo(dtype).min
    emb = model.electra.embeddings(input_ids=ids, position_ids=pos)
    h = model.electra.encoder(emb, attention_mask=add).last_hidden_state
    first = h.reshape(-1, h.shape[-1])[where][:, None]
    return model.classifier(first)[:, 0]


# packed scoring per family: decoders, and encoders by hf_model_type
PACKED = {"decoder": _packed_decoder, "deberta-v2": _packed_encoder, "electra": _packed_electra}


def strategy_calls(model, shape: ModelShape, lengths: list[int], device: str):
    """{strategy: (call returning scores [batch] in input order, padded tokens)}."""
    ids, mask = random_batch(shape.vocab, lengths, device, _seed(len(lengths), max(lengths)))
    calls = {}

    def padded():
        return model(input_ids=ids, attention_mask=mask).logits[:, 0]

    calls["padded"] = (padded, len(lengths) * max(lengths))
    singles = [(ids[i:i + 1, :n], mask[i:i + 1, :n]) for i, n in enumerate(lengths)]

    def batch1():
        return torch.cat([model(input_ids=x, attention_mask=m).logits[:, 0] for x, m in singles])

    calls["batch1"] = (batch1, sum(lengths))
    buckets = [(torch.tensor(b, device=device), max(lengths[i] for i in b)) for b in _buckets(lengths)]

    def bucketed():
        out = torch.empty(len(lengths), dtype=next(model.parameters()).dtype, device=device)
        for idx, w in buckets:
            out[idx] = model(input_ids=ids[idx, :w], attention_mask=mask[idx, :w]).logits[:, 0]
        return out

    calls["bucketed"] = (bucketed, sum(len(idx) * w for idx, w in buckets))
    p_ids, pos, p_mask, where, p_tokens = packed_inputs(ids, lengths, causal=shape.arch == "decoder")
    fn = PACKED["decoder" if shape.arch == "decoder" else shape.hf_model_type]

    def packed():
        return fn(model, p_ids, pos, p_mask, where)

    calls["packed"] = (packed, p_tokens)
    return calls


def measure_strategies(s: Session, model, shape: ModelShape, batch: int, max_len: int) -> None:
    """The batching strategies of one (batch, max length), interleaved in rounds like the runtimes."""
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
    todo = [st for st in STRATEGIES if s.pending(keys[st])]
    g = s.grid

    def measure():
        smp = {}
        for st in todo:
            def call(fn=calls[st][0]):
                with torch.inference_mode():
                    return fn()
            smp[st] = InProcessSampler(call, device=s.device, warmup=g.warmup)
        return smp, interleave(smp, g.rounds, g.per_round)

    try:
        samplers, got = s.guarded(measure, attempts=1)
    except torch.cuda.OutOfMemoryError as e:
        s.free()
        for st in todo:
            s.record(keys[st], {"op": "score", "model": shape.name, "runtime": "eager", "strategy": st,
                                "batch": batch, "seq_len": max_len}, skipped=f"out of memory ({str(e).splitlines()[0][:120]})")
        return
    for st in todo:
        fields = {"op": "score", "model": shape.name, "shape": shape.to_dict(), "head": "value", "runtime": "eager",
                  "strategy": st, "varlen": True, "lengths": lengths, "batch": batch, "seq_len": max_len,
                  "prefix_len": 0, "tokens": sum(lengths), "padded_tokens": calls[st][1],
                  "max_abs_diff": float((samplers[st].output.float().cpu() - ref).abs().max()),
                  "peak_mem_mb": samplers[st].peak_mem_mb, "peak_mem_extra_mb": samplers[st].peak_mem_extra_mb,
                  "rounds_of": got[st].rounds_of, "interleaved_with": list(todo), "rounds": g.rounds,
                  "per_round": g.per_round}
        rec = s.record(keys[st], fields, timing=summarize(got[st].samples_s, got[st].first_call_s))
        if rec["max_abs_diff"] > tolerance(s.dtype, ref):
            s.progress.note(f"warning: strategy {st} on {shape.name} disagrees with padded by {rec['max_abs_diff']:.3g}")

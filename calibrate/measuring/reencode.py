"""Re-encode scoring of encoder reward models (OPPO intra-step streaming into a model with no causal cache,
``models.reward.streaming: reencode``; ``rlhfsim.sim.streaming``).

One response of ``max(Grid.reencode_lengths)`` random tokens is scored as the streaming scorer scores it:
its prefixes of growing length L_1 < L_2 < ... (``Grid.reencode_lengths``), each a batch-1 call from
scratch (no cache, no padding), the last one giving the score. At every length the scoring runtimes of
the calibration (eager, compile, onnxruntime, aoti_python, aoti_cpp: the C++ harness) are timed together
in interleaved rounds (``calibrate.measuring.scoring.interleaved_point``) and checked against eager's score of the
same prefix; a runtime whose artifacts are compiled per input shape (``Grid.static_shape_runtimes``)
takes only ``Grid.reencode_static_lengths`` (tens of seconds of compilation per shape on two cores).

Points: op ``reencode``, batch 1, ``seq_len`` = L_k, ``prefix_len`` = L_{k-1} (the previous pass's
length; informational: nothing is cached), ``tokens`` = L_k, ``runtime``. ``calibrate.fitting.assemble`` fits
``reencode:RUNTIME`` to each runtime's points (the roofline of ``flops.forward_work`` of L tokens, one
sequence, no cache) and lists them under ``profile["reencode"]``.
"""

from __future__ import annotations

from calibrate.measuring.measure import summarize
from calibrate.measuring.models import random_batch
from calibrate.runtimes.base import Runtime
from calibrate.measuring.scoring import interleaved_point
from calibrate.running.session import Session, point_key
from rlhfsim.models.catalog import ModelShape


def reencode_key(s: Session, name: str, shape: ModelShape, length: int, prev: int) -> str:
    return point_key("reencode", shape.name, s.dtype, batch=1, seq_len=length, prefix_len=prev, head="value",
                     runtime=name)


def reencode_fields(name: str, shape: ModelShape, length: int, prev: int) -> dict:
    return {"op": "reencode", "model": shape.name, "shape": shape.to_dict(), "head": "value", "runtime": name,
            "batch": 1, "seq_len": length, "prefix_len": prev, "tokens": length}


def lengths_for(s: Session, shape: ModelShape, name: str) -> list[int]:
    """The prefix lengths runtime ``name`` is measured at on ``shape`` (within its positions)."""
    g = s.grid
    ls = g.reencode_static_lengths if name in g.static_shape_runtimes else g.reencode_lengths
    return sorted(x for x in ls if 1 <= x <= shape.max_positions)


def plan_size(grid, shape: ModelShape, names) -> int:
    """Points ``measure_reencode`` takes on ``shape`` (0 for a decoder)."""
    if shape.arch != "encoder":
        return 0
    total = 0
    for name in names:
        ls = grid.reencode_static_lengths if name in grid.static_shape_runtimes else grid.reencode_lengths
        total += sum(1 for x in ls if 1 <= x <= shape.max_positions)
    return total


def measure_reencode(s: Session, rts: dict[str, Runtime], model, shape: ModelShape) -> None:
    """Every runtime of ``rts`` at every prefix length of the growing response (module docstring). A
    runtime that cannot run or disagrees with eager is journaled as skipped with the reason and measured
    no further on this model."""
    if shape.arch != "encoder":
        return
    every = sorted({x for name in rts for x in lengths_for(s, shape, name)})
    if not every:
        return
    full, _ = random_batch(shape.vocab, [every[-1]], s.device, 104_729 + every[-1])
    g = s.grid
    dead: dict[str, str] = {}
    prev = 0
    for length in every:
        here = {name: rt for name, rt in rts.items() if length in lengths_for(s, shape, name)}
        keys = {name: reencode_key(s, name, shape, length, prev) for name in here}
        todo = {}
        for name, rt in here.items():
            if name in dead:
                s.record(keys[name], reencode_fields(name, shape, length, prev), skipped=dead[name])
            elif s.pending(keys[name]):
                todo[name] = rt
        if todo:
            ids = full[:, :length]
            mask = ids.new_ones(ids.shape)
            res = s.guarded(lambda: interleaved_point(model, todo, ids, mask, device=s.device, dtype=s.dtype,
                                                      warmup=g.warmup, rounds=g.rounds, per_round=g.per_round,
                                                      cache_dir=s.cache_dir), attempts=1)
            for name in todo:
                r, fields = res[name], reencode_fields(name, shape, length, prev)
                if "error" in r:
                    dead[name] = f"unavailable: {r['error']}"
                    s.record(keys[name], fields, skipped=dead[name])
                elif not r["valid"]:
                    dead[name] = f"invalid: max abs diff {r['max_abs_diff']:.3g} vs eager exceeds {r['tolerance']:.3g}"
                    s.record(keys[name], {**fields, "max_abs_diff": r["max_abs_diff"]}, skipped=dead[name])
                else:
                    extra = {k: r[k] for k in ("max_abs_diff", "tolerance", "setup_s", "rounds_of")}
                    s.record(keys[name], {**fields, **extra, "interleaved_with": sorted(todo)},
                             timing=summarize(r["samples_s"], r["first_call_s"]))
        prev = length

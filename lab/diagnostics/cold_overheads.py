"""A decode step's fixed costs after the weights of a larger model have streamed through the caches: the executor's
decode step of a small in-cache model, and the sampling call alone, each timed right after a sweep of one-row
products over F MiB of distinct weights, against the same with no sweep. A decode step of a model of F MiB runs
its per-op work (dispatch, norms, attention on one row, the cache writes, the sampling tail) in caches its own
weights have just swept; the calibration measures that work mostly on models that fit in cache. Not a speed
benchmark: it measures one source of decode error on a CPU whose cache holds some models and not others.

    python lab/diagnostics/cold_overheads.py
    python lab/diagnostics/cold_overheads.py --model tiny-qwen2 --vocab 8192 --feet 0,4,8,16,32 --rounds 3 --json

Per round, footprints in a shuffled order; per footprint ``--iters`` timed repetitions (after 10 untimed) of: the
sweep (``F.linear`` of a [1, 256] row by each of ceil(F MiB / 0.75 MiB) distinct [768, 256] float32 weights),
then (a) ``Generator._decode`` of ``--model`` (a ``StaticKVDecoder`` step and ``sample_next``, one row at 64 cached
tokens, rewound before each call) timed alone, and, in a second pass, (b) ``sample_next`` timed alone on the
[1, vocab] logits of an LM-head product made (untimed) right after the sweep, as a step's head makes them. Each cell is the median over the rounds of the per-round medians; the ratio is
to the same cell at footprint 0 (no sweep). One process, torch's default threads, float32.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from calibrate.cpu.coldfixed import SWEEP  # noqa: E402  (the calibration's probe sweeps the same matrices)
from decode_rows import CONTEXT, shape_of  # noqa: E402


def sweep_weights(foot_mib: float):
    import torch

    from calibrate.cpu.coldfixed import sweep_weights as weights

    return weights(foot_mib, "cpu", torch.float32, torch.Generator().manual_seed(1))


def timed_after_sweep(call, weights, iters: int, setup=None, pre=None) -> float:
    """Median seconds of ``call`` right after a one-row product by each of ``weights`` (``setup`` untimed before
    the sweep, ``pre`` untimed after it)."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(1, SWEEP[1])
    out = []
    for i in range(iters + 10):
        if setup is not None:
            setup()
        for w in weights:
            F.linear(x, w)
        if pre is not None:
            pre()
        t = time.perf_counter()
        call()
        dt = time.perf_counter() - t
        if i >= 10:
            out.append(dt)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-qwen2", help="The small model whose decode step is timed (catalog or drawn name).")
    ap.add_argument("--vocab", type=int, default=1024, help="Vocabulary of the sampling call timed alone.")
    ap.add_argument("--feet", default="0,2,6,12,20,32,48", help="Footprints of the sweep, MiB (0: no sweep).")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    from _common import decode_call
    from calibrate.measuring.decoder import StaticKVDecoder, sample_next

    feet = [float(f) for f in args.feet.split(",") if f]
    if 0.0 not in feet:
        feet = [0.0] + feet
    m = shape_of(args.model)
    dec = StaticKVDecoder(m, dtype=torch.float32, device=torch.device("cpu"), max_slots=1, max_len=CONTEXT + 2, head="lm", seed=0)
    decode, rewind = decode_call(dec, m.vocab, 1, CONTEXT)
    head = torch.randn(args.vocab, 256, generator=torch.Generator().manual_seed(2))
    row = torch.randn(1, 256)
    rng = torch.Generator().manual_seed(3)
    state: dict = {}

    def fresh_logits():
        state["logits"] = F.linear(row, head)

    got: dict[float, list[tuple[float, float]]] = {}
    order = random.Random(0)
    with torch.inference_mode():
        for r in range(args.rounds):
            cells = list(feet)
            order.shuffle(cells)
            for f in cells:
                w = sweep_weights(f)
                step = timed_after_sweep(decode, w, args.iters, rewind)
                sample = timed_after_sweep(lambda: sample_next(state["logits"], rng, 0), w, args.iters, pre=fresh_logits)
                got.setdefault(f, []).append((1e3 * step, 1e3 * sample))
                del w
            print(f"round {r + 1} of {args.rounds}", file=sys.stderr)
    base_step, base_sample = (statistics.median(x) for x in zip(*got[0.0]))
    cells = []
    for f in sorted(got):
        step, sample = (statistics.median(x) for x in zip(*got[f]))
        cells.append({"footprint_mib": f, "step_ms": step, "step_x": step / base_step, "sample_ms": sample,
                      "sample_x": sample / base_sample, "rounds": got[f]})
    if args.json:
        print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "model": m.name, "vocab": args.vocab,
                          "context": CONTEXT, "rounds": args.rounds, "cells": cells}, indent=1))
        return
    print(f"after a sweep of F MiB of weights: {m.name}'s decode step (1 row, {CONTEXT} cached tokens) and sample_next on "
          f"[1, {args.vocab}] logits, ms (x no sweep); {torch.get_num_threads()} threads, median of {args.rounds} rounds")
    print(f"{'F MiB':>6} {'step':>8} {'x':>5} {'sample':>8} {'x':>5}")
    for c in cells:
        print(f"{c['footprint_mib']:6g} {c['step_ms']:8.3f} {c['step_x']:5.2f} {c['sample_ms']:8.3f} {c['sample_x']:5.2f}")


if __name__ == "__main__":
    main()

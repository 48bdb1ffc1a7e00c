"""Helpers the diagnostic scripts share (run as ``python lab/diagnostics/NAME.py``: this directory is on the
import path): timing in alternating child processes, encoder cells, a decode step's call and its median time."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def alternate_children(script: str, conditions: tuple[str, ...], rounds: int, describe) -> dict[str, list[dict]]:
    """Run ``python SCRIPT --child COND`` for every condition, round after round (conditions alternate, so a
    shared machine's load falls on all of them alike), each in a fresh process with the repository on the
    import path; each child prints one JSON object as its last line. ``describe(cond, result)`` gives a
    progress fragment per child for the round's line on stderr. Returns the results per condition."""
    root = Path(script).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    res: dict[str, list[dict]] = {c: [] for c in conditions}
    for r in range(rounds):
        for c in conditions:
            out = subprocess.run([sys.executable, script, "--child", c], capture_output=True, text=True, env=env,
                                 check=True).stdout
            res[c].append(json.loads(out.strip().splitlines()[-1]))
        print(f"round {r + 1}: " + ", ".join(describe(c, res[c][-1]) for c in conditions), file=sys.stderr)
    return res


def alternating_main(script: str, doc: str, conditions: tuple[str, ...], default_rounds: int, child, describe):
    """The command line of an alternating benchmark: ``--rounds N``, ``--json``, and the hidden ``--child COND``
    that runs one condition (``child(cond)``). Returns (args, results per condition) in the parent, None in
    a child."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=default_rounds)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", choices=conditions, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return None
    return args, alternate_children(script, conditions, args.rounds, describe)


ENCODER_SHAPES = ((1, 128), (2, 128), (4, 108), (8, 146), (8, 256))   # (rows, padded tokens) of a reward call


def encoder_cells(models, warmup: int = 3, calls: int = 15):
    """Each encoder model (``ModelShape``, HF model with random weights, float32, CPU) at each of
    ``ENCODER_SHAPES``: yields (model, rows, tokens, median seconds of ``calls`` calls after ``warmup``)."""
    import statistics
    import time

    import torch

    from calibrate.measuring.models import build_hf_model

    with torch.inference_mode():
        for m in models:
            net = build_hf_model(m, "value", torch.float32, "cpu")
            for rows, n in ENCODER_SHAPES:
                ids = torch.randint(1, m.vocab, (rows, n))
                mask = torch.ones_like(ids)
                for _ in range(warmup):
                    net(input_ids=ids, attention_mask=mask)
                ts = []
                for _ in range(calls):
                    t = time.perf_counter()
                    net(input_ids=ids, attention_mask=mask)
                    ts.append(time.perf_counter() - t)
                yield m, rows, n, statistics.median(ts)
            del net


def decode_call(dec, vocab: int, rows: int, context: int):
    """(call, rewind): the executor's decode step (``Generator._decode``: a ``StaticKVDecoder`` step and
    ``sample_next``) of ``rows`` rows on ``dec`` (its ``max_slots`` at least ``rows``, its ``max_len`` at least
    ``context + 2``), prefilled here with ``context`` tokens per row, and the rewind to ``context`` cached tokens to run
    before every call: ``calibrate.measuring.bench.decode_loop``, as ``calibrate.measuring.bench.measure_generation`` uses it."""
    import torch

    from calibrate.measuring.bench import decode_loop

    slots = torch.arange(rows)
    dec.reset(slots)
    dec.extend(slots, torch.randint(0, vocab, (rows, context), generator=torch.Generator().manual_seed(rows)))
    return decode_loop(dec, slots, context, [1] * rows, "cpu")


def decode_step_ms(dec, vocab: int, rows: int, context: int, iters: int) -> float:
    """The executor's decode step at ``rows`` rows of ``context`` cached tokens each, on ``dec`` (``decode_call``): the
    median of ``iters`` timed calls after 10 untimed, rewound before every call; in ms."""
    from calibrate.measuring.measure import time_calls

    call, rewind = decode_call(dec, vocab, rows, context)
    t = time_calls(call, device="cpu", warmup=10, iters=iters, setup=rewind)
    return 1e3 * t.median_s

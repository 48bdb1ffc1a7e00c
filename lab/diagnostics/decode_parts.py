"""The executor's decode step taken apart where it runs: the transformer body, the LM head's product and the
sampling tail (``sample_next``), each timed inside the step, next to the same three parts of a profile's price.
Where ``decode_rows.py`` says by how much a shape's decode step is mispriced, this says in which part. Not a speed
benchmark: it measures one source of decode error on a CPU whose cache holds some models and not others.

    python lab/diagnostics/decode_parts.py --profile GENERIC.json
    python lab/diagnostics/decode_parts.py --profile P --models l4-h256-a8-kv2-i768-v8192,tiny-qwen2 --rows 1,2,4 --json

``--models`` as in ``decode_rows.py`` (catalog names, or drawn shapes ``l{L}-h{H}-a{A}-kv{K}-i{I}-v{V}[-tied]``).
One process, torch's default threads, float32, 64 cached tokens per row. Each cell runs ``_common.decode_step_ms``
(``Generator._decode``: a ``StaticKVDecoder`` step and ``sample_next``; median of ``--iters`` calls after 10
untimed) with two clocks inside the step: one around the LM head's product (the ``F.linear`` of
``StaticKVDecoder.extend`` by the head's weight; the decoder module's ``F`` is swapped for a timing proxy while
the cell runs, then put back) and one around ``sample_next`` (the generation module's name, swapped likewise).
Body = step - head - sampling (the layers, the final norm, the host work of the loop). Models and row counts
alternate round after round in a shuffled order; each part is the median over the rounds of its per-round median.

The price's parts, from ``rlhfsim.costs.model._Decode`` with the ``kv_decoder`` runtime (what the simulator and
validate use): sampling = the measured tail ``sample_s + sample_per_logit_s x rows x V`` (``calibrate.measuring.sampling``);
head = the step's roofline less the roofline of the same step without the head's FLOPs, weight bytes (counted
with the step's weight passes and stream factor, as the step's other weights are) and logit bytes; body = the
rest (the layers' roofline, the per-step and per-layer overheads, the K/V).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from decode_rows import CONTEXT, cell_args, decoders, shape_of, shuffled_cells  # noqa: E402

DEFAULT_MODELS = ("l4-h256-a8-kv2-i768-v8192,l4-h256-a8-kv2-i768-v4096,l4-h256-a8-kv2-i768-v1024,"
                  "l2-h128-a2-kv1-i512-v8192,l2-h128-a2-kv1-i512-v1024")


@contextlib.contextmanager
def part_clocks(vocab: int):
    """While open: the seconds of each LM-head product (an ``F.linear`` in ``calibrate.measuring.decoder`` whose weight has
    ``vocab`` rows) and of each ``sample_next`` call of the executor's generation loop, appended to the lists
    ``head`` and ``sample`` of the dict it yields."""
    import torch.nn.functional as TF

    import calibrate.measuring.decoder as dec_mod
    import calibrate.executor.generation as gen_mod

    acc: dict[str, list[float]] = {"head": [], "sample": []}
    real_f, real_sample = dec_mod.F, gen_mod.sample_next

    class _F(types.ModuleType):
        def __getattr__(self, name):
            return getattr(TF, name)

    proxy = _F("timed_functional")

    def linear(x, w, b=None):
        if w.shape[0] != vocab:
            return TF.linear(x, w, b)
        t = time.perf_counter()
        y = TF.linear(x, w, b)
        acc["head"].append(time.perf_counter() - t)
        return y

    def sample_next(*a, **k):
        t = time.perf_counter()
        out = real_sample(*a, **k)
        acc["sample"].append(time.perf_counter() - t)
        return out

    proxy.linear = linear
    dec_mod.F, gen_mod.sample_next = proxy, sample_next
    try:
        yield acc
    finally:
        dec_mod.F, gen_mod.sample_next = real_f, real_sample


def price_parts(cost, m, rows: int, context: int = CONTEXT) -> dict:
    """The price of one ``kv_decoder`` decode step of ``rows`` rows at ``context`` cached tokens each, in ms, and
    its parts (see the module docstring)."""
    from rlhfsim.costs import flops as fl
    from rlhfsim.costs.model import _Decode

    d = _Decode(cost, m, "float32", 1, "kv_decoder")
    k = d.shape
    c0, _, u0, _, over = d.coeffs(rows, rows * context, None)
    tail = d.tail0 + d.tail_row * rows
    passes = float(fl.gemm_passes(float(rows), d.wp))
    # the head's weights, counted like the rest of them (the step's passes and stream factor)
    head_bytes = m.hidden * m.vocab * fl.DTYPE_BYTES["float32"] * passes * d.ws
    c0_h = k.f_head * rows / d.peak
    u0_h = (head_bytes + k.logit_bytes * rows) / d.bw
    total = max(c0, u0) + over
    head = max(c0, u0) - max(c0 - c0_h, u0 - u0_h)
    return {"total_ms": 1e3 * total, "head_ms": 1e3 * head, "sample_ms": 1e3 * tail, "body_ms": 1e3 * (total - head - tail),
            "weight_passes": passes, "stream_factor": d.ws, "cold_factor": d.cold}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True, help="The profile whose price goes beside each cell.")
    cell_args(ap, DEFAULT_MODELS, "1,2,4")
    args = ap.parse_args()

    import torch

    from _common import decode_step_ms
    from rlhfsim.costs.model import CostModel
    from rlhfsim.costs.profile import load_profile
    from rlhfsim.hardware.catalog import get_gpu

    rows_list, shapes, decs = decoders(args)
    cost = CostModel(get_gpu("cpu"), load_profile(args.profile))
    got: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    with torch.inference_mode():
        for m, b in shuffled_cells(shapes, rows_list, args.rounds):
            with part_clocks(m.vocab) as acc:
                step = decode_step_ms(decs[m.name], m.vocab, b, CONTEXT, args.iters)
            head = 1e3 * statistics.median(acc["head"][-args.iters:])
            sample = 1e3 * statistics.median(acc["sample"][-args.iters:])
            got.setdefault((m.name, b), []).append((step, head, sample))
    cells = []
    for m in shapes:
        for b in rows_list:
            step, head, sample = (statistics.median(x) for x in zip(*got[(m.name, b)]))
            cells.append({"model": m.name, "rows": b, "measured": {"total_ms": step, "head_ms": head, "sample_ms": sample,
                                                                   "body_ms": step - head - sample},
                          "priced": price_parts(cost, m, b), "rounds": got[(m.name, b)]})
    if args.json:
        print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "profile": args.profile,
                          "context": CONTEXT, "rounds": args.rounds, "cells": cells}, indent=1))
        return
    print(f"decode step by part (ms), {CONTEXT} cached tokens per row, {torch.get_num_threads()} threads, median of "
          f"{args.rounds} rounds; measured in the step / priced by {args.profile}")
    print(f"{'model':>36} {'rows':>4} | {'step':>13} | {'body':>13} | {'LM head':>13} | {'sampling':>13}")
    for c in cells:
        me, pr = c["measured"], c["priced"]
        print(f"{c['model']:>36} {c['rows']:4d} | " + " | ".join(
            f"{me[k]:6.3f} {pr[k]:6.3f}" for k in ("total_ms", "body_ms", "head_ms", "sample_ms")))


if __name__ == "__main__":
    main()

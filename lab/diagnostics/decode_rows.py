"""The executor's decode step at 1, 2, 3, 4, 6 and 8 rows against a profile's price at each: how the step's
time grows with its rows on this device, next to the cost model's weight passes (one pass at one row;
from two rows on ``gemm_passes_by_footprint`` at the model's footprint, one number for every row count or,
with ``by_rows``, interpolated in rows; ``rlhfsim.costs.flops.gemm_passes``). Not a
speed benchmark: it measures the mechanism behind decode errors on a CPU whose cache holds some models and
not others (actors decoding at most two rows were priced 27-78% high on drawn validation scenarios).

    python lab/diagnostics/decode_rows.py --profile GENERIC.json                          # the default shapes
    python lab/diagnostics/decode_rows.py --profile P --models tiny-qwen2,l2-h256-a4-kv2-i768-v4096 --rounds 5 --json

``--models``: catalog names, or drawn shapes written as ``rlhfsim.validate_gen`` names them without the
``gen-qwen2-`` prefix (``l{layers}-h{hidden}-a{heads}-kv{kv heads}-i{intermediate}-v{vocab}[-tied]``). One
process, torch's default threads (the executor's condition in a sync scenario), float32. Each cell is the
median over ``--iters`` timed calls (``calibrate.measuring.measure.time_calls``, after 10 untimed) of
``Generator._decode`` (the calibration's and the executor's decode loop: a ``StaticKVDecoder`` step and
``sample_next``) at 64 cached tokens per row, rewound before every call; models and row counts alternate
round after round in a shuffled order (so a shared machine's drift falls on all of them alike) and the
table gives the median over the rounds. The price is ``CostModel.decode_steps`` of one step at the same
shape with the ``kv_decoder`` runtime's parameters.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ROWS = (1, 2, 3, 4, 6, 8)
CONTEXT = 64
DEFAULT_MODELS = "tiny-qwen2,small-qwen2-l2,small-qwen2,l2-h256-a4-kv2-i768-v4096,l3-h320-a5-kv5-i960-v8192-tied"
_DRAWN = re.compile(r"^l(\d+)-h(\d+)-a(\d+)-kv(\d+)-i(\d+)-v(\d+)(-tied)?$")


def shape_of(name: str):
    """A catalog model, or a drawn shape from its name (see the module's docstring)."""
    from rlhfsim.models.catalog import CATALOG, ModelShape

    if name in CATALOG:
        return CATALOG[name]
    m = _DRAWN.match(name)
    if not m:
        raise SystemExit(f"--models: {name!r}: expected a catalog model or l<L>-h<H>-a<A>-kv<K>-i<I>-v<V>[-tied]")
    layers, hidden, heads, kv, inter, vocab = (int(x) for x in m.groups()[:6])
    return ModelShape(name=f"gen-qwen2-{name}", arch="decoder", layers=layers, hidden=hidden, intermediate=inter,
                      heads=heads, kv_heads=kv, vocab=vocab, tied_embeddings=bool(m.group(7)))


def cell_args(ap, models: str, rows: str) -> None:
    """The options of a benchmark whose cells are (model, rows) decode steps: ``--models``, ``--rows``, ``--rounds``,
    ``--iters``, ``--json`` (``decode_rows.py``, ``decode_parts.py``)."""
    ap.add_argument("--models", default=models)
    ap.add_argument("--rows", default=rows)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--json", action="store_true")


def decoders(args):
    """(row counts, shapes, {name: a float32 ``StaticKVDecoder`` with a slot per row and room for ``CONTEXT`` cached
    tokens}) of ``cell_args``' parsed options."""
    import torch

    from calibrate.measuring.decoder import StaticKVDecoder

    rows_list = [int(r) for r in args.rows.split(",") if r]
    shapes = [shape_of(n) for n in args.models.split(",") if n]
    decs = {m.name: StaticKVDecoder(m, dtype=torch.float32, device=torch.device("cpu"), max_slots=max(rows_list),
                                    max_len=CONTEXT + 2, head="lm", seed=0) for m in shapes}
    return rows_list, shapes, decs


def shuffled_cells(shapes, rows_list, rounds: int):
    """The (model, rows) cells, round after round, each round in a shuffled order (seeded: a shared machine's drift falls
    on all of them alike); a progress line on stderr after each round."""
    rng = random.Random(0)
    for r in range(rounds):
        cells = [(m, b) for m in shapes for b in rows_list]
        rng.shuffle(cells)
        yield from cells
        print(f"round {r + 1} of {rounds}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True, help="The profiles whose prices go beside each cell, comma-separated.")
    cell_args(ap, DEFAULT_MODELS, ",".join(map(str, ROWS)))
    args = ap.parse_args()

    import torch

    from _common import decode_step_ms
    from rlhfsim.costs import flops as fl
    from rlhfsim.costs.model import CostModel
    from rlhfsim.costs.profile import load_profile
    from rlhfsim.hardware.catalog import get_gpu

    rows_list, shapes, decs = decoders(args)
    costs = {p: CostModel(get_gpu("cpu"), load_profile(p)) for p in args.profile.split(",") if p}
    ms: dict[tuple[str, int], list[float]] = {}
    with torch.inference_mode():
        for m, b in shuffled_cells(shapes, rows_list, args.rounds):
            ms.setdefault((m.name, b), []).append(decode_step_ms(decs[m.name], m.vocab, b, CONTEXT, args.iters))
    out = []
    for m in shapes:
        k = fl.ShapeCoeffs.of(m, "float32", "lm")
        one = statistics.median(ms[(m.name, rows_list[0])])
        for b in rows_list:
            meas = statistics.median(ms[(m.name, b)])
            cell = {"model": m.name, "weights_mib": k.decode_weight_bytes / 2**20, "rows": b, "measured_ms": meas,
                    "rounds_ms": ms[(m.name, b)], "measured_over_first_row": meas / one, "profiles": {}}
            for name, cost in costs.items():
                wp = cost.decoder(m, "float32", runtime="kv_decoder").wp   # the passes its decode steps are priced with
                price = 1e3 * cost.decode_steps(m, "float32", b, b * CONTEXT, 1, runtime="kv_decoder").total_s
                cell["profiles"][name] = {"passes": fl.gemm_passes(float(b), wp), "priced_ms": price,
                                          "price_over_measured": price / meas}
            out.append(cell)
    if args.json:
        print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "profiles": list(costs),
                          "context": CONTEXT, "rounds": args.rounds, "cells": out}, indent=1))
        return
    print(f"decode step (ms), {CONTEXT} cached tokens per row, {torch.get_num_threads()} threads, median of "
          f"{args.rounds} rounds; per profile: the weight passes at the step's rows, the price, price / measured")
    for i, name in enumerate(costs):
        print(f"  profile {i + 1}: {name}")
    print(f"{'model':>40} {'MiB':>5} {'rows':>4} {'measured':>9} {'/1 row':>7} "
          + " ".join(f"{'p' + str(i + 1) + ' passes':>10} {'priced':>8} {'ratio':>6}" for i in range(len(costs))))
    for c in out:
        print(f"{c['model']:>40} {c['weights_mib']:5.1f} {c['rows']:4d} {c['measured_ms']:9.3f} {c['measured_over_first_row']:7.2f} "
              + " ".join(f"{v['passes']:10.2f} {v['priced_ms']:8.3f} {v['price_over_measured']:6.2f}" for v in c["profiles"].values()))


if __name__ == "__main__":
    main()

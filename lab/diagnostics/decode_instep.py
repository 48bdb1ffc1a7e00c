"""A validation scenario's decode calls inside its real steps against the same decode step timed apart, in the same
process and minute, and against a profile's price: whether a decode call's miss comes from the step around it
(caches made cold by the other models, the heap of a process holding four models, the padded K/V of rows of
unequal context) or from the price of that shape; the CPU counterpart of ``gpu_instep.py``, per row count and with
the price. Not a speed benchmark: it measures one source of decode error on a CPU whose cache holds some
models and not others.

    python lab/diagnostics/decode_instep.py SCENARIO.yaml --profile GENERIC.json
    python lab/diagnostics/decode_instep.py DIR/gen-S-08.yaml --profile DIR/generic-profile.json --json

The scenario (a ``--generate`` set's YAML, or any the executor runs with ``kv_decoder``) runs its steps on the
executor (``calibrate.executor.run_steps``, torch's default threads); its ``decode`` calls after the first step
are grouped by rows. Per row count: the median call in the steps; the same step timed apart (a fresh
``StaticKVDecoder`` of the actor's shape and dtype, that many rows all at the group's median padded context per
row: ``_common.decode_step_ms``, the median of 25 calls after 10 untimed); and the price of one step at the calls'
median cached tokens (``calibrate.validation.compare.price_op``, what validate prices). The totals
weight each row count by its calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def apart_s(shape, dtype: str, rows: int, context: int, iters: int = 25) -> float:
    """Seconds of one decode step of ``rows`` rows at ``context`` cached tokens each, timed apart on a fresh
    ``StaticKVDecoder`` of ``shape`` (``_common.decode_step_ms``)."""
    from _common import decode_step_ms
    from calibrate.measuring.decoder import StaticKVDecoder
    from calibrate.measuring.models import torch_dtype

    dec = StaticKVDecoder(shape, dtype=torch_dtype(dtype), device="cpu", max_slots=rows, max_len=context + 2, head="lm", seed=0)
    return 1e-3 * decode_step_ms(dec, shape.vocab, rows, context, iters)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--profile", required=True, help="profile name or path the decode calls are priced with")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args(argv)
    from calibrate.executor.run import run_steps
    from calibrate.validation.compare import price_op
    from calibrate.validation.scenario import prepare
    import rlhfsim.costs.flops as fl
    from rlhfsim.costs.model import CostModel
    from rlhfsim.errors import RlhfsimError

    try:
        sc, setup, cfg, _ = prepare(a.scenario, "cpu", None, None)
        cost = CostModel.load(setup.gpu, a.profile)
    except RlhfsimError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if cfg.gen_runtime != "kv_decoder":
        print(f"error: generation.runtime: expected kv_decoder (the decode calls this compares), got {cfg.gen_runtime!r}",
              file=sys.stderr)
        return 2
    m, dtype = setup.shapes["actor"], setup.dtypes["actor"]
    weights = fl.ShapeCoeffs.of(m, dtype, "lm").decode_weight_bytes / 2**20
    results = run_steps(cfg)
    groups: dict[int, list] = {}
    for r in results[1:]:
        for name, secs, s in r.ops:
            if name == "decode":
                groups.setdefault(s["batch"], []).append((s["kv0"], s["kv_padded"], secs))
    rows = []
    for b in sorted(groups):
        xs = groups[b]
        kv0, kvp = statistics.median(x[0] for x in xs), statistics.median(x[1] for x in xs)
        step = statistics.median(x[2] for x in xs)
        rows.append({"rows": b, "calls": len(xs), "context_per_row": kv0 / b, "padded_context_per_row": kvp / b,
                     "in_step_s": step, "apart_s": apart_s(m, dtype, b, max(1, int(kvp / b))),
                     "price_s": price_op(cost, m, dtype, cfg.gen_runtime, "decode", {"batch": b, "kv0": kv0}).total_s})
    tot = {k: sum(r[k] * r["calls"] for r in rows) for k in ("in_step_s", "apart_s", "price_s")}
    out = {"scenario": str(a.scenario), "actor": m.name, "streamed_weights_mib": weights, "engine": cfg.engine,
           "intra": cfg.intra, "rows": rows, "totals_s": tot}
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{a.scenario.name}: {m.name} ({weights:.1f} MiB streamed), {cfg.engine} engine, intra-step scoring {cfg.intra}")
    print("rows  calls  ctx/row  padded/row  in step ms  apart ms  price ms  step/apart  price vs step")
    for r in rows:
        print(f"{r['rows']:4d} {r['calls']:6d} {r['context_per_row']:8.0f} {r['padded_context_per_row']:11.0f} "
              f"{1e3 * r['in_step_s']:11.2f} {1e3 * r['apart_s']:9.2f} {1e3 * r['price_s']:9.2f} "
              f"{r['in_step_s'] / r['apart_s']:11.2f} {r['price_s'] / r['in_step_s'] - 1:+14.1%}")
    print(f"all calls: in step {tot['in_step_s']:.3f} s, apart {tot['apart_s']:.3f} s (step/apart "
          f"{tot['in_step_s'] / tot['apart_s']:.2f}), price {tot['price_s']:.3f} s ({tot['price_s'] / tot['in_step_s'] - 1:+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

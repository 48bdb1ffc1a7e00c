"""The encoder work model, old against new, on one measurement: a calibration journal's encoder scoring points
(``score``, eager, padded) fitted twice, once without DeBERTa-v2's disentangled-attention terms (the work model
before DeBERTa was priced apart: a BERT layer's FLOPs and bytes) and once with them (``rlhfsim.costs.flops``); then tiny-deberta,
small-deberta and each HF config given (e.g. the drawn ``models/gen-deberta-*.json`` of ``validate --generate``
directories) timed once per shape (padded rows, the median of 15 calls after 3) and priced by both fits.

    python lab/diagnostics/encoder_workmodel.py CALIBRATION.journal.jsonl [MODEL_CONFIG.json ...]

Per model and shape: the time and price / measured under each work model. Last lines, per work model: the
drawn (given) models' price / measured, and the same divided by the in-grid models' median (tiny-deberta and
small-deberta, measured beside them), which cancels the host's drift since the calibration.
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np
from _common import encoder_cells

GRID_MODELS = ("tiny-deberta", "small-deberta")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("journal", help="a calibration journal with encoder scoring points (eager)")
    ap.add_argument("configs", nargs="*", help="HF config.json files of encoder models")
    args = ap.parse_args()

    import rlhfsim.costs.flops as fl
    from calibrate.fitting.assemble import padded_score_points
    from calibrate.fitting.fit import fit_operation
    from rlhfsim.costs.model import OpParams, roofline_kernel_s, with_overheads_s
    from rlhfsim.costs.profile import load_profile
    from rlhfsim.hardware.catalog import get_gpu
    from rlhfsim.models.catalog import CATALOG, shape_from_hf_config

    gpu = get_gpu("cpu")
    prior = OpParams.from_dict(load_profile("default")["operations"]["prefill"])
    with open(args.journal) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    pts = padded_score_points([r for r in recs if r.get("kind") == "point"], "eager", "encoder")
    if not pts:
        raise SystemExit(f"error: {args.journal}: expected eager padded encoder scoring points, found none")
    new_rel = fl._deberta_rel
    models_of = {"old": lambda m, b, materialized=True: {}, "new": new_rel}

    def under(name, fn):
        fl._deberta_rel = models_of[name]
        try:
            return fn()
        finally:
            fl._deberta_rel = new_rel

    fits = {k: OpParams.from_dict(under(k, lambda: fit_operation(pts, gpu, prior))) for k in models_of}

    def price(name, m, rows, n):
        p = fits[name]
        w = under(name, lambda: fl.forward_work(m, "float32", rows * n, rows))
        return float(with_overheads_s(roofline_kernel_s(w.flops, w.bytes, gpu.peak("float32"), gpu.mem_bw,
                                                        p.compute_eff, p.memory_eff), p, w.layers))

    models = [CATALOG[n] for n in GRID_MODELS] + [shape_from_hf_config(c) for c in args.configs]
    ratios = {k: {"grid": [], "drawn": []} for k in fits}
    for m, rows, n, meas in encoder_cells(models):
        r = {k: price(k, m, rows, n) / meas for k in fits}
        for k in fits:
            ratios[k]["grid" if m.name in GRID_MODELS else "drawn"].append(r[k])
        print(f"{m.name:28s} {rows}x{n}: {1e3 * meas:8.2f} ms  price / measured  old {r['old']:.2f}  new {r['new']:.2f}",
              flush=True)
    for k in fits:
        g = statistics.median(ratios[k]["grid"])
        line = f"{k}: in-grid median {g:.2f}"
        if ratios[k]["drawn"]:
            a = np.array(ratios[k]["drawn"])
            d = a / g
            line += (f"; drawn median {np.median(a):.2f} [{a.min():.2f}-{a.max():.2f}]; drawn / in-grid median "
                     f"{np.median(d):.2f} [{d.min():.2f}-{d.max():.2f}], median |log| {100 * np.median(np.abs(np.log(d))):.0f}%, "
                     f"sd of log {100 * np.std(np.log(d)):.0f}%")
        print(line)


if __name__ == "__main__":
    main()

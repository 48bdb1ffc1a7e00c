"""An encoder reward model's forward pass (padded rows x width, the HF model with random weights) timed on this CPU
against one or more profiles' price of the same pass (``CostModel.forward``, the ``encode:eager`` fit: what the
simulator and ``rlhfsim validate`` charge a reward call of an encoder). Not a speed benchmark: it checks whether a
profile's encoder fit carries to shapes it did not measure (on drawn validation scenarios: fitted on
tiny-deberta alone, drawn DeBERTa models of hidden 256 were priced at 1.6-2.6x their time).

    python lab/diagnostics/encoder_price.py --profiles a.json,b.json [MODEL_CONFIG.json ...]

Models: ``tiny-deberta`` and ``small-deberta`` from the catalog, then each HF config given (e.g. the drawn
``models/gen-deberta-*.json`` of a ``validate --generate`` directory). Per model and shape: the median of 15 calls
after 3 untimed, and price / measured per profile; the last line, per profile, the median and range of price /
measured over the configs given (all models when none is given).
"""

from __future__ import annotations

import argparse
import statistics

from _common import encoder_cells


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", required=True, help="comma-separated profile paths or names")
    ap.add_argument("configs", nargs="*", help="HF config.json files of encoder models")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()

    import torch

    from rlhfsim.costs.model import CostModel
    from rlhfsim.hardware.catalog import get_gpu
    from rlhfsim.models.catalog import CATALOG, shape_from_hf_config

    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.profiles.split(",")
    costs = [CostModel.load(get_gpu("cpu"), p) for p in names]
    given = [shape_from_hf_config(p) for p in args.configs]
    models = [CATALOG["tiny-deberta"], CATALOG["small-deberta"], *given]
    ratios: list[list[float]] = [[] for _ in costs]
    for m, rows, width, meas in encoder_cells(models):
        price = [float(c.forward(m, "float32", rows * width, rows, runtime="eager", head="value").total_s)
                 for c in costs]
        if m in given or not given:
            for r, p in zip(ratios, price):
                r.append(p / meas)
        print(f"{m.name:<28} L{m.layers} h{m.hidden} V{m.vocab} {rows}x{width}: measured {1e3 * meas:7.2f} ms, "
              "price / measured " + " ".join(f"{p / meas:.2f}" for p in price), flush=True)
    for name, r in zip(names, ratios):
        print(f"{name}: price / measured median {statistics.median(r):.2f} [{min(r):.2f}-{max(r):.2f}], "
              f"median |error| {100 * statistics.median(abs(x - 1) for x in r):.0f}% over {len(r)} cells")


if __name__ == "__main__":
    main()

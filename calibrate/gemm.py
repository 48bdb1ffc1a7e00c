"""Weight passes of a matrix product with more than one row, against one row, measured on this device.

A decode step of one row multiplies a vector by each weight matrix: the kernel (a GEMV) streams the
weights once. Two rows or more make it a matrix-matrix product (GEMM), whose CPU kernels (oneDNN/MKL)
pack the weight matrix into blocks before multiplying: on the 2-core CPU a linear layer of 0.3-4 MB of
weights took 1.9x as long at 2-8 rows as at 1 row (flat from 2 to 8 rows, where compute is still
small), proportional to the weight bytes. A roofline with one memory efficiency cannot fit both: the
decode fit under-priced every batch-4 point by 9-38% while fitting batch 1 and 16
(docs/validation.md, "Generated scenarios"). So the ratio is measured on its own, here, and the decode
work counts the weights ``gemm_weight_passes`` times when a step has two rows or more
(``rlhfsim.costs.flops.ShapeCoeffs.decode``), in the fit (``calibrate.fit.point_work``) and in the
simulator alike. Prefill, scoring and training always multiply many rows: their single memory efficiency
absorbs the packing.

Points (op ``gemm``; grid ``Grid.gemm`` of (rows, out features, in features)): ``torch.nn.functional.linear``
of a [rows, in] input by an [out, in] weight in the calibration dtype. The profile's
``kernels.gemm_weight_passes`` is the median over the grid's matrices and rows >= 2 of t(rows) / t(1 row),
at least 1 (``gemm_summary``); a profile without it counts the weights once at every batch.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from calibrate.session import Session, point_key


def _key(rows: int, out_f: int, in_f: int, dtype: str) -> str:
    return point_key("gemm", f"w{out_f}x{in_f}", dtype, batch=rows, seq_len=in_f, prefix_len=out_f)


def measure_gemm(s: Session) -> None:
    """Every ``Grid.gemm`` point (rows x [out, in] weights)."""
    with torch.inference_mode():
        for rows, out_f, in_f in s.grid.gemm:
            key = _key(rows, out_f, in_f, s.dtype)
            if not s.pending(key):
                continue
            gen = torch.Generator().manual_seed(out_f + in_f)
            w = torch.randn(out_f, in_f, generator=gen).to(s.device, s.tdtype)
            x = torch.randn(rows, in_f, generator=gen).to(s.device, s.tdtype)
            s.measure(key, {"op": "gemm", "model": f"w{out_f}x{in_f}", "batch": rows, "out_features": out_f,
                            "in_features": in_f, "weight_bytes": w.numel() * w.element_size(), "head": "",
                            "seq_len": in_f, "prefix_len": out_f, "tokens": rows,
                            "timed": "torch.nn.functional.linear"},
                      lambda x=x, w=w: F.linear(x, w))


def plan_size(grid) -> int:
    return len(grid.gemm)


def gemm_summary(points: list[dict], value) -> dict | None:
    """``{"gemm_weight_passes", "ratios", "points", "source"}`` from the ``gemm`` points (``value``: a
    point's measured seconds), or None without a matrix measured at 1 row and at more."""
    pts = [p for p in points if p["op"] == "gemm" and not p.get("skipped") and value(p) > 0]
    one = {(p["out_features"], p["in_features"]): value(p) for p in pts if p["batch"] == 1}
    ratios = [{"rows": p["batch"], "out": p["out_features"], "in": p["in_features"],
               "ratio": value(p) / one[(p["out_features"], p["in_features"])]}
              for p in pts if p["batch"] > 1 and (p["out_features"], p["in_features"]) in one]
    if not ratios:
        return None
    return {"gemm_weight_passes": max(1.0, float(np.median([r["ratio"] for r in ratios]))), "ratios": ratios,
            "points": [{"rows": p["batch"], "out": p["out_features"], "in": p["in_features"], "us": 1e6 * value(p)}
                       for p in pts],
            "source": "measured", "method": "median over matrices and rows >= 2 of t(rows) / t(1 row)"}

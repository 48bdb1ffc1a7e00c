"""Weight passes of a matrix product with more than one row, against one row, measured on this device.

A decode step of one row multiplies a vector by each weight matrix: the kernel (a GEMV) streams the
weights once. Two rows or more make it a matrix-matrix product (GEMM), whose CPU kernels (oneDNN/MKL)
pack the weight matrix into blocks before multiplying: on the 2-core CPU a linear layer of 0.3-4 MB of
weights took 1.9x as long at 2-8 rows as at 1 row (flat from 2 to 8 rows, where compute is still
small), proportional to the weight bytes. A roofline with one memory efficiency cannot fit both: the
decode fit under-priced every batch-4 point by 9-38% while fitting batch 1 and 16
(on scenarios drawn by ``rlhfsim validate --generate``). So the ratio is measured on its own, here, and the decode
work counts the weights ``gemm_weight_passes`` times when a step has two rows or more
(``rlhfsim.costs.flops.ShapeCoeffs.decode``), in the fit (``calibrate.fitting.fit.point_work``) and in the
simulator alike. Prefill, scoring and training always multiply many rows: their single memory efficiency
absorbs the packing.

Points (op ``gemm``; grid ``Grid.gemm`` of (rows, out features, in features)): ``torch.nn.functional.linear``
of a [rows, in] input by an [out, in] weight in the calibration dtype. The profile's
``kernels.gemm_weight_passes`` is the median over the grid's matrices and rows >= 2 of t(rows) / t(1 row),
at least 1 (``gemm_summary``); a profile without it counts the weights once at every batch.

By footprint (grid ``Grid.gemm_footprints_mib``; points with ``footprint_mib``): the same products with
the weight cycled through distinct copies of it that add up to each footprint, one call per copy, as a
decode step cycles through its layers' weights. One matrix called again and again stays in cache; a
decode step's weights do only while the model fits there. On the AMD EPYC 2-vCPU VM (32 MiB L3 of which
a VM sees less) one thread's 1-row product streamed 40-56 GB/s up to 9 MiB of weights and 9-16 GB/s from
16 MiB on, and the ratio at 2 rows fell from 1.6-2.5 to 1.0-1.6 across that cliff
(``lab/diagnostics/gemm_footprint.py``). ``kernels.gemm_passes_by_footprint``
is, per footprint, the median ratio over matrices and rows >= 2 (at least 1), and (``by_rows``) the median
ratio per row count: the cost model takes a model's passes at its weight footprint
(``rlhfsim.costs.cpuhost.footprint_passes``) and, where the row counts are there, at its step's rows,
interpolated linearly from one pass at one row (``gemm_passes``). One number for every row count priced a
two-row decode step at the passes of 2 and 4 rows alike, while a GEMM's time keeps growing with its rows
(``lab/diagnostics/decode_rows.py``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from calibrate.running.session import Session, point_key
from rlhfsim.costs.cpuhost import rates_from_ratios


def _name(out_f: int, in_f: int, foot: float | None) -> str:
    return f"w{out_f}x{in_f}" + ("" if foot is None else f"-f{foot:g}MiB")


def _key(rows: int, out_f: int, in_f: int, dtype: str, foot: float | None = None) -> str:
    return point_key("gemm", _name(out_f, in_f, foot), dtype, batch=rows, seq_len=in_f, prefix_len=out_f)


def _fields(rows: int, out_f: int, in_f: int, weight_bytes: int, foot: float | None = None, copies: int = 1) -> dict:
    f = {"op": "gemm", "model": _name(out_f, in_f, foot), "batch": rows, "out_features": out_f, "in_features": in_f,
         "weight_bytes": weight_bytes, "head": "", "seq_len": in_f, "prefix_len": out_f, "tokens": rows,
         "timed": "torch.nn.functional.linear"}
    if foot is not None:
        f.update(footprint_mib=foot, copies=copies,
                 timed=f"torch.nn.functional.linear over {copies} distinct copies of the weight")
    return f


def measure_gemm(s: Session) -> None:
    """Every ``Grid.gemm`` point (rows x [out, in] weights), then each matrix again at every
    ``Grid.gemm_footprints_mib`` (cycled through distinct copies of it)."""
    with torch.inference_mode():
        for rows, out_f, in_f in s.grid.gemm:
            key = _key(rows, out_f, in_f, s.dtype)
            if not s.pending(key):
                continue
            gen = torch.Generator().manual_seed(out_f + in_f)
            w = torch.randn(out_f, in_f, generator=gen).to(s.device, s.tdtype)
            x = torch.randn(rows, in_f, generator=gen).to(s.device, s.tdtype)
            s.measure(key, _fields(rows, out_f, in_f, w.numel() * w.element_size()), lambda x=x, w=w: F.linear(x, w))
        for foot in s.grid.gemm_footprints_mib:
            for out_f, in_f in sorted({(o, i) for _, o, i in s.grid.gemm}):
                todo = [r for r, o, i in s.grid.gemm
                        if (o, i) == (out_f, in_f) and s.pending(_key(r, out_f, in_f, s.dtype, foot))]
                if not todo:
                    continue
                gen = torch.Generator().manual_seed(out_f + in_f)
                w0 = torch.randn(out_f, in_f, generator=gen).to(s.device, s.tdtype)
                wb = w0.numel() * w0.element_size()
                copies = max(1, round(foot * 2**20 / wb))
                ws = [w0] + [w0.clone() for _ in range(copies - 1)]
                for rows in todo:
                    x = torch.randn(rows, in_f, generator=gen).to(s.device, s.tdtype)
                    s.measure(_key(rows, out_f, in_f, s.dtype, foot), _fields(rows, out_f, in_f, wb, foot, copies),
                              lambda x=x, ws=ws: [F.linear(x, w) for w in ws])
                del ws, w0


def plan_size(grid) -> int:
    return len(grid.gemm) * (1 + len(grid.gemm_footprints_mib))


def _ratios(pts: list[dict], value, matrix) -> list[tuple[dict, float, float]]:
    """(point, t(rows) / t(1 row), t(1 row)) of each point of two rows or more whose ``matrix(point)`` was
    also measured at one row."""
    one = {matrix(p): value(p) for p in pts if p["batch"] == 1}
    return [(p, value(p) / one[matrix(p)], one[matrix(p)]) for p in pts if p["batch"] > 1 and matrix(p) in one]


def gemm_summary(points: list[dict], value) -> dict | None:
    """``{"gemm_weight_passes", "ratios", "points", "source"}`` (and ``by_footprint``: ``footprint_summary``)
    from the ``gemm`` points (``value``: a point's measured seconds), or None without a matrix measured at 1
    row and at more."""
    every = [p for p in points if p["op"] == "gemm" and not p.get("skipped") and value(p) > 0]
    pts = [p for p in every if p.get("footprint_mib") is None]
    ratios = [{"rows": p["batch"], "out": p["out_features"], "in": p["in_features"], "ratio": r}
              for p, r, _ in _ratios(pts, value, lambda p: (p["out_features"], p["in_features"]))]
    if not ratios:
        return None
    out = {"gemm_weight_passes": max(1.0, float(np.median([r["ratio"] for r in ratios]))), "ratios": ratios,
           "points": [{"rows": p["batch"], "out": p["out_features"], "in": p["in_features"], "us": 1e6 * value(p)}
                      for p in pts],
           "source": "measured", "method": "median over matrices and rows >= 2 of t(rows) / t(1 row)"}
    by = footprint_summary(every, value)
    if by is not None:
        out["by_footprint"] = by
    return out


def footprint_summary(points: list[dict], value) -> dict | None:
    """``{"footprint_mib", "passes", "ratios", "source", "method"}`` from the footprint points (at least two
    footprints with a ratio), or None."""
    pts = [p for p in points if p.get("footprint_mib") is not None]
    ratios = [{"footprint_mib": p["footprint_mib"], "rows": p["batch"], "out": p["out_features"], "in": p["in_features"],
               "copies": p.get("copies"), "ratio": r, "gb_s_1row": (p.get("copies") or 1) * p["weight_bytes"] / t1 / 1e9}
              for p, r, t1 in _ratios(pts, value, lambda p: (p["footprint_mib"], p["out_features"], p["in_features"]))]
    feet = sorted({r["footprint_mib"] for r in ratios})
    if len(feet) < 2:
        return None
    out = {"footprint_mib": [float(f) for f in feet],
           "passes": [max(1.0, float(np.median([r["ratio"] for r in ratios if r["footprint_mib"] == f]))) for f in feet],
           # the one-row product's streaming rate per footprint: the fastest a decode step's weights of that
           # footprint can stream (rlhfsim.costs.cpuhost.footprint_rate)
           "gb_s_1row": rates_from_ratios(ratios, feet),
           "ratios": ratios, "source": "measured",
           "method": "per footprint, median over matrices and rows >= 2 of t(rows) / t(1 row), the weight cycled "
                     "through distinct copies adding up to the footprint; interpolated in log footprint"}
    rows = sorted({r["rows"] for r in ratios})
    if len(rows) >= 2 and all(any(r["rows"] == n and r["footprint_mib"] == f for r in ratios) for n in rows for f in feet):
        out["by_rows"] = {
            "rows": rows,
            "passes": [[max(1.0, float(np.median([r["ratio"] for r in ratios if r["rows"] == n and r["footprint_mib"] == f])))
                        for f in feet] for n in rows],
            "method": "per row count and footprint, median over matrices of t(rows) / t(1 row); the cost model "
                      "interpolates linearly in rows from 1 pass at one row and holds the last row count's passes "
                      "beyond it (rlhfsim.costs.flops.gemm_passes)"}
    return out

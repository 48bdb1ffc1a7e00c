"""A linear layer's time at 2, 4 and 8 rows against 1 row, by the working set it streams from: one weight
matrix called again and again (what ``calibrate.cpu.gemm`` measures, the matrix stays in cache) against
distinct copies of it cycled until their bytes add up to a footprint, as a decode step cycles through its
layers' weights. Not a speed benchmark: it measures the cache cliff that the scalar
``gemm_weight_passes`` of a CPU profile cannot express.

    python lab/diagnostics/gemm_footprint.py                       # 1 thread, the default matrices and footprints
    python lab/diagnostics/gemm_footprint.py --threads 2 --format json --profile cpu

Each cell is the median of the timed rounds (after two warm-up rounds) of one call per copy, divided by
the copies; the ratio is t(rows) / t(1 row) at the same footprint; GB/s is the 1-row call's weight bytes
over its time. Weights in float32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

MATRICES = ((768, 256), (1536, 384), (384, 1536))
FOOTPRINTS_MIB = (0.0, 4.0, 8.0, 16.0, 32.0, 64.0)   # 0: one matrix called again and again (calibrate.cpu.gemm)
ROWS = (2, 4, 8)


def _time(F, ws, x, rounds: int) -> float:
    out = []
    for _ in range(rounds + 2):
        t0 = time.perf_counter()
        for w in ws:
            F.linear(x, w)
        out.append((time.perf_counter() - t0) / len(ws))
    return statistics.median(out[2:])


def measure(matrices, footprints, rows, budget_calls: int) -> list[dict]:
    import torch
    import torch.nn.functional as F
    out = []
    with torch.inference_mode():
        for o, i in matrices:
            mib = o * i * 4 / 2**20
            for foot in footprints:
                n = 1 if foot <= 0 else max(1, round(foot / mib))
                ws = [torch.randn(o, i)] * 32 if foot <= 0 else [torch.randn(o, i) for _ in range(n)]
                rounds = max(5, budget_calls // len(ws))
                one = _time(F, ws, torch.randn(1, i), rounds)
                row = {"out": o, "in": i, "matrix_mib": round(mib, 2), "footprint_mib": round(n * mib, 1) if foot > 0 else None,
                       "us_1row": 1e6 * one, "gbps_1row": o * i * 4 / one / 1e9}
                for r in rows:
                    row[f"ratio_{r}"] = _time(F, ws, torch.randn(r, i), rounds) / one
                out.append(row)
                print(f"  {o}x{i} {'same matrix' if foot <= 0 else f'{n * mib:.1f} MiB'} done", file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=400, help="calls per timed cell (at least 5 rounds)")
    ap.add_argument("--profile", default=None, help="a CPU profile whose gemm_weight_passes to show beside")
    ap.add_argument("--format", choices=("table", "json"), default="table")
    a = ap.parse_args()
    import torch
    torch.set_num_threads(a.threads)
    rows = measure(MATRICES, FOOTPRINTS_MIB, ROWS, a.calls)
    passes, by_foot = None, None
    if a.profile:
        from rlhfsim.costs.profile import load_profile
        kernels = load_profile(a.profile).get("kernels") or {}
        passes, by_foot = kernels.get("gemm_weight_passes"), kernels.get("gemm_passes_by_footprint")
    if a.format == "json":
        print(json.dumps({"threads": a.threads, "torch": torch.__version__, "profile_gemm_weight_passes": passes,
                          "profile_gemm_passes_by_footprint": by_foot and dict(zip(by_foot["footprint_mib"], by_foot["passes"])),
                          "rows": rows}, indent=1))
        return
    print(f"F.linear, float32, {a.threads} thread(s), torch {torch.__version__}"
          + (f"; profile {a.profile}: gemm_weight_passes {passes}" if a.profile else "")
          + ("; by footprint " + ", ".join(f"{f:g} MiB {p:.2f}" for f, p in zip(by_foot["footprint_mib"], by_foot["passes"]))
             if by_foot else ""))
    print(f"{'matrix':>10} {'working set':>12} {'us @1 row':>9} {'GB/s':>6} " + " ".join(f"{f'x{r} rows':>8}" for r in ROWS))
    for x in rows:
        ws = "same matrix" if x["footprint_mib"] is None else f"{x['footprint_mib']} MiB"
        print(f"{x['out']}x{x['in']:<5} {ws:>12} {x['us_1row']:>9.1f} {x['gbps_1row']:>6.1f} "
              + " ".join(f"{x[f'ratio_{r}']:>8.2f}" for r in ROWS))


if __name__ == "__main__":
    main()

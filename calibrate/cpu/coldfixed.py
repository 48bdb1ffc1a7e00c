"""A decode step's fixed costs after its weights have streamed through the caches, measured on this device.

A decode step of one row is the weights streamed once plus fixed work per step and per layer (dispatch,
norms, one-row attention, the cache writes, the sampling tail). The decode fit prices that fixed work as
``overhead_s + overhead_per_layer_s x L`` and the sampling tail as ``calibrate.measuring.sampling`` measures it, hot: one
number for every model size. In a real step each layer's fixed work runs right after the other layers' weights
(this step's and the last one's) have swept the caches, so it costs more the larger the model: on the AMD EPYC
2-vCPU VM a small in-cache model's whole step took 1.25-1.8x as long after 12-48 MiB of other weights had
streamed, its sampling call 1.1-2.9x (``lab/diagnostics/cold_overheads.py``).

Points (op ``cold_step``; one per footprint in 0 + ``Grid.gemm_footprints_mib``): the executor's decode step
(``Generator._decode``: a ``StaticKVDecoder`` step and ``sample_next``, one row at ``CONTEXT`` cached tokens,
rewound before each call) of the smallest actor decoder, its weights a few MiB and its step almost all fixed
cost, each timed right after an untimed sweep of one-row products (``F.linear`` of a [1, 256] row by each of
``ceil(F MiB / 0.75 MiB)`` distinct [768, 256] weights in the calibration dtype), as ``calibrate.cpu.gemm``'s
footprint sweep streams them. ``kernels.cold_overheads`` (``cold_summary``) holds, per footprint, the step's
time over the same step with no sweep, at least 1: the factor by which a model of that decode-weight footprint
pays its fixed costs and sampling tail (``rlhfsim.costs.cpuhost.cold_factor``), in the decode fit
(``calibrate.fitting.fit``: each decode point's overheads and tail times its factor, field ``cold_x``) and in the
simulator alike (``rlhfsim.costs.model._Decode``). On a GPU the sweep streams device memory and the fixed work
is the host's, so the factors there come out near 1.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from calibrate.running.session import Session, point_key
from rlhfsim.costs import flops as fl
from rlhfsim.models.catalog import ModelShape

CONTEXT = 64           # cached tokens of the probe's one row
SWEEP = (768, 256)     # one sweep matrix (out, in): 0.75 MiB of float32, a small model's MLP projection


def feet(grid) -> tuple[float, ...]:
    """The probe's footprints, MiB: 0 (no sweep) and the grid's ``gemm_footprints_mib``; () without those."""
    return (0.0,) + tuple(float(f) for f in grid.gemm_footprints_mib) if grid.gemm_footprints_mib else ()


def probe_shape(actors: list[ModelShape], dtype: str = "float32") -> ModelShape | None:
    """The actor decoder with the fewest decode-weight bytes (its step is the most fixed cost), or None."""
    return min(actors, key=lambda m: fl.ShapeCoeffs.of(m, dtype, "lm").decode_weight_bytes) if actors else None


def plan_size(grid, actors) -> int:
    return len(feet(grid)) if actors else 0


def _key(shape: ModelShape, dtype: str, foot: float) -> str:
    return point_key("cold_step", f"{shape.name}-f{foot:g}MiB", dtype, batch=1, seq_len=1, prefix_len=CONTEXT, head="lm")


def sweep_weights(foot_mib: float, device, dtype, generator) -> list:
    """``ceil(F MiB / 0.75 MiB)`` distinct ``SWEEP`` weights (none at 0), drawn from ``generator``."""
    n = math.ceil(foot_mib * 2**20 / (SWEEP[0] * SWEEP[1] * 4)) if foot_mib > 0 else 0
    return [torch.randn(*SWEEP, generator=generator).to(device, dtype) for _ in range(n)]


def measure_cold(s: Session, actors: list[ModelShape]) -> None:
    """Every footprint's ``cold_step`` point on the smallest of ``actors`` (module docstring)."""
    from calibrate.measuring.bench import _fields, decode_loop

    shape = probe_shape(actors, s.dtype)
    todo = [(f, _key(shape, s.dtype, f)) for f in feet(s.grid)] if shape is not None else []
    if not todo or s.all_done([k for _, k in todo]):
        return
    g = s.grid
    with torch.inference_mode():
        dec = s.decoder(shape, "lm", 1, CONTEXT + g.max_iters + g.warmup + 4)
        slots = torch.arange(1)
        gen_ids = torch.Generator().manual_seed(23)
        dec.reset(slots)
        dec.extend(slots, torch.randint(0, shape.vocab, (1, CONTEXT), generator=gen_ids).to(s.device))
        call, rewind = decode_loop(dec, slots, CONTEXT, [1], s.device)
        x = torch.randn(1, SWEEP[1], generator=gen_ids).to(s.device, s.tdtype)
        for foot, key in todo:
            if not s.pending(key):
                continue
            ws = sweep_weights(foot, s.device, s.tdtype, gen_ids)

            def setup(ws=ws):
                rewind()
                for w in ws:
                    F.linear(x, w)
                s.sync()

            f = {**_fields("cold_step", shape, "lm", 1, 1, CONTEXT, 1), "footprint_mib": foot, "sweep_matrices": len(ws),
                 "timed": f"Generator._decode of one row after F.linear of a [1, {SWEEP[1]}] row by {len(ws)} distinct "
                          f"[{SWEEP[0]}, {SWEEP[1]}] weights (untimed)"}
            s.measure(key, f, call, setup=setup)
            del ws
        del dec
        s.free()


def cold_summary(points: list[dict], value) -> dict | None:
    """``{"footprint_mib", "factor", "step_us", "model", "source", "method"}`` from the ``cold_step`` points of
    one model (the first measured), or None without its no-sweep point and at least one footprint beside it."""
    pts = [p for p in points if p.get("op") == "cold_step" and not p.get("skipped") and value(p) > 0]
    if not pts:
        return None
    model = pts[0]["model"]
    by = {}
    for p in pts:
        if p["model"] == model:
            by[float(p["footprint_mib"])] = value(p)
    if 0.0 not in by or len(by) < 2:
        return None
    feet_ = sorted(by)
    base = by[0.0]
    return {"footprint_mib": feet_, "factor": [max(1.0, by[f] / base) for f in feet_],
            "step_us": [1e6 * by[f] for f in feet_], "model": model, "source": "measured",
            "method": "per footprint F, the smallest actor's one-row decode step (Generator._decode) timed right "
                      "after one-row products over F MiB of distinct weights, over the same step with no sweep "
                      "(at least 1); interpolated linearly in F, held at the ends (calibrate.cpu.coldfixed)"}


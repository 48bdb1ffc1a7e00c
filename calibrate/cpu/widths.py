"""Training efficiency by model width, measured on this device.

The ``train`` fit has one compute efficiency for every model, but the rate at which a transformer layer
trains is not the same at every width: narrow layers multiply narrow matrices (a short inner dimension
per output element) and spend more of their time in the per-token work around the products (norms,
rotary embeddings, activations, their backward). On the 2-core CPU the bundled profile's own training
points of hidden-128 models were under-priced by 7-21% at 1,024 tokens and those of hidden 256
over-priced by 6-16%, and generated scenarios' actor training was under-priced by a median 20% at hidden
128 and over by 5% at hidden 320 (``rlhfsim validate --generate``). So the rate is measured per width, here, and the
body FLOPs of a training pass are divided by the width's relative rate in the fit
(``calibrate.fitting.fit.point_work``) and in the simulator (``CostModel.train``) alike:

    F_train = 3 (F_body / r(h) + F_attn + F_head),   r(h) = rate(h) / max_w rate(w)

Points (op ``width_train``; grid ``Grid.widths``, widths w with MLP ratio ``width_mlp_ratio`` and
``width_tokens`` tokens in 2 rows): a forward + backward of a Qwen2 model with a value head and a
256-entry vocabulary (the head and embedding cost nothing), of 1 and of 3 layers of width w (heads of 64,
one KV head for an odd head count, else two). A layer's time is (t(3) - t(1)) / 2, which removes the
fixed per-call costs; its rate is the layer's training FLOPs (``rlhfsim.costs.flops``) over that time.
``kernels.width_efficiency``: the widths, their relative rates (the fastest 1) and the points
(``width_summary``); r(h) of a model is interpolated in log width and held at the ends
(``rlhfsim.costs.cpuhost.width_rate``).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import torch

from calibrate.running.session import Session, point_key
from rlhfsim.models.catalog import ModelShape

VOCAB = 256
HEAD_DIM = 64
LAYER_COUNTS = (1, 3)


def width_shape(width: int, layers: int, ratio: int) -> ModelShape:
    heads = max(1, width // HEAD_DIM)
    kv = 2 if heads % 2 == 0 else 1
    return ModelShape(f"width-w{width}-l{layers}", "decoder", layers, width, ratio * width, heads, kv, VOCAB,
                      True, True, "qwen2", 4096, "")


def _key(width: int, layers: int, tokens: int, dtype: str, ratio: int | None = None) -> str:
    """A point's journal key; ``ratio`` for the MLP ratios beyond the grid's ``width_mlp_ratio`` (whose
    keys stay as they were, so journals of earlier calibrations resume)."""
    name = f"w{width}-l{layers}" + ("" if ratio is None else f"-r{ratio}")
    return point_key("width_train", name, dtype, batch=2, seq_len=tokens // 2, prefix_len=layers)


def measure_widths(s: Session) -> None:
    """Every ``Grid.widths`` width at 1 and 3 layers (see the module docstring)."""
    g = s.grid
    n = max(2, int(g.width_tokens) // 2)
    autocast = (lambda: torch.autocast("cuda", dtype=s.tdtype)) if s.cuda and s.dtype != "float32" else contextlib.nullcontext
    ratios = [(g.width_mlp_ratio, None)] + [(r, r) for r in g.width_mlp_ratios if r != g.width_mlp_ratio]
    for (ratio, tag), width, layers in ((rt, w, k) for rt in ratios for w in g.widths for k in LAYER_COUNTS):
        key = _key(width, layers, 2 * n, s.dtype, tag)
        if not s.pending(key):
            continue
        shape = width_shape(width, layers, ratio)
        if tag is not None:
            shape = replace(shape, name=f"{shape.name}-r{ratio}")
        model = s.hf_model(shape, "value", dtype="float32").train()
        ids = torch.randint(1, VOCAB, (2, n), generator=torch.Generator().manual_seed(width + layers)).to(s.device)

        def step(model=model, ids=ids):
            model.zero_grad(set_to_none=True)
            with autocast():    # as calibrate.measuring.bench.measure_training trains: bf16 autocast on CUDA
                loss = model(input_ids=ids).logits.float().pow(2).mean()
            loss.backward()

        with torch.inference_mode(False):
            s.measure(key, {"op": "width_train", "model": shape.name, "shape": shape.to_dict(), "head": "value",
                            "batch": 2, "seq_len": n, "prefix_len": 0, "tokens": 2 * n, "width": width,
                            "layers": layers, "timed": "forward + backward of a value-head model"}, step)
        del model
        s.free()


def plan_size(grid) -> int:
    ratios = {grid.width_mlp_ratio, *grid.width_mlp_ratios}
    return len(grid.widths) * len(LAYER_COUNTS) * len(ratios)


def _layer_flops(width: int, ratio: int, tokens: int) -> float:
    shape = width_shape(width, 1, ratio)
    per_seq = tokens / 2
    return 3.0 * (2.0 * shape.layer_params * tokens + 4.0 * width * 2 * per_seq * (per_seq + 1) / 2)


def width_summary(points: list[dict], value) -> dict | None:
    """``{"widths", "relative_rate", "points", ...}`` from the ``width_train`` points (``value``: a point's
    seconds), or None without two widths measured at both layer counts. Rates are per (MLP ratio, width),
    relative to the fastest of all; ``widths``/``relative_rate`` are the grid's own ratio's (``mlp_ratio``:
    the points without a ``-r`` tag), and with two ratios or more ``by_ratio`` has each one's
    (``rlhfsim.costs.cpuhost.width_rate`` interpolates between them)."""
    t: dict[tuple[int, int], dict[int, tuple[float, dict]]] = {}
    primary = None
    for p in points:
        if p["op"] == "width_train" and not p.get("skipped") and value(p) > 0:
            ratio = p["shape"]["intermediate"] // p["width"]
            t.setdefault((ratio, p["width"]), {})[p["layers"]] = (value(p), p)
            if not p["model"].endswith(f"-r{ratio}"):
                primary = ratio
    rates: dict[int, dict[int, tuple[float, float]]] = {}
    for (ratio, w), by in sorted(t.items()):
        if all(k in by for k in LAYER_COUNTS):
            layer_s = (by[LAYER_COUNTS[1]][0] - by[LAYER_COUNTS[0]][0]) / (LAYER_COUNTS[1] - LAYER_COUNTS[0])
            if layer_s > 0:
                rates.setdefault(ratio, {})[w] = (_layer_flops(w, ratio, by[LAYER_COUNTS[0]][1]["tokens"]) / layer_s, layer_s)
    rates = {r: v for r, v in rates.items() if len(v) >= 2}
    if not rates:
        return None
    primary = primary if primary in rates else max(rates, key=lambda r: len(rates[r]))
    top = max(x for v in rates.values() for x, _ in v.values())
    widths = sorted(rates[primary])
    out = {"widths": widths, "relative_rate": [rates[primary][w][0] / top for w in widths], "mlp_ratio": primary,
           "layer_ms": [1e3 * rates[primary][w][1] for w in widths],
           "gflops": [rates[primary][w][0] / 1e9 for w in widths], "source": "measured",
           "method": "per-layer forward+backward time (3 layers - 1 layer) / 2; rate = layer FLOPs / time; "
                     "relative to the fastest width and MLP ratio"}
    if len(rates) >= 2:
        out["by_ratio"] = {str(r): {"widths": sorted(v), "relative_rate": [v[w][0] / top for w in sorted(v)]}
                           for r, v in sorted(rates.items())}
    return out

"""TensorRT through torch-tensorrt (dynamo frontend), where installed and on CUDA only.

The reward model is compiled once per model with an optimization profile over (batch, length) ranges
that cover the calibration grid (min 1 x 2, opt at the first point's shape, max 256 x 4096, widened if a
point exceeds it, which recompiles); precision is the model's dtype. ``setup_s`` = the compile time on the
first point of each model. Elsewhere the runtime is skipped with the reason stated.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from calibrate.measuring.interleave import Prepared
from calibrate.runtimes.base import Runtime, ScoreModule
from rlhfsim.errors import RlhfsimError

MAX_SHAPE = (256, 4096)


class TensorRT(Runtime):
    """``torch_tensorrt.compile(ScoreModule(model), ir="dynamo", ...)``."""

    NAME = "tensorrt"

    def __init__(self):
        self._compiled: dict[int, tuple] = {}

    def available(self, device: str) -> tuple[bool, str]:
        if torch.device(device).type != "cuda":
            return False, "TensorRT runs on NVIDIA GPUs only"
        if not torch.cuda.is_available():
            return False, "CUDA is not available to torch"
        try:
            import torch_tensorrt  # noqa: F401
        except ImportError:
            return False, "torch-tensorrt is not installed"
        return True, ""

    def prepare(self, model, input_ids, attention_mask, *, device: str, cache_dir: Path) -> Prepared:
        import torch_tensorrt

        b, n = input_ids.shape
        key = id(model)
        setup_s = 0.0
        entry = self._compiled.get(key)
        if entry is None or b > entry[1][0] or n > entry[1][1]:
            max_shape = (max(b, MAX_SHAPE[0]), max(n, MAX_SHAPE[1]))
            spec = [torch_tensorrt.Input(min_shape=(1, 2), opt_shape=(b, n), max_shape=max_shape, dtype=torch.int64)
                    for _ in range(2)]
            dtype = next(model.parameters()).dtype
            t0 = time.perf_counter()
            try:
                trt = torch_tensorrt.compile(ScoreModule(model).eval(), ir="dynamo", inputs=spec,
                                             enabled_precisions={dtype}, truncate_double=True)
            except Exception as e:  # compiler failures come in many types; all mean "cannot build"
                msg = (str(e).strip().splitlines() or ["(no message)"])[0]
                raise RlhfsimError(f"tensorrt: torch_tensorrt.compile failed for {type(model).__name__}: {type(e).__name__}: {msg}") from None
            setup_s = time.perf_counter() - t0
            entry = (trt, max_shape)
            self._compiled = {key: entry}  # one model at a time: free the previous engine
        trt = entry[0]

        def call():
            with torch.inference_mode():
                return trt(input_ids, attention_mask)

        return Prepared(call, setup_s)

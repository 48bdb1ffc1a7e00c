"""torch.compile with the inductor backend.

Compiled with ``dynamic=True``: one graph per model serves every batch size and length (the deployment
a scorer fed by variable-length RLHF responses would use; static shapes would recompile per shape).
The compilation happens inside the first call of the first point of each model, so it is that point's
``first_call_s`` (compile time = first_call_s - median_s); steady-state samples never include it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from calibrate.measuring.interleave import Prepared
from calibrate.runtimes.base import Runtime, ScoreModule


def inductor_available(device: str) -> tuple[bool, str]:
    """Can torch.compile's inductor run on ``device``? (On CUDA it generates Triton kernels.)"""
    if torch.device(device).type == "cuda":
        try:
            import triton  # noqa: F401  (inductor's GPU code generator)
        except ImportError:
            return False, "inductor on CUDA needs triton, which is not installed"
    return True, ""


class Compile(Runtime):
    """``torch.compile(ScoreModule(model), backend="inductor", dynamic=True)``."""

    NAME = "compile"

    def __init__(self):
        self._compiled: dict[int, torch.nn.Module] = {}

    def available(self, device: str) -> tuple[bool, str]:
        return inductor_available(device)

    def prepare(self, model, input_ids, attention_mask, *, device: str, cache_dir: Path) -> Prepared:
        key = id(model)
        if key not in self._compiled:
            self._compiled = {key: torch.compile(ScoreModule(model), backend="inductor", dynamic=True)}
        mod = self._compiled[key]

        def call():
            with torch.inference_mode():
                return mod(input_ids, attention_mask)

        return Prepared(call)

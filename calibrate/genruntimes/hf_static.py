"""``hf_static``: ``generate()`` with ``cache_implementation="static"`` and the model's forward wrapped in
``torch.compile``, the recipe of the transformers docs ("LLM inference optimization")::

    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    model.generate(..., cache_implementation="static")

``mode="reduce-overhead"`` (CUDA graphs) on CUDA; inductor's default mode on CPU, where CUDA graphs do
not exist. Otherwise TRL's arguments (``hf_generate``), including ``disable_compile=True`` so that
``generate`` does not wrap the already compiled forward a second time. Every fresh call allocates its
static cache with ``max_cache_len`` = the largest length this calibration needs for the model (a
constant, so the decode graph depends on the batch size alone and is compiled once per batch size;
prefill graphs are compiled per prompt shape until dynamo marks the length dynamic). Compilation lands
in the first calls (the correctness check and each point's first call), never in the timed samples; a
compile failure makes the runtime invalid with the error as its reason. Past dynamo's recompile limit
a compiled function silently runs eagerly; here that raises instead
(``fail_on_recompile_limit_hit``), so an eager run is never timed under this runtime's name.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from calibrate.genruntimes.hf_generate import HfGenerate
from calibrate.runtimes.compile import inductor_available
from rlhfsim.models.catalog import ModelShape


class HfStatic(HfGenerate):
    """HF generate with a static cache and a ``torch.compile``d forward."""

    NAME: ClassVar[str] = "hf_static"
    COMPILED: ClassVar[bool] = True

    def available(self, device: str) -> tuple[bool, str]:
        return inductor_available(device)

    def load(self, model, shape: ModelShape, *, max_batch: int, max_len: int) -> None:
        super().load(model, shape, max_batch=max_batch, max_len=max_len)
        mode = "reduce-overhead" if model.device.type == "cuda" else "default"
        model.forward = torch.compile(model.forward, mode=mode, fullgraph=True)

    def unload(self) -> None:
        if self.model is not None and "forward" in vars(self.model):
            del self.model.forward        # back to the class's eager forward
        super().unload()

    def fresh_cache_kwargs(self) -> dict:
        return {"cache_implementation": "static", "max_cache_len": self.max_len}

    def generate(self, *args, **kwargs):
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
            return super().generate(*args, **kwargs)

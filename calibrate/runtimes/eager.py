"""Eager PyTorch (transformers' modules as they are, sdpa attention), under ``torch.inference_mode``:
the baseline every other runtime is compared with."""

from __future__ import annotations

from pathlib import Path

import torch

from calibrate.runtimes.base import Runtime, ScoreModule, Timing


class Eager(Runtime):
    """transformers model called directly."""

    NAME = "eager"

    def time_scoring(self, model, input_ids, attention_mask, *, device: str, warmup: int, iters: int,
                     cache_dir: Path) -> Timing:
        mod = ScoreModule(model)

        def call():
            with torch.inference_mode():
                return mod(input_ids, attention_mask)

        return self._timed(call, device=device, warmup=warmup, iters=iters, setup_s=0.0)

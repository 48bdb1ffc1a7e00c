"""Eager PyTorch (transformers' modules as they are, sdpa attention), under ``torch.inference_mode``:
the baseline every other runtime is compared with."""

from __future__ import annotations

from pathlib import Path

import torch

from calibrate.measuring.interleave import Prepared
from calibrate.runtimes.base import Runtime, ScoreModule


class Eager(Runtime):
    """transformers model called directly."""

    NAME = "eager"

    def prepare(self, model, input_ids, attention_mask, *, device: str, cache_dir: Path) -> Prepared:
        mod = ScoreModule(model)

        def call():
            with torch.inference_mode():
                return mod(input_ids, attention_mask)

        return Prepared(call)

"""``vllm`` and ``sglang``: continuous-batching engines with paged KV caches, measured through their
offline Python APIs where one is importable on a CUDA device, otherwise skipped with the reason (never
faked). Neither is installed where this repository's tests run, so this path is exercised only on a
GPU machine that has them.

The HF model (random weights) is saved to a temporary directory and loaded by the engine without a
tokenizer; prompts go in as token ids (left padding stripped); ``exact`` sets ``min_tokens = max_tokens``
and ``ignore_eos``. A continuation resubmits prompt + generated tokens: with prefix caching on, the
engine finds the prefix in its cache and prefills only the last partial block (these engines keep no
per-request state between calls, so this is how a chunked generation on top of them runs). Timed on the
host clock (the engines launch on streams torch does not see).
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from typing import ClassVar

import torch

from calibrate.genruntimes.base import Generation, GenRuntime
from calibrate.measuring.models import PAD_ID
from rlhfsim.models.catalog import ModelShape

GPU_MEMORY_FRACTION = 0.5


class _Offline(GenRuntime):
    """Shared plumbing of the offline engines (subclasses set ``MODULE`` and implement ``_start``/``_run``)."""

    MODULE: ClassVar[str]
    HOST_CLOCK: ClassVar[bool] = True
    PROBES_FORWARD: ClassVar[bool] = False
    TAKES_PROCESSORS: ClassVar[bool] = False

    def __init__(self):
        self.engine = None
        self.dir: str | None = None

    def available(self, device: str) -> tuple[bool, str]:
        if importlib.util.find_spec(self.MODULE) is None:
            return False, f"not importable ({self.MODULE} is not installed)"
        if torch.device(device).type != "cuda":
            return False, "needs a CUDA device"
        return True, ""

    def load(self, model, shape: ModelShape, *, max_batch: int, max_len: int) -> None:
        self.dir = tempfile.mkdtemp(prefix=f"rlhfsim-{self.NAME}-")
        model.save_pretrained(self.dir)
        self.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        self.engine = self._start(max_batch, max_len)

    def unload(self) -> None:
        self.engine = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def generate(self, ids, mask, max_new_tokens, *, sample=True, exact=True, state=None, keep_state=False,
                 want_logits=False, stopping=(), processors=()) -> Generation:
        prompts = [row[m.bool()].tolist() for row, m in zip(ids.cpu(), mask.cpu())]
        outs = self._run(prompts, max_new_tokens, sample, exact)
        new = torch.full((len(prompts), max_new_tokens), PAD_ID, dtype=torch.long)
        for i, o in enumerate(outs):
            new[i, :len(o)] = torch.tensor(o[:max_new_tokens], dtype=torch.long)
        seq = torch.cat([ids, new.to(ids.device)], 1)
        return Generation(seq, torch.cat([mask, torch.ones_like(new, dtype=mask.dtype).to(mask.device)], 1))

    def _start(self, max_batch: int, max_len: int):
        raise NotImplementedError

    def _run(self, prompts: list[list[int]], n: int, sample: bool, exact: bool) -> list[list[int]]:
        raise NotImplementedError

"""``vllm`` and ``vllm_eager``: ``vllm.LLM`` through its offline API (see ``offline``), with CUDA graphs
(vLLM's default) and without them (``enforce_eager=True``, verl's default until v0.5); ``vllm_v0`` and
``vllm_v0_eager``: the same on vLLM's V0 engine (``VLLM_USE_V1=0``), which vLLM releases before 0.10 still carry.
Each sets ``VLLM_USE_V1`` before it starts its engine (vLLM reads it then), so V0 and V1 runs in one process do
not inherit each other's engine."""

from __future__ import annotations

import importlib.metadata
import os
import re
from typing import ClassVar

import torch

from calibrate.genruntimes.offline import GPU_MEMORY_FRACTION, _Offline


class Vllm(_Offline):
    """``vllm.LLM(...).generate`` on token-id prompts."""

    NAME: ClassVar[str] = "vllm"
    MODULE: ClassVar[str] = "vllm"
    ENFORCE_EAGER: ClassVar[bool] = False
    V1: ClassVar[bool] = True

    def available(self, device: str) -> tuple[bool, str]:
        ok, why = super().available(device)
        if ok and not self.V1:
            version = importlib.metadata.version("vllm")
            m = re.match(r"(\d+)\.(\d+)", version)
            if m and (int(m.group(1)), int(m.group(2))) >= (0, 10):
                return False, f"vLLM {version} has no V0 engine (removed in 0.10)"
        return ok, why

    def _start(self, max_batch, max_len):
        os.environ["VLLM_USE_V1"] = "1" if self.V1 else "0"
        from vllm import LLM

        return LLM(model=self.dir, dtype=self.dtype, skip_tokenizer_init=True, enable_prefix_caching=True,
                   max_model_len=max_len, max_num_seqs=max_batch, gpu_memory_utilization=GPU_MEMORY_FRACTION, seed=0,
                   enforce_eager=self.ENFORCE_EAGER)

    def _run(self, prompts, n, sample, exact):
        from vllm import SamplingParams

        sp = SamplingParams(n=1, temperature=1.0 if sample else 0.0, max_tokens=n, min_tokens=n if exact else 0,
                            ignore_eos=exact, detokenize=False)
        outs = self.engine.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def unload(self) -> None:
        super().unload()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class VllmEager(Vllm):
    """``vllm.LLM(..., enforce_eager=True)``: no CUDA graphs."""

    NAME: ClassVar[str] = "vllm_eager"
    ENFORCE_EAGER: ClassVar[bool] = True


class VllmV0(Vllm):
    """``vllm.LLM`` on the V0 engine (``VLLM_USE_V1=0``)."""

    NAME: ClassVar[str] = "vllm_v0"
    V1: ClassVar[bool] = False


class VllmV0Eager(VllmV0):
    """``vllm.LLM(..., enforce_eager=True)`` on the V0 engine."""

    NAME: ClassVar[str] = "vllm_v0_eager"
    ENFORCE_EAGER: ClassVar[bool] = True

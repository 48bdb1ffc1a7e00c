"""``vllm`` and ``vllm_eager``: ``vllm.LLM`` through its offline API (see ``offline``), with CUDA graphs
(vLLM's default) and without them (``enforce_eager=True``, verl's default until v0.5)."""

from __future__ import annotations

from typing import ClassVar

import torch

from calibrate.genruntimes.offline import GPU_MEMORY_FRACTION, _Offline


class Vllm(_Offline):
    """``vllm.LLM(...).generate`` on token-id prompts."""

    NAME: ClassVar[str] = "vllm"
    MODULE: ClassVar[str] = "vllm"
    ENFORCE_EAGER: ClassVar[bool] = False

    def _start(self, max_batch, max_len):
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

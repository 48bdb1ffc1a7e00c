"""``sglang``: ``sglang.Engine`` through its offline API (see ``offline``)."""

from __future__ import annotations

from typing import ClassVar

from calibrate.genruntimes.offline import GPU_MEMORY_FRACTION, _Offline


class Sglang(_Offline):
    """``sglang.Engine(...).generate`` on token-id prompts."""

    NAME: ClassVar[str] = "sglang"
    MODULE: ClassVar[str] = "sglang"

    def _start(self, max_batch, max_len):
        import sglang

        return sglang.Engine(model_path=self.dir, dtype=self.dtype, skip_tokenizer_init=True,
                             context_length=max_len, max_running_requests=max_batch,
                             mem_fraction_static=GPU_MEMORY_FRACTION, random_seed=0)

    def _run(self, prompts, n, sample, exact):
        params = {"max_new_tokens": n, "min_new_tokens": n if exact else 0, "ignore_eos": exact,
                  "temperature": 1.0 if sample else 0.0}
        outs = self.engine.generate(input_ids=prompts, sampling_params=params)
        return [list(o["output_ids"]) for o in outs]

    def unload(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
        super().unload()

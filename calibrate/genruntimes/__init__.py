"""Generation runtimes on the hardware side, one explicit registry; the names, batching semantics and
profile keys are the contract in ``rlhfsim.costs.genruntimes`` (interface: ``base``).

``hf_generate`` (``hf_generate``), ``hf_static`` (``hf_static``), ``kv_decoder`` (``kv_decoder``),
``vllm``, ``vllm_eager``, ``vllm_v0`` and ``vllm_v0_eager`` (``vllm_engine``) and ``sglang`` (``sglang_engine``), all over ``offline``. What is measured
of each: ``calibrate.measuring.genbench``.
"""

from calibrate.genruntimes.base import (Generation, GenRuntime, GumbelNoise, check_prompts, check_runtime, eager_greedy,
                                      left_pad)
from calibrate.genruntimes.hf_generate import HfGenerate
from calibrate.genruntimes.hf_static import HfStatic
from calibrate.genruntimes.kv_decoder import KvDecoder
from calibrate.genruntimes.sglang_engine import Sglang
from calibrate.genruntimes.vllm_engine import Vllm, VllmEager, VllmV0, VllmV0Eager

GEN_RUNTIMES_IMPL: dict[str, type[GenRuntime]] = {
    "hf_generate": HfGenerate,
    "hf_static": HfStatic,
    "kv_decoder": KvDecoder,
    "vllm": Vllm,
    "sglang": Sglang,
    "vllm_eager": VllmEager,
    "vllm_v0": VllmV0,
    "vllm_v0_eager": VllmV0Eager,
}

__all__ = ["GEN_RUNTIMES_IMPL", "Generation", "GenRuntime", "GumbelNoise", "check_prompts", "check_runtime",
           "eager_greedy", "left_pad"]

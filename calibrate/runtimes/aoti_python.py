"""AOTInductor from Python: the very package ``aoti_cpp`` times from C++ (same export, same compiled
``.pt2``, same cache key: ``calibrate.runtimes.aoti_cpp.export_package``), loaded in this process with
``torch._inductor.aoti_load_package`` and called from Python. Beside ``aoti_cpp`` it separates the
language from the runtime: the same compiled kernels, only the caller differs (the study's Python vs C++
question, asked of AOTInductor instead of ONNX Runtime).

``setup_s`` = export + compile (0 when the package came from the cache) + the package load.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from calibrate.measuring.interleave import Prepared
from calibrate.runtimes.aoti_cpp import export_remembered
from calibrate.runtimes.base import Runtime
from rlhfsim.errors import RlhfsimError


class AotiPython(Runtime):
    """``torch._inductor.aoti_load_package(package)(input_ids, attention_mask)`` in this process."""

    NAME = "aoti_python"

    def __init__(self):
        self.unsupported: dict[str, str] = {}

    def available(self, device: str) -> tuple[bool, str]:
        import torch._inductor

        for fn in ("aoti_compile_and_package", "aoti_load_package"):
            if not hasattr(torch._inductor, fn):
                return False, f"torch {torch.__version__} has no torch._inductor.{fn}"
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            return False, "CUDA is not available to torch"
        return True, ""

    def prepare(self, model, input_ids, attention_mask, *, device: str, cache_dir: Path) -> Prepared:
        package, package_s = export_remembered(self.unsupported, self.NAME, model, input_ids, attention_mask,
                                               device=device, cache_dir=cache_dir)
        t0 = time.perf_counter()
        try:
            runner = torch._inductor.aoti_load_package(str(package))
        except Exception as e:  # loader failures come in many types; all mean "cannot run it here"
            raise RlhfsimError(f"{self.NAME}: cannot load {package.name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
        load_s = time.perf_counter() - t0

        def call():
            with torch.inference_mode():
                out = runner(input_ids, attention_mask)
            return out[0] if isinstance(out, (list, tuple)) else out

        return Prepared(call, package_s + load_s)

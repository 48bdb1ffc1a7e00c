"""ONNX Runtime: the reward model exported with ``torch.onnx.export`` (dynamo exporter, batch and
sequence axes dynamic, so one export serves every shape) and run in an ``InferenceSession``.

Providers: ``CPUExecutionProvider`` on CPU (``intra_op_num_threads`` = torch's thread count, so both sides
use the same cores); ``CUDAExecutionProvider`` on CUDA where the installed onnxruntime has it, with inputs
and output bound to torch's device buffers (IOBinding), so no host copies are timed. ORT's CUDA kernels
have poor bfloat16 coverage, so a bfloat16 model is exported in float16 on CUDA (``export_dtype``).
ORT runs on its own stream, so it is timed with the host clock around a synchronized call.

Exports are cached in ``<cache_dir>/onnx/<model key>/model.onnx`` (weights in an external data file);
``setup_s`` = export + session creation time on the first point of each model (0 afterwards).
"""

from __future__ import annotations

import copy
import os
import shutil
import time
from pathlib import Path

import torch

from calibrate.measuring.interleave import Prepared
from calibrate.runtimes.base import Runtime, ScoreModule, model_key
from rlhfsim.errors import RlhfsimError

MAX_BATCH = 4096


class OnnxRuntime(Runtime):
    """torch.onnx export + onnxruntime InferenceSession (CPU provider, CUDA provider where installed)."""

    NAME = "onnxruntime"

    def __init__(self):
        self._sessions: dict[int, tuple] = {}
        self.export_dtype: str | None = None

    def available(self, device: str) -> tuple[bool, str]:
        try:
            import onnxruntime as ort
        except ImportError:
            return False, "onnxruntime is not installed"
        if torch.device(device).type == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
            return False, "the installed onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
        return True, ""

    def _session(self, model, input_ids, attention_mask, device: str, cache_dir: Path):
        import onnxruntime as ort

        cuda = torch.device(device).type == "cuda"
        src = model
        if cuda and next(model.parameters()).dtype == torch.bfloat16:
            src = copy.deepcopy(model).to(torch.float16)
        self.export_dtype = str(next(src.parameters()).dtype).removeprefix("torch.")
        final = Path(cache_dir) / "onnx" / model_key(src)
        path = final / "model.onnx"
        t0 = time.perf_counter()
        if not path.is_file():
            # Export into a private directory, then rename it into place: a crash never leaves a partial
            # model where a later run would load it. Weights go to an external data file next to the
            # graph (protobuf cannot hold models over 2 GB).
            tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
            seq = torch.export.Dim("seq", min=2, max=int(src.config.max_position_embeddings))
            try:
                torch.onnx.export(ScoreModule(src).eval(), (input_ids, attention_mask), str(tmp / "model.onnx"),
                                  dynamo=True, input_names=["input_ids", "attention_mask"], output_names=["scores"],
                                  dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
                                  external_data=True, optimize=True, verbose=False)
            except Exception as e:  # the exporter raises many types; all mean "cannot export this model"
                shutil.rmtree(tmp, ignore_errors=True)
                msg = (str(e).strip().splitlines() or ["(no message)"])[0]
                raise RlhfsimError(f"onnxruntime: torch.onnx.export failed for {type(model).__name__}: {type(e).__name__}: {msg}") from None
            try:
                os.rename(tmp, final)
            except OSError:  # another process put the same export in place first
                shutil.rmtree(tmp, ignore_errors=True)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if cuda:
            providers = [("CUDAExecutionProvider", {"device_id": torch.device(device).index or 0}), "CPUExecutionProvider"]
        else:
            so.intra_op_num_threads = torch.get_num_threads()
            so.inter_op_num_threads = 1
            providers = ["CPUExecutionProvider"]
        sess = ort.InferenceSession(str(path), so, providers=providers)
        return sess, time.perf_counter() - t0

    def prepare(self, model, input_ids, attention_mask, *, device: str, cache_dir: Path) -> Prepared:
        key = id(model)
        setup_s = 0.0
        if key not in self._sessions:
            self._sessions = {key: self._session(model, input_ids, attention_mask, device, cache_dir)}
            setup_s = self._sessions[key][1]
        sess = self._sessions[key][0]
        if torch.device(device).type == "cuda":
            call = self._cuda_call(sess, input_ids, attention_mask, device)
        else:
            feeds = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}

            def call():
                return torch.from_numpy(sess.run(["scores"], feeds)[0])

        return Prepared(call, setup_s, host_clock=True)

    @staticmethod
    def _cuda_call(sess, input_ids, attention_mask, device: str):
        import numpy as np

        out_dtype = {"tensor(float)": torch.float32, "tensor(float16)": torch.float16}[sess.get_outputs()[0].type]
        out = torch.empty(input_ids.shape[0], dtype=out_dtype, device=device)
        idx = torch.device(device).index or 0
        binding = sess.io_binding()
        for name, t in (("input_ids", input_ids.contiguous()), ("attention_mask", attention_mask.contiguous())):
            binding.bind_input(name, "cuda", idx, np.int64, list(t.shape), t.data_ptr())
        binding.bind_output("scores", "cuda", idx, np.float32 if out_dtype == torch.float32 else np.float16,
                            list(out.shape), out.data_ptr())

        def call():
            sess.run_with_iobinding(binding)
            return out

        return call

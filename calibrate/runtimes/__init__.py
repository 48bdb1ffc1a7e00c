"""Scoring runtimes, one explicit registry (interface in ``base``)."""

from calibrate.runtimes.aoti_cpp import AotiCpp
from calibrate.runtimes.aoti_python import AotiPython
from calibrate.runtimes.base import Runtime, ScoreModule, Timing, eager_scores
from calibrate.runtimes.compile import Compile
from calibrate.runtimes.eager import Eager
from calibrate.runtimes.onnxrt import OnnxRuntime
from calibrate.runtimes.tensorrt import TensorRT

RUNTIMES: dict[str, type[Runtime]] = {
    "eager": Eager,
    "compile": Compile,
    "onnxruntime": OnnxRuntime,
    "aoti_python": AotiPython,
    "aoti_cpp": AotiCpp,
    "tensorrt": TensorRT,
}

__all__ = ["RUNTIMES", "Runtime", "ScoreModule", "Timing", "eager_scores"]

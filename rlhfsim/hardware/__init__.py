"""Device specs: datasheet peak FLOP/s, memory bandwidth and size, interconnect bandwidths."""

from rlhfsim.hardware.catalog import GPUS, GpuSpec, get_gpu

__all__ = ["GPUS", "GpuSpec", "get_gpu"]

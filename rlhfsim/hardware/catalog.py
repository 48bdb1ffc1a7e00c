"""Datasheet numbers per device (dense, no sparsity). Units: FLOP/s, bytes/s, bytes.

Sources: NVIDIA A100, H100, H200 and L40S datasheets (dense tensor-core peaks, i.e. half the "with
sparsity" figures). Inter-node bandwidth is per GPU (one 200 Gb/s HDR or 400 Gb/s NDR NIC per GPU).
Host link (``host_link_bw``, one direction, what an offloaded parameter or optimizer shard crosses
between host memory and the device): the datasheets' PCIe figure, which they give for both directions
together: A100 SXM "PCIe Gen4: 64 GB/s", H100 SXM and H200 SXM "PCIe Gen5: 128 GB/s", L40S "PCIe Gen4 x16:
64 GB/s bidirectional"; so 32, 64, 64 and 32 GB/s each way.
The ``cpu`` entry describes a generic 2-core AVX2 machine like the CI runner; a calibrated CPU profile
replaces its efficiencies with measured ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rlhfsim.errors import ScenarioError

GB = 1e9
GiB = 2**30
TFLOPS = 1e12


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator (or the CPU) as the cost model sees it."""

    name: str
    peak_flops: dict  # dtype -> dense FLOP/s
    mem_bw: float  # bytes/s
    mem_bytes: float
    intra_node_bw: float  # bytes/s per GPU, one direction (NVLink / PCIe)
    inter_node_bw: float  # bytes/s per GPU across nodes
    price_per_hour: float  # default on-demand dollars per GPU-hour (overridable in plans)
    kind: str = "cuda"
    host_link_bw: float = 0.0  # bytes/s host <-> device, one direction (PCIe); 0: not known

    def peak(self, dtype: str) -> float:
        return self.peak_flops[dtype]

    def to_dict(self) -> dict:
        return asdict(self)


def _gpu(name, bf16, fp32, bw, mem, intra, inter, price, host):
    return GpuSpec(name, {"bfloat16": bf16 * TFLOPS, "float16": bf16 * TFLOPS, "float32": fp32 * TFLOPS},
                   bw * GB, mem, intra * GB, inter * GB, price, host_link_bw=host * GB)


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in [
        _gpu("a100-40gb", 312, 19.5, 1555, 40 * GiB, 300, 25, 1.80, 32),
        _gpu("a100-80gb", 312, 19.5, 2039, 80 * GiB, 300, 25, 2.20, 32),
        _gpu("h100-sxm", 989, 67, 3350, 80 * GiB, 450, 50, 3.50, 64),
        _gpu("h200", 989, 67, 4800, 141 * GB, 450, 50, 4.50, 64),
        # GH200 Grace Hopper (NVIDIA GH200 datasheet, the 96 GB HBM3 part): H100's tensor cores, 4 TB/s HBM3,
        # NVLink 900 GB/s and NVLink-C2C 900 GB/s to Grace memory (both directions together); inter-node: one
        # 200 Gb/s NIC per GPU. No public per-GPU-hour price: h100-sxm's is used.
        _gpu("gh200", 989, 67, 4000, 96 * GB, 450, 25, 3.50, 450),
        _gpu("l40s", 362, 91.6, 864, 48 * GB, 32, 12.5, 1.20, 32),
        # Generic 2-core AVX2 CPU at ~3 GHz: 2 cores x 32 fp32 FLOP/cycle; bf16 has no native matmul
        # units there, so its peak is taken as fp32's. Its "host link" is a copy within host memory,
        # taken as its intra-node figure.
        GpuSpec("cpu", {"bfloat16": 0.19 * TFLOPS, "float16": 0.19 * TFLOPS, "float32": 0.19 * TFLOPS},
                20 * GB, 24 * GiB, 10 * GB, 1.25 * GB, 0.10, "cpu", host_link_bw=10 * GB),
    ]
}

ALIASES = {"a100": "a100-80gb", "h100": "h100-sxm", "h100-80gb": "h100-sxm", "h200-141gb": "h200"}


def get_gpu(name: str, yaml_path: str = "cluster.gpu") -> GpuSpec:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in GPUS:
        raise ScenarioError(yaml_path, f"expected one of {', '.join(GPUS)}, got {name!r}")
    return GPUS[key]

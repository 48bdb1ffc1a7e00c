"""Datasheet numbers per device (dense, no sparsity). Units: FLOP/s, bytes/s, bytes.

Memory is in one unit throughout: GiB (2**30 bytes). Vendors write "80GB", "141GB", "192GB" for HBM and
GDDR capacities that are binary sizes (an A100 80GB reports 81,920 MiB, an H200 143,771 MiB: 140.4 GiB,
a MI300X 196,592 MiB); ``rlhfsim gpus`` prints GiB. Bandwidths are decimal (GB/s = 1e9 bytes/s), as
datasheets give them. Interconnect figures are one direction per GPU (datasheets give NVLink and
Infinity Fabric bidirectional: half of it here); inter-node bandwidth is per GPU (one 200 Gb/s HDR or
400 Gb/s NDR NIC per GPU; 25 GB/s on the PCIe inference parts).

Sources (dense tensor-core peaks, i.e. half of the "with sparsity" figures):
- A100: NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100/).
- H100 SXM and PCIe: NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100/),
  SXM and PCIe columns: BF16 1,979 / 1,513 TFLOPS sparse, FP32 67 / 51 TFLOPS, 3.35 / 2.0 TB/s, NVLink
  900 GB/s (SXM); the PCIe card without NVLink bridges talks over PCIe Gen5 (128 GB/s bidirectional).
- H200: NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200/): 141GB HBM3e, 4.8 TB/s.
- B200: NVIDIA HGX B200 datasheet (nvidia.com/en-us/data-center/hgx/): per GPU FP16/BF16 4.5 PFLOPS
  sparse, FP32 75 TFLOPS (600 for eight), 180GB HBM3e at 8 TB/s (1.44 TB and 64 TB/s for eight), fifth
  generation NVLink 1.8 TB/s.
- H20: NVIDIA H20 product brief (HGX H20): FP16/BF16 148 TFLOPS dense, FP32 44 TFLOPS, 96GB HBM3 at
  4.0 TB/s, NVLink 900 GB/s.
- L4: NVIDIA L4 datasheet (nvidia.com/en-us/data-center/l4/): BF16 242 TFLOPS sparse, FP32 30.3
  TFLOPS, 24GB GDDR6 at 300 GB/s, PCIe Gen4 x16 (64 GB/s bidirectional), no NVLink.
- A10G: the NVIDIA A10 datasheet (nvidia.com/en-us/data-center/products/a10-gpu/): BF16 250 TFLOPS
  sparse, FP32 31.2 TFLOPS, 24GB GDDR6 at 600 GB/s, PCIe Gen4; AWS's A10G (G5 instances) publishes no
  separate tensor figures, so the A10's are used.
- L40S: NVIDIA L40S datasheet: BF16 733 TFLOPS sparse (362 dense), FP32 91.6 TFLOPS, 48GB, 864 GB/s.
- A40: NVIDIA A40 datasheet (nvidia.com/en-us/data-center/a40/): BF16/FP16 tensor 299.4 TFLOPS sparse (149.7
  dense), FP32 37.4 TFLOPS, 48GB GDDR6 at 696 GB/s, PCIe Gen4 x16; its NVLink bridge (112.5 GB/s both directions)
  joins pairs of cards only, so a node of eight talks over PCIe (the L40S's figures).
- RTX 4090 (GeForce, Ada Lovelace AD102): NVIDIA Ada Lovelace GPU architecture whitepaper, appendix table of the
  GeForce RTX 4090: BF16/FP16 tensor with FP32 accumulate 165.2 TFLOPS dense (330.4 sparse; the 330.3 dense "FP16
  accumulate" figure is not what a bf16 GEMM runs at), FP32 82.6 TFLOPS, 24GB GDDR6X at 1008 GB/s, PCIe Gen4 x16,
  no NVLink. Price a rough 0.40 $/GPU-hour (rented consumer cards).
- GH200 Grace Hopper: NVIDIA GH200 datasheet, the 96GB HBM3 part: H100's tensor cores, 4 TB/s HBM3,
  NVLink 900 GB/s and NVLink-C2C 900 GB/s to Grace memory (both directions together); inter-node one
  200 Gb/s NIC per GPU. No public per-GPU-hour price: h100-sxm's is used.
- GB200 (one Blackwell GPU of a GB200 NVL72 rack): NVIDIA GB200 NVL72 specifications (nvidia.com/en-us/data-center/
  gb200-nvl72/), the rack's 72 GPUs: FP8 720 PFLOPS sparse, FP16/BF16 360 PFLOPS sparse, FP32 5,760 TFLOPS, up to
  13.4 TB HBM3e at 576 TB/s, NVLink Switch 130 TB/s; per GPU FP8 5,000 and BF16 2,500 TFLOPS dense, FP32 80, 186GB
  at 8 TB/s, NVLink 1.8 TB/s. The 72 GPUs (18 compute trays of 4) are one NVLink domain (``nvlink_domain``): a
  group within the rack talks over NVLink even across trays. Inter-node (between racks): one 400 Gb/s NIC per GPU;
  host memory behind Grace's NVLink-C2C as on GH200.
- MI355X: AMD Instinct MI355X datasheet (amd.com/en/products/accelerators/instinct/mi350/mi355x.html): 288GB HBM3E
  at 8 TB/s, FP16/BF16 2.5 PFLOPS and FP8 5.0 PFLOPS dense (256 CUs at 2.4 GHz times 4,096 and 8,192 dense FLOP per
  CU per clock: 2,516.6 and 5,033.2 TFLOPS; the FP8 rate per CU is in AMD's ISSCC 2026 MI355X paper), FP32 157.3
  TFLOPS, Infinity Fabric 7 links of 153.6 GB/s (1,075.2 GB/s aggregate), PCIe Gen5 x16. Runs under ROCm as MI300X.
- MI300X: AMD Instinct MI300X datasheet (amd.com/en/products/accelerators/instinct/mi300/mi300x.html):
  FP16/BF16 1,307.4 TFLOPS dense (2,614.9 sparse), FP32 163.4 TFLOPS, 192GB HBM3 at 5.3 TB/s, Infinity
  Fabric 896 GB/s aggregate peer bandwidth, FP8 2,614.9 TFLOPS dense. Runs under ROCm, which PyTorch drives through its CUDA API
  (``kind: cuda`` here means "a torch.cuda device").

FP8 (``float8``: dense tensor-core FP8 with FP16/FP32 accumulate, half the sparse figures of the same datasheets):
H100 SXM 1,979 and PCIe 1,513; H200 and GH200 1,979 (H100's tensor cores); H20 296; B200 4,500 (HGX B200 datasheet,
9 PFLOPS sparse); L40S 733 (1,466 sparse); L4 242.5 (485 sparse); MI300X 2,614.9; GB200 and MI355X above. A100, A40
and A10G have no FP8 tensor cores (Ampere); the RTX 4090's FP8 with FP32 accumulate is not in the whitepaper's table
the way its BF16 is, so it is left out; the CPU has none. A GPU without a ``float8`` peak refuses ``dtype: float8``.

NVLink domain (``nvlink_domain``): how many consecutive GPUs one NVLink fabric joins where that is more than a node
(GB200 NVL72: 72 GPUs in trays of 4); 0 where NVLink stops at the node (HGX boards, PCIe cards): the domain is then
``cluster.gpus_per_node``. ``GpuSpec.link_domain`` gives the size the cost model uses: a group of GPUs within one
domain talks over ``intra_node_bw``, a group across domains over ``inter_node_bw``.

Inter-node all-reduce latency (``INTER_NODE_ALLREDUCE_S``): what one small all-reduce costs when its group spans NVLink
domains (a generation engine's tensor parallelism beyond a node: vLLM at TP 16 or 32 on 8-GPU nodes), the time of an
all-reduce of 4 to 512 bytes over 16 Hopper GPUs in two nodes on NDR InfiniBand: 46.3-47.8 us (NCCL 2.21.5,
NVLSTree, 16 ConnectX-7 NICs, 2 x 8 H20; nccl-tests all_reduce_perf in github.com/NVIDIA/nccl/issues/1244), against
18-60 us for the same call inside a node (Vidur's NCCL all-reduces, REFERENCES.md section 6) and 19-20 us between two
A100s, one per node, on HDR (github.com/NVIDIA/nccl-tests/issues/150). 47 us is taken for every GPU (no other
generation's or network's figure was found); the bytes go at ``inter_node_bw``, the slowest link of the ring.

Host link (``host_link_bw``, one direction, what an offloaded parameter or optimizer shard crosses
between host memory and the device): the datasheets' PCIe figure, which they give for both directions
together: A100 SXM "PCIe Gen4: 64 GB/s", H100 SXM and H200 SXM "PCIe Gen5: 128 GB/s", L40S "PCIe Gen4 x16:
64 GB/s bidirectional"; so 32, 64, 64 and 32 GB/s each way. The same reading for the other entries:
PCIe Gen5 x16 (H100 PCIe, H20, B200, MI300X, MI355X) 64 GB/s, PCIe Gen4 x16 (L4, A10G) 32 GB/s each way; GH200's
host memory sits behind NVLink-C2C (900 GB/s both directions: 450 each way), and so does GB200's.

Host CPU (``host_cpu``, a key of ``rlhfsim.hardware.hosts.HOSTS``): the CPU of the server the GPU ships in, which
runs the host-side work of a step (the engine's scheduler, kernel launches, the driver); that module's docstring
gives each GPU's server and source, and says which are choices (H20, H100 PCIe, MI300X, A40, RTX 4090).

Prices are rough on-demand dollars per GPU-hour for plans to start from (override them in a plan's
``prices:``); they are not vendor figures.

The ``cpu`` entry describes a generic 2-core AVX2 machine like the CI runner; a calibrated CPU profile
replaces its efficiencies with measured ones.

Sustained rates (``SUSTAINED``): what a software stack reached against these peaks, each with its source (dense
BF16 GEMM, FLOP/s). A derived profile (the bundled ``default``, whose efficiencies are typical fractions of NVIDIA
peaks under CUDA) prices a GPU of another stack with its compute efficiencies times ``stack_factor`` (MI300X under
the ROCm of early 2025: 0.64); a profile with kernel terms fitted for the GPU (``kernels_by_shape``) is not changed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rlhfsim.errors import ScenarioError

GB = 1e9  # bandwidths (decimal, as datasheets give them)
INTER_NODE_ALLREDUCE_S = 47e-6  # one small all-reduce across nodes (module docstring: NVIDIA/nccl#1244)
GiB = 2**30  # memory sizes
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
    host_cpu: str = ""  # the server's host CPU (rlhfsim.hardware.hosts.HOSTS); "": none apart (the CPU device)
    nvlink_domain: int = 0  # GPUs one NVLink fabric joins across nodes (GB200 NVL72: 72); 0: NVLink stops at the node

    def peak(self, dtype: str) -> float:
        return self.peak_flops[dtype]

    def link_domain(self, gpus_per_node: int) -> int:
        """How many consecutive GPUs talk over ``intra_node_bw``: the NVLink domain where it spans nodes (an NVL72
        rack of 72 GPUs in trays of 4), else the node."""
        return max(self.nvlink_domain, gpus_per_node)

    def to_dict(self) -> dict:
        return asdict(self)


def _gpu(name, bf16, fp32, bw, mem, intra, inter, price, host, cpu, fp8=None, domain=0):
    peaks = {"bfloat16": bf16 * TFLOPS, "float16": bf16 * TFLOPS, "float32": fp32 * TFLOPS}
    if fp8 is not None:   # a GPU without FP8 tensor cores has no float8 key: the scenario check refuses it
        peaks["float8"] = fp8 * TFLOPS
    return GpuSpec(name, peaks, bw * GB, mem, intra * GB, inter * GB, price, host_link_bw=host * GB, host_cpu=cpu,
                   nvlink_domain=domain)


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in [
        _gpu("a100-40gb", 312, 19.5, 1555, 40 * GiB, 300, 25, 1.80, 32, "epyc-7742"),
        _gpu("a100-80gb", 312, 19.5, 2039, 80 * GiB, 300, 25, 2.20, 32, "epyc-7742"),
        _gpu("h100-sxm", 989, 67, 3350, 80 * GiB, 450, 50, 3.50, 64, "xeon-8480", fp8=1979),
        _gpu("h100-pcie", 756, 51, 2000, 80 * GiB, 64, 25, 2.90, 64, "xeon-8480", fp8=1513),
        _gpu("h200", 989, 67, 4800, 141 * GiB, 450, 50, 4.50, 64, "xeon-8480", fp8=1979),
        _gpu("gh200", 989, 67, 4000, 96 * GiB, 450, 25, 3.50, 450, "grace", fp8=1979),
        _gpu("h20", 148, 44, 4000, 96 * GiB, 450, 50, 1.80, 64, "xeon-8480", fp8=296),
        _gpu("b200", 2250, 75, 8000, 180 * GiB, 900, 50, 6.00, 64, "xeon-8570", fp8=4500),
        _gpu("gb200", 2500, 80, 8000, 186 * GiB, 900, 50, 7.00, 450, "grace", fp8=5000, domain=72),
        _gpu("l40s", 362, 91.6, 864, 48 * GiB, 32, 12.5, 1.20, 32, "epyc-7r13", fp8=733),
        _gpu("a40", 149.7, 37.4, 696, 48 * GiB, 32, 12.5, 0.70, 32, "epyc-7r13"),
        _gpu("l4", 121, 30.3, 300, 24 * GiB, 32, 12.5, 0.80, 32, "epyc-7r13", fp8=242.5),
        _gpu("a10g", 125, 31.2, 600, 24 * GiB, 32, 12.5, 1.00, 32, "epyc-7r32"),
        _gpu("rtx-4090", 165.2, 82.6, 1008, 24 * GiB, 32, 12.5, 0.40, 32, "epyc-7r13"),
        _gpu("mi300x", 1307.4, 163.4, 5300, 192 * GiB, 448, 50, 4.00, 64, "epyc-9004", fp8=2614.9),
        _gpu("mi355x", 2516.6, 157.3, 8000, 288 * GiB, 537.6, 50, 5.00, 64, "epyc-9004", fp8=5033.2),
        # Generic 2-core AVX2 CPU at ~3 GHz: 2 cores x 32 fp32 FLOP/cycle; bf16 has no native matmul
        # units there, so its peak is taken as fp32's. Its "host link" is a copy within host memory,
        # taken as its intra-node figure.
        GpuSpec("cpu", {"bfloat16": 0.19 * TFLOPS, "float16": 0.19 * TFLOPS, "float32": 0.19 * TFLOPS},
                20 * GB, 24 * GiB, 10 * GB, 1.25 * GB, 0.10, "cpu", host_link_bw=10 * GB),
    ]
}

ALIASES = {"a100": "a100-80gb", "h100": "h100-sxm", "h100-80gb": "h100-sxm", "h200-141gb": "h200",
           "b200-180gb": "b200", "mi300x-192gb": "mi300x", "h20-96gb": "h20", "gb200-nvl72": "gb200", "mi355x-288gb": "mi355x", "a10": "a10g",
           "4090": "rtx-4090", "rtx4090": "rtx-4090"}


@dataclass(frozen=True)
class Sustained:
    """What a software stack reached on a GPU: the dense BF16/FP16 GEMM rate (FLOP/s) of its BLAS library on
    large, well-shaped matrices, against the datasheet peak (``GPUS``). ``source``: where the number is published."""

    stack: str
    gemm_flops: float
    source: str

    def fraction(self, gpu: str) -> float:
        return self.gemm_flops / GPUS[gpu].peak("bfloat16")


# Sustained rates per GPU and stack (issue 47 item 4). MAMF: the "Maximum Achievable Matmul FLOPS" table of Stas
# Bekman's ml-engineering (github.com/stas00/ml-engineering, compute/accelerator/README.md at commit 744d01e, lines
# 344-361: BF16 matmul, mean of 100 iterations after 50 warm-up, best shape of a brute-force search). Vidur: the
# large-token limit e_max of the GEMM curve fitted from Vidur's fp16 per-layer GEMMs (calibrate.fitting.fromops; bundled
# profiles h100-sxm and a100-80gb), which is what cuBLAS reached on LLM layer shapes rather than on the best shape.
SUSTAINED: dict[str, Sustained] = {
    "h100-sxm": Sustained("CUDA 12.6, torch 2.7.0 (cuBLAS)", 794.5 * TFLOPS,
                          "MAMF, ml-engineering@744d01e compute/accelerator/README.md:354 (80.3% of 989); LLM layer "
                          "shapes: 0.78 x 989 (Vidur fp16 GEMMs, microsoft/vidur@7d47513, calibrate.fitting.fromops)"),
    "a100-80gb": Sustained("CUDA 12.6, torch 2.6.0 (cuBLAS)", 271.2 * TFLOPS,
                           "MAMF, ml-engineering@744d01e compute/accelerator/README.md:351 (86.9% of 312); LLM layer "
                           "shapes: 0.75 x 312 (Vidur fp16 GEMMs, microsoft/vidur@7d47513, calibrate.fitting.fromops)"),
    "gh200": Sustained("CUDA 12.6, torch 2.6.0 (cuBLAS)", 828.6 * TFLOPS,
                       "MAMF, ml-engineering@744d01e compute/accelerator/README.md:352 (83.8% of 989; the 900 W 141 GiB "
                       "HBM3e GH200, the same Hopper tensor cores as the catalog's 96 GiB part)"),
    "mi300x": Sustained("ROCm 6.3 (torch 2.5.1+rocm6.3.42131, hipBLASLt, PYTORCH_TUNABLEOP_ENABLED=1), early 2025",
                        668.4 * TFLOPS,
                        "MAMF, ml-engineering@744d01e compute/accelerator/README.md:361 (51.4% of 1300; the row was "
                        "measured and committed on 2025-01-06, faa7ddf); the same table's notes (line 389) record 450 "
                        "TFLOPS under ROCm 6.1"),
}
# The stack the default profile's efficiencies describe (typical fractions of NVIDIA datasheet peaks under CUDA):
# other stacks' kernels run at their sustained fraction over this one's (``stack_factor``).
REFERENCE_STACK_GPU = "h100-sxm"


def stack_factor(name: str) -> float:
    """How much of the reference stack's GEMM efficiency (H100 under CUDA, ``REFERENCE_STACK_GPU``) the GPU's own
    stack reaches, as a fraction of each one's datasheet peak: MAMF fraction over the reference's for a GPU driven by
    another stack (MI300X under ROCm: 0.514 / 0.803 = 0.64), else 1 (CUDA GPUs: the default profile describes them)."""
    key = ALIASES.get(name.lower(), name.lower())
    s = SUSTAINED.get(key)
    if s is None or s.stack.startswith("CUDA"):
        return 1.0
    return s.fraction(key) / SUSTAINED[REFERENCE_STACK_GPU].fraction(REFERENCE_STACK_GPU)


def balance_ratio(name: str, ref: str = REFERENCE_STACK_GPU) -> float:
    """The GPU's compute-to-bandwidth balance (dense BF16 FLOP/s per byte/s of memory bandwidth) over the reference
    GPU's (``ref``, by default ``REFERENCE_STACK_GPU``): 1 for an H100 SXM, 0.70 for an H200 (more bandwidth, the same
    tensor cores), 0.13 for an H20 (a sixth of the tensor rate, more bandwidth), 1.42 for an L40S."""
    def balance(n: str) -> float:
        g = GPUS[ALIASES.get(n.lower(), n.lower())]
        return g.peak("bfloat16") / g.mem_bw

    return balance(name) / balance(ref)


def stated_gpu(gpu_field: str) -> str | None:
    """The GPU a profile's efficiencies are stated for, from its ``gpu`` field: ``any`` (a datasheet-derived profile:
    typical fractions of an H100's peaks under CUDA) the reference GPU ``REFERENCE_STACK_GPU``, a catalog GPU itself
    (its canonical name), None for a CPU profile (nothing to carry) or a name the catalog does not hold."""
    if gpu_field == "any":
        return REFERENCE_STACK_GPU
    key = ALIASES.get(str(gpu_field).lower(), str(gpu_field).lower())
    return key if key in GPUS and GPUS[key].kind != "cpu" else None


def carried_compute_eff(eff: float, name: str, ref: str = REFERENCE_STACK_GPU) -> float:
    """A pass's compute efficiency ``eff`` stated for GPU ``ref`` (by default the reference GPU: a derived profile's
    typical fraction of an H100's peak), carried to GPU ``name``. A pass is GEMMs at its stack's sustained GEMM
    fraction and the rest of its time (element-wise kernels, norms, softmax passes, the loss), which the tensor rate
    does not shorten. On ``ref`` the GEMMs run at e_r = e_g x stack_factor(ref) (e_g: ``SUSTAINED``'s 0.803 of an
    H100's peak under CUDA) and the rest takes 1/eff - 1/e_r per FLOP/peak; on ``name`` the GEMMs run at
    e_g x stack_factor(name) and the rest takes the time its memory moves at, rho = ``balance_ratio(name, ref)``::

        eff' = 1 / ( 1 / (e_g x stack_factor(name)) + rho x (1/eff - 1/e_r) )

    ``ref`` itself gets ``eff`` back (rho 1, the same stack); carrying there and back returns ``eff``. An efficiency
    at or above e_r (no rest to carry) is only scaled by the stacks, stack_factor(name) / stack_factor(ref)."""
    e_g = SUSTAINED[REFERENCE_STACK_GPU].fraction(REFERENCE_STACK_GPU)
    sf, sr = stack_factor(name), stack_factor(ref)
    e_r = e_g * sr
    if eff >= e_r:
        return eff * sf / sr
    return 1.0 / (1.0 / (e_g * sf) + balance_ratio(name, ref) * (1.0 / eff - 1.0 / e_r))


def carried_operations(ops: dict, ref: str, name: str) -> dict:
    """A profile's ``operations`` with every ``compute_eff`` carried from GPU ``ref`` to GPU ``name``
    (``carried_compute_eff``); the same object where the two are one GPU."""
    if ALIASES.get(ref, ref) == ALIASES.get(name, name):
        return ops
    return {op: ({**p, "compute_eff": carried_compute_eff(p["compute_eff"], name, ref)}
                 if isinstance(p, dict) and isinstance(p.get("compute_eff"), (int, float)) else p)
            for op, p in ops.items()}


def get_gpu(name: str, yaml_path: str = "cluster.gpu") -> GpuSpec:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in GPUS:
        raise ScenarioError(yaml_path, f"expected one of {', '.join(GPUS)}, got {name!r}")
    return GPUS[key]

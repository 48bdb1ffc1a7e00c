"""What was measured on: device name and memory, driver and CUDA versions, torch version, CPU model,
the thread count the measurements used and the environment variables that set how the CPU thread pools
wait between parallel regions; and the check that ``--gpu NAME`` names the local GPU."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess

import torch

from rlhfsim.errors import RlhfsimError
from rlhfsim.hardware.catalog import GPUS, GpuSpec, get_gpu


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def load_avg() -> float | None:
    """The 1-minute load average: other processes competing for the cores the measurements used."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def _driver_version() -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


# Environment variables that change how torch's CPU thread pools behave: their size, and whether a worker
# spins or sleeps between parallel regions. On the 2-vCPU VM a two-row decode step of a 0.6M-parameter model
# took 0.95 ms with the default policy and 3.86 ms with OMP_WAIT_POLICY=PASSIVE (lab/diagnostics/decode_threadpool.py),
# so a profile records the ones that were set.
THREAD_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "KMP_AFFINITY",
              "MKL_NUM_THREADS", "OMP_PROC_BIND")


def thread_env() -> dict[str, str]:
    """The ``THREAD_ENV`` variables set in this process's environment (empty: the runtimes' defaults)."""
    return {k: os.environ[k] for k in THREAD_ENV if k in os.environ}


def describe(device: str, threads: int) -> dict:
    """The profile's ``device`` block."""
    dev = torch.device(device)
    info = {"kind": dev.type, "torch": torch.__version__, "cpu_model": cpu_model(), "threads": threads,
            "cpu_cores": usable_cores(), "thread_env": thread_env(), "load_avg_1m_at_start": load_avg()}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info.update(name=props.name, memory_bytes=int(props.total_memory), driver=_driver_version(),
                    cuda=torch.version.cuda, capability=f"{props.major}.{props.minor}",
                    multiprocessors=props.multi_processor_count)
    else:
        try:
            mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            mem = None
        info.update(name=cpu_model(), memory_bytes=mem, driver=None, cuda=None)
    return info


def _probe() -> tuple[torch.Tensor, torch.Tensor]:
    """The probe matmul's operands: 64x256 by 256x256 float32 (~50 us on one core)."""
    return torch.randn(64, 256), torch.randn(256, 256)


def _probe_median_s(x: torch.Tensor, w: torch.Tensor, n: int, calls: int) -> float:
    """Median time of the probe matmul with ``n`` torch threads, after one untimed call at that thread
    count. Leaves torch at ``n`` threads (callers restore theirs)."""
    import time

    torch.set_num_threads(n)
    torch.nn.functional.linear(x, w)
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        torch.nn.functional.linear(x, w)
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


def contention_ratio(threads: int, calls: int = 20) -> float:
    """Median time of a small float32 matmul (64x256 by 256x256, ~50 us on one core) with ``threads``
    torch threads over its time with one thread: at most about 1 on an idle machine, far above 1 when
    other processes hold the cores and every OpenMP region waits for descheduled workers (then a measured
    point times the scheduler, not the operation). Small on purpose: that wait hurts small ops most."""
    x, w = _probe()
    try:
        return _probe_median_s(x, w, threads, calls) / _probe_median_s(x, w, 1, calls)
    finally:
        torch.set_num_threads(threads)


def contention_probe(threads: int, calls: int = 9) -> dict:
    """The contention probe at every thread count 1..``threads``: the probe matmul's median time (us)
    with k threads and its ratio to one thread, plus the 1-minute load average. On an idle machine the
    ratio stays near or below 1 at every k; a ratio far above 1 at k threads means other processes hold
    some of those k cores (recorded in the profile's ``device`` at the start and end of a calibration)."""
    x, w = _probe()
    old = torch.get_num_threads()
    out: dict = {"load_avg_1m": load_avg(), "by_threads": {}}
    try:
        base = None
        for k in range(1, max(int(threads), 1) + 1):
            med = _probe_median_s(x, w, k, calls)
            base = base or med
            out["by_threads"][str(k)] = {"median_us": med * 1e6, "ratio_to_1": med / base}
    finally:
        torch.set_num_threads(old)
    return out


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def matches(spec: GpuSpec, device_name: str, memory_bytes: float) -> bool:
    """Does the local device look like catalog entry ``spec``? The family (a100, h100, h200, l40s) must
    appear in the device name as a word of its own (``l4`` is not found in "L40S", nor ``h20`` in
    "H200"); a memory size in the entry's name (a100-40gb) must match within 25% (where the memory is known); an SXM entry rejects
    a PCIe part and a PCIe entry an SXM one; any other part of the entry's name (the 4090 of rtx-4090) must be a word of
    the device name too."""
    family, *rest = spec.name.split("-")
    name = _norm(device_name)
    words = re.findall(r"[a-z0-9]+", device_name.lower())
    if _norm(family) not in words:
        return False
    for part in rest:
        m = re.fullmatch(r"(\d+)gb", part)
        if m and memory_bytes is not None and abs(memory_bytes / 1e9 - int(m.group(1))) > 0.25 * int(m.group(1)):
            return False
        if part == "pcie" and "pcie" not in name:
            return False
        if part == "sxm" and "pcie" in name:
            return False
        if not re.fullmatch(r"\d+gb|pcie|sxm", part) and part not in words:
            return False  # a model number (rtx-4090): an RTX 3090 is not a 4090
    return True


def catalog_gpu(device_name: str, memory_bytes: float | None) -> GpuSpec | None:
    """The first CUDA catalog entry a device of this name (and memory, where known) ``matches``, or None."""
    return next((g for g in GPUS.values() if g.kind == "cuda" and matches(g, device_name, memory_bytes)), None)


def resolve_cuda_gpu(gpu_name: str | None, device: str, force: bool) -> GpuSpec:
    """The catalog entry of the local CUDA device: ``gpu_name`` checked against it (unless ``force``),
    or found from the device's name. Errors are one line saying what was found."""
    if not torch.cuda.is_available():
        found = "torch reports no CUDA device"
        if torch.version.cuda is None:
            found += f" (torch {torch.__version__} is a CPU-only build)"
        want = f"--gpu {gpu_name}" if gpu_name else "--device cuda"
        raise RlhfsimError(f"{want}: expected a local CUDA device, found none: {found}; use --device cpu to calibrate the CPU")
    props = torch.cuda.get_device_properties(torch.device(device))
    if gpu_name is not None:
        spec = get_gpu(gpu_name, "--gpu")
        if spec.kind != "cuda":
            raise RlhfsimError(f"--gpu: expected a GPU name ({', '.join(n for n, g in GPUS.items() if g.kind == 'cuda')}), got {gpu_name!r}; use --device cpu for the CPU")
        if not force and not matches(spec, props.name, props.total_memory):
            raise RlhfsimError(f"--gpu {gpu_name}: expected a local {spec.name}, found {props.name!r} "
                               f"({props.total_memory / 2**30:.0f} GiB); pass --force to calibrate it under that name anyway")
        return spec
    spec = catalog_gpu(props.name, props.total_memory)
    if spec is not None:
        return spec
    raise RlhfsimError(f"--device cuda: found {props.name!r}, which is not in the hardware catalog "
                       f"({', '.join(n for n, g in GPUS.items() if g.kind == 'cuda')}); pass --gpu NAME --force to name it")

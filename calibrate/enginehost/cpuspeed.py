"""This machine's single-thread speed, and the factor that carries host seconds measured here to the host
CPUs of GPU servers.

An engine's host work is one Python thread (the scheduler, input preparation, output processing), so it
scales with one core's speed: clock x instructions per clock (IPC) on branchy interpreter code. Here:

* ``measure()``: the clock this core runs at, from a dependent chain of integer adds (one per cycle on
  every x86 and Arm core of the last decade) compiled with the system C compiler, and the time of a fixed
  pure-Python workload (dict/list/attribute churn, the kind of code a scheduler runs), both best of 7.
* ``host_scales()``: for each GPU server host CPU, ``scale = (f_here x ipc_here) / (f_host x ipc_host)``,
  the factor to multiply a host time measured here by. Clocks are the vendors' datasheet values (max
  single-core boost; the all-core turbo as the low end, since 8 engine processes and their workers keep
  other cores busy); IPC relative to Zen 5 from the vendors' generational claims, chained (sources in
  ``HOSTS``). Uncertainty: the IPC claims are the vendors' own suites, not CPython; one step of the chain
  is worth about +-10%, so the factor is good to about +-25% for x86 hosts and +-30% for Grace.

Not captured by the factor: the Python version (CPython 3.11 and 3.12 run this code 10-25% faster than
3.10, the Python of many vLLM 0.6-0.8 images), the vLLM version (host code was rewritten between V0 and
V1 and keeps changing), and the GPU-only host work this CPU does not do (CUDA launches, copies to the
device); docs/calibration.md, "Engine host work per step", discusses each.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlhfsim.hardware import hosts

# Per-clock speed relative to Zen 5 and the GPU servers' host CPUs (datasheet boost and all-core clocks): one home,
# rlhfsim.hardware.hosts, which the simulator's host factor reads too (its docstring and IPC's comment give sources).
IPC = hosts.IPC
HOSTS = {n: {"servers": h.servers, "uarch": h.uarch, "boost_ghz": h.boost_ghz, "allcore_ghz": h.allcore_ghz,
             "source": h.source} for n, h in hosts.HOSTS.items()}
HERE_UARCH = {("AuthenticAMD", 26): "zen5", ("AuthenticAMD", 25): "zen4", ("AuthenticAMD", 23): "zen2"}

_CHAIN_C = r"""
#include <stdio.h>
#include <time.h>
int main(int argc, char **argv) {
    long n = 400000000L; volatile long seed = argc; long x = seed;
    struct timespec a, b; double best = 1e9;
    for (int r = 0; r < 7; r++) {
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
        for (long i = 0; i < n; i++) { __asm__ volatile("add $1, %0" : "+r"(x)); }
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
        double s = (b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec);
        if (s < best) best = s;
    }
    printf("%.6f %ld\n", n / best / 1e9, x);
    return 0;
}
"""


def machine() -> dict:
    """CPU model, vendor, family, model, logical CPUs, Python and platform."""
    info = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        k, _, v = line.partition(":")
        k, v = k.strip(), v.strip()
        if k in ("model name", "vendor_id", "cpu family", "model", "cpu MHz") and k not in info:
            info[k] = v
    try:
        info["lscpu_model"] = next(line.split(":", 1)[1].strip() for line in
                                   subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
                                   if line.startswith("Model name"))
    except (OSError, StopIteration):
        pass
    return info


def clock_ghz() -> float | None:
    """The core's clock (GHz) from a dependent add chain (x86 only; None without a C compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or platform.machine() not in ("x86_64", "AMD64"):
        return None
    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d) / "chain.c", Path(d) / "chain"
        src.write_text(_CHAIN_C)
        if subprocess.run([cc, "-O1", "-o", str(exe), str(src)], capture_output=True).returncode != 0:
            return None
        out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120).stdout.split()
    return float(out[0]) if out else None


def python_workload(n: int = 20000) -> float:
    """Seconds (thread CPU time) of a fixed pure-Python workload: small objects, dict and list churn,
    attribute reads, the shape of a scheduler's per-request loop."""
    class Req:
        __slots__ = ("rid", "computed", "blocks", "out")

        def __init__(self, rid):
            self.rid, self.computed, self.blocks, self.out = rid, 0, [], []

    t0 = time.thread_time()
    reqs = {i: Req(i) for i in range(256)}
    for step in range(n // 256):
        sched = {}
        for rid, r in reqs.items():
            r.computed += 1
            if r.computed % 16 == 0:
                r.blocks.append(step)
            sched[rid] = 1
            r.out.append(r.computed & 1023)
            if len(r.out) > 64:
                del r.out[:32]
        total = sum(sched.values())
        assert total == len(reqs)
    return time.thread_time() - t0


def measure() -> dict:
    """Best of 7 of the Python workload and the measured clock."""
    times = sorted(python_workload(100000) for _ in range(7))
    clocks = [c for c in (clock_ghz() for _ in range(3)) if c is not None]
    # the highest of three: a shared host lowers the boost clock while it is busy; the fit's quiet reference
    # (the fastest Python run seen) goes with the highest clock, so the scale uses it too
    return {"python_workload_s": times[0], "python_workload_median_s": times[len(times) // 2],
            "clock_ghz": max(clocks) if clocks else None, "clock_samples_ghz": clocks, "uarch": _here_uarch()}


def _here_uarch() -> str | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    vendor = family = None
    for line in text.splitlines():
        k, _, v = line.partition(":")
        if k.strip() == "vendor_id" and vendor is None:
            vendor = v.strip()
        elif k.strip() == "cpu family" and family is None:
            family = int(v.strip())
    return HERE_UARCH.get((vendor, family))


def host_scales(clock_here_ghz: float | None = None, uarch_here: str | None = None) -> dict:
    """Per host CPU: the factor (central, and the range from max boost to all-core turbo) by which a host
    time measured here becomes that host's."""
    f = clock_here_ghz if clock_here_ghz is not None else clock_ghz()
    u = uarch_here or _here_uarch()
    if f is None or u is None:
        return {}
    here = f * IPC[u]
    out = {}
    for name, h in HOSTS.items():
        fast = here / (h["boost_ghz"] * IPC[h["uarch"]])
        slow = here / (h["allcore_ghz"] * IPC[h["uarch"]])
        out[name] = {**h, "ipc_rel_zen5": IPC[h["uarch"]], "scale": (fast + slow) / 2, "scale_low": fast,
                     "scale_high": slow}
    return out

"""One OpenMP thread for the calling thread only: what the intra-step scorer thread runs with on a CPU.

torch's CPU wheel runs its parallel regions on GNU OpenMP, and every Python thread that opens one gets an
OpenMP team of its own. libgomp counts every team's workers in one process-wide number; once it exceeds the
CPUs, every waiting worker spins 100 times instead of 300,000 before it sleeps (``gomp_throttled_spin_count_var``;
libgomp ``env.c``, ``wait.h``), so a second thread's team, even idle, makes each parallel region of the main
thread wake a sleeping worker (``lab/diagnostics/decode_threadpool.py`` measures it). A scorer on its own GPU, which the
executor's scorer thread stands in for, costs the actor nothing while it waits. A scorer thread that runs
its operations on one OpenMP thread opens no team, so while it waits the actor's pool keeps its own spin
policy, and while it computes it takes one core (the executor's ``Scorer`` and the hand-over calibration,
``calibrate.cpu.corun``, both run their scorer thread so on a CPU).

``one_thread_here()`` sets, for the calling thread only: OpenMP's ``nthreads-var`` (``omp_set_num_threads``
acts on the calling thread's task) and MKL's thread-local count (``MKL_Set_Num_Threads_Local``; torch's
``set_num_threads`` would set MKL's global count, and every not-yet-initialized thread's). It first calls
``torch.get_num_threads()`` so torch's lazy per-thread initialization (which would set the count back)
has already run, without opening a region.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

import torch


@functools.lru_cache(maxsize=1)
def _libs() -> tuple[object | None, object | None, str]:
    """(OpenMP library, library exporting MKL's service calls, what was found), loaded once."""
    lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    omp = None
    for cand in ("libgomp.so.1", "libomp.so", "libiomp5.so", "libomp.dylib"):
        path = os.path.join(lib_dir, cand)
        if os.path.exists(path):
            try:
                omp = ctypes.CDLL(path)
                break
            except OSError:
                pass
    if omp is None:
        for name in ("gomp", "omp", "iomp5"):
            found = ctypes.util.find_library(name)
            if found:
                try:
                    omp = ctypes.CDLL(found)
                    break
                except OSError:
                    pass
    mkl = None
    for cand in ("libtorch_cpu.so", "libtorch_cpu.dylib"):
        path = os.path.join(lib_dir, cand)
        if os.path.exists(path):
            try:
                lib = ctypes.CDLL(path)
                if hasattr(lib, "MKL_Set_Num_Threads_Local"):
                    mkl = lib
            except OSError:
                pass
            break
    if omp is not None and not hasattr(omp, "omp_set_num_threads"):
        omp = None
    return omp, mkl, ("OpenMP" if omp is not None else "no OpenMP") + (" + MKL" if mkl is not None else "")


def scorer_threads(cuda: bool) -> int | None:
    """The OpenMP threads a scorer thread runs with (1 on a CPU where ``one_thread_here`` can set it; None:
    the process's own count, on CUDA, where the thread only launches kernels, or where it cannot be set)."""
    if cuda or not torch.backends.openmp.is_available():
        return None
    return 1 if _libs()[0] is not None else None


def one_thread_here() -> str:
    """Run the calling thread's torch operations on one OpenMP thread (no team of its own); the other
    threads keep theirs. Returns what was set ("OpenMP + MKL", "OpenMP", or why nothing was)."""
    if not torch.backends.openmp.is_available():
        return "not set: torch has no OpenMP backend"
    torch.get_num_threads()          # torch's per-thread lazy init first; it opens no parallel region
    omp, mkl, what = _libs()
    if omp is None:
        return "not set: no OpenMP library found beside torch"
    omp.omp_set_num_threads(ctypes.c_int(1))
    if mkl is not None:
        mkl.MKL_Set_Num_Threads_Local(ctypes.c_int(1))
    return what

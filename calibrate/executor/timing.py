"""Clocks and the per-step log of timed work.

Every piece of work is timed with ``time.perf_counter`` after synchronising the calling thread's
current CUDA stream (the decode loop and the training phases run on the default stream, the scorer on
its own stream, so one never waits for the other's queued work). Times are stored relative to the
step's start ``t0`` (the moment generation starts), in seconds.

A phase's span in a step = (min start, max end) over that phase's intervals; ``generate`` spans from
0 to the end of the last generation call.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections import Counter

import torch


PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# The CUDA caching allocator's counters a step's phases are read by (``torch.cuda.memory_stats``): device
# memory mapped (cudaMalloc) and returned (cudaFree), allocations retried after freeing the cache, and
# synchronisations of every stream the allocator forced. On the H200 the actor's minibatches took 2.3-25x
# the same call alone in the steps, where every minibatch has its own width and the LM head's logits need
# blocks of gigabytes (lab/results/h200-2026-12-04/: the lent H200's validation): these say whether the allocator
# was mapping memory then.
ALLOC_KEYS = {"device_allocs": "num_device_alloc", "device_frees": "num_device_free",
              "alloc_retries": "num_alloc_retries", "sync_all_streams": "num_sync_all_streams"}


def minor_faults() -> int:
    """Minor page faults of this process so far (``getrusage``): a page of fresh memory touched."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def device_allocs(device: torch.device) -> dict[str, int] | None:
    """The caching allocator's counters on ``device`` so far (``ALLOC_KEYS``); None off CUDA (a CPU has no
    caching allocator: its fresh memory shows as page faults, ``minor_faults``)."""
    if device.type != "cuda":
        return None
    stats = torch.cuda.memory_stats(device)
    return {k: int(stats.get(v, 0)) for k, v in ALLOC_KEYS.items()}


class Clock:
    """``now()``: perf_counter after the calling thread's CUDA stream has finished its queued work."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def now(self) -> float:
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()
        return time.perf_counter()


class StepLog:
    """Intervals (role, phase, start_s, end_s) and counters of one step; appended from the decode
    thread and the scorer thread."""

    def __init__(self, t0_at: float):
        self.t0_at = t0_at
        self.intervals: list[tuple[str, str, float, float]] = []
        self.counts: Counter = Counter()
        # Operations timed inside the step with the shape the cost model prices them at:
        # (operation, seconds, shape), e.g. ("decode", 0.004, {"batch": 4, "kv0": 412}) or ("train_call", 0.02,
        # {"role": "actor", "phase": "actor_train", "rows": 2, "width": 96, "index": 0}); see ``op``.
        self.ops: list[tuple[str, float, dict]] = []
        # Pages faulted in by each minibatch of the main thread's sequential phases (calibrate.cpu.pagefaults):
        # (phase, bytes faulted, rows, padded width); see ``minor_faults``.
        self.faults: list[tuple[str, int, int, int]] = []
        # Per phase, the caching allocator's counters it moved (``device_allocs``; CUDA only, device-wide: under
        # OPPO's intra-step overlap ``generate`` includes the scorer thread's).
        self.allocs: dict[str, Counter] = {}
        self._lock = threading.Lock()

    def op(self, name: str, seconds: float, **shape) -> None:
        """One timed operation and its shape (``calibrate.validation.compare`` prices it)."""
        with self._lock:
            self.ops.append((name, seconds, shape))

    def piece(self, name: str, role: str, phase: str, start_at: float, end_at: float, ids, index: int,
              **counts: int) -> None:
        """One call of a sequential phase over a padded batch ``ids`` [rows, width]: its interval (``add``)
        and the same call as an operation with its shape (``op``: ``forward_call`` or ``train_call``;
        ``index``: its place in the phase, 0 for the first)."""
        self.op(name, end_at - start_at, role=role, phase=phase, rows=int(ids.shape[0]), width=int(ids.shape[1]),
                index=index)
        self.add(role, phase, start_at, end_at, **counts)

    def add(self, role: str, phase: str, start_at: float, end_at: float, **counts: int) -> None:
        with self._lock:
            self.intervals.append((role, phase, start_at - self.t0_at, end_at - self.t0_at))
            self.counts.update(counts)

    def fault(self, phase: str, faults_before: int, rows: int, width: int) -> None:
        """One minibatch's faulted bytes: the process's minor faults since ``faults_before`` (taken with
        ``minor_faults`` at its start) times the page size. Process-wide, so only for work no other
        thread runs beside (reference, critic, training minibatches)."""
        with self._lock:
            self.faults.append((phase, (minor_faults() - faults_before) * PAGE_BYTES, rows, width))

    def alloc(self, phase: str, before: dict[str, int] | None, after: dict[str, int] | None) -> None:
        """What the allocator counters moved between two ``device_allocs`` readings, added to ``phase``
        (nothing off CUDA, where both are None)."""
        if before is None or after is None:
            return
        with self._lock:
            self.allocs.setdefault(phase, Counter()).update({k: after[k] - before[k] for k in after})

    def count(self, **counts: int) -> None:
        with self._lock:
            self.counts.update(counts)

    def phases(self) -> dict[str, tuple[float, float]]:
        spans: dict[str, tuple[float, float]] = {}
        with self._lock:
            for _, phase, s, e in self.intervals:
                a, b = spans.get(phase, (s, e))
                spans[phase] = (min(a, s), max(b, e))
        # generate always starts the step (it may be empty when carried rollouts alone fill the batch)
        spans["generate"] = (0.0, spans.get("generate", (0.0, 0.0))[1])
        return spans

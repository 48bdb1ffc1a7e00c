"""Interleaved measurement: the contenders of one operating point (scoring runtimes, or batching
strategies) timed in alternating rounds, so that a machine whose speed drifts (a shared VM, thermal
limits, other tenants) slows every contender alike instead of whichever happened to run in the slow
minute.

A contender is a ``Sampler``: ``first()`` times its first call on its own (compilation lands there) and
runs ``warmup`` untimed calls; ``round(k)`` returns ``k`` timed calls. ``interleave(samplers, rounds,
per_round)`` calls every ``first()``, then runs ``rounds`` rounds; in round r the contenders go in the
order of the list rotated by r (A B C, B C A, C A B, ...: ABAB... for two, and no contender always
first), each taking ``per_round`` timed calls. Each sample is kept with its round index (``rounds_of``),
so the statistics (``calibrate.fitting.stats``) can treat a round, not a call, as the unit of independence.

Clocks as in ``calibrate.measuring.measure.Clock`` (CUDA events on GPU; ``time.perf_counter`` on CPU; the host
clock around a synchronised call for runtimes on streams torch does not know). Peak memory per
contender: on CUDA ``torch.cuda.max_memory_allocated`` over its first call and warmup (reset before);
on CPU the process's peak resident set (``VmHWM``) over the same calls, after resetting it to the
current RSS (``/proc/self/clear_refs``, Linux): the whole process, weights of every loaded model
included (``peak_mem_extra_mb`` is the rise over the RSS just before). ``None`` where neither works.
Units: seconds, MiB.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

from calibrate.measuring.measure import Clock

MIB = 2 ** 20


@dataclass
class Prepared:
    """A runtime's scoring call for one operating point, and the seconds spent preparing it."""

    call: Callable[[], Any]
    setup_s: float = 0.0
    host_clock: bool = False


def _rss_mb(field_name: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) * 1024 / MIB
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class MemoryWatch:
    """Peak memory over a block (see the module docstring): ``with w: ...`` then ``w.peak_mb``."""

    def __init__(self, device: str):
        self.cuda = str(device).startswith("cuda")
        self.device = device
        self.peak_mb: float | None = None
        self.extra_mb: float | None = None

    def __enter__(self):
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._before = torch.cuda.memory_allocated(self.device) / MIB
        else:
            self._ok = _reset_peak_rss()
            self._before = _rss_mb("VmRSS")
        return self

    def __exit__(self, *exc):
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
            self.peak_mb = torch.cuda.max_memory_allocated(self.device) / MIB
        elif self._ok:
            self.peak_mb = _rss_mb("VmHWM")
        if self.peak_mb is not None and self._before is not None:
            self.extra_mb = max(self.peak_mb - self._before, 0.0)


class Sampler(ABC):
    """One contender of an operating point (see the module docstring). After ``first()``: ``output`` is
    the last call's result, ``setup_s`` the preparation time, ``peak_mem_mb`` / ``peak_mem_extra_mb``."""

    setup_s: float = 0.0
    output: Any = None
    peak_mem_mb: float | None = None
    peak_mem_extra_mb: float | None = None

    @abstractmethod
    def first(self) -> float: ...

    @abstractmethod
    def round(self, k: int) -> list[float]: ...


class InProcessSampler(Sampler):
    """A Python callable timed in this process."""

    def __init__(self, call: Callable[[], Any], *, device: str, warmup: int, setup_s: float = 0.0,
                 host_clock: bool = False):
        self.call, self.warmup, self.setup_s = call, warmup, setup_s
        self.device = device
        self.clock = Clock(device, host_clock)

    def first(self) -> float:
        with MemoryWatch(self.device) as w:
            first_s, self.output = self.clock.call(self.call)
            for _ in range(self.warmup):
                self.output = self.call()
        self.peak_mem_mb, self.peak_mem_extra_mb = w.peak_mb, w.extra_mb
        return first_s

    def round(self, k: int) -> list[float]:
        out = []
        for _ in range(k):
            dt, self.output = self.clock.call(self.call)
            out.append(dt)
        return out


@dataclass
class Interleaved:
    """What ``interleave`` measured for one contender."""

    first_call_s: float
    samples_s: list[float] = field(default_factory=list)
    rounds_of: list[int] = field(default_factory=list)   # the round index of each sample


def order(names: list[str], r: int) -> list[str]:
    """The contenders' order in round ``r``: the list rotated by r."""
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


def interleave(samplers: dict[str, Sampler], rounds: int, per_round: int, round_offset: int = 0,
               first_calls: dict[str, float] | None = None) -> dict[str, Interleaved]:
    """First calls (unless ``first_calls`` has them: the caller took them, e.g. to check outputs), then
    ``rounds`` alternating rounds of ``per_round`` timed calls per contender (round indices start at
    ``round_offset``, so the rounds of several launches stay distinct)."""
    names = list(samplers)
    out = {n: Interleaved(first_calls[n] if first_calls is not None else samplers[n].first()) for n in names}
    for r in range(rounds):
        for n in order(names, r):
            got = samplers[n].round(per_round)
            out[n].samples_s += got
            out[n].rounds_of += [round_offset + r] * len(got)
    return out

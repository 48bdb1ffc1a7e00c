"""State shared by every measurement of one calibration: device, dtype, grid, the journal, progress, and
the models (random weights from a fixed seed, or a local checkpoint).

``Session.measure(key, fields, fn)`` is the one way a point gets measured: skipped if the journal has it
(``--resume``), timed with ``calibrate.measuring.measure.time_calls`` under the grid's budget, appended to the
journal (flushed + fsynced) at once, a warning printed if it is noisy.

On a CPU shared with other processes (``Session.guarded``), each point first waits (up to
``grid.quiet_wait_s``) until a small matmul with the calibration's thread count is no more than 1.5x
slower than with one thread (``device_info.contention_ratio``): while other processes hold the cores,
every OpenMP region waits for descheduled workers and a point would time the scheduler, not the
operation. The check is repeated after the point; a point that the other processes disturbed is
measured again (up to ``MEASURE_ATTEMPTS`` times). A check taken less than ``PROBE_FRESH_S`` ago that found
the cores quiet (the previous point's check after) stands for the next point's check before. On a host
that other processes keep busy for the whole calibration, waiting and measuring again only multiply its
time: ``grid.quiet_budget_s`` (None: unbounded) caps the seconds one calibration spends on them; once it
is spent, points are measured at once and a disturbed one is kept, flagged. The worst ratio seen around the kept measurement is
stored in the point (``contention_ratio``); a point kept while still contended is flagged
``contended`` and warned about. A point that runs out of memory is
journaled as skipped (with the reason) so a resume does not retry it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch

from calibrate.measuring.device_info import contention_ratio, load_avg
from calibrate.running.grid import Grid
from calibrate.running.journal import Journal
from calibrate.measuring.measure import Measurement, time_calls
from calibrate.measuring.models import build_hf_model, load_hf_checkpoint, torch_dtype
from calibrate.running.progress import Progress
from rlhfsim.models.catalog import ModelShape

SEED = 0
CONTENTION_LIMIT = 1.5  # N-thread / 1-thread matmul time above which other processes hold the cores
MEASURE_ATTEMPTS = 3
PROBE_FRESH_S = 1.0     # a quiet check this recent stands for the next one (no point ran in between)


def point_key(op: str, model: str, dtype: str, *, batch: int, seq_len: int, prefix_len: int = 0,
              head: str = "", runtime: str = "", strategy: str = "") -> str:
    return f"{op}|{model}|{head}|{runtime}|{strategy}|b{batch}|n{seq_len}|p{prefix_len}|{dtype}"


@dataclass
class Session:
    """One calibration's measuring context (see the module docstring)."""

    device: str
    dtype: str
    grid: Grid
    journal: Journal
    progress: Progress
    cache_dir: Path
    checkpoints: dict[str, Path] = field(default_factory=dict)
    threads: int = 1
    ratio: float | None = None  # contention ratio around the last measurement (None: not checked)
    quiet_spent_s: float = 0.0  # seconds spent waiting for quiet cores and measuring disturbed points again
    _last_probe: tuple[float, float] | None = None  # (monotonic time, ratio) of the latest contention check

    @property
    def cuda(self) -> bool:
        return torch.device(self.device).type == "cuda"

    @property
    def tdtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

    # -- models ------------------------------------------------------------------------------------
    def hf_model(self, shape: ModelShape, head: str, dtype: str | None = None):
        dt = dtype or self.dtype
        if shape.name in self.checkpoints:
            return load_hf_checkpoint(self.checkpoints[shape.name], head, dt, self.device)
        return build_hf_model(shape, head, dt, self.device, seed=SEED)

    def decoder(self, shape: ModelShape, head: str, max_slots: int, max_len: int):
        from calibrate.measuring.decoder import StaticKVDecoder

        dec = StaticKVDecoder(shape, dtype=self.tdtype, device=self.device, max_slots=max_slots,
                              max_len=max_len, head=head, seed=SEED)
        if shape.name in self.checkpoints:
            hf = load_hf_checkpoint(self.checkpoints[shape.name], head, self.dtype, self.device)
            dec.load_hf_state_dict(hf.state_dict())
            del hf
        return dec

    # -- points ------------------------------------------------------------------------------------
    def pending(self, key: str) -> bool:
        if self.journal.has(key):
            self.progress.advance(f"{key} (journal)", skipped=True)
            return False
        return True

    def label(self, fields: dict) -> str:
        parts = [fields["op"], fields["model"]] + ([fields["head"]] if fields["op"] in ("train", "optimizer") else [])
        parts += [fields[k] for k in ("runtime", "strategy") if fields.get(k)]
        if fields.get("varlen"):
            parts[-1] += " (varied lengths)"
        parts.append(f"b={fields['batch']} n={fields['seq_len']}" + (f" p={fields['prefix_len']}" if fields.get("prefix_len") else ""))
        return " ".join(str(p) for p in parts)

    def _probe(self) -> float | None:
        if self.cuda or self.threads <= 1 or self.grid.quiet_wait_s <= 0:
            return None
        ratio = contention_ratio(self.threads, calls=9)
        self._last_probe = (time.monotonic(), ratio)
        return ratio

    def quiet_left_s(self) -> float:
        """Seconds of ``grid.quiet_budget_s`` not yet spent on waiting and measuring again (inf: unbounded)."""
        budget = self.grid.quiet_budget_s
        return float("inf") if budget is None else max(budget - self.quiet_spent_s, 0.0)

    def wait_quiet(self) -> float | None:
        """Wait (bounded by ``grid.quiet_wait_s`` and what is left of ``grid.quiet_budget_s``) until other
        processes leave the cores alone; returns the last contention ratio (None where it is not checked:
        CUDA, one thread). A quiet check of the last ``PROBE_FRESH_S`` seconds is not repeated."""
        last = self._last_probe
        if last is not None and time.monotonic() - last[0] < PROBE_FRESH_S and last[1] <= CONTENTION_LIMIT:
            return last[1]
        ratio = self._probe()
        start = time.monotonic()
        deadline = start + min(self.grid.quiet_wait_s, self.quiet_left_s())
        while ratio is not None and ratio > CONTENTION_LIMIT and time.monotonic() < deadline:
            time.sleep(0.5)
            ratio = self._probe()
        self.quiet_spent_s += time.monotonic() - start
        return ratio

    def guarded(self, run: Callable[[], Any], attempts: int = MEASURE_ATTEMPTS) -> Any:
        """``run()`` (one measurement) on quiet cores: waits before, checks after, measures again (up to
        ``attempts`` tries, while ``grid.quiet_budget_s`` lasts) when other processes disturbed it; sets
        ``self.ratio`` for the record. Interleaved points take one attempt: alternating rounds already
        expose every contender to the same disturbance, and a disturbed point is flagged ``contended``
        rather than retaken."""
        for k in range(attempts):
            before = self.wait_quiet()
            t0 = time.monotonic()
            out = run()
            after = self._probe()
            if k > 0:
                self.quiet_spent_s += time.monotonic() - t0   # a measurement taken again
            self.ratio = None if before is None else max(before, after)
            if self.ratio is None or self.ratio <= CONTENTION_LIMIT or self.quiet_left_s() <= 0:
                break
        return out

    def record(self, key: str, fields: dict, m: Measurement | None = None, timing: dict | None = None,
               skipped: str | None = None) -> dict:
        """Journal one point (``timing`` = the fields of ``measure.summarize``) and advance progress."""
        rec: dict[str, Any] = {"kind": "point", "key": key, "dtype": self.dtype, **fields,
                               "measured_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds")}
        if skipped is not None:
            rec["skipped"] = skipped
        else:
            rec.update(timing if timing is not None else m.summary())
            rec["contention_ratio"] = self.ratio
            rec["contended"] = self.ratio is not None and self.ratio > CONTENTION_LIMIT
            rec["load_avg_1m"] = load_avg()
        self.journal.append(rec)
        label = self.label(rec)
        if skipped is not None:
            self.progress.note(f"skipped {label}: {skipped}")
        else:
            if rec["contended"]:
                self.progress.note(f"warning: {label} measured while other processes held the CPU "
                                   f"(contention ratio {rec['contention_ratio']:.1f})")
            if rec["warn_noisy"]:
                self.progress.note(f"warning: noisy point {label}: IQR/median = {rec['iqr_s'] / rec['median_s']:.2f} > 0.1")
            label += f": {rec['median_s'] * 1e3:.3f} ms"
        self.progress.advance(label, skipped=skipped is not None)
        return rec

    def measure(self, key: str, fields: dict, fn: Callable[[], Any], setup: Callable[[], Any] | None = None,
                host_clock: bool = False, extra: Callable[[Measurement], dict] | None = None) -> dict | None:
        """Measure one point unless the journal has it; returns the journaled record (or None if it was
        already measured). ``extra(measurement)`` adds fields computed from the last call's output."""
        if not self.pending(key):
            return None
        g = self.grid
        try:
            m = self.guarded(lambda: time_calls(fn, device=self.device, warmup=g.warmup, iters=g.max_iters,
                                                min_iters=g.min_iters, budget_s=g.point_budget_s, setup=setup,
                                                host_clock=host_clock))
        except torch.cuda.OutOfMemoryError as e:
            self.free()
            return self.record(key, fields, skipped=f"out of memory ({str(e).splitlines()[0][:120]})")
        if extra is not None:
            fields = {**fields, **extra(m)}
        return self.record(key, fields, m)

    def all_done(self, keys: list[str]) -> bool:
        """True (and the points counted as done) when the journal has every one of ``keys``: the caller
        can then skip building models."""
        if all(self.journal.has(k) for k in keys):
            for k in keys:
                self.pending(k)
            return True
        return False

    def free(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

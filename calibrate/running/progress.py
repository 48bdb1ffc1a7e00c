"""Progress display: a rich progress bar when rich is installed and output is a terminal, plain lines
otherwise (GPU images may lack rich; CI logs want lines). Warnings (noisy points, skipped runtimes)
always print as lines on stderr. Each line (or the bar's label) carries the elapsed time and an ETA:
the mean time of the points measured so far times the points left (points resumed from a journal
take no time and do not count toward the rate)."""

from __future__ import annotations

import sys
import time


class Progress:
    """``advance(label)`` after each point; ``note(text)`` for warnings; use as a context manager."""

    def __init__(self, total: int, enabled: bool = True, stream=None):
        self.total, self.done, self.enabled = total, 0, enabled
        self.stream = stream or sys.stderr
        self.measured, self.t0 = 0, time.monotonic()
        self._rich = None
        if enabled and self.stream.isatty():
            try:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, \
                    TimeElapsedColumn
            except ImportError:
                pass
            else:
                self._rich = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                          TimeElapsedColumn(), transient=False)
                self._task = self._rich.add_task("calibrating", total=total)

    def __enter__(self) -> "Progress":
        if self._rich:
            self._rich.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._rich:
            self._rich.stop()

    def eta_s(self) -> float | None:
        """Seconds left at the mean rate of the points measured so far (None before the first)."""
        if not self.measured:
            return None
        return (time.monotonic() - self.t0) / self.measured * max(self.total - self.done, 0)

    def timing(self) -> str:
        eta = self.eta_s()
        return f"elapsed {_mmss(time.monotonic() - self.t0)}, eta " + ("?" if eta is None else _mmss(eta))

    def advance(self, label: str, skipped: bool = False) -> None:
        self.done += 1
        if not skipped:
            self.measured += 1
        if not self.enabled:
            return
        if self._rich:
            self._rich.update(self._task, advance=1, description=f"{label[:50]} ({self.timing()})")
        else:
            print(f"[{self.done}/{self.total}] {'skip ' if skipped else ''}{label}  ({self.timing()})", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        if self._rich:
            self._rich.console.print(f"[yellow]{text}[/yellow]", highlight=False)
        else:
            print(text, file=self.stream, flush=True)


def _mmss(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s"

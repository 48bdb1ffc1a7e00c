"""What every log reader returns: step records, the bad lines it skipped with their reasons, and notes.

A reader turns one file (or a directory of TensorBoard event files) into a ``LogRead``:

* ``steps``: one ``StepLine`` per logged step record, in the order the file has them, each with its step number,
  the line (event, row) it came from, its numeric metrics and its ``kind``: ``train`` (a training step; it may also
  carry validation or checkpoint timers) or ``validation`` (a record with validation metrics only: verl's
  ``val_before_train`` at step 0, its final validation after the last step in 0.2, a resumed run's first line);
* ``bad``: every record that looked like a step but could not be read whole (``BadLine``: where, why, an excerpt);
  nothing is dropped without a line here;
* ``notes``: what the reader noticed that is not an error (old metric names read as new ones, lines that were not
  UTF-8, a compressed file cut short).

Numbers are parsed by ``number``: Python's ``repr`` of a float or int (``nan``, ``inf`` included), numpy's
``np.float64(x)`` (verl >= 0.5 prints metrics with ``pprint.pformat``, and numpy >= 2 writes its scalars that
way), ``True``/``False`` (a bool is a ``numbers.Number``).
"""

from __future__ import annotations

import gzip
import math
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from rlhfsim.errors import RlhfsimError

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NUM = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf|infinity)"
NUMBER = re.compile(rf"^(?:np\.(?:float|int|uint)\d*\(\s*({_NUM})\s*\)|tensor\(\s*({_NUM})\s*\)|({_NUM}))$", re.I)
KEY = re.compile(r"^[^\s:]*[A-Za-z][^\s:]*$")        # a metric name: no blanks or colons, at least one letter
BINARY = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f\ufffd]")   # not text: NUL and other C0 codes, U+FFFD
VALIDATION_PREFIXES = ("val/", "val-", "eval/", "test_score/")   # test_score/: verl 0.1 before train
EXCERPT = 70


class LogError(RlhfsimError):
    """A run log that cannot be read or used: one line naming the file and where."""


@dataclass(frozen=True)
class StepLine:
    """One logged step record: its number, the 1-based line (event, row) it came from, its metrics and its kind
    (``train`` or ``validation``; module docstring). ``source``: the file, where a log spans several."""

    step: int
    line: int
    metrics: dict
    kind: str = "train"
    source: str = ""


@dataclass(frozen=True)
class BadLine:
    """A record that looked like a step and was skipped: where (line, event or row), why, and how it began."""

    line: int
    reason: str
    excerpt: str = ""
    step: int | None = None
    source: str = ""


@dataclass
class LogRead:
    """A log as read: its step records, the bad lines skipped, notes (module docstring). ``unit`` names what
    ``line`` counts (``line``, ``event``, ``row``); ``framework``: ``verl`` or ``openrlhf``."""

    source: str
    format: str
    steps: list[StepLine] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unit: str = "line"
    framework: str = "verl"

    def __iter__(self):
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, i):
        return self.steps[i]

    def where(self, b: BadLine) -> str:
        return f"{b.source or self.source} {self.unit} {b.line}"


def excerpt(text: str) -> str:
    """The start of a record, printable and short (for a skipped line's notice)."""
    t = ANSI.sub("", text).strip()
    t = BINARY.sub("?", t)
    return t[:EXCERPT] + ("..." if len(t) > EXCERPT else "")


def number(text: str) -> float | None:
    """A metric value as verl and OpenRLHF print one (module docstring), or None."""
    t = text.strip()
    if "_" not in t:
        try:
            return float(t)         # the common case, fast: a float's or an int's repr, nan, inf
        except ValueError:
            pass
    if t in ("True", "False"):
        return float(t == "True")
    m = NUMBER.match(t)
    if m is None:
        return None
    return float(next(g for g in m.groups() if g is not None))


def is_validation_key(key: str) -> bool:
    return key.startswith(VALIDATION_PREFIXES)


def kind_of(metrics: dict) -> str:
    """``validation`` when every metric of a record is a validation metric, else ``train``."""
    return "validation" if metrics and all(is_validation_key(k) for k in metrics) else "train"


def decode(data: bytes, source: str, notes: list[str]) -> str:
    """Bytes as text: UTF-8 with replacement characters where it is not (the lines with them are reported by the
    readers, which see them as binary bytes)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    text = data.decode("utf-8", errors="replace")
    bad = [i for i, ln in enumerate(text.split("\n"), 1) if "\ufffd" in ln]
    notes.append(f"{source}: {len(bad)} line(s) not UTF-8 (lines {ranges(bad)}), read with replacement characters")
    return text


def read_bytes(path: Path, notes: list[str]) -> bytes:
    """A file's bytes; a ``.gz`` file decompressed, as much of it as is whole (a cut-short archive is noted)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise LogError(f"log: expected a readable file, got {str(path)!r} ({e.strerror or e})") from None
    return gunzip(data, path.name, notes) if path.suffix == ".gz" else data


def gunzip(data: bytes, name: str, notes: list[str]) -> bytes:
    """gzip-compressed bytes decompressed, as much of them as is whole (a cut-short archive is noted)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data)
        if not d.eof:
            notes.append(f"{name}: the compressed file ends early (cut short after {len(data)} bytes); "
                         f"read the {len(out)} bytes it holds")
        return out
    except zlib.error as e:
        try:
            return gzip.decompress(data)   # several members, which decompressobj stops after the first of
        except (OSError, EOFError, zlib.error):
            pass
        raise LogError(f"{name}: expected a gzip-compressed log (.gz), got bytes that are not ({e})") from None


def ranges(xs: list[int], limit: int = 8) -> str:
    """``1-4, 7, 9-10``; after ``limit`` runs, ``... (N in all)``."""
    xs = sorted(set(xs))
    runs: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        runs.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    if len(runs) > limit:
        return ", ".join(runs[:limit]) + f", ... ({len(xs)} in all)"
    return ", ".join(runs)


def finite(v: float) -> bool:
    return not (math.isnan(v) or math.isinf(v))

"""Readers of training logs as frameworks write them, one module per format, and the one entry point
``read_path`` that picks the reader. Every reader returns a ``LogRead`` (``base``); ``normalize`` then adds one set of
metric names across frameworks and releases."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from rlhfsim.fromrun.logformats import jsonl, openrlhf, tensorboard, verl_console, wandb_csv
from rlhfsim.fromrun.logformats.base import LogError, LogRead, decode, gunzip
from rlhfsim.fromrun.logformats.normalize import normalize

# The text formats, by name (TensorBoard's binary event files are read from their path: ``tensorboard.read``).
READERS: dict[str, Callable[[str, str], LogRead]] = {
    "verl-console": verl_console.read,
    "jsonl": jsonl.read,
    "wandb-csv": wandb_csv.read,
    "openrlhf-console": openrlhf.read,
}


def detect(name: str, text: str) -> str:
    """The text format of a log: a CSV with a step column, JSON objects per line, OpenRLHF's ``Global step N: {``
    lines, else verl's console."""
    base = name.removesuffix(".gz")
    if base.endswith(".csv") or wandb_csv.looks_like(text):
        return "wandb-csv"
    firsts = [ln.strip() for ln in text.split("\n", 200)[:200] if ln.strip()][:20]
    if firsts and sum(ln.startswith("{") for ln in firsts) * 2 > len(firsts):
        return "jsonl"
    if openrlhf.looks_like(text):
        return "openrlhf-console"
    return "verl-console"


def read_path(path: Path | str) -> LogRead:
    """A log file (``.gz`` read as such) or a directory of TensorBoard event files, read and normalized."""
    p = Path(path)
    if p.is_dir():
        return normalize(tensorboard.read(p))
    if not p.is_file():
        raise LogError(f"log: expected a log file or a directory of TensorBoard event files, got {str(p)!r} "
                       f"({'no such file' if not p.exists() else 'not a regular file'})")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise LogError(f"log: expected a readable file, got {str(p)!r} ({e.strerror or e})") from None
    return read_data(data, p.name)


def read_data(data: bytes, name: str) -> LogRead:
    """A log's bytes as the file ``name`` holds them (gzip-compressed when the name ends in ``.gz``), read and
    normalized as ``read_path`` reads the file."""
    notes: list[str] = []
    if name.endswith(".gz"):
        data = gunzip(data, name, notes)
    if "tfevents" in name or tensorboard.looks_like(data):
        out = LogRead(name, tensorboard.FORMAT, unit="event")
        tensorboard.read_data(data, name, out)
    else:
        text = decode(data, name, notes)
        out = READERS[detect(name, text)](text, name)
    out.notes[:0] = notes
    return normalize(out)

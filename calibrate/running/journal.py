"""The calibration journal: one JSON object per line, appended, flushed and fsynced as each point is
measured, so an interruption (Ctrl-C, kill, power loss) loses at most the point in flight.

Records carry ``"kind"``: ``meta`` (first line: device, dtype, command; a resume must match it),
``point`` (one measured point, with a unique ``key``) and ``runtime`` (a runtime's availability,
correctness check and setup cost for one model, keyed too). On reading, a torn last line (a write cut
short) is ignored and cut off the file before anything is appended; a bad line elsewhere is an error,
since only the last line can be torn by an interrupted append.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlhfsim.errors import RlhfsimError
from rlhfsim.files import write_atomic, write_json_atomic

META_KEYS = ("device_kind", "device_name", "dtype", "threads")


def journal_path(out: Path) -> Path:
    """``cpu.json`` -> ``cpu.journal.jsonl`` next to it."""
    out = Path(out)
    return out.with_name(out.stem + ".journal.jsonl")


class Journal:
    """Append-only JSONL of measured points (see the module docstring)."""

    def __init__(self, path: Path, records: list[dict]):
        self.path = Path(path)
        self.records = records
        self.done: dict[str, dict] = {r["key"]: r for r in records if r.get("kind") in ("point", "runtime")}
        self._f = open(self.path, "a", encoding="utf-8")

    @classmethod
    def open(cls, path: Path, meta: dict, resume: bool) -> "Journal":
        """Start a fresh journal (``resume=False``: an existing one is replaced) or continue one whose
        meta record matches ``meta`` on device and dtype."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume and path.is_file():
            records = read_journal(path, repair=True)
            old = next((r for r in records if r.get("kind") == "meta"), None)
            if old is None:
                raise RlhfsimError(f"--resume: journal {str(path)!r} has no meta record; remove it or run without --resume")
            for k in META_KEYS:
                if old.get(k) != meta.get(k):
                    raise RlhfsimError(f"--resume: journal {str(path)!r} was measured with {k}={old.get(k)!r}, "
                                       f"this run has {k}={meta.get(k)!r}; run without --resume to start over")
            return cls(path, records)
        write_atomic(path, json.dumps({"kind": "meta", **meta}) + "\n", fsync=True)
        return cls(path, [{"kind": "meta", **meta}])

    def has(self, key: str) -> bool:
        return key in self.done

    def get(self, key: str) -> dict | None:
        return self.done.get(key)

    def append(self, record: dict) -> None:
        """Write one record durably (one ``write`` of one line, then flush and fsync)."""
        if "key" not in record or record.get("kind") not in ("point", "runtime"):
            raise ValueError(f"journal record needs kind point|runtime and a key, got {sorted(record)}")
        self._f.write(json.dumps(record, allow_nan=True) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())
        self.records.append(record)
        self.done[record["key"]] = record

    def points(self) -> list[dict]:
        return [r for r in self.records if r.get("kind") == "point"]

    def runtimes(self) -> list[dict]:
        return [r for r in self.records if r.get("kind") == "runtime"]

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_journal(path: Path, repair: bool = False) -> list[dict]:
    """All complete records. A torn last line is skipped (and, with ``repair``, truncated away so the
    next append starts on a fresh line)."""
    path = Path(path)
    data = path.read_bytes()
    records: list[dict] = []
    pos = 0
    lines = data.split(b"\n")
    for i, raw in enumerate(lines):
        last = i == len(lines) - 1
        if not raw.strip():
            pos += len(raw) + 1
            continue
        try:
            rec = json.loads(raw)
            if not isinstance(rec, dict):
                raise ValueError("not an object")
            if last:
                raise ValueError("no newline after the last record")  # an append cut before its "\n"
        except ValueError as e:
            if last or all(not x.strip() for x in lines[i + 1:]):
                if repair:
                    with open(path, "r+b") as f:
                        f.truncate(pos)
                        f.flush()
                        os.fsync(f.fileno())
                return records
            raise RlhfsimError(f"journal {str(path)}:{i + 1}: expected one JSON object per line, got a corrupt line ({e})") from None
        records.append(rec)
        pos += len(raw) + 1
    return records



def points_path(profile: Path) -> Path:
    """``cpu.json`` -> ``cpu.points.jsonl`` beside it: where a profile kept without its raw measured points
    holds them, one point per line. The bundled ``cpu`` profile is kept so: the simulator never reads the
    points, only the calibrator's reports and refits do (``with_points``), and they are not package data."""
    profile = Path(profile)
    return profile.with_name(profile.stem + ".points.jsonl")


def with_points(doc: dict, path: Path | str | None = None) -> dict:
    """``doc`` with its ``points``: its own, else those of ``points_path`` beside its file (``path``, default
    the ``_path`` that ``load_profile`` records), else ``doc`` unchanged (a profile that has none)."""
    src = path if path is not None else doc.get("_path")
    if "points" in doc or src is None or not points_path(src).is_file():
        return doc
    pts = [r for r in read_journal(points_path(src)) if r.get("kind", "point") == "point"]
    return {**doc, "points": pts}


def write_profile(path: Path, doc: dict) -> None:
    """Write a profile atomically; where a points file sits beside it (``points_path``: the profile is kept
    without its points), its ``points`` are written there, one per line, and the profile without them."""
    path = Path(path)
    beside = points_path(path)
    if beside.is_file() and "points" in doc:
        write_atomic(beside, "".join(json.dumps(p, allow_nan=True) + "\n" for p in doc["points"]), fsync=True)
        doc = {k: v for k, v in doc.items() if k != "points"}
    write_json_atomic(path, doc)

class PassView:
    """The journal as one measuring pass sees it (``Grid.passes``): pass ``k > 0`` journals its points
    under ``KEY|passK`` (field ``pass``), so every pass measures every point and ``--resume`` resumes
    each pass where it stopped; pass 0 uses the plain keys (a one-pass journal is unchanged)."""

    def __init__(self, journal: Journal, index: int):
        self.journal, self.index = journal, index
        self.suffix = f"|pass{index}" if index else ""

    def has(self, key: str) -> bool:
        return self.journal.has(key + self.suffix)

    def get(self, key: str) -> dict | None:
        return self.journal.get(key + self.suffix)

    def append(self, record: dict) -> None:
        self.journal.append({**record, "key": record["key"] + self.suffix, "pass": self.index})

    def points(self) -> list[dict]:
        return [r for r in self.journal.points() if r.get("pass", 0) == self.index]

    def runtimes(self) -> list[dict]:
        return [r for r in self.journal.runtimes() if r.get("pass", 0) == self.index]


def profile_inputs(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """(points, runtime records) a profile is built from: every point with its passes merged
    (``merge_passes``), and the first pass's runtime records."""
    points = [r for r in records if r.get("kind") == "point"]
    runtimes = [r for r in records if r.get("kind") == "runtime" and r.get("pass", 0) == 0]
    return merge_passes(points), runtimes


def merge_passes(points: list[dict]) -> list[dict]:
    """One point per key from the passes' points: the samples of all passes pooled (trimmed mean, median,
    IQR and p95 recomputed; interference slowdowns from the pooled co-running and alone samples), the first pass's
    first call and fields, the worst contention seen, ``passes`` = how many passes measured it. A point
    any pass skipped keeps its first measured pass only if another pass measured it."""
    from calibrate.measuring.measure import Measurement, alone_fields, summarize

    groups: dict[str, list[dict]] = {}
    for p in points:
        base = p["key"].split("|pass", 1)[0]
        groups.setdefault(base, []).append(p)
    out = []
    for base, group in groups.items():
        group.sort(key=lambda r: r.get("pass", 0))
        measured = [r for r in group if "skipped" not in r]
        if len(group) == 1 or not measured:
            out.append({k: v for k, v in group[0].items() if k != "pass"} | {"key": base})
            continue
        first = measured[0]
        rec = {k: v for k, v in first.items() if k != "pass"}
        rec["key"] = base
        rec.update(summarize([x for r in measured for x in r["samples_s"]], first["first_call_s"]))
        rec["passes"] = len(measured)
        ratios = [r["contention_ratio"] for r in measured if r.get("contention_ratio") is not None]
        rec["contention_ratio"] = max(ratios) if ratios else None
        rec["contended"] = any(r.get("contended") for r in measured)
        if all(r.get("rounds_of") is not None for r in measured):   # rounds of different passes stay distinct
            rec["rounds_of"] = [f"{r.get('pass', 0)}:{k}" for r in measured for k in r["rounds_of"]]
        if "max_abs_diff" in first:
            rec["max_abs_diff"] = max(r["max_abs_diff"] for r in measured)
        if "alone_samples_s" in first:
            rec.update(alone_fields(Measurement([x for r in measured for x in r["alone_samples_s"]], first["first_call_s"])))
            # hand-over points (calibrate.cpu.corun): medians, as they are measured
            rec["slowdown"] = (rec["median_s"] / rec["alone_median_s"] if first.get("corun_pattern") == "handover"
                               else rec["tmean_s"] / rec["alone_tmean_s"])
        out.append(rec)
    return out

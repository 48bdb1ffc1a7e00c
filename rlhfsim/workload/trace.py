"""Replayed rollouts: ``workload.response_length: {kind: trace, path: FILE}``.

A trace is what a real run generated, rollout by rollout: one row per completion with its ``step``, its
prompt (``prompt_id``), its index in the prompt's group (``rollout``; ``group_index`` is read as the same
column) and its token counts ``prompt_len`` and ``response_len``. The file is a CSV with a header or JSONL
with one object per line (a first ``{"meta": ...}`` line, as the TRL adapter's completions log has, is
skipped; other keys, such as the prompt and completion text, are ignored).

The simulator replays a trace one for one (``trace_rollouts``): steps in ascending order, within a step
the prompts in the order they first appear, within a prompt its rollouts by index; each rollout keeps
its own prompt length (``workload.prompt_length`` is not sampled), and both lengths are clipped to
``max_prompt_tokens`` / ``max_response_tokens`` like every other source. Every prompt must have
``algorithm.group_size`` rollouts and every step ``workload.prompts_per_step`` prompts, so a simulated step
is the trace's step. A run longer than the trace starts the trace over. Where only a distribution is
wanted (a trace as a mixture component is refused), a trace resamples its response lengths.

Every bad file is one ``ScenarioError`` line naming the YAML path of the ``path`` field.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from rlhfsim.errors import ScenarioError

COLUMNS = ("step", "prompt_id", "rollout", "prompt_len", "response_len")
ALIASES = {
    "step": ("step", "global_step"),
    "prompt_id": ("prompt_id", "prompt_index", "group"),
    "rollout": ("rollout", "group_index", "rollout_index", "sample_index"),
    "prompt_len": ("prompt_len", "prompt_length", "prompt_tokens"),
    "response_len": ("response_len", "response_length", "response_tokens", "completion_len", "completion_length"),
}


@dataclass(frozen=True)
class TraceRow:
    """One replayed completion (module docstring)."""

    step: int
    prompt_id: int
    rollout: int
    prompt_len: int
    response_len: int


def _column_map(keys, where: str, yaml_path: str) -> dict[str, str]:
    low = {str(k).strip().lower(): k for k in keys}
    out = {}
    for col, names in ALIASES.items():
        hit = next((low[n] for n in names if n in low), None)
        if hit is None:
            raise ScenarioError(yaml_path, f"expected a trace with columns {', '.join(COLUMNS)}, got no {col!r} column{where}")
        out[col] = hit
    return out


def whole_number(v) -> int:
    """``v`` (an int, a float or a string such as "12" or "12.0") as an int; ValueError when it is not a
    whole number (the trace reader and the log importers share this rule)."""
    try:
        f = float(v)
        if f != int(f):
            raise ValueError
        return int(f)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"not a whole number: {v!r}") from None


def _int(v, col: str, line: int, path: Path, yaml_path: str, minimum: int) -> int:
    try:
        n = whole_number(v)
    except ValueError:
        raise ScenarioError(yaml_path, f"expected an integer {col} on line {line} of {str(path)!r}, got {v!r}") from None
    if n < minimum:
        raise ScenarioError(yaml_path, f"expected {col} >= {minimum} on line {line} of {str(path)!r}, got {n}")
    return n


def read_trace(path: Path, yaml_path: str) -> list[TraceRow]:
    """The rows of a trace file, in file order. Every failure is a ScenarioError naming ``yaml_path``."""
    path = Path(path)
    if not path.is_file():
        raise ScenarioError(yaml_path, f"expected a CSV or JSONL trace file, got {str(path)!r} (no such file)")
    try:
        text = path.read_text()
    except OSError as e:
        raise ScenarioError(yaml_path, f"expected a readable trace file, got {str(path)!r} ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ScenarioError(yaml_path, f"expected a CSV or JSONL text trace, got {str(path)!r} (not UTF-8 text)") from None
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not lines:
        raise ScenarioError(yaml_path, f"expected at least one rollout, got an empty trace {str(path)!r}")
    records: list[tuple[int, dict]] = []
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        for i, ln in lines:
            try:
                rec = json.loads(ln)
            except ValueError as e:
                raise ScenarioError(yaml_path, f"expected one JSON object per line, got malformed line {i} of {str(path)!r} ({e})") from None
            if not isinstance(rec, dict):
                raise ScenarioError(yaml_path, f"expected one JSON object per line, got {type(rec).__name__} on line {i} of {str(path)!r}")
            if set(rec) == {"meta"}:
                continue
            records.append((i, rec))
    else:
        rows = list(csv.reader([ln for _, ln in lines]))
        header = rows[0]
        for (i, _), row in zip(lines[1:], rows[1:]):
            if len(row) != len(header):
                raise ScenarioError(yaml_path, f"expected {len(header)} fields on line {i} of {str(path)!r}, got {len(row)}")
            records.append((i, dict(zip(header, row))))
        if not records:
            raise ScenarioError(yaml_path, f"expected at least one rollout after the header, got none in {str(path)!r}")
    if not records:
        raise ScenarioError(yaml_path, f"expected at least one rollout, got none in {str(path)!r}")
    out: list[TraceRow] = []
    cols = None
    for i, rec in records:
        if cols is None or any(c not in rec for c in cols.values()):
            cols = _column_map(rec.keys(), f" on line {i} of {str(path)!r}", yaml_path)
        out.append(TraceRow(*(_int(rec[cols[c]], c, i, path, yaml_path, 1 if c.endswith("_len") else 0) for c in COLUMNS)))
    seen = set()
    for r in out:
        key = (r.step, r.prompt_id, r.rollout)
        if key in seen:
            raise ScenarioError(yaml_path, f"expected each (step, prompt_id, rollout) once, got step {r.step} prompt {r.prompt_id} rollout {r.rollout} twice in {str(path)!r}")
        seen.add(key)
    return out


def ordered_groups(rows: list[TraceRow]) -> list[tuple[int, int, list[TraceRow]]]:
    """(step, prompt_id, rollouts) in replay order (module docstring)."""
    groups: dict[tuple[int, int], list[TraceRow]] = {}
    for r in rows:
        groups.setdefault((r.step, r.prompt_id), []).append(r)
    steps = sorted({s for s, _ in groups})
    out = []
    for s in steps:
        for (st, pid), g in groups.items():   # dicts keep first-appearance order
            if st == s:
                out.append((s, pid, sorted(g, key=lambda r: r.rollout)))
    return out


def trace_rollouts(rows: list[TraceRow], group_size: int, prompts_per_step: int, prompt_cap: int,
                   response_cap: int, path: Path, yaml_path: str) -> list[tuple[int, int]]:
    """(prompt_len, response_len) of every rollout in replay order, after checking the group structure
    against the scenario (``algorithm.group_size``, ``workload.prompts_per_step``)."""
    out = []
    per_step: dict[int, int] = {}
    for step, pid, g in ordered_groups(rows):
        if len(g) != group_size:
            raise ScenarioError(yaml_path, f"expected {group_size} rollouts per prompt (algorithm.group_size), got {len(g)} for step {step} prompt {pid} in {str(path)!r}")
        if len({r.prompt_len for r in g}) != 1:
            raise ScenarioError(yaml_path, f"expected one prompt length per prompt, got {sorted({r.prompt_len for r in g})} for step {step} prompt {pid} in {str(path)!r}")
        per_step[step] = per_step.get(step, 0) + 1
        out.extend((min(r.prompt_len, prompt_cap), min(r.response_len, response_cap)) for r in g)
    for step, n in per_step.items():
        if n != prompts_per_step:
            raise ScenarioError(yaml_path, f"expected {prompts_per_step} prompts in every step (workload.prompts_per_step), got {n} in step {step} of {str(path)!r}")
    return out


def resolve(path: str, base_dir: Path | None) -> Path:
    p = Path(path)
    return base_dir / p if not p.is_absolute() and base_dir is not None else p


def write_trace(path: Path, rows: list[TraceRow]) -> None:
    """A trace as CSV (``.csv``) or JSONL (any other suffix), columns ``COLUMNS``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        if path.suffix.lower() == ".csv":
            w = csv.writer(f)
            w.writerow(COLUMNS)
            for r in rows:
                w.writerow([r.step, r.prompt_id, r.rollout, r.prompt_len, r.response_len])
        else:
            for r in rows:
                f.write(json.dumps(dict(zip(COLUMNS, (r.step, r.prompt_id, r.rollout, r.prompt_len, r.response_len)))) + "\n")

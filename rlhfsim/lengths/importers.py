"""Readers of real rollout logs, each turning its format into trace rows (``rlhfsim.workload.trace.TraceRow``:
step, prompt_id, rollout, prompt_len, response_len) with the prompt-response pairing and the group
structure kept.

Formats (``IMPORTERS``; ``auto`` picks one from the file):

* ``trl``: the TRL adapter's completions log (``calibrate.frameworks.trl.write_completions_log``: JSONL, a
  ``{"meta": {"framework": "trl", ...}}`` first line, then step, prompt_id, rollout, prompt_len,
  response_len and the text); or TRL's own ``log_completions`` Parquet files (a ``completions/`` directory
  of ``completions_NNNNN.parquet`` with step, prompt, completion columns: text only, so a tokenizer is
  needed).
* ``verl``: verl's rollout dumps (``trainer.rollout_data_dir``: one ``{step}.jsonl`` per step, or a single
  JSONL), one completion per line with ``input`` and ``output`` text (``prompt``/``response`` are read as
  the same) and ``step``.
* ``table``: plain CSV, JSONL or Parquet with token counts (``prompt_len``, ``response_len`` and their
  aliases in ``rlhfsim.workload.trace.ALIASES``) or text (``prompt``, ``response``/``completion``), and
  optional ``step``, ``prompt_id``, ``rollout`` columns.

Group structure where the file does not carry it: within a step, consecutive completions of the same
prompt text form a group (verl and TRL repeat each prompt group-size times in a row); without prompt
text and ids, ``group_size`` consecutive rows form a group (default 1). Without steps, every completion is
in step 0 unless ``prompts_per_step`` re-cuts the groups into steps. Text is counted with ``tokenizer``:
a local tokenizer directory (transformers, imported only then) or ``whitespace`` (words; no dependency).
A count is of the text as logged (verl and TRL log completions without their EOS token).

Parquet needs pyarrow; without it, a Parquet input is a one-line error. Every error is one line naming
the file (``RlhfsimError``).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Callable

from rlhfsim.errors import RlhfsimError
from rlhfsim.workload.trace import ALIASES, TraceRow, whole_number

TEXT_PROMPT = ("prompt", "input", "query")
TEXT_RESPONSE = ("response", "output", "completion")
Counter = Callable[[str], int]


def token_counter(tokenizer: str | None) -> Counter | None:
    """A function text -> token count: ``whitespace`` counts words; a path loads a local tokenizer."""
    if tokenizer is None:
        return None
    if tokenizer == "whitespace":
        return lambda text: len(text.split())
    p = Path(tokenizer)
    if not p.is_dir():
        raise RlhfsimError(f"--tokenizer: expected a local tokenizer directory or 'whitespace', got {tokenizer!r} (no such directory)")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise RlhfsimError("--tokenizer: counting text with a tokenizer needs transformers (pip install transformers)") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except (OSError, ValueError) as e:
        raise RlhfsimError(f"--tokenizer: cannot load a tokenizer from {tokenizer!r} ({str(e).splitlines()[0]})") from None
    return lambda text: len(tok(text, add_special_tokens=False)["input_ids"])


def _parquet_rows(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise RlhfsimError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow), which is not installed") from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises its own error types for a bad file
        raise RlhfsimError(f"{path}: expected a Parquet file, cannot read it ({str(e).splitlines()[0]})") from None


def _jsonl_rows(path: Path) -> list[dict]:
    rows = []
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise RlhfsimError(f"{path}: expected JSONL text, got undecodable bytes") from None
    except OSError as e:
        raise RlhfsimError(f"{path}: cannot read ({e.strerror})") from None
    for i, ln in enumerate(text.splitlines(), 1):
        if not ln.strip():
            continue
        try:
            rec = json.loads(ln)
        except ValueError as e:
            raise RlhfsimError(f"{path}: expected one JSON object per line, got malformed line {i} ({e})") from None
        if not isinstance(rec, dict):
            raise RlhfsimError(f"{path}: expected one JSON object per line, got {type(rec).__name__} on line {i}")
        rows.append(rec)
    return rows


def _csv_rows(path: Path) -> list[dict]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except UnicodeDecodeError:
        raise RlhfsimError(f"{path}: expected CSV text, got undecodable bytes") from None
    except (OSError, csv.Error) as e:
        raise RlhfsimError(f"{path}: cannot read as CSV ({e})") from None


def read_rows(path: Path) -> list[dict]:
    """The records of a CSV, JSONL or Parquet file, or of every such file in a directory (sorted by the
    step number in the file name when there is one, as verl names its dumps)."""
    path = Path(path)
    if path.is_dir():
        files = [p for p in path.iterdir() if p.suffix.lower() in (".jsonl", ".json", ".csv", ".parquet")]
        if not files:
            raise RlhfsimError(f"{path}: expected CSV, JSONL or Parquet files in the directory, found none")
        files.sort(key=lambda p: (int(digits) if (digits := "".join(c for c in p.stem if c.isdigit())) else -1, p.name))
        return [r for p in files for r in read_rows(p)]
    if not path.is_file():
        raise RlhfsimError(f"{path}: expected a rollout log file or directory, found none")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        rows = _parquet_rows(path)
    elif suffix in (".jsonl", ".json", ".ndjson"):
        rows = _jsonl_rows(path)
    elif suffix in (".csv", ".tsv", ".txt"):
        rows = _csv_rows(path)
    else:
        raise RlhfsimError(f"{path}: expected a .csv, .jsonl or .parquet file, got {suffix or 'no suffix'!r}")
    if not rows:
        raise RlhfsimError(f"{path}: expected at least one completion, got none")
    return rows


def _key(rec: dict, names) -> str | None:
    low = {str(k).lower(): k for k in rec}
    return next((low[n] for n in names if n in low), None)


def _int(v, what: str, i: int, path: Path, minimum: int) -> int:
    try:
        n = whole_number(v)
    except ValueError:
        raise RlhfsimError(f"{path}: expected an integer {what} in record {i}, got {v!r}") from None
    if n < minimum:
        raise RlhfsimError(f"{path}: expected {what} >= {minimum} in record {i}, got {n}")
    return n


def _text(v) -> str:
    """Prompt or completion text as logged: a string, or a chat (list of messages) joined by contents."""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return "\n".join(m.get("content", "") if isinstance(m, dict) else str(m) for m in v)
    return "" if v is None else str(v)


def rows_to_trace(rows: list[dict], path: Path, count: Counter | None, group_size: int = 1,
                  prompts_per_step: int | None = None) -> list[TraceRow]:
    """Trace rows from generic records (module docstring: how groups and steps are found)."""
    items = []   # (step, prompt key, prompt id or None, rollout or None, prompt_len, response_len)
    for i, rec in enumerate(rows, 1):
        if set(rec) == {"meta"}:
            continue
        ks = {c: _key(rec, names) for c, names in ALIASES.items()}
        tp, tr = _key(rec, TEXT_PROMPT), _key(rec, TEXT_RESPONSE)
        if ks["response_len"] is not None:
            rl = _int(rec[ks["response_len"]], "response length", i, path, 0)
        elif tr is not None:
            if count is None:
                raise RlhfsimError(f"{path}: record {i} has response text but no token count; pass --tokenizer DIR (or whitespace)")
            rl = count(_text(rec[tr]))
        else:
            raise RlhfsimError(f"{path}: expected a response length ({', '.join(ALIASES['response_len'])}) or text ({', '.join(TEXT_RESPONSE)}) in record {i}, got keys {sorted(map(str, rec))}")
        if ks["prompt_len"] is not None:
            pl = _int(rec[ks["prompt_len"]], "prompt length", i, path, 1)
        elif tp is not None:
            if count is None:
                raise RlhfsimError(f"{path}: record {i} has prompt text but no token count; pass --tokenizer DIR (or whitespace)")
            pl = count(_text(rec[tp]))
        else:
            raise RlhfsimError(f"{path}: expected a prompt length ({', '.join(ALIASES['prompt_len'])}) or text ({', '.join(TEXT_PROMPT)}) in record {i}, got keys {sorted(map(str, rec))}")
        step = _int(rec[ks["step"]], "step", i, path, 0) if ks["step"] is not None else 0
        pid = _int(rec[ks["prompt_id"]], "prompt_id", i, path, 0) if ks["prompt_id"] is not None else None
        rollout = _int(rec[ks["rollout"]], "rollout", i, path, 0) if ks["rollout"] is not None else None
        pkey = _text(rec[tp]) if tp is not None else None
        items.append((step, pkey, pid, rollout, max(pl, 1), max(rl, 1)))
    if not items:
        raise RlhfsimError(f"{path}: expected at least one completion, got none")
    # Group ids where the file has none: consecutive completions of one prompt (text), or group_size rows.
    out: list[TraceRow] = []
    next_pid, prev, run = 0, None, 0
    for step, pkey, pid, rollout, pl, rl in items:
        if pid is None:
            same = prev is not None and prev[0] == step and (pkey == prev[1] if pkey is not None else run < group_size)
            if not same:
                next_pid += 1
                run = 0
            pid = next_pid - 1
        run += 1
        prev = (step, pkey)
        out.append(TraceRow(step, pid, rollout if rollout is not None else -1, pl, rl))
    # Rollout indices in group order where missing.
    seen: dict[tuple[int, int], int] = {}
    fixed = []
    for r in out:
        k = (r.step, r.prompt_id)
        idx = seen.get(k, 0)
        seen[k] = idx + 1
        fixed.append(r if r.rollout >= 0 else TraceRow(r.step, r.prompt_id, idx, r.prompt_len, r.response_len))
    if prompts_per_step:
        fixed = recut_steps(fixed, prompts_per_step)
    return fixed


def recut_steps(rows: list[TraceRow], prompts_per_step: int) -> list[TraceRow]:
    """Renumber steps so that every ``prompts_per_step`` consecutive prompt groups are one step."""
    order: dict[tuple[int, int], int] = {}
    for r in rows:
        order.setdefault((r.step, r.prompt_id), len(order))
    return [TraceRow(order[(r.step, r.prompt_id)] // prompts_per_step, r.prompt_id, r.rollout, r.prompt_len, r.response_len)
            for r in rows]


def import_trl(path: Path, count: Counter | None, group_size: int = 1, prompts_per_step: int | None = None) -> list[TraceRow]:
    """The TRL adapter's completions log, or TRL's own completions Parquet files (module docstring)."""
    rows = read_rows(path)
    if not any("prompt_len" in r or "completion" in r or "prompt" in r for r in rows):
        raise RlhfsimError(f"{path}: expected a TRL completions log (prompt_len/response_len or prompt/completion columns), got keys {sorted(map(str, rows[0]))}")
    return rows_to_trace(rows, Path(path), count, group_size, prompts_per_step)


def import_verl(path: Path, count: Counter | None, group_size: int = 1, prompts_per_step: int | None = None) -> list[TraceRow]:
    """verl rollout dumps: ``input``/``output`` text and ``step`` per line (module docstring)."""
    rows = read_rows(path)
    bad = next((i for i, r in enumerate(rows, 1) if _key(r, TEXT_PROMPT) is None or _key(r, TEXT_RESPONSE) is None), None)
    if bad is not None:
        raise RlhfsimError(f"{path}: expected verl dump records with input and output text, got keys {sorted(map(str, rows[bad - 1]))} in record {bad}")
    return rows_to_trace(rows, Path(path), count, group_size, prompts_per_step)


def import_table(path: Path, count: Counter | None, group_size: int = 1, prompts_per_step: int | None = None) -> list[TraceRow]:
    """Plain CSV/JSONL/Parquet with token counts or text (module docstring)."""
    return rows_to_trace(read_rows(path), Path(path), count, group_size, prompts_per_step)


IMPORTERS = {"trl": import_trl, "verl": import_verl, "table": import_table}


def detect_format(path: Path) -> str:
    """``trl`` for the adapter's log (its meta line) or a ``completions_*.parquet``; ``verl`` for records
    with ``input``/``output``; else ``table``."""
    path = Path(path)
    first = path
    if path.is_dir():
        cands = sorted(p for p in path.iterdir() if p.suffix.lower() in (".jsonl", ".json", ".csv", ".parquet"))
        if not cands:
            raise RlhfsimError(f"{path}: expected CSV, JSONL or Parquet files in the directory, found none")
        first = cands[0]
    if first.suffix.lower() == ".parquet":
        return "trl" if first.name.startswith("completions_") else "table"
    if first.suffix.lower() in (".jsonl", ".json", ".ndjson") and first.is_file():
        try:
            with open(first) as f:
                line = next((ln for ln in f if ln.strip()), "")
            rec = json.loads(line) if line else {}
        except (ValueError, OSError, UnicodeDecodeError):
            return "table"   # the reader reports what is wrong with it
        if isinstance(rec, dict):
            if isinstance(rec.get("meta"), dict) and rec["meta"].get("framework") == "trl":
                return "trl"
            if "input" in rec and "output" in rec:
                return "verl"
    return "table"


def import_lengths(path: Path, fmt: str = "auto", tokenizer: str | None = None, group_size: int = 1,
                   prompts_per_step: int | None = None) -> list[TraceRow]:
    """Trace rows from a rollout log of format ``fmt`` (``auto``: ``detect_format``)."""
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt not in IMPORTERS:
        raise RlhfsimError(f"--format: expected auto or one of {', '.join(IMPORTERS)}, got {fmt!r}")
    return IMPORTERS[fmt](Path(path), token_counter(tokenizer), group_size, prompts_per_step)

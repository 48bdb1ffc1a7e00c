"""Read and check a run directory (``rlhfsim simulate --out``) or a plan directory (``rlhfsim plan --out``).

Plain ``csv``/``json`` plus numpy: no pandas, no plotly, so this module is safe to import anywhere.
Every problem is raised as one ``RlhfsimError`` line naming the file, the line or field, what was
expected and what was given.

Run directory:
  summary.json    {"scenario", "schedule", "steps", "warmup_steps", "step_time_s", "step_time_p50_s",
                   "step_time_p90_s", "phases_s": {phase: s}, "gpu_utilization": {pool: fraction},
                   optional "gpu_busy" (= gpu_utilization) and "gpu_active": {pool: fraction},
                   "tokens_per_s", "profile", "pools": {pool: {"gpus", "roles"}}, "schedule_stats": {...},
                   optional "variants": {name: {"step_time_s", "speedup" (vs sync, or null), "gpu_utilization",
                   optional "gpu_busy", "gpu_active", "phases_s", ...}}}
  steps.csv       step,start_s,end_s,step_time_s,generated_tokens,trained_rollouts,deferred,
                  off_policy_token_frac,chunk_tokens,delta,<phase>_s..., other numeric columns
  intervals.csv   step,pool,gpu,role,phase,start_s,end_s[,active_s]   (one row per busy interval and GPU;
                  active_s: its kernel seconds, <= end_s - start_s; absent in older runs)
  lengths.csv     step,rollout_id,prompt_len,response_len
Plan directory (recognised by plan.json):
  plan.json       {"axes": {path: [values]}, "objective", "best": row, "pareto": [rows],
                   optional "heatmap": {"x": path, "y": path}}
  results.csv     <axis path>...,step_time_s,cost_per_1000_steps,gpus,feasible,reason,<phase>_s...,util_<pool>...
                  [,active_<pool>...]   (util: busy fraction; active: kernel fraction)
All times are seconds of simulated time; fractions are in [0, 1].
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# The columns and names are the shared contracts (rlhfsim.contracts); the report rejects anything else.
from rlhfsim.contracts import (CPU_POOL, INTERVAL_REQUIRED_COLUMNS as INTERVAL_COLUMNS, INTERVALS_FILE, LENGTH_COLUMNS,
                               LENGTHS_FILE, PHASES, PLAN_FILE, RESULTS_FILE, ROLES, STEP_REQUIRED_COLUMNS as STEP_COLUMNS,
                               STEP_REQUIRED_VALUES, STEPS_FILE, SUMMARY_FILE)
from rlhfsim.errors import RlhfsimError

PLAN_METRICS = ("step_time_s", "cost_per_1000_steps", "gpus")
PLAN_INTERVAL = ("step_time_lo_s", "step_time_hi_s")  # optional: the step's 90% interval (plans before it have none)

_SUMMARY_NUMBERS = ("step_time_s", "step_time_p50_s", "step_time_p90_s", "tokens_per_s")
_SUMMARY_INTS = ("steps", "warmup_steps")
_SUMMARY_STRS = ("scenario", "schedule", "profile")
UTILIZATION_EXTRA = ("gpu_busy", "gpu_active")  # optional beside gpu_utilization (runs before they existed)
ACTIVE_SLACK_S = 2e-6  # intervals.csv rounds times to 1 us: active_s may exceed the rounded span by that


@dataclass(frozen=True)
class Intervals:
    """Busy intervals, column-wise (one array entry per row of intervals.csv)."""

    step: np.ndarray      # int64
    pool: np.ndarray      # str (object)
    gpu: np.ndarray       # int64, index within the pool
    role: np.ndarray      # str (object)
    phase: np.ndarray     # str (object)
    start_s: np.ndarray   # float64
    end_s: np.ndarray     # float64
    active_s: np.ndarray | None = None  # float64, kernel seconds of each interval; None: not recorded

    def __len__(self) -> int:
        return len(self.step)


@dataclass(frozen=True)
class RunRecords:
    """Everything in a run directory, checked: summary as a dict, CSVs as name -> numpy column."""

    path: Path
    summary: dict
    steps: dict[str, np.ndarray]      # STEP_COLUMNS plus "<phase>_s"; empty cells are NaN
    step_phases: tuple[str, ...]      # phases that have a "<phase>_s" column, in PHASES order
    intervals: Intervals
    lengths: dict[str, np.ndarray]    # LENGTH_COLUMNS, int64


@dataclass(frozen=True)
class PlanRecords:
    """A plan directory: plan.json and results.csv rows with typed values."""

    path: Path
    plan: dict
    axes: tuple[str, ...]             # axis paths, in plan.json order
    rows: list[dict]                  # axis values as axis_key(), metrics float (NaN if empty), feasible bool
    phase_columns: tuple[str, ...]    # "<phase>_s" columns present
    util_columns: tuple[str, ...]     # "util_<pool>" (busy) and "active_<pool>" columns present


def is_plan_dir(path: Path) -> bool:
    return (Path(path) / PLAN_FILE).is_file()


def _fail(where: str, message: str) -> RlhfsimError:
    return RlhfsimError(f"{where}: {message}")


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise _fail(str(path.parent), f"not a run or plan directory: expected {path.name}, found none")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _fail(str(path), f"expected JSON, got a parse error ({exc})") from None
    if not isinstance(doc, dict):
        raise _fail(str(path), f"expected a JSON object, got {type(doc).__name__}")
    return doc


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_number_map(doc: dict, key: str, where: str, keys_from: tuple[str, ...] | None = None) -> None:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise _fail(where, f"field '{key}': expected an object, got {value!r}"[:300])
    for name, number in value.items():
        if keys_from is not None and name not in keys_from:
            raise _fail(where, f"field '{key}.{name}': expected a key in {list(keys_from)}, got {name!r}")
        if not _is_number(number) or number < 0:
            raise _fail(where, f"field '{key}.{name}': expected a non-negative number, got {number!r}")


def check_summary(doc: dict, where: str) -> dict:
    """Check summary.json's fields and types; return it unchanged."""
    for key in _SUMMARY_STRS:
        if not isinstance(doc.get(key), str):
            raise _fail(where, f"field '{key}': expected a string, got {doc.get(key)!r}")
    for key in _SUMMARY_INTS:
        value = doc.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _fail(where, f"field '{key}': expected a non-negative integer, got {value!r}")
    for key in _SUMMARY_NUMBERS:
        if not _is_number(doc.get(key)) or doc[key] < 0:
            raise _fail(where, f"field '{key}': expected a non-negative number, got {doc.get(key)!r}")
    pools = doc.get("pools")
    if not isinstance(pools, dict) or not pools:
        raise _fail(where, f"field 'pools': expected a non-empty object, got {pools!r}"[:300])
    for name, pool in pools.items():
        if not isinstance(pool, dict):
            raise _fail(where, f"field 'pools.{name}': expected an object, got {pool!r}")
        gpus = pool.get("gpus")
        if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
            raise _fail(where, f"field 'pools.{name}.gpus': expected a positive integer, got {gpus!r}")
        roles = pool.get("roles")
        if not isinstance(roles, list) or any(r not in ROLES for r in roles):
            raise _fail(where, f"field 'pools.{name}.roles': expected a list drawn from {list(ROLES)}, got {roles!r}")
    _check_number_map(doc, "phases_s", where, PHASES)
    for key in ("gpu_utilization", *(k for k in UTILIZATION_EXTRA if k in doc)):
        _check_number_map(doc, key, where, tuple(pools))
    if not isinstance(doc.get("schedule_stats"), dict):
        raise _fail(where, f"field 'schedule_stats': expected an object, got {doc.get('schedule_stats')!r}")
    variants = doc.get("variants")
    if variants is not None:
        if not isinstance(variants, dict):
            raise _fail(where, f"field 'variants': expected an object, got {variants!r}"[:300])
        for name, variant in variants.items():
            vwhere = f"{where}: field 'variants.{name}'"
            if not isinstance(variant, dict):
                raise RlhfsimError(f"{vwhere}: expected an object, got {variant!r}")
            if not _is_number(variant.get("step_time_s")) or variant["step_time_s"] < 0:
                raise RlhfsimError(f"{vwhere}.step_time_s: expected a non-negative number, got {variant.get('step_time_s')!r}")
            # speedup is relative to the "sync" variant, so null when sync was not compared.
            if variant.get("speedup") is not None and not (_is_number(variant["speedup"]) and variant["speedup"] >= 0):
                raise RlhfsimError(f"{vwhere}.speedup: expected a non-negative number or null, got {variant['speedup']!r}")
            for key in ("gpu_utilization", *(k for k in UTILIZATION_EXTRA if k in variant)):
                _check_number_map(variant, key, f"{where}: variant '{name}'")
            _check_number_map(variant, "phases_s", f"{where}: variant '{name}'", PHASES)
    return doc


def _read_csv(path: Path, required: tuple[str, ...]) -> tuple[list[str], list[list[str]]]:
    if not path.is_file():
        raise _fail(str(path.parent), f"expected {path.name} in the run directory, found none")
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise _fail(str(path), "expected a header line, got an empty file")
        header = [h.strip() for h in header]
        missing = [c for c in required if c not in header]
        if missing:
            raise _fail(str(path), f"expected column(s) {', '.join(missing)}; header has {', '.join(header)}")
        rows = [row for row in reader if row]
    for i, row in enumerate(rows):
        if len(row) != len(header):
            raise _fail(f"{path}:{i + 2}", f"expected {len(header)} fields, got {len(row)}")
    return header, rows


def _column(path: Path, header: list[str], rows: list[list[str]], name: str, kind: str,
            allow_empty: bool = False) -> np.ndarray:
    """Parse one column: kind "int", "float" (finite, or NaN where empty is allowed) or "str"."""
    j = header.index(name)
    if kind == "str":
        return np.array([row[j].strip() for row in rows], dtype=object)
    raw = [row[j] for row in rows]
    try:  # fast path: numpy parses the whole column (surrounding blanks allowed)
        values = np.array(raw, dtype=np.float64)
        ok = np.isfinite(values) & ((values == np.round(values)) if kind == "int" else True)
        if ok.all():
            return values.astype(np.int64) if kind == "int" else values
    except ValueError:
        pass
    out = np.empty(len(raw), dtype=np.int64 if kind == "int" else np.float64)
    for i, text in enumerate(raw):
        text = text.strip()
        if text == "" and allow_empty:
            out[i] = np.nan
            continue
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or (kind == "int" and value != int(value)):
            expected = "an integer" if kind == "int" else "a number"
            raise _fail(f"{path}:{i + 2}", f"column '{name}': expected {expected}, got {text!r}")
        out[i] = value
    return out


def _first_bad(mask: np.ndarray) -> int | None:
    bad = np.flatnonzero(mask)
    return int(bad[0]) if bad.size else None


def load_steps(path: Path) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """steps.csv: STEP_COLUMNS, "<phase>_s" columns, and any further numeric columns (e.g. staleness),
    all as float arrays; empty cells are NaN except in STEP_REQUIRED_VALUES."""
    header, rows = _read_csv(path, STEP_COLUMNS)
    extra = [c for c in header if c not in STEP_COLUMNS]
    steps = {name: _column(path, header, rows, name, "float", allow_empty=name not in STEP_REQUIRED_VALUES)
             for name in (*STEP_COLUMNS, *extra)}
    bad = _first_bad(steps["end_s"] < steps["start_s"])
    if bad is not None:
        raise _fail(f"{path}:{bad + 2}", f"expected end_s >= start_s, got {steps['end_s'][bad]} < {steps['start_s'][bad]}")
    phases = tuple(p for p in PHASES if f"{p}_s" in extra)
    return steps, phases


def load_intervals(path: Path, pools: dict) -> Intervals:
    """intervals.csv; rows of the CPU pseudo-pool (``CPU_POOL``, when no real pool has that name) are left
    out: they occupy no GPU (their phases still show in steps.csv and summary.json)."""
    header, rows = _read_csv(path, INTERVAL_COLUMNS)
    if CPU_POOL not in pools:
        col = header.index("pool")
        rows = [r for r in rows if r[col].strip() != CPU_POOL]
    iv = Intervals(
        step=_column(path, header, rows, "step", "int"),
        pool=_column(path, header, rows, "pool", "str"),
        gpu=_column(path, header, rows, "gpu", "int"),
        role=_column(path, header, rows, "role", "str"),
        phase=_column(path, header, rows, "phase", "str"),
        start_s=_column(path, header, rows, "start_s", "float"),
        end_s=_column(path, header, rows, "end_s", "float"),
        active_s=_column(path, header, rows, "active_s", "float") if "active_s" in header else None,
    )
    for name, allowed in (("pool", tuple(pools)), ("role", ROLES), ("phase", PHASES)):
        values = getattr(iv, name)
        bad = _first_bad(~np.isin(values, np.array(allowed, dtype=object)))
        if bad is not None:
            raise _fail(f"{path}:{bad + 2}", f"column '{name}': expected one of {list(allowed)}, got {values[bad]!r}")
    gpus = np.array([pools[p]["gpus"] for p in iv.pool], dtype=np.int64)
    bad = _first_bad((iv.gpu < 0) | (iv.gpu >= gpus))
    if bad is not None:
        raise _fail(f"{path}:{bad + 2}", f"column 'gpu': expected 0..{gpus[bad] - 1} for pool "
                    f"{iv.pool[bad]!r} (summary.json pools), got {iv.gpu[bad]}")
    bad = _first_bad((iv.end_s < iv.start_s) | (iv.start_s < 0))
    if bad is not None:
        raise _fail(f"{path}:{bad + 2}", f"expected 0 <= start_s <= end_s, got start_s={iv.start_s[bad]}, end_s={iv.end_s[bad]}")
    if iv.active_s is not None:
        bad = _first_bad((iv.active_s < 0) | (iv.active_s > iv.end_s - iv.start_s + ACTIVE_SLACK_S))
        if bad is not None:
            raise _fail(f"{path}:{bad + 2}", f"column 'active_s': expected 0 <= active_s <= end_s - start_s, "
                        f"got active_s={iv.active_s[bad]} for end_s - start_s={iv.end_s[bad] - iv.start_s[bad]}")
    return iv


def load_lengths(path: Path) -> dict[str, np.ndarray]:
    header, rows = _read_csv(path, LENGTH_COLUMNS)
    lengths = {name: _column(path, header, rows, name, "int") for name in LENGTH_COLUMNS}
    for name in ("prompt_len", "response_len"):
        bad = _first_bad(lengths[name] < 0)
        if bad is not None:
            raise _fail(f"{path}:{bad + 2}", f"column '{name}': expected a non-negative length, got {lengths[name][bad]}")
    return lengths


def load_run(run_dir: Path) -> RunRecords:
    """Read and check a run directory written by ``rlhfsim simulate --out``."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise _fail(str(run_dir), "expected a run directory (from `rlhfsim simulate --out`), found none")
    summary = check_summary(_read_json(run_dir / SUMMARY_FILE), str(run_dir / SUMMARY_FILE))
    steps, step_phases = load_steps(run_dir / STEPS_FILE)
    return RunRecords(
        path=run_dir,
        summary=summary,
        steps=steps,
        step_phases=step_phases,
        intervals=load_intervals(run_dir / INTERVALS_FILE, summary["pools"]),
        lengths=load_lengths(run_dir / LENGTHS_FILE),
    )


def axis_key(value) -> float | str:
    """One comparable form for an axis value from plan.json (JSON) or results.csv (text):
    numbers -> float, booleans -> "true"/"false", other strings as written, anything else -> JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        return json.dumps(value, sort_keys=True)
    try:
        number = float(value)
    except ValueError:
        return value.lower() if value.lower() in ("true", "false") else value
    return number if math.isfinite(number) else value


def axis_label(key: float | str) -> str:
    """Display form of an axis_key: 8.0 -> "8", 0.5 -> "0.5"."""
    if isinstance(key, float):
        return str(int(key)) if key.is_integer() and abs(key) < 1e15 else f"{key:g}"
    return key


def _feasible(text: str, where: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise _fail(where, f"column 'feasible': expected true or false, got {text!r}")


def load_plan(plan_dir: Path) -> PlanRecords:
    """Read and check a plan directory written by ``rlhfsim plan --out``."""
    plan_dir = Path(plan_dir)
    where = str(plan_dir / PLAN_FILE)
    plan = _read_json(plan_dir / PLAN_FILE)
    axes = plan.get("axes")
    if not isinstance(axes, dict) or not axes or not all(isinstance(v, list) for v in axes.values()):
        raise _fail(where, f"field 'axes': expected an object of path -> [values], got {axes!r}"[:300])
    pareto = plan.get("pareto")
    if not isinstance(pareto, list) or not all(isinstance(r, dict) for r in pareto):
        raise _fail(where, f"field 'pareto': expected a list of rows, got {pareto!r}"[:300])
    if plan.get("best") is not None and not isinstance(plan["best"], dict):
        raise _fail(where, f"field 'best': expected a row object or null, got {plan['best']!r}"[:300])
    heatmap = plan.get("heatmap")
    if heatmap is not None:
        if not isinstance(heatmap, dict) or any(heatmap.get(k) not in axes for k in ("x", "y")):
            raise _fail(where, f"field 'heatmap': expected {{\"x\": axis, \"y\": axis}} with axes from "
                        f"{list(axes)}, got {heatmap!r}")
    path = plan_dir / RESULTS_FILE
    header, raw_rows = _read_csv(path, (*axes, *PLAN_METRICS, "feasible", "reason"))
    phase_columns = tuple(f"{p}_s" for p in PHASES if f"{p}_s" in header)
    util_columns = tuple(c for c in header if c.startswith(("util_", "active_")))
    numeric = (*PLAN_METRICS, *(c for c in PLAN_INTERVAL if c in header), *phase_columns, *util_columns)
    rows = []
    for i, raw in enumerate(raw_rows):
        line = f"{path}:{i + 2}"
        cells = dict(zip(header, (c.strip() for c in raw)))
        feasible = _feasible(cells["feasible"], line)
        row: dict = {axis: axis_key(cells[axis]) for axis in axes}
        for name in numeric:
            text = cells[name]
            try:
                value = float(text) if text != "" else math.nan
            except ValueError:
                raise _fail(line, f"column '{name}': expected a number, got {text!r}") from None
            # An infeasible configuration has no step time or cost; a feasible one must have them.
            if feasible and name in PLAN_METRICS and not (math.isfinite(value) and value >= 0):
                raise _fail(line, f"column '{name}': expected a non-negative number for a feasible row, got {text!r}")
            row[name] = value
        row["feasible"] = feasible
        row["reason"] = cells["reason"]
        rows.append(row)
    return PlanRecords(path=plan_dir, plan=plan, axes=tuple(axes), rows=rows,
                       phase_columns=phase_columns, util_columns=util_columns)

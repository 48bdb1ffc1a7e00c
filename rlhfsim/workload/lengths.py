"""Sampling token lengths from the scenario's distributions.

Every distribution is sampled with the simulation's own ``numpy.random.Generator`` and clipped to
[1, cap] tokens (rounded to integers):

- ``fixed``: always ``value``.
- ``normal``: N(mean, std).
- ``lognormal``: given median m and 99th percentile q, ln L ~ N(mu, sigma) with mu = ln m and
  sigma = (ln q - ln m) / z_0.99, z_0.99 = 2.3263. Long-tailed like real RL rollouts.
- ``pareto``: classical Pareto with scale x_m and shape alpha: L = x_m x (1 - U)^(-1/alpha).
- ``empirical``: uniform resampling (with replacement) of observed lengths read from a CSV (first numeric
  column, or a column named ``length``/``response_length``/``tokens``) or JSONL (``{"length": n}`` per line
  or bare numbers).
- ``mixture``: pick a component by weight, then sample it.
- ``trace``: a real run's rollouts replayed one for one with their prompt lengths
  (``rlhfsim.workload.trace``; the pairing reaches the rollout stream through ``Setup.trace``); sampled
  as a distribution, its response lengths are resampled uniformly like ``empirical``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Callable

import numpy as np

from rlhfsim.errors import ScenarioError

Z99 = 2.3263478740408408
LENGTH_COLUMNS = ("length", "response_length", "response_len", "tokens", "num_tokens")


def read_lengths_file(path: Path, yaml_path: str) -> np.ndarray:
    """Observed lengths from CSV or JSONL. Every failure is a ScenarioError naming ``yaml_path``."""
    if not path.is_file():
        raise ScenarioError(yaml_path, f"expected a CSV or JSONL file of lengths, got {str(path)!r} (no such file)")
    try:
        text = path.read_text()
    except OSError as e:
        raise ScenarioError(yaml_path, f"expected a readable lengths file, got {str(path)!r} ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ScenarioError(yaml_path, f"expected a CSV or JSONL text file of lengths, got {str(path)!r} (not UTF-8 text)") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ScenarioError(yaml_path, f"expected at least one length, got an empty file {str(path)!r}")
    values: list[float] = []
    try:
        if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
            for i, ln in enumerate(lines, 1):
                rec = json.loads(ln)
                if isinstance(rec, dict):
                    key = next((k for k in LENGTH_COLUMNS if k in rec), None)
                    if key is None:
                        raise ValueError(f"line {i} has none of the keys {', '.join(LENGTH_COLUMNS)}")
                    rec = rec[key]
                values.append(float(rec))
        else:
            rows = list(csv.reader(lines))
            header = [c.strip().lower() for c in rows[0]]
            col, start = 0, 0
            if not _is_number(rows[0][0] if rows[0] else ""):
                start = 1
                col = next((header.index(k) for k in LENGTH_COLUMNS if k in header), 0)
            for i, row in enumerate(rows[start:], start + 1):
                if len(row) <= col or not _is_number(row[col]):
                    raise ValueError(f"line {i}: {row!r} is not a number in column {col + 1}")
                values.append(float(row[col]))
    except (ValueError, TypeError) as e:  # json.JSONDecodeError is a ValueError; TypeError: null, lists
        raise ScenarioError(yaml_path, f"expected one positive length per line, got malformed {str(path)!r} ({e})") from None
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise ScenarioError(yaml_path, f"expected at least one length, got none in {str(path)!r}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 1):
        raise ScenarioError(yaml_path, f"expected lengths >= 1, got {float(arr[~(np.isfinite(arr) & (arr >= 1))][0])!r} in {str(path)!r}")
    return np.rint(arr).astype(np.int64)


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


Sampler = Callable[[np.random.Generator, int], np.ndarray]


def sampler_for(dist, cap: int, base_dir: Path | None = None, yaml_path: str = "") -> Sampler:
    """A function (rng, n) -> int64 array of n lengths in [1, cap] for a distribution config."""
    raw = _raw_sampler(dist, base_dir, yaml_path)

    def sample(rng: np.random.Generator, n: int) -> np.ndarray:
        return np.clip(np.rint(raw(rng, n)), 1, cap).astype(np.int64)

    return sample


def _raw_sampler(d, base_dir: Path | None, yaml_path: str) -> Sampler:
    kind = d.kind
    if kind == "fixed":
        return lambda rng, n: np.full(n, float(d.value))
    if kind == "normal":
        return lambda rng, n: rng.normal(d.mean, d.std, n)
    if kind == "lognormal":
        mu = np.log(d.median)
        sigma = (np.log(d.p99) - mu) / Z99
        return lambda rng, n: rng.lognormal(mu, sigma, n)
    if kind == "pareto":
        return lambda rng, n: d.scale * (1.0 - rng.random(n)) ** (-1.0 / d.alpha)
    if kind == "empirical":
        p = Path(d.path)
        if not p.is_absolute() and base_dir is not None:
            p = base_dir / p
        data = read_lengths_file(p, f"{yaml_path}.path")
        return lambda rng, n: data[rng.integers(0, data.size, n)].astype(np.float64)
    if kind == "trace":
        from rlhfsim.workload.trace import read_trace, resolve

        rows = read_trace(resolve(d.path, base_dir), f"{yaml_path}.path")
        data = np.array([r.response_len for r in rows], dtype=np.float64)
        return lambda rng, n: data[rng.integers(0, data.size, n)]
    if kind == "mixture":
        for i, c in enumerate(d.components):
            if c.dist.kind == "trace":
                raise ScenarioError(f"{yaml_path}.components[{i}].dist.kind", "expected a distribution, got trace (a trace replays whole rollouts; use it as workload.response_length itself)")
        subs = [_raw_sampler(c.dist, base_dir, f"{yaml_path}.components[{i}].dist") for i, c in enumerate(d.components)]
        w = np.array([c.weight for c in d.components], dtype=np.float64)
        if not np.isfinite(w.sum()):  # weights near the float limit (1e308) overflow their sum: rescale first
            w = w / w.max()
        w = w / w.sum()

        def mix(rng: np.random.Generator, n: int) -> np.ndarray:
            which = rng.choice(len(subs), size=n, p=w)
            out = np.empty(n)
            for i, s in enumerate(subs):
                idx = np.nonzero(which == i)[0]
                if idx.size:
                    out[idx] = s(rng, idx.size)
            return out

        return mix
    raise ScenarioError(yaml_path, f"unknown distribution kind {kind!r}")


def trace_for(workload, group_size: int, base_dir: Path | None, yaml_path: str = "workload") -> list[tuple[int, int]] | None:
    """The replayed (prompt_len, response_len) rollouts of a ``trace`` response-length source, checked
    against the group structure (``rlhfsim.workload.trace.trace_rollouts``); None for any other source."""
    d = workload.response_length
    if workload.prompt_length.kind == "trace":
        raise ScenarioError(f"{yaml_path}.prompt_length.kind", "expected a distribution, got trace (a trace carries its prompt lengths: put it in workload.response_length)")
    if d.kind != "trace":
        return None
    from rlhfsim.workload.trace import read_trace, resolve, trace_rollouts

    where = f"{yaml_path}.response_length.path"
    p = resolve(d.path, base_dir)
    return trace_rollouts(read_trace(p, where), group_size, workload.prompts_per_step, workload.max_prompt_tokens,
                          workload.max_response_tokens, p, where)

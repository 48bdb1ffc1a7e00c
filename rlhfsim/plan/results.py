"""Rows of a plan: one per configuration, written to ``results.csv`` as they arrive; the Pareto front of
step time against cost; the best configuration for the objective and what dominates its step.

Cost of a configuration (dollars per 1,000 steps), paying for every GPU of the cluster:

    cost_per_1000_steps = step_time_s x 1000 / 3600 x gpus x price_per_gpu_hour[gpu_type]

A configuration A dominates B when A's step time and cost are both <= B's and one is strictly lower;
the Pareto front is the feasible configurations no other one dominates (equal points are all kept).

``step_time_lo_s``, ``step_time_hi_s``: the 90% interval of the step where the profile is a GPU's (the model's own
error, analytic: ``rlhfsim.sim.uncertainty.point_interval``); empty on a CPU or with ``--no-uncertainty``. The
front and the best configuration are chosen on the point prediction: every configuration carries the same
record, so the interval says how far to trust a step time, not which configuration wins.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Optional

from rlhfsim.contracts import PHASE_COLUMNS, PHASE_DESCRIPTIONS, PHASES
from rlhfsim.errors import RlhfsimError
from rlhfsim.files import write_atomic
from rlhfsim.hardware.catalog import GPUS
from rlhfsim.plan.spec import OBJECTIVES, Config, Plan

METRICS = ("step_time_s", "step_time_lo_s", "step_time_hi_s", "cost_per_1000_steps", "gpus", "gpu_type",
           "step_time_p90_s", "tokens_per_s", "off_policy_token_frac")
NUMERIC = ("step_time_s", "step_time_lo_s", "step_time_hi_s", "cost_per_1000_steps", "step_time_p90_s",
           "tokens_per_s", "off_policy_token_frac")


def util_columns(plan: Plan) -> list[str]:
    """Per pool, ``util_<pool>`` (busy: work assigned) and beside it ``active_<pool>`` (kernels executing),
    both fractions of the pool's GPU-time (``rlhfsim.sim.simulation.summarize``)."""
    return [c for p in plan.pools for c in (f"util_{p}", f"active_{p}")]


def columns(plan: Plan) -> list[str]:
    """A parallelism search's rows also say how each was priced (``method``: rlhfsim.plan.fastpath) and which is the
    base scenario's own parallelism (``base``)."""
    extra = ["method", "base"] if plan.search is not None else []
    return ["config", *plan.axes, "feasible", "reason", *extra, *METRICS, *PHASE_COLUMNS, *util_columns(plan)]


def price_of(plan: Plan, gpu_type: str) -> float:
    return plan.prices.get(gpu_type, GPUS[gpu_type].price_per_hour)


def make_row(plan: Plan, cfg: Config, metrics: Optional[dict], reason: str = "", method: Optional[str] = None) -> dict:
    """A typed row: axis values as written in the plan, metrics as floats (None where there are none).
    ``metrics`` is what ``rlhfsim.plan.backends.run_one`` returns for a feasible configuration; ``method``: how a
    parallelism search's row was priced."""
    row: dict[str, Any] = {"config": cfg.id, **cfg.values}
    ok = metrics is not None and not reason and not cfg.reason
    row["feasible"] = ok
    row["reason"] = "" if ok else (cfg.reason or reason)
    if plan.search is not None:
        # pruned: by the search's memory estimate; refused: by the scenario checks or the simulator
        # screened: left out by search.parallelism.refine (not simulated)
        row["method"] = method if ok or method == "screened" else "pruned" if cfg.reason.startswith("memory:") else "refused"
        row["base"] = cfg.base
    row["gpus"], row["gpu_type"] = cfg.gpus, cfg.gpu_type
    for c in (*NUMERIC, *PHASE_COLUMNS, *util_columns(plan)):
        row[c] = None
    if ok:
        step = metrics["step_time_s"]
        row["step_time_s"] = step
        row["cost_per_1000_steps"] = step * 1000.0 / 3600.0 * cfg.gpus * price_of(plan, cfg.gpu_type)
        for k in ("step_time_p90_s", "tokens_per_s", "off_policy_token_frac"):
            row[k] = metrics[k]
        if metrics.get("step_time_interval_s"):   # the 90% interval of the step (rlhfsim.sim.uncertainty)
            row["step_time_lo_s"], row["step_time_hi_s"] = metrics["step_time_interval_s"]
        for ph, v in metrics["phases_s"].items():
            row[f"{ph}_s"] = v
        for pool, u in metrics["utilization"].items():
            row[f"util_{pool}"] = u
        for pool, u in metrics["active"].items():
            row[f"active_{pool}"] = u
    return row


def cell(value: Any) -> str:
    """CSV text of a value; mappings and lists as sorted JSON (what the report's axis_key expects)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def parse_row(plan: Plan, cfg: Config, cells: dict[str, str]) -> dict:
    """A typed row back from results.csv text (for --resume); axis values come from the plan."""
    row: dict[str, Any] = {"config": cfg.id, **cfg.values}
    row["feasible"] = cells["feasible"] == "true"
    row["reason"] = cells["reason"]
    if plan.search is not None:
        row["method"], row["base"] = cells["method"], cfg.base
    row["gpus"], row["gpu_type"] = int(cells["gpus"]), cells["gpu_type"]
    for c in (*NUMERIC, *PHASE_COLUMNS, *util_columns(plan)):
        text = cells.get(c, "")
        row[c] = float(text) if text != "" else None
    return row


class ResultsFile:
    """``results.csv`` in the plan directory: rows appended and flushed one by one as they arrive, so an
    interrupted sweep keeps what it finished; ``finish`` rewrites it in configuration order."""

    def __init__(self, path: Path, header: list[str], resume: bool):
        self.path = Path(path)
        self.header = header
        self.done: dict[str, dict[str, str]] = {}
        if resume and self.path.is_file():
            self.done = self._read()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not (resume and self.path.is_file())
        self.f = open(self.path, "w" if fresh else "a", newline="")
        self.w = csv.writer(self.f)
        if fresh:
            self.w.writerow(header)
            self.f.flush()

    def _read(self) -> dict[str, dict[str, str]]:
        with open(self.path, newline="") as f:
            rows = list(csv.reader(f))
        if not rows:
            return {}
        if rows[0] != self.header:
            raise RlhfsimError(f"{self.path}: expected the columns of this plan to resume "
                               f"({', '.join(self.header)}), got {', '.join(rows[0])}; use another --out")
        done = {}
        for r in rows[1:]:
            if len(r) == len(self.header):  # a line cut short by an interruption is run again
                done[r[0]] = dict(zip(self.header, r))
        return done

    def append(self, row: dict) -> None:
        self.w.writerow([cell(row[c]) for c in self.header])
        self.f.flush()

    def close(self) -> None:
        if not self.f.closed:
            self.f.close()

    def finish(self, rows: list[dict]) -> None:
        """Rewrite the file with ``rows`` (in configuration order), atomically."""
        self.close()
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(self.header)
        for row in rows:
            w.writerow([cell(row[c]) for c in self.header])
        write_atomic(self.path, buf.getvalue())


def pareto_front(rows: list[dict]) -> list[dict]:
    """Feasible rows not dominated in (step_time_s, cost_per_1000_steps), by increasing step time."""
    pts = sorted((r for r in rows if r["feasible"]), key=lambda r: (r["step_time_s"], r["cost_per_1000_steps"]))
    front: list[dict] = []
    min_cost = math.inf
    for r in pts:
        t, c = r["step_time_s"], r["cost_per_1000_steps"]
        if c < min_cost:
            front.append(r)
            min_cost = c
        elif front and (t, c) == (front[-1]["step_time_s"], front[-1]["cost_per_1000_steps"]):
            front.append(r)  # equal points dominate neither each other
    return front


def pick_best(rows: list[dict], objective: str, max_step_time_s: Optional[float]) -> Optional[dict]:
    """The feasible row (under the step-time bound, if any) minimizing the objective; ties go to the
    faster, then the cheaper, then the earlier configuration."""
    ok = [(i, r) for i, r in enumerate(rows) if r["feasible"]
          and (max_step_time_s is None or r["step_time_s"] <= max_step_time_s)]
    if not ok:
        return None
    metric = OBJECTIVES[objective]
    _, best = min(ok, key=lambda ir: (ir[1][metric], ir[1]["step_time_s"], ir[1]["cost_per_1000_steps"], ir[0]))
    return best


_WHY = {
    "generate": "decoding is memory-bound and the longest responses hold the rollout pool",
    "retokenize": "re-tokenizing responses for a reward model of another tokenizer holds the driver's CPU",
    "reward": "the reward model cannot keep up: give it more GPUs or a faster scoring runtime",
    "reference": "the reference forward pass over every rollout follows generation",
    "old_log_prob": "the actor recomputes log-probs over every rollout before training",
    "critic_fwd": "the critic forward pass over every rollout follows generation",
    "adv": "advantages are computed on the driver while the GPUs wait",
    "actor_train": "actor training is compute-bound: more or faster GPUs shorten it",
    "critic_train": "critic training is compute-bound: more or faster GPUs shorten it",
    "weight_sync": "copying the actor's weights to the generation engine is the bottleneck",
}
_NAMES = PHASE_DESCRIPTIONS


def explain(row: dict) -> str:
    """One sentence on what dominates the step of a feasible row (phase spans may overlap)."""
    step = row["step_time_s"]
    spans = {p: row[f"{p}_s"] for p in PHASES if row.get(f"{p}_s") is not None}
    if not spans or not step:
        return "no phase breakdown"
    top = max(spans, key=spans.get)
    share = min(spans[top] / step, 1.0)
    text = f"{_NAMES[top]} spans {100 * share:.0f}% of the step; {_WHY[top]}"
    if top == "generate" and spans.get("reward", 0) > 0.5 * step:
        text += f" (reward scoring, overlapped with it, spans {100 * spans['reward'] / step:.0f}%)"
    utils = {k[5:]: v for k, v in row.items() if k.startswith("util_") and v is not None}
    if utils:
        text += "; busy: " + ", ".join(f"{p} {100 * u:.0f}%" for p, u in utils.items())
    active = {k[7:]: v for k, v in row.items() if k.startswith("active_") and v is not None}
    if active:
        text += "; active: " + ", ".join(f"{p} {100 * u:.0f}%" for p, u in active.items())
    return text + "."


def model_errors(profiles: dict[str, dict]) -> dict:
    """GPU type -> the model error its rows' intervals carry (``rlhfsim.sim.uncertainty.model_error``; None on a
    CPU), read once here and sent to the workers. The interval is the analytic part of ``simulate``'s: an overlay's
    fitted terms are not drawn and re-simulated per configuration (its misfit is carried), which would multiply
    the sweep's cost by the draws."""
    from rlhfsim.hardware.catalog import get_gpu
    from rlhfsim.sim.uncertainty import model_error

    return {g: model_error(p, get_gpu(g)) for g, p in profiles.items()}

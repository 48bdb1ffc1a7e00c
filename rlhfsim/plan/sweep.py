"""Running a plan: configurations known to be infeasible are written at once, the others are simulated
on a backend (identical scenarios only once) and written to ``results.csv`` as they arrive; at the end
``results.csv`` is rewritten in configuration order and ``plan.json`` holds the Pareto front, the best
configuration and the heatmap axes (the files ``rlhfsim report`` reads)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from rlhfsim.contracts import PLAN_FILE, RESULTS_FILE
from rlhfsim.errors import RlhfsimError
from rlhfsim.files import write_json_atomic
from rlhfsim.plan.backends import chunked, default_workers
from rlhfsim.plan.results import (ResultsFile, columns, explain, make_row, model_errors, pareto_front, parse_row,
                                  pick_best, price_of)
from rlhfsim.plan.spec import OBJECTIVES, Plan


@dataclass
class Outcome:
    """A finished sweep: every row in configuration order, the Pareto front and the best row."""

    plan: Plan
    out: Path
    rows: list[dict]
    pareto: list[dict]
    best: Optional[dict]
    wall_s: float
    simulated: int      # distinct scenarios simulated by this run
    resumed: int        # configurations skipped because results.csv had them
    shared: int = 0     # a parallelism search's configurations priced on a shared generation (rlhfsim.plan.fastpath)
    generations: int = 0   # the generations simulated for them (fastpath.share)
    compare: Optional[dict] = None   # a parallelism search: the base scenario's parallelism against the best, by term

    @property
    def feasible(self) -> int:
        return sum(r["feasible"] for r in self.rows)

    def summary(self) -> dict:
        """What ``rlhfsim plan --format json`` prints."""
        return {"configs": len(self.rows), "feasible": self.feasible, "best": self.best, "pareto": self.pareto,
                "objective": self.plan.objective, "max_step_time_s": self.plan.max_step_time_s,
                "out": str(self.out), "wall_s": self.wall_s, "simulated": self.simulated, "resumed": self.resumed,
                **({"shared_generation": self.shared, "compare": self.compare} if self.plan.search is not None else {})}


def default_out(plan: Plan) -> Path:
    return Path("runs") / f"plan-{plan.name}"


def run_plan(plan: Plan, *, backend: str = "local", workers: Optional[int] = None, address: Optional[str] = None,
             out: Optional[Path] = None, resume: bool = False,
             progress: Optional[Callable[[int, int], None]] = None, uncertainty: bool = True) -> Outcome:
    """Run every configuration of ``plan`` not already in ``out/results.csv`` (with ``resume``).
    ``progress(done, total)`` is called as configurations finish. ``uncertainty``: each row on a GPU carries the
    90% interval of its step (``model_errors``)."""
    from rlhfsim.plan import BACKENDS

    if backend not in BACKENDS:
        raise RlhfsimError(f"--backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    t0 = time.perf_counter()
    out = Path(out) if out is not None else default_out(plan)
    workers = workers or default_workers()
    results = ResultsFile(out / RESULTS_FILE, columns(plan), resume)
    (out / PLAN_FILE).unlink(missing_ok=True)  # written again at the end; never stale next to new rows
    rows: dict[int, dict] = {}
    try:
        todo = []
        for cfg in plan.configs:
            if cfg.id in results.done:
                rows[cfg.index] = parse_row(plan, cfg, results.done[cfg.id])
            else:
                todo.append(cfg)
        resumed = len(rows)
        total, finished = len(todo), 0
        shared = generations = 0
        if plan.search is not None:   # the fast path first; what it cannot take is simulated below
            from rlhfsim.plan.shared import run_shared

            todo, shared, screened, generations = run_shared(plan, todo, rows, results, uncertainty, workers)
            finished = shared + screened
        groups: dict[str, list] = {}
        for cfg in todo:
            if cfg.doc is None:
                rows[cfg.index] = make_row(plan, cfg, None)
                results.append(rows[cfg.index])
                finished += 1
            else:
                groups.setdefault(json.dumps(cfg.doc, sort_keys=True), []).append(cfg)
        members = list(groups.values())
        tasks = [(k, m[0].doc, str(plan.base_dir), m[0].gpu_type) for k, m in enumerate(members)]
        profiles = {g: plan.profiles[g] for g in {t[3] for t in tasks}}
        errors = model_errors(profiles) if uncertainty else None
        chunks = chunked(tasks, workers)
        if not chunks and progress:
            progress(finished, total)
        if chunks:
            # The backend starts (forks its workers) before the first progress call starts a progress bar.
            with BACKENDS[backend](min(workers, len(chunks)), address) as be:
                if progress:
                    progress(finished, total)
                for chunk in be.run(chunks, profiles, errors):
                    for key, metrics, reason in chunk:
                        for cfg in members[key]:
                            rows[cfg.index] = make_row(plan, cfg, metrics, reason, method="simulated")
                            results.append(rows[cfg.index])
                            finished += 1
                    if progress:
                        progress(finished, total)
        ordered = [rows[c.index] for c in plan.configs]
        results.finish(ordered)
    finally:
        results.close()
    front = pareto_front(ordered)
    best = pick_best(ordered, plan.objective, plan.max_step_time_s)
    if best is not None:
        best = {**best, "why": explain(best)}
    outcome = Outcome(plan=plan, out=out, rows=ordered, pareto=front, best=best,
                      wall_s=time.perf_counter() - t0, simulated=len(tasks), resumed=resumed, shared=shared,
                      generations=generations)
    if plan.search is not None:   # timed apart from the sweep: two more simulations, with their cost terms
        from rlhfsim.plan.compare import compare_with_base

        outcome.compare = compare_with_base(plan, ordered, best)
    write_plan_json(outcome, backend, workers)
    return outcome


def write_plan_json(o: Outcome, backend: str, workers: int) -> None:
    p = o.plan
    used = sorted({r["gpu_type"] for r in o.rows})
    doc = {
        "name": p.name,
        "plan_file": str(p.path),
        "axes": p.axes,
        "objective": {"kind": p.objective, "metric": OBJECTIVES[p.objective]},
        "max_step_time_s": p.max_step_time_s,
        "prices": {g: price_of(p, g) for g in used},
        "best": o.best,
        "pareto": o.pareto,
        "heatmap": p.heatmap,
        "configs": len(o.rows),
        "feasible": o.feasible,
        "wall_s": o.wall_s,
        "backend": backend,
        "workers": workers,
    }
    if doc["heatmap"] is None:
        del doc["heatmap"]
    if p.search is not None:
        doc["search"] = {"excluded": dict(p.search.excluded), "shared_generation": o.shared, "simulated": o.simulated,
                         "compare": o.compare}
    write_json_atomic(o.out / PLAN_FILE, doc, fsync=False)

"""A parallelism search's configurations priced without simulating each in full (``rlhfsim.plan.fastpath``): grouped by
generation, each group's generation simulated once (in forked worker processes), each configuration's steps rebuilt.
What the fast path cannot price is left to the sweep's backend, all of it or, with ``search.parallelism.refine: K``,
the K best by a screen (``screen``); the rest are listed as screened out, not simulated."""

from __future__ import annotations

from typing import Optional

from rlhfsim.errors import RlhfsimError
from rlhfsim.plan.results import make_row, model_errors
from rlhfsim.plan.spec import Plan


def run_shared(plan: Plan, todo: list, rows: dict, results, uncertainty: bool,
               workers: int = 1) -> tuple[list, int, int, int]:
    """A parallelism search's configurations on the fast path (``rlhfsim.plan.fastpath``): grouped by generation, each
    group's generation simulated once, each configuration's steps rebuilt; their rows written here. Groups go to
    ``workers`` forked processes. Returns the configurations left to simulate in full (with their scenario mappings),
    how many rows were priced, how many screened out (``refine``) and how many generations were simulated (``fastpath.
    share``); every such row is written here."""
    import dataclasses

    from rlhfsim.costs.model import CostModel
    from rlhfsim.hardware.catalog import get_gpu
    from rlhfsim.plan import fastpath as fp
    from rlhfsim.scenario.checks import build_setup

    costs = {g: CostModel(get_gpu(g), p) for g, p in plan.profiles.items()}
    rest, groups = [], {}
    for cfg in todo:
        if cfg.scenario is None:
            rest.append(cfg)
            continue
        setup, cost = build_setup(cfg.scenario), costs[cfg.gpu_type]
        if fp.eligible(setup, cost) is not None:
            rest.append(dataclasses.replace(cfg, doc=cfg.scenario.model_dump(mode="json")))
            continue
        groups.setdefault(fp.generation_key(setup), []).append((cfg, setup))
    work = _SharedWork(list(groups.values()), costs, model_errors(plan.profiles) if uncertainty else {})
    done = generations = 0
    for group, n in _shared_results(work, workers):
        generations += n
        for index, metrics, reason in group:
            cfg = plan.configs[index]
            rows[index] = make_row(plan, cfg, metrics, reason, method=fp.FAST)
            results.append(rows[index])
            done += 1
    written = 0   # rows screened out
    k = plan.search.ps.refine
    if k is not None:
        est = screen([c for c in rest if c.scenario is not None], costs, work.memos)
        ranked = sorted(est, key=lambda i: est[i])
        keep = set(ranked[:k]) | {c.index for c in rest if c.base}
        cut = est[ranked[k - 1]] if len(ranked) >= k else None
        kept = []
        for cfg in rest:
            if cfg.index in est and cfg.index not in keep:
                rows[cfg.index] = make_row(plan, cfg, None, (
                    f"not simulated: screened out by refine {k} (estimate {est[cfg.index]:.1f} s a step; the {k} best "
                    f"estimates, up to {cut:.1f} s, were simulated)"), method="screened")
                results.append(rows[cfg.index])
                written += 1
            else:
                kept.append(cfg)
        rest = kept
    return rest, done, written, generations


def screen(cfgs: list, costs: dict, memos: dict) -> dict[int, float]:
    """An estimate of the step of each configuration the fast path cannot price, to rank them (``refine``): its
    synchronous twin (the same placement and layouts, the schedule made sync) priced on the fast path; for an async
    schedule with generation on a pool of its own, the longer of the generation and the rest of the step (the two pools
    working side by side), else the synchronous step. A ranking, not a prediction: the rows it leaves out carry no step
    time. A configuration whose twin the fast path cannot price either is not screened (it is simulated)."""
    from rlhfsim.plan import fastpath as fp
    from rlhfsim.scenario.checks import build_setup
    from rlhfsim.scenario.schedules import SyncSchedule
    from rlhfsim.sim.simulation import collector_paused

    groups: dict[str, list] = {}
    for cfg in cfgs:
        twin = cfg.scenario.model_copy(update={"schedule": SyncSchedule()})
        twin._base_dir = cfg.scenario.base_dir
        try:
            setup = build_setup(twin)
        except RlhfsimError:
            continue
        cost = costs[cfg.gpu_type]
        if fp.eligible(setup, cost) is None:
            groups.setdefault(fp.generation_key(setup), []).append((cfg, setup))
    out: dict[int, float] = {}
    for group in groups.values():
        cost = costs[group[0][0].gpu_type]
        with collector_paused():
            shared = list(fp.share(group, cost, memos))
        for gen, members in shared:
            if isinstance(gen, RlhfsimError):
                continue
            for cfg, setup in members:
                times, _ = fp.steps(gen, setup, cost)
                warm = min(setup.scenario.warmup_steps, len(times) - 1)
                g = sum(gen.gen_s[warm:]) / len(times[warm:])
                step = sum(times[warm:]) / len(times[warm:])
                apart = setup.role_pool["rollout"] != setup.role_pool["actor"]
                out[cfg.index] = max(g, step - g) if cfg.scenario.schedule.kind == "async" and apart else step
    return out


class _SharedWork:
    """The fast path's groups and what prices them, held by each worker (inherited at fork, never pickled)."""

    def __init__(self, groups: list, costs: dict, errors: dict):
        self.groups, self.costs, self.errors = groups, costs, errors
        self.memos: dict = {}   # phase prices by the rows trained, across this process's generations

    def run(self, g: int) -> tuple[list[tuple[int, Optional[dict], str]], int]:
        """Group ``g``'s rows (index, metrics, why not) and how many generations were simulated for it."""
        from rlhfsim.plan import fastpath as fp
        from rlhfsim.sim.simulation import collector_paused

        group = self.groups[g]
        gpu = group[0][0].gpu_type
        cost = self.costs[gpu]
        err = self.errors.get(gpu)
        out, n = [], 0
        with collector_paused():
            shared = list(fp.share(group, cost, self.memos))
        for gen, members in shared:
            n += 1
            if isinstance(gen, RlhfsimError):
                out.extend((cfg.index, None, str(gen)) for cfg, _ in members)
                continue
            for cfg, setup in members:
                m = fp.metrics(gen, setup, cost)
                if err is not None:
                    from rlhfsim.sim.uncertainty import point_interval

                    m["step_time_interval_s"] = point_interval(m, err)["step_time_s_interval"]
                out.append((cfg.index, m, ""))
        return out, n


_WORK: Optional[_SharedWork] = None   # a forked worker's share of the fast path (set once per worker process)


def _worker_init(work: _SharedWork) -> None:
    global _WORK
    _WORK = work


def _worker_run(g: int):
    return _WORK.run(g)


def _shared_results(work: _SharedWork, workers: int):
    """Each group's rows, in this process (one worker, or no fork) or in forked worker processes."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    n = len(work.groups)
    if workers <= 1 or n <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        for g in range(n):
            yield work.run(g)
        return
    # fork: the workers inherit the groups (scenarios, setups, cost models) instead of receiving them pickled
    with ProcessPoolExecutor(max_workers=min(workers, n), mp_context=multiprocessing.get_context("fork"),
                             initializer=_worker_init, initargs=(work,)) as pool:
        for f in as_completed([pool.submit(_worker_run, g) for g in range(n)]):
            yield f.result()

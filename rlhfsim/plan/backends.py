"""Where a plan's configurations run: ``local`` (worker processes on this machine) or ``ray`` (Ray tasks
on a local cluster started for the sweep, or on an existing one given by its address).

Work goes out in chunks of configurations, so that process start-up, pickling and the cost model (built
once per GPU type in each chunk) are paid per chunk, not per configuration. Each configuration runs the
same code with the same seed on either backend, so both give the same numbers, bit for bit.

A worker process freezes what it holds when it starts (``gc.freeze``: the modules it imported and, for a
forked local worker, everything it inherited), so that the garbage collector's full passes during the
sweep walk only the objects the simulations make (about a tenth of a sweep's CPU time otherwise).
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import ClassVar, Iterator, Optional

from rlhfsim.errors import RlhfsimError

# A task: (key, scenario mapping, base_dir, gpu type); its result: (key, metrics or None, reason).
Task = tuple[int, dict, str, str]
Result = tuple[int, Optional[dict], str]


def run_one(doc: dict, base_dir: str, cost, err=None) -> dict:
    """Simulate one scenario mapping; the numbers a row of results.csv needs. ``err``: the model error
    (``rlhfsim.sim.modelerror.ModelError``) whose 90% interval of the step the row carries, analytic: no
    re-simulation (``step_time_interval_s``; None without one)."""
    from rlhfsim.scenario.loader import load_scenario
    from rlhfsim.sim.run import simulate
    from rlhfsim.sim.simulation import collector_paused

    sc = load_scenario(doc, base_dir=Path(base_dir), check=False)
    # The collector stays paused until the simulation is dropped (not only while it runs): its first pass
    # afterwards then frees the run's objects, instead of walking them once while they are still in use
    # and again, in an older generation, once they are garbage.
    with collector_paused():
        s = simulate(sc, cost=cost).summary
    if err is not None:
        from rlhfsim.sim.uncertainty import point_interval

        iv = point_interval(s, err)["step_time_s_interval"]
    else:
        iv = None
    return {"step_time_s": s["step_time_s"], "step_time_p90_s": s["step_time_p90_s"],
            "tokens_per_s": s["tokens_per_s"], "off_policy_token_frac": s["schedule_stats"]["off_policy_token_frac"],
            "phases_s": s["phases_s"], "utilization": s["gpu_busy"], "active": s["gpu_active"],
            "step_time_interval_s": iv}


def run_chunk(tasks: list[Task], profiles: dict[str, dict], errors: Optional[dict] = None) -> list[Result]:
    """Run a chunk of tasks; a configuration the simulator rejects becomes (key, None, reason). ``errors``: GPU type
    -> the model error its rows' intervals carry (None, or a type missing: no interval)."""
    from rlhfsim.costs.model import CostModel
    from rlhfsim.hardware.catalog import get_gpu

    costs: dict[str, CostModel] = {}
    out: list[Result] = []
    for key, doc, base_dir, gpu in tasks:
        if gpu not in costs:
            costs[gpu] = CostModel(get_gpu(gpu), profiles[gpu])
        try:
            out.append((key, run_one(doc, base_dir, costs[gpu], (errors or {}).get(gpu)), ""))
        except RlhfsimError as e:
            out.append((key, None, str(e)))
    return out


def worker_start() -> None:
    """A worker process starts: what it holds now lives as long as it does, so the garbage collector
    need not walk it again (once per process)."""
    if gc.get_freeze_count() == 0:
        gc.freeze()


def run_chunk_in_worker(tasks: list[Task], profiles: dict[str, dict], errors: Optional[dict] = None) -> list[Result]:
    """``run_chunk`` in a worker process that may not have been started by us (Ray)."""
    worker_start()
    return run_chunk(tasks, profiles, errors)


def chunked(tasks: list[Task], workers: int, max_size: int = 16) -> list[list[Task]]:
    """About four chunks per worker (for load balance and progress), at most ``max_size`` tasks each."""
    if not tasks:
        return []
    size = max(1, min(max_size, -(-len(tasks) // (4 * max(workers, 1)))))
    return [tasks[i:i + size] for i in range(0, len(tasks), size)]


class Backend(ABC):
    """Runs chunks of tasks and yields each chunk's results as it completes. A context manager: what
    it starts, it stops on exit."""

    NAME: ClassVar[str]

    def __init__(self, workers: int, address: Optional[str] = None):
        if workers < 1:
            raise RlhfsimError(f"--workers: expected at least 1, got {workers}")
        self.workers = workers
        self.address = address

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc) -> None:
        pass

    @abstractmethod
    def run(self, chunks: list[list[Task]], profiles: dict[str, dict],
            errors: Optional[dict] = None) -> Iterator[list[Result]]:
        ...


class LocalBackend(Backend):
    """Worker processes on this machine (``--workers`` of them; with one, work runs in this process)."""

    NAME: ClassVar[str] = "local"

    def __init__(self, workers: int, address: Optional[str] = None):
        if address is not None:
            raise RlhfsimError(f"--address: expected only with --backend ray, got {address!r} with --backend local")
        super().__init__(workers)
        self.pool: Optional[ProcessPoolExecutor] = None

    def __enter__(self):
        if self.workers > 1:
            import multiprocessing

            # fork is cheap (nothing is imported again). The workers are forked here, before the caller
            # starts any thread (a progress bar): a pool using fork starts all its processes at once on
            # the first submit.
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            self.pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context(method),
                                            initializer=worker_start)
            self.pool.submit(os.getpid).result()
        return self

    def run(self, chunks, profiles, errors=None):
        if self.pool is None:
            for chunk in chunks:
                yield run_chunk(chunk, profiles, errors)
            return
        pending = {self.pool.submit(run_chunk, c, profiles, errors) for c in chunks}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                yield f.result()

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.shutdown(wait=exc[0] is None, cancel_futures=True)
            self.pool = None


class RayBackend(Backend):
    """Ray tasks. Without ``--address`` a local Ray cluster of ``--workers`` CPUs is started in a
    temporary directory and shut down (and the directory removed) on exit; with ``--address`` the
    sweep joins that cluster, whose nodes must have rlhfsim installed."""

    NAME: ClassVar[str] = "ray"

    def __init__(self, workers: int, address: Optional[str] = None):
        super().__init__(workers, address)
        self.ray = None
        self.temp_dir: Optional[str] = None

    def __enter__(self):
        try:
            import ray
        except ImportError:
            raise RlhfsimError("--backend ray: expected Ray installed, got an import error "
                               "(pip install 'rlhfsim[ray]')") from None
        if ray.is_initialized():
            raise RlhfsimError("--backend ray: expected no Ray session in this process, got one already initialized")
        self.ray = ray
        quiet = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
        try:
            if self.address is None:
                self.temp_dir = tempfile.mkdtemp(prefix="rlhfsim-ray-")
                ray.init(num_cpus=self.workers, num_gpus=0, object_store_memory=256 * 1024**2,
                         _temp_dir=self.temp_dir, **quiet)
            else:
                ray.init(address=self.address, **quiet)
        except Exception as e:  # Ray raises ConnectionError, RuntimeError, ValueError, ...
            self.__exit__(None, None, None)
            where = f"at {self.address!r}" if self.address else "locally"
            raise RlhfsimError(f"--backend ray: expected a Ray cluster {where}, got {type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}") from None
        return self

    def run(self, chunks, profiles, errors=None):
        ray = self.ray
        task = ray.remote(num_cpus=1, max_retries=0)(run_chunk_in_worker)
        shared, shared_err = ray.put(profiles), ray.put(errors)
        pending = [task.remote(c, shared, shared_err) for c in chunks]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])

    def __exit__(self, *exc):
        if self.ray is not None and self.ray.is_initialized():
            self.ray.shutdown()
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None


def default_workers() -> int:
    return os.cpu_count() or 1

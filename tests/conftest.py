"""Shared fixtures: small scenarios that simulate in milliseconds, a run helper that tracks every rollout
and every forward/train call, a cost model with free reward scoring, and the ``gpu`` marker's skip.

Factories are session-scoped fixtures returning plain functions, so hypothesis tests can use them
(hypothesis rejects function-scoped fixtures in @given tests)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import simpy
from hypothesis import HealthCheck, settings

from rlhfsim.costs.model import CostModel
from rlhfsim.costs.terms import Price
from rlhfsim.scenario import load_scenario
from rlhfsim.scenario.checks import build_setup
from rlhfsim.scenario.loader import deep_merge
from rlhfsim.scenario.schema import Scenario
from rlhfsim.sim import stages
from rlhfsim.sim.schedules import SCHEDULES
from rlhfsim.sim.simulation import Simulation

# Hypothesis: a modest budget by default so the property suite stays well under a minute on 2 cores;
# HYPOTHESIS_PROFILE=deep runs many more examples (for hunting, not for CI).
settings.register_profile("ci", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# Small GPU scenario: Qwen2.5-0.5B everywhere on 4 A100-80GB, reward on its own GPU (OPPO's 3+1 here),
# three generation replicas, 16 rollouts per step.
GPU_SMALL = {
    "name": "gpu-small",
    "models": {
        "actor": {"model": "qwen2.5-0.5b"},
        "critic": {"model": "qwen2.5-0.5b"},
        "reference": {"model": "qwen2.5-0.5b"},
        "reward": {"model": "qwen2.5-0.5b"},
    },
    "cluster": {"gpu": "a100-80gb", "nodes": 1, "gpus_per_node": 4},
    "placement": {"kind": "dedicated_reward", "reward_gpus": 1},
    "algorithm": {"kind": "ppo", "ppo_epochs": 1, "minibatch_size": 8},
    "workload": {
        "prompts_per_step": 16,
        "prompt_length": {"kind": "lognormal", "median": 64, "p99": 256},
        "max_prompt_tokens": 512,
        "response_length": {"kind": "lognormal", "median": 100, "p99": 1000},
        "max_response_tokens": 1024,
    },
    "generation": {"engine": "continuous", "max_batch": 8},
    "schedule": {"kind": "sync"},
    "steps": 4,
    "warmup_steps": 1,
    "seed": 0,
}

# Colocated variant: 1.5B actor/critic/reference and a distinct 0.5B reward model, all on the same
# 4 GPUs, generation at TP 2 (two replicas).
GPU_COLOCATED = {
    **deep_merge(GPU_SMALL, {
        "name": "gpu-colocated",
        "models": {"actor": {"model": "qwen2.5-1.5b"}, "critic": {"model": "qwen2.5-1.5b"},
                   "reference": {"model": "qwen2.5-1.5b"}, "reward": {"model": "qwen2.5-0.5b"}},
    }),
    "placement": {"kind": "colocated", "tp": {"rollout": 2}},
}

# CPU scenario with the tiny catalog shapes (what CI and `calibrate` on CPU use).
CPU_TINY = {
    "name": "cpu-tiny",
    "models": {
        "actor": {"model": "tiny-qwen2", "dtype": "float32"},
        "reference": {"model": "tiny-qwen2", "dtype": "float32"},
        "reward": {"model": "small-qwen2", "dtype": "float32"},
    },
    "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 1},
    "placement": {"kind": "colocated"},
    "algorithm": {"kind": "grpo", "group_size": 4, "minibatch_size": 8},
    "workload": {
        "prompts_per_step": 4,
        "prompt_length": {"kind": "fixed", "value": 32},
        "max_prompt_tokens": 64,
        "response_length": {"kind": "normal", "mean": 48, "std": 16},
        "max_response_tokens": 128,
    },
    "generation": {"engine": "static", "max_batch": 8},
    "schedule": {"kind": "sync"},
    "steps": 3,
    "warmup_steps": 1,
}

BASES = {"gpu": GPU_SMALL, "colocated": GPU_COLOCATED, "cpu": CPU_TINY}

# One config per schedule kind (applied with deep_merge over a base scenario).
# The test matrix of schedules: every registered schedule's EXAMPLES (the registry is the only list).
SCHEDULE_CONFIGS = {name: cfg for cls in SCHEDULES.values() for name, cfg in cls.EXAMPLES.items()}


# A CPU profile's ``kernels`` with every CPU host effect measured (rlhfsim.costs.cpuhost), each large enough to
# show in a price: tests/unit/test_cpuhost.py and tests/unit/test_explain.py build profiles from it.
CPU_HOST_KERNELS = {
    "gemm_weight_passes": 2.0,
    "gemm_passes_by_footprint": {"footprint_mib": [4, 64], "passes": [1.5, 3.0], "gb_s_1row": [60.0, 12.0]},
    "width_efficiency": {"widths": [64, 512], "relative_rate": [0.5, 1.0]},
    "page_faults": {"fault_s_per_byte": 2e-10, "threshold_bytes": 0, "tensors": {"logprob_forward": 3.0,
                    "logprob_train": 6.0, "labels_train": 4.0}, "logprob_tail": {"s_per_logit": 5e-10}},
    "cold_overheads": {"footprint_mib": [0, 64], "factor": [1.0, 2.0]},
}

def make_dict(base: str = "gpu", over: dict | None = None, schedule: str | None = None) -> dict:
    """A fresh scenario mapping: ``BASES[base]`` with ``over`` merged in (mappings merge key by key)
    and, if given, the schedule ``SCHEDULE_CONFIGS[schedule]`` (replacing the whole schedule block)."""
    d = copy.deepcopy(BASES[base])
    if over:
        d = deep_merge(d, copy.deepcopy(over))
    if schedule is not None:
        d["schedule"] = copy.deepcopy(SCHEDULE_CONFIGS[schedule])
    return d


@dataclass
class TrackedRun:
    """A finished simulation plus everything needed to check conservation: every rollout the stream
    handed out (``taken``), the rows each forward pass and each training call saw, per role."""

    sim: Simulation
    records: list
    taken: list = field(default_factory=list)
    forward_ids: dict = field(default_factory=dict)  # role -> list of rollout ids (one entry per pass)
    train_ids: dict = field(default_factory=dict)  # role -> list of rollout ids

    @property
    def trained_ids(self) -> list[int]:
        return [i for r in self.records for i in r.trained_ids]

    @property
    def step_times(self) -> list[float]:
        return [r.step_time_s for r in self.records]


@contextmanager
def _spy_stages(run: TrackedRun):
    """Record the rollouts each forward pass and each training call receives (restored afterwards)."""
    fwd, trn = stages.forward_pass, stages.train

    def forward_pass(env, sim, step, role, rows, phase=None):
        run.forward_ids.setdefault(phase or role, []).extend(r.id for r in rows)
        return fwd(env, sim, step, role, rows, phase)

    def train(env, sim, step, role, rows):
        run.train_ids.setdefault(role, []).extend(r.id for r in rows)
        return trn(env, sim, step, role, rows)

    stages.forward_pass, stages.train = forward_pass, train
    try:
        yield
    finally:
        stages.forward_pass, stages.train = fwd, trn


def run_tracked(source, steps: int | None = None, seed: int | None = None, cost: CostModel | None = None,
                rollouts: list[tuple[int, int]] | None = None) -> TrackedRun:
    """Simulate a scenario (mapping or Scenario) and keep the Simulation and every rollout it drew."""
    sc = source if isinstance(source, Scenario) else load_scenario(source)
    setup = build_setup(sc)
    cost = cost or CostModel.load(setup.gpu)
    sim = Simulation(setup, cost, seed=seed, rollouts=rollouts)
    run = TrackedRun(sim, [])
    take = sim.stream.take

    def tracking_take(n, step):
        out = take(n, step)
        run.taken.extend(out)
        return out

    sim.stream.take = tracking_take
    with _spy_stages(run):
        run.records = sim.run(steps or sc.steps)
    return run


def check_conservation(run: TrackedRun) -> None:
    """Nothing lost, nothing counted twice, no negative duration:

    - every rollout drawn is trained at most once, and trained only when fully generated;
    - drawn = trained + still in flight after the last step (sync, OPPO, partial), or, for async, step k
      trains exactly the k-th batch of B;
    - every decoded token is counted once (per rollout and in the step records);
    - every trained rollout is scored exactly once by each scoring role: one forward pass, or chunks
      whose response tokens add up to its length (the chunk scorer's token count, prompts included,
      matches the rollouts' scored tokens);
    - intervals, phases and steps have non-negative durations and steps follow each other.
    """
    sim, recs, taken = run.sim, run.records, run.taken
    setup = sim.setup
    sc = setup.scenario
    B = setup.rollouts_per_step
    kind = sc.schedule.kind
    assert [r.id for r in taken] == list(range(len(taken))), "rollout ids are drawn in order, once"
    by_id = {r.id: r for r in taken}
    ids = run.trained_ids
    assert len(ids) == len(set(ids)), "a rollout was trained twice"
    assert set(ids) <= set(by_id)
    for rec in recs:
        assert rec.trained_rollouts == len(rec.trained_ids)
        assert rec.response_tokens == sum(by_id[i].response_len for i in rec.trained_ids)
    for r in taken:
        assert 0 <= r.generated <= r.response_len
        assert sum(r.tokens_by_step.values()) == r.generated
        assert all(n >= 0 for n in r.tokens_by_step.values())
    for i in ids:
        assert by_id[i].generated == by_id[i].response_len, f"rollout {i} trained before it finished"
    if kind == "async":
        for k, rec in enumerate(recs):
            assert sorted(rec.trained_ids) == list(range(k * B, (k + 1) * B))
            assert rec.generated_tokens == rec.response_tokens
            assert 0 <= rec.staleness <= sc.schedule.max_staleness
    else:
        assert len(taken) == len(ids) + recs[-1].deferred, "a rollout was lost"
        assert sum(rec.generated_tokens for rec in recs) == sum(r.generated for r in taken)
        if kind != "partial":
            assert all(rec.trained_rollouts == B for rec in recs)
        if kind == "sync":
            for k, rec in enumerate(recs):
                assert sorted(rec.trained_ids) == list(range(k * B, (k + 1) * B))
    # Scoring and training: each trained rollout exactly once per role.
    want = sorted(ids)
    for role in ("reward", "reference", "critic"):
        if role not in setup.shapes:
            continue
        if role in sim.scorers:
            scorer = sim.scorers[role]
            assert role not in run.forward_ids, f"{role} both streamed and run as a full pass"
            assert scorer.outstanding == 0
            for i in ids:
                assert by_id[i].scored.get(role, 0) == by_id[i].response_len, f"{role} scored rollout {i} partly"
            for r in taken:
                assert r.scored.get(role, 0) <= r.generated
            assert scorer.tokens == sum(r.prompt_len + r.scored[role] for r in taken if r.scored.get(role, 0) > 0)
        else:
            assert sorted(run.forward_ids.get(role, [])) == want, f"{role} forward pass rows"
    # Per-step scoring counts add up to the scorers' run totals (each chunk counted in one step).
    assert sum(rec.chunks_scored for rec in recs) == sum(sc.chunks for sc in sim.scorers.values())
    assert sum(rec.scored_tokens for rec in recs) == sum(sc.tokens for sc in sim.scorers.values())
    assert all(rec.chunks_scored >= 0 and rec.scored_tokens >= 0 for rec in recs)
    if setup.rule_reward is not None:
        assert "reward" not in run.forward_ids
    for role in ("actor", "critic"):
        if role in setup.shapes:
            assert sorted(run.train_ids.get(role, [])) == want, f"{role} trained rows"
    # Durations.
    for iv in sim.rec.intervals:
        assert 0.0 <= iv.start_s <= iv.end_s, iv
    for k, rec in enumerate(recs):
        assert rec.step == k
        assert rec.end_s >= rec.start_s >= 0.0
        assert all(v >= 0.0 for v in rec.phases_s.values())
        if k:
            assert rec.start_s == recs[k - 1].end_s


class FreeRewardCost(CostModel):
    """A CostModel under which the reward model costs nothing: every forward pass or chunk prefill of
    ``free`` (the reward model's shape, distinct from the other roles' shapes) takes 0 s."""

    def __init__(self, gpu, profile, free):
        super().__init__(gpu, profile)
        self.free = free

    def forward(self, m, *a, **kw):   # every forward pass, chunk prefill and re-scoring is priced through it
        return Price(0.0, 0.0) if m == self.free else super().forward(m, *a, **kw)


def free_reward_cost(sc: Scenario) -> FreeRewardCost:
    setup = build_setup(sc)
    # a GPU's datasheet-derived profile by name (the fitted one a GPU now gets by default prices a forward
    # micro-batch's framework time, step.microbatch_forward_s, which a free scorer would still pay)
    base = CostModel.load(setup.gpu, None if setup.gpu.kind == "cpu" else "default")
    other = {setup.shapes[r] for r in setup.shapes if r != "reward"}
    if setup.shapes["reward"] in other:
        raise ValueError("free_reward_cost needs a reward model shape no other role uses")
    # Streaming to a free reward model costs the actor nothing either: no handoff pause at chunk boundaries,
    # and no co-running slowdown measured beside a scorer that works (interference.handover).
    inter = {k: v for k, v in base.profile.get("interference", {}).items() if k != "handover"}
    profile = {**base.profile, "generation": {rt: {**g, "handoff_s": 0.0, "handoff_per_row_s": 0.0}
                                              for rt, g in base.profile.get("generation", {}).items()},
               "interference": inter}
    # a free scorer's call would still pay the framework's host dispatch (rlhfsim.costs.framework): priced
    # without it, as every other role then is, so sync and intra-step differ by the scoring's placement only
    profile.pop("framework", None)
    return FreeRewardCost(setup.gpu, profile, setup.shapes["reward"])


def rlhfsim_cmd() -> list[str]:
    """The installed console script next to this interpreter, else the same entry point via -c."""
    script = Path(sys.executable).parent / "rlhfsim"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-c", "from rlhfsim.cli import main; main()"]


def run_cli(*args, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(rlhfsim_cmd() + [str(a) for a in args], capture_output=True, text=True,
                          cwd=cwd or ROOT, timeout=timeout)


# --- fixtures -------------------------------------------------------------------------------------
@pytest.fixture
def env():
    return simpy.Environment()


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def scenario_dict():
    return make_dict


@pytest.fixture(scope="session")
def tracked():
    return run_tracked


@pytest.fixture(scope="session")
def conservation():
    return check_conservation


@pytest.fixture(scope="session")
def free_cost():
    return free_reward_cost


@pytest.fixture(scope="session")
def cli():
    return run_cli


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


# --- the gpu marker ---------------------------------------------------------------------------------
def pytest_collection_modifyitems(config, items):
    """Skip ``@pytest.mark.gpu`` tests unless torch sees a CUDA device (torch is imported only when such
    a test was collected, so the simulator's tests run without torch)."""
    gpu_items = [it for it in items if it.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    try:
        import torch

        has_cuda = torch.cuda.is_available()
        reason = "needs a CUDA device (torch.cuda.is_available() is False)"
    except ImportError:
        has_cuda, reason = False, "needs torch with CUDA (torch is not installed)"
    if not has_cuda:
        skip = pytest.mark.skip(reason=reason)
        for it in gpu_items:
            it.add_marker(skip)

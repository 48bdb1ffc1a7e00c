"""The CUDA caching allocator's counters per phase (``calibrate.executor.timing``): none off CUDA, the
deltas between two readings added to a phase, and validation's per-step summary (``allocator`` per scenario)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from calibrate.executor.timing import ALLOC_KEYS, StepLog, device_allocs  # noqa: E402
from calibrate.validation.compare import allocator  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it


def test_no_counters_off_cuda_and_nothing_recorded():
    assert device_allocs(torch.device("cpu")) is None
    log = StepLog(0.0)
    log.alloc("actor_train", None, None)
    assert log.allocs == {}


def test_deltas_add_up_per_phase():
    log = StepLog(0.0)
    r = [{k: i * 10 + j for j, k in enumerate(ALLOC_KEYS)} for i in range(4)]
    log.alloc("actor_train", r[0], r[1])
    log.alloc("actor_train", r[2], r[3])
    log.alloc("generate", r[1], r[2])
    assert dict(log.allocs["actor_train"]) == {k: 20 for k in ALLOC_KEYS}
    assert dict(log.allocs["generate"]) == {k: 10 for k in ALLOC_KEYS}


def test_validation_summary_is_per_measured_step_and_absent_without_counts():
    steps = [SimpleNamespace(allocs={"actor_train": {"device_allocs": 4, "device_frees": 2}}),
             SimpleNamespace(allocs={"actor_train": {"device_allocs": 2, "device_frees": 0},
                                     "generate": {"device_allocs": 1, "device_frees": 1}})]
    got = allocator(steps)
    assert got == {"actor_train": {"device_allocs": 3.0, "device_frees": 1.0},
                   "generate": {"device_allocs": 0.5, "device_frees": 0.5}}
    assert allocator([SimpleNamespace(allocs={}), SimpleNamespace()]) == {}

"""The calibration's guard against other processes (calibrate.running.session): a quiet check just taken stands for
the next point's, and ``quiet_budget_s`` caps what a whole calibration spends waiting for quiet cores and
measuring disturbed points again; the quick CPU grid measures the batching strategies on the runtime models only."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.hw  # the calibrator's session (it loads torch)

import calibrate.running.session as session  # noqa: E402
from calibrate.running.grid import FULL_CPU, QUICK_CPU, with_overrides  # noqa: E402
from calibrate.running.session import Session  # noqa: E402
from rlhfsim.errors import RlhfsimError  # noqa: E402


class Clock:
    """A fake monotonic clock that sleeping and probing advance."""

    def __init__(self):
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def make(monkeypatch, ratios, **grid) -> tuple[Session, list, Clock]:
    clock, calls = Clock(), []

    def probe(threads, calls_=9, **_):
        calls.append(clock.t)
        clock.t += 0.01
        return ratios(len(calls)) if callable(ratios) else ratios

    monkeypatch.setattr(session, "contention_ratio", lambda threads, calls=9: probe(threads, calls))
    monkeypatch.setattr(session.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(session.time, "sleep", clock.sleep)
    g = replace(QUICK_CPU, **{"quiet_wait_s": 20.0, **grid})
    return Session("cpu", "float32", g, None, None, Path("."), threads=2), calls, clock


def test_a_fresh_quiet_check_stands_for_the_next(monkeypatch):
    s, calls, clock = make(monkeypatch, 1.0)
    s.guarded(lambda: None)
    assert len(calls) == 2                      # before and after the first point
    s.guarded(lambda: None)
    assert len(calls) == 3                      # the previous check after stood for this one's before
    clock.t += 5.0
    s.guarded(lambda: None)
    assert len(calls) == 5                      # too old: checked again
    assert s.ratio == 1.0 and s.quiet_spent_s == 0.0


def test_a_contended_check_is_never_reused(monkeypatch):
    s, calls, _ = make(monkeypatch, lambda k: 3.0 if k == 2 else 1.0)
    s.guarded(lambda: None)                     # after-check contended: measured again, with a fresh check before
    assert len(calls) == 4 and s.ratio == 1.0


def test_quiet_budget_caps_waiting_and_retakes(monkeypatch):
    s, calls, clock = make(monkeypatch, 3.0, quiet_budget_s=30.0)
    runs = []
    s.guarded(lambda: runs.append(clock.t))
    assert s.quiet_spent_s >= 30.0 and len(runs) == 2   # waited 20 s, measured, waited the 10 s left, measured again
    spent, n = s.quiet_spent_s, len(calls)
    s.guarded(lambda: runs.append(clock.t))
    assert len(runs) == 3 and s.quiet_spent_s == pytest.approx(spent, abs=0.05)   # budget spent: at once, kept
    assert s.ratio == 3.0 and len(calls) == n + 2


def test_unbounded_by_default(monkeypatch):
    s, _, clock = make(monkeypatch, 3.0, quiet_budget_s=None)
    runs = []
    s.guarded(lambda: runs.append(clock.t))
    assert len(runs) == session.MEASURE_ATTEMPTS and s.quiet_spent_s >= 3 * 20.0


def test_grid_fields():
    assert QUICK_CPU.quiet_budget_s is not None and FULL_CPU.quiet_budget_s is None
    assert with_overrides(QUICK_CPU, {"quiet_budget_s": None}).quiet_budget_s is None
    with pytest.raises(RlhfsimError, match="grid.quiet_budget_s"):
        with_overrides(QUICK_CPU, {"quiet_budget_s": -1})


def test_strategies_only_on_runtime_models():
    from calibrate.running.run import pick_runtime_models, plan_size
    from calibrate.measuring.scoring import STRATEGIES
    from rlhfsim.models.catalog import CATALOG

    models = [CATALOG[n] for n in ("tiny-qwen2", "small-qwen2", "tiny-deberta")]
    rts = {"eager": None}
    g = with_overrides(QUICK_CPU, {"strategies": [[8, 128]]})
    one = plan_size(g, models, rts, pick_runtime_models(models, 1))
    every = plan_size(g, models, rts, pick_runtime_models(models, None))
    assert every - one == len(STRATEGIES)        # small-qwen2's strategies


def test_quick_leaves_out_the_runtimes_compiled_per_shape_unless_named():
    """A quick run measures every scoring runtime but those compiled per shape (AOTInductor's packages), and the
    quick CPU grid no compiled generation runtime (hf_static); the full grids keep them all."""
    from calibrate.measuring.genbench import plan
    from calibrate.running.run import default_runtimes
    from calibrate.runtimes import RUNTIMES
    from rlhfsim.models.catalog import CATALOG

    quick = default_runtimes(QUICK_CPU, quick=True)
    assert "eager" in quick and not {"aoti_python", "aoti_cpp"} & set(quick)
    assert set(quick) | set(QUICK_CPU.static_shape_runtimes) == set(RUNTIMES)
    assert default_runtimes(FULL_CPU, quick=False) == list(RUNTIMES)
    models = [CATALOG["tiny-qwen2"]]
    assert "hf_static" not in {rt for rt, _, _ in plan(QUICK_CPU, models)}
    assert "hf_static" in {rt for rt, _, _ in plan(FULL_CPU, models)}
    assert QUICK_CPU.gen_pad == FULL_CPU.gen_pad[:2] and set(QUICK_CPU.chunk_prefixes) < set(FULL_CPU.chunk_prefixes)
    # handoff and pad points (fits that read no model) on the first gen_host_models decoders of the quick grid
    four = [CATALOG[n] for n in ("tiny-qwen2", "small-qwen2", "tiny-qwen2-l4", "small-qwen2-l2")]
    ops = {m.name: {p.op for rt, _, pts in plan(QUICK_CPU, four) if rt == "hf_generate" for p in pts if _ is m}
           for m in four}
    assert ops["tiny-qwen2-l4"] == {"prefill", "decode", "handoff", "pad"} and ops["small-qwen2-l2"] == {"prefill", "decode"}
    assert all({"handoff", "pad"} <= {p.op for rt, _, pts in plan(FULL_CPU, four) if rt == "hf_generate" and _ is m
                                      for p in pts} for m in four)

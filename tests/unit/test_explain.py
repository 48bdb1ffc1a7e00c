"""Every term of every phase (rlhfsim explain): the breakdowns sum to the prices they split (CPU and GPU profiles;
decode, forward, training and streamed scorer calls), a streamed phase's busy terms and its waiting make its
span, the CPU host effects appear on a CPU only, and every name explain prints is a registry term."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import CPU_HOST_KERNELS

from rlhfsim.cli import main
from rlhfsim.costs import cpuhost
from rlhfsim.costs import terms as T
from rlhfsim.costs.cpuhost import CpuHostEffects
from rlhfsim.costs.model import CostModel, decode_sum
from rlhfsim.costs.profile import load_profile
from rlhfsim.hardware.catalog import GPUS
from rlhfsim.models.catalog import CATALOG
from rlhfsim.scenario.loader import load_scenario, parse_set
from rlhfsim.sim.engines.base import Engine
from rlhfsim.sim.explain import explain, explained_names, render
from rlhfsim.sim.streaming import STREAMING

ROOT = Path(__file__).resolve().parents[2]
CPU, H200 = GPUS["cpu"], GPUS["h200"]
CPU_KERNELS = CPU_HOST_KERNELS   # every CPU host effect measured, each large enough to show (tests/conftest.py)
CPU_TERMS = {t.name for t in T.TERMS if t.devices == "cpu"}


def _models():
    cpu = CostModel(CPU, {**load_profile("cpu"), "kernels": CPU_KERNELS})
    gpu = CostModel(H200, load_profile("h200-measured"))
    assert cpu.cpu is not None and gpu.cpu is None
    return (cpu, CATALOG["small-qwen2"], "float32"), (gpu, CATALOG["qwen2.5-0.5b"], "bfloat16")


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_forward_training_and_decode_terms_sum_to_their_prices(device):
    cost, m, dt = _models()[device == "gpu"]
    seen = set()
    for training in (False, True):
        for kw in ({}, {"checkpointing": True, "ckpt_frac": 0.3}, {"sp": 2}, {"fsdp_n": 4}):
            if kw.get("checkpointing") and not training:
                continue
            call = cost.framework_call(training, m, dt, 2048.0, 8.0, head="lm", logprob=True, entropy=True, **kw)
            terms = call.terms()
            assert sum(terms.values()) == pytest.approx(call.total_s, rel=1e-12), (training, kw)
            seen |= {k for k, v in terms.items() if v}
    for head, all_logits in (("lm", True), ("value", False)):
        t = cost.forward(m, dt, 1024.0, 4.0, cached_tokens=256.0, op="chunk_prefill", head=head, all_logits=all_logits).terms()
        assert sum(t.values()) == pytest.approx(cost.forward(m, dt, 1024.0, 4.0, 1, 256.0, "chunk_prefill", None,
                                                                   head, all_logits).total_s, rel=1e-12)
        seen |= {k for k, v in t.items() if v}
    d = cost.decoder(m, dt)
    for batch, kv in ((1, 100.0), (8, 8 * 700.0)):
        t = d.price(batch, kv, 1).terms()
        assert sum(t.values()) == pytest.approx(decode_sum(d.coeffs(batch, kv, None), 1)[0], rel=1e-12)
        seen |= {k for k, v in t.items() if v}
    assert seen <= set(T.BY_NAME)
    if device == "cpu":   # each effect split out of the term it was folded into
        assert CPU_TERMS <= seen
        assert all(v > 0 for k, v in d.price(8, 8 * 700.0, 1).terms().items() if k in (T.GEMM_FOOTPRINT, T.COLD_OVERHEADS))
    else:
        assert not seen & CPU_TERMS


@pytest.mark.parametrize("device", ["cpu", "gpu"])
@pytest.mark.parametrize("name", sorted(STREAMING))
def test_a_streamed_scorer_call_splits_its_price(device, name):
    cost, m, dt = _models()[device == "gpu"]
    strategy = STREAMING[name]
    for head in ("value", "lm"):
        for tokens, prefix, new in ((600.0, 0.0, 600.0), (640.0, 0.0, 64.0), (64.0, 576.0, 64.0)):
            total = strategy.price(cost, m, dt, tokens, 1, prefix, 1, head, None).total_s
            parts = strategy.price(cost, m, dt, tokens, 1, prefix, 1, head, None, new).terms()
            assert sum(parts.values()) == pytest.approx(total, rel=1e-12), (head, tokens, new)
            assert set(parts) <= set(T.BY_NAME)
            assert (parts.get(T.REENCODE_PREFIX, 0.0) > 0) == (name != "incremental" and new < tokens)
            assert device == "cpu" or not set(parts) & CPU_TERMS


def _check(doc):
    """Every phase that takes time is explained by registry terms summing to its span (streamed phases and
    generate: with their waiting)."""
    assert explained_names(doc) <= set(T.BY_NAME) and set(doc["terms"]) == explained_names(doc)
    for ph, e in doc["phases"].items():
        if e["span_s"] == 0:
            continue
        assert "terms_s" in e, ph
        busy = sum(e["terms_s"].values())
        assert busy + e.get("waiting_s", 0.0) == pytest.approx(e["span_s"], rel=1e-9, abs=1e-12), ph
    d = doc["decode_step"]
    assert sum(d["terms_s"].values()) == pytest.approx(d["step_s"])


def test_a_streamed_reward_phase_is_its_replicas_terms_plus_waiting():
    doc = explain(load_scenario(ROOT / "scenarios" / "oppo.yaml"), steps=3)
    _check(doc)
    reward = doc["phases"]["reward"]
    assert reward["waiting_s"] > 0 and {T.KERNELS, T.OP_OVERHEAD} <= set(reward["terms_s"])
    assert not explained_names(doc) & CPU_TERMS   # a GPU profile


@pytest.mark.parametrize("path, want", [
    ("validate/oppo-encoder-reencode.yaml", {T.REENCODE_PREFIX, T.INTERFERENCE, T.WIDTH_RATE}),
    ("validate/grpo-retokenize.yaml", {T.RETOKENIZE}),
    ("validate/sync-static.yaml", {T.KERNELS, T.OPTIMIZER}),
    ("baseline.yaml", {T.KERNELS}),
    ("examples/verl-grpo.yaml", {T.RULE_REWARD}),
])
def test_every_phase_of_these_scenarios_is_named_by_registry_terms(path, want):
    doc = explain(load_scenario(ROOT / "scenarios" / path), steps=3)
    _check(doc)
    assert want <= explained_names(doc)


def test_cpu_side_phases_and_the_weight_update_are_terms():
    sc = load_scenario(ROOT / "scenarios" / "verl-ppo.yaml", overrides=[parse_set("execution.advantage.enabled=true"),
                                                                      parse_set("execution.weight_sync.kind=reshard")])
    doc = explain(sc, steps=3)
    _check(doc)
    assert T.ADVANTAGE in doc["phases"]["adv"]["terms_s"] and T.WEIGHT_SYNC in doc["phases"]["weight_sync"]["terms_s"]


def test_explain_on_a_gpu_runs_no_cpu_host_code(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a GPU price ran CPU host code")

    for name, fn in inspect.getmembers(cpuhost, inspect.isfunction):
        if fn.__module__ == cpuhost.__name__ and name != "device_kind":
            monkeypatch.setattr(cpuhost, name, boom)
    for name, fn in vars(CpuHostEffects).items():
        if (callable(fn) or isinstance(fn, (staticmethod, classmethod))) and name not in ("of", "__init__") \
                and not name.startswith("__"):
            monkeypatch.setattr(CpuHostEffects, name, boom)
    doc = explain(load_scenario(ROOT / "scenarios" / "verl-ppo.yaml"), steps=2)
    assert doc["step_time_s"] > 0 and not explained_names(doc) & CPU_TERMS


def test_json_carries_the_terms_and_the_waiting():
    r = CliRunner().invoke(main, ["explain", str(ROOT / "scenarios" / "oppo.yaml"), "--steps", "3", "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["waiting"] == T.WAITING and doc["phases"]["reward"]["waiting_s"] > 0
    assert set(doc["terms"]) <= set(T.BY_NAME)
    text = CliRunner().invoke(main, ["explain", str(ROOT / "scenarios" / "oppo.yaml"), "--steps", "3"]).output
    assert T.WAITING in text and "not a cost term" in text


def _generate(doc):
    """generate's busy terms, its idle seconds and its span, checked: registry terms, summing with the idle
    seconds to the span."""
    g = doc["phases"]["generate"]
    terms, idle = g["terms_s"], g.get("waiting_s", 0.0)
    assert set(terms) <= set(T.BY_NAME)
    assert sum(terms.values()) + idle == pytest.approx(g["span_s"], rel=1e-9)
    return terms, idle, g["span_s"]


@pytest.mark.parametrize("path, want", [
    ("validate/sync-static.yaml", {T.GEN_CALL_OVERHEAD, T.KERNELS, T.DECODE_KERNELS, T.ENGINE_STEP}),
    ("validate/sync-continuous.yaml", {T.KERNELS, T.DECODE_KERNELS, T.ENGINE_STEP, T.SAMPLING_TAIL}),
])
def test_generate_is_its_last_replicas_terms_static_and_continuous(path, want):
    doc = explain(load_scenario(ROOT / "scenarios" / path), steps=3)
    _check(doc)
    terms, idle, span = _generate(doc)
    assert want <= set(terms) and T.INTERFERENCE not in terms and T.HANDOFF not in terms
    assert abs(idle) <= 1e-9 * span   # one request a step: the replica is busy all through its span
    text = "\n".join(render(doc))
    assert "decode steps; one of" in text and "idle" in text


def test_generate_under_oppo_intra_step_counts_interference_and_handoff():
    # kv_decoder beside a co-running CPU scorer: decode re-timed while the scorer runs (interference)
    terms, _, span = _generate(explain(load_scenario(ROOT / "scenarios" / "validate" / "oppo-full.yaml"), steps=3))
    assert terms[T.INTERFERENCE] > 0.05 * span and terms[T.DECODE_KERNELS] > 0
    # hf_generate in chunked generate() calls, stopped at the first B: the hand-over pause at every boundary
    doc = explain(load_scenario(ROOT / "scenarios" / "oppo.yaml"), steps=3)
    terms, _, _ = _generate(doc)
    assert {T.HANDOFF, T.GEN_CALL_OVERHEAD, T.DECODE_KERNELS} <= set(terms)
    # resume by re-prefilling: each boundary's prefill less the decode step its token replaces
    sc = load_scenario(ROOT / "scenarios" / "oppo.yaml", overrides=[parse_set("schedule.intra.resume=reprefill")])
    terms, _, _ = _generate(explain(sc, steps=3))
    assert all(v > 0 for v in terms.values()) and T.KERNELS in terms   # the replaced steps were decoded, then given back


@pytest.mark.parametrize("path", ["validate/sync-static.yaml", "validate/sync-continuous.yaml", "verl-ppo.yaml"])
def test_generate_terms_are_the_same_on_the_event_and_the_deferred_clock(path, monkeypatch):
    sc = load_scenario(ROOT / "scenarios" / path)
    detached = explain(sc, steps=3)
    monkeypatch.setattr(Engine, "DETACH", False)
    event = explain(sc, steps=3)
    assert detached["phases"]["generate"]["span_s"] == event["phases"]["generate"]["span_s"]
    a, b = _generate(detached)[0], _generate(event)[0]
    assert set(a) == set(b)
    for k in a:
        assert a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-12), k


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_a_segments_terms_are_its_steps_terms_summed(device):
    cost, m, dt = _models()[device == "gpu"]
    for runtime in (None, *cost.runtimes[:2]):
        d = cost.decoder(m, dt, 1, runtime)
        for batch, kv0, n, over, extra in ((1, 100.0, 1, None, 0.0), (8, 8 * 700.0, 300, None, 0.0),
                                           (4, 4 * 50.0, 57, 2e-3, 1e-4)):
            p = d.price(batch, kv0, n, over, extra)
            price, terms = p.total_s, p.terms()
            c = d.coeffs(batch, kv0, over)
            assert price == decode_sum((*c[:4], c[4] + extra), n)[0]
            assert sum(terms.values()) == pytest.approx(price, rel=1e-12) and set(terms) <= set(T.BY_NAME)
            steps: dict = {}
            for i in range(n):
                for k, v in d.price(batch, kv0 + i * batch, 1).terms().items():
                    steps[k] = steps.get(k, 0.0) + v
            if over is not None:
                steps[T.ENGINE_STEP] = n * over   # the engine's own per-step overhead (generation.step_overhead_s)
                steps.pop(T.COLD_OVERHEADS, None)
            assert terms.get(T.LEFT_PADDING, 0.0) == pytest.approx(n * extra)
            if not d.hfloor and over is None:   # the launch floor folded into the compute line is the one difference
                for k in set(steps) | set(terms) - {T.LEFT_PADDING}:
                    assert terms.get(k, 0.0) == pytest.approx(steps.get(k, 0.0), rel=1e-9, abs=1e-15), (runtime, k)

"""The CPU host effects in one place (rlhfsim.costs.cpuhost): built only for a CPU whose profile measured them,
never reached by a GPU price, and the GPU calibration grids schedule none of their sweeps."""

from __future__ import annotations

import copy
import dataclasses
import inspect
from pathlib import Path

import pytest

from conftest import CPU_HOST_KERNELS

from calibrate.running.grid import CPU_ONLY_FIELDS, FULL_CPU, FULL_GPU, QUICK_CPU, QUICK_GPU, cpu_only_sweeps, with_overrides
from rlhfsim.costs import cpuhost
from rlhfsim.costs import flops as fl
from rlhfsim.costs.cpuhost import CpuHostEffects
from rlhfsim.costs.model import CostModel
from rlhfsim.costs.profile import load_profile
from rlhfsim.hardware.catalog import GPUS
from rlhfsim.models.catalog import CATALOG
from rlhfsim.scenario.loader import load_scenario
from rlhfsim.sim.run import simulate

ROOT = Path(__file__).resolve().parents[2]
CPU, H200 = GPUS["cpu"], GPUS["h200"]
CPU_KERNELS = CPU_HOST_KERNELS   # every CPU host effect measured (tests/conftest.py)


def _raising(monkeypatch) -> list[str]:
    """Every function of cpuhost and every method of CpuHostEffects but the gate (``of``, ``device_kind``)
    replaced by one that raises; returns their names."""
    def boom(*a, **k):
        raise AssertionError("a GPU price ran CPU host code")

    names = []
    for name, fn in inspect.getmembers(cpuhost, inspect.isfunction):
        if fn.__module__ == cpuhost.__name__ and name != "device_kind":
            monkeypatch.setattr(cpuhost, name, boom)
            names.append(name)
    for name, fn in vars(CpuHostEffects).items():
        if callable(fn) or isinstance(fn, (staticmethod, classmethod)):
            if name not in ("of", "__init__") and not name.startswith("__"):
                monkeypatch.setattr(CpuHostEffects, name, boom)
                names.append(f"CpuHostEffects.{name}")
    return names


def test_effects_exist_only_for_a_cpu_whose_profile_measured_them():
    cpu_doc = load_profile("cpu")
    got = CpuHostEffects.of(cpu_doc)
    assert got is not None and got.page_faults == cpu_doc["kernels"]["page_faults"]
    assert CostModel(CPU, cpu_doc).cpu == got
    assert CpuHostEffects.of({**cpu_doc, "kernels": None}) is None              # nothing measured: nothing to apply
    assert CpuHostEffects.of(cpu_doc, "cuda") is None                          # a CPU profile's keys, a GPU priced
    gpu_doc = {**load_profile("h200-measured"), "kernels": CPU_KERNELS}
    assert CpuHostEffects.of(gpu_doc) is None and CostModel(H200, gpu_doc).cpu is None
    assert CostModel(H200, load_profile("default")).cpu is None and CostModel(H200, load_profile("default")).page_faults is None


def test_a_gpu_price_runs_no_cpu_specific_code(monkeypatch):
    assert len(_raising(monkeypatch)) >= 10
    res = simulate(load_scenario(ROOT / "scenarios" / "verl-ppo.yaml"), steps=2)
    assert res.summary["step_time_s"] > 0
    # CPU keys in a GPU profile change nothing: the gate is the device, not the keys
    plain = CostModel(H200, load_profile("h200-measured"))
    keyed = CostModel(H200, {**load_profile("h200-measured"), "kernels": CPU_KERNELS})
    m = CATALOG["qwen2.5-0.5b"]
    for cm in (plain, keyed):
        assert cm.cpu is None
    calls = [lambda c: c.forward(m, "bfloat16", 512.0, 4.0, all_logits=True, head="lm"),
             lambda c: tuple(c.forward(m, "bfloat16", [64.0, 512.0], 4.0, all_logits=True, head="lm").total_s),
             lambda c: c.train(m, "bfloat16", 4096.0, 8.0, sp=2),
             lambda c: c.decoder(m, "bfloat16").coeffs(16, 16 * 300.0),
             lambda c: c.decoder(m, "bfloat16").price(16, 16 * 300.0, 1).terms()]
    for call in calls:
        assert call(plain) == call(keyed)


def test_a_cpu_price_goes_through_the_effects(monkeypatch):
    doc = {**load_profile("cpu"), "kernels": CPU_KERNELS}
    m = CATALOG["small-qwen2"]
    on, off = CostModel(CPU, doc), CostModel(CPU, {**doc, "kernels": None})
    assert on.cpu is not None and off.cpu is None
    assert on.train(m, "float32", 512.0, 4.0).total_s > off.train(m, "float32", 512.0, 4.0).total_s  # width, faults
    assert on.decode_steps(m, "float32", 4, 4 * 64.0, 8).total_s > off.decode_steps(m, "float32", 4, 4 * 64.0, 8).total_s
    d = on.decoder(m, "float32")
    shape = fl.ShapeCoeffs.of(m, "float32", "lm")
    p = on.gen_params("decode", None)
    want = CpuHostEffects.of(doc).decode_factors(shape.decode_weight_bytes, 1, CPU.mem_bw * p.memory_eff)
    assert (d.cold, d.wp, d.ws) == want
    _raising(monkeypatch)
    with pytest.raises(AssertionError, match="CPU host code"):
        CostModel(CPU, doc).train(m, "float32", 512.0, 4.0)


def test_the_gpu_grids_schedule_no_cpu_only_sweep():
    for grid in (QUICK_GPU, FULL_GPU):
        assert cpu_only_sweeps(grid) == []
    assert set(cpu_only_sweeps(QUICK_CPU)) == set(CPU_ONLY_FIELDS) and cpu_only_sweeps(FULL_CPU) == cpu_only_sweeps(QUICK_CPU)
    assert cpu_only_sweeps(with_overrides(QUICK_GPU, {"widths": [512]})) == ["widths"]


@pytest.mark.hw
def test_the_fit_annotates_points_with_the_same_effects_on_a_cpu_only():
    pytest.importorskip("torch")
    from calibrate.fitting.assemble import with_tails

    m = CATALOG["small-qwen2"]
    shape = dataclasses.asdict(m)
    dec = {"op": "decode", "head": "lm", "dtype": "float32", "batch": 4, "prefix_len": 64, "shape": shape}
    train = {"op": "train", "head": "lm", "dtype": "float32", "batch": 4, "seq_len": 256, "tokens": 1024, "shape": shape}
    pts = [copy.deepcopy(dec), copy.deepcopy(train)]
    assert with_tails(pts, {}, CPU_KERNELS, "cuda") is pts                      # a GPU's fit: no CPU fields
    d, t = with_tails(pts, {}, CPU_KERNELS, "cpu")
    cpu = CpuHostEffects.of({"kernels": CPU_KERNELS}, "cpu")
    wbytes = fl.ShapeCoeffs.of(m, "float32", "lm").decode_weight_bytes
    assert d["cold_x"] == cpuhost.cold_factor(CPU_KERNELS["cold_overheads"], wbytes)
    assert d["gemm_weight_passes"] == cpuhost.passes_at(cpuhost.footprint_passes(cpu.by_footprint, 2.0, wbytes), 4)
    assert t["width_rate"] == cpu.body_rate(m) and t["fault_s"] == cpu.fault_s(4 * 256, m.vocab, "labels_train")


@pytest.mark.hw
def test_a_gpu_validation_lean_calibration_schedules_no_cpu_only_sweep():
    from calibrate.validation.calibration import _lean_roles
    from calibrate.validation.scenario import prepare

    prepared = [prepare(ROOT / "tests" / "fixtures" / "validate" / "tiny-sync.yaml", "cpu", 3, 1)]
    assert cpu_only_sweeps(with_overrides(QUICK_GPU, _lean_roles(prepared, QUICK_GPU))) == []
    assert {"gemm", "widths"} <= set(cpu_only_sweeps(with_overrides(QUICK_CPU, _lean_roles(prepared, QUICK_CPU))))

"""The host CPU of each GPU's server and the one factor on every host-side term (``rlhfsim.hardware.hosts``,
``rlhfsim.costs.hostscale``; issue 53), against numbers worked by hand."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from rlhfsim.costs.model import CostModel
from rlhfsim.costs.stepcosts import STEP_DEFAULTS
from rlhfsim.errors import ProfileError
from rlhfsim.hardware.catalog import GPUS, get_gpu
from rlhfsim.hardware.hosts import HOSTS, host_scale, scale_from_clock
from rlhfsim.models.catalog import load_model

ROOT = Path(__file__).resolve().parents[2]
PROFILE = json.loads((ROOT / "tests" / "fixtures" / "profiles" / "default.json").read_text())


def test_host_times_by_hand():
    # Golden Cove at 1/1.16 of Zen 5's IPC: tau = (1 / (3.8 x 0.862069) + 1 / (3.0 x 0.862069)) / 2 = 0.3459649
    assert HOSTS["xeon-8480"].tau == pytest.approx(0.3459649, rel=1e-6)
    # Zen 2 at 1 / (1.16 x 1.13 x 1.19) = 0.6410865: (1 / (3.4 x ...) + 1 / (3.2 x ...)) / 2 = 0.4731169
    assert HOSTS["epyc-7742"].tau == pytest.approx(0.4731169, rel=1e-6)
    assert host_scale("epyc-7742") == pytest.approx(0.4731169 / 0.3459649, rel=1e-6)   # 1.3675: DGX A100's host
    assert host_scale("grace") == pytest.approx(1 / (3.1 * 0.75) / 0.3459649, rel=1e-6)  # 1.2432
    assert host_scale("xeon-8480") == 1.0
    # this project's VM (Zen 5, 3.9 GHz) to the Xeon 8480C: 0.3459649 x 3.9 = 1.3492632 (docs/calibration.md: 1.35)
    assert scale_from_clock(3.9, "zen5") == pytest.approx(1.3492632, rel=1e-6)


def test_every_gpu_names_a_known_host():
    for g in GPUS.values():
        assert g.host_cpu in HOSTS or (g.kind == "cpu" and g.host_cpu == ""), g.name


def test_host_terms_scale_and_device_terms_do_not():
    doc = copy.deepcopy(PROFILE)   # with an engine's host work per step (the frozen fixture predates those keys)
    doc["generation"]["vllm"].update(step_host_s=8.7e-4, step_host_per_seq_s=2.83e-5, step_host_overlap=0.0)
    h100 = CostModel(get_gpu("h100-sxm"), doc)
    a100 = CostModel(get_gpu("a100-80gb"), doc)
    f = host_scale("epyc-7742")
    assert h100.host_factor == 1.0 and a100.host_factor == pytest.approx(f)
    # framework dispatch per layer, the engine's host work per step and sequence, a fitted per-call overhead, the
    # driver's advantage costs (defaults): all x f
    assert a100.host.train_per_layer_s == pytest.approx(h100.host.train_per_layer_s * f)
    assert a100.host.fsdp_per_unit_s == pytest.approx(h100.host.fsdp_per_unit_s * f)
    eh_a, eh_h = a100.engine_host("vllm"), h100.engine_host("vllm")
    assert eh_h.step_s > 0 and eh_a.step_s == pytest.approx(eh_h.step_s * f)
    assert eh_a.per_seq_s == pytest.approx(eh_h.per_seq_s * f) and eh_a.overlap == eh_h.overlap
    assert a100.ops["train"].overhead_s == pytest.approx(h100.ops["train"].overhead_s * f)
    assert a100.ops["decode:vllm_eager"].overhead_per_layer_s == pytest.approx(
        h100.ops["decode:vllm_eager"].overhead_per_layer_s * f)
    assert a100.step_scalar("adv_per_row_s") == pytest.approx(STEP_DEFAULTS["adv_per_row_s"] * f)
    # efficiencies and device copies are the accelerator's
    assert a100.ops["train"].compute_eff == h100.ops["train"].compute_eff
    assert a100.step_scalar("host_copy_eff") == h100.step_scalar("host_copy_eff")
    assert a100.step_scalar("kv_realloc_s") == h100.step_scalar("kv_realloc_s")
    # the profile as given is kept: a CostModel rebuilt from it (the interval's draws) prices the same
    again = CostModel(get_gpu("a100-80gb"), a100.profile)
    assert again.host.train_per_layer_s == a100.host.train_per_layer_s
    assert a100.profile is doc and doc["generation"]["vllm"]["step_host_s"] == 8.7e-4


def test_a_profile_states_its_reference_host():
    doc = copy.deepcopy(PROFILE)
    doc["host_cpu"] = "epyc-7742"   # host terms measured on a DGX A100
    assert CostModel(get_gpu("a100-80gb"), doc).host_factor == 1.0
    assert CostModel(get_gpu("h200"), doc).host_factor == pytest.approx(1 / host_scale("epyc-7742"))
    doc["host_cpu"] = "pentium"
    with pytest.raises(ProfileError, match=r"^profile\.host_cpu: expected one of .*got 'pentium'$"):
        CostModel(get_gpu("h200"), doc)


def test_a_cpu_device_is_its_own_host():
    cpu = json.loads((ROOT / "tests" / "fixtures" / "profiles" / "cpu.json").read_text())
    assert CostModel(get_gpu("cpu"), cpu).host_factor == 1.0


def test_a_launch_bound_piece_costs_more_on_a_slower_host():
    m = load_model("qwen2.5-0.5b")
    h100 = CostModel(get_gpu("h100-sxm"), PROFILE)
    gh200 = CostModel(get_gpu("gh200"), PROFILE)   # the same Hopper peaks, a Grace host
    small = dict(n_tokens=128, n_seqs=2)
    a = h100.framework_call(True, m, "bfloat16", **small)
    b = gh200.framework_call(True, m, "bfloat16", **small)
    assert a.host_s > a.device_s   # launch-bound: the host's dispatch sets the call
    assert b.host_s == pytest.approx(a.host_s * host_scale("grace"))

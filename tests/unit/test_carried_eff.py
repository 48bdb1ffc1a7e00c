"""A profile's efficiencies carried from the GPU they are stated for to another (``catalog.carried_compute_eff``,
``costs.model.with_stack_rate``, an overlay's inherited efficiencies in ``costs.profile.extend``; issue 53), against
numbers worked by hand."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from rlhfsim.costs import flops as fl
from rlhfsim.costs.model import CostModel, with_stack_rate
from rlhfsim.costs.profile import load_profile
from rlhfsim.errors import ProfileError
from rlhfsim.hardware.catalog import balance_ratio, carried_compute_eff, get_gpu, stack_factor
from rlhfsim.models.catalog import load_model

ROOT = Path(__file__).resolve().parents[2]
PROFILE = json.loads((ROOT / "tests" / "fixtures" / "profiles" / "default.json").read_text())


def test_balance_ratio_and_carried_efficiency_by_hand():
    # H20: (148e12 / 4.0e12) / (989e12 / 3.35e12) = 37 / 295.2239 = 0.125329
    assert balance_ratio("h20") == pytest.approx(0.125329, rel=1e-5)
    assert balance_ratio("h100-sxm") == 1.0
    # e_g = 794.5 / 989 = 0.803337 (MAMF, catalog.SUSTAINED); 1/e_g = 1.244808; 1/0.4 - 1/e_g = 1.255192;
    # H20's train: 1 / (1.244808 + 0.125329 x 1.255192) = 1 / 1.402120 = 0.713206
    assert carried_compute_eff(0.4, "h20") == pytest.approx(0.713206, rel=1e-5)
    assert carried_compute_eff(0.4, "h100-sxm") == pytest.approx(0.4)
    # an efficiency at the GEMM ceiling or above has no rest to carry: the stack alone
    assert carried_compute_eff(0.9, "h20") == 0.9
    # MI300X: the stack scales the GEMMs, the balance the rest
    sf = stack_factor("mi300x")
    want = 1 / (1 / (0.803337 * sf) + balance_ratio("mi300x") * (1 / 0.4 - 1 / 0.803337))
    assert carried_compute_eff(0.4, "mi300x") == pytest.approx(want, rel=1e-5)


def test_every_profile_is_carried_from_the_gpu_it_is_stated_for():
    h20 = get_gpu("h20")
    carried = with_stack_rate(PROFILE, h20)
    assert carried["operations"]["train"]["compute_eff"] == pytest.approx(carried_compute_eff(0.4, "h20"))
    assert carried["operations"]["train"]["memory_eff"] == PROFILE["operations"]["train"]["memory_eff"]
    assert "stated for h100-sxm carried to h20" in carried["provenance"]["source"]
    assert with_stack_rate(PROFILE, get_gpu("h100-sxm")) is PROFILE
    fitted = copy.deepcopy(PROFILE)
    fitted["gpu"] = "h20"           # efficiencies stated for the GPU itself: as they are there
    assert with_stack_rate(fitted, h20) is fitted
    # ... and carried from the H20 to an H100: rho = 1 / 0.125329; the rest of 0.7 on the H20,
    # 1/0.7 - 1/e_g = 1.428571 - 1.244808 = 0.183763, x 7.978977 = 1.466242; 1 / (1.244808 + 1.466242) = 0.368860
    fitted["operations"]["train"]["compute_eff"] = 0.7
    back = with_stack_rate(fitted, get_gpu("h100-sxm"))
    assert back["operations"]["train"]["compute_eff"] == pytest.approx(0.368860, rel=1e-5)
    assert balance_ratio("h100-sxm", "h20") == pytest.approx(1 / 0.125329, rel=1e-5)
    # there and back again: the same efficiency
    assert carried_compute_eff(carried_compute_eff(0.4, "h20"), "h100-sxm", "h20") == pytest.approx(0.4)
    # a family profile (stated for the H100, kernel terms by shape) priced for an H200: its training carried too
    # (rho = (989 / 4800) / (989 / 3350) = 0.697917; 1/0.35 - 1/e_g = 1.612335; 1 / (1.244808 + 1.125276) = 0.421926)
    family = {**copy.deepcopy(PROFILE), "gpu": "h100-sxm", "kernels_by_shape": {"applies_to": ["prefill"]}}
    family["operations"]["train"]["compute_eff"] = 0.35
    h200 = with_stack_rate(family, get_gpu("h200"))
    assert h200["operations"]["train"]["compute_eff"] == pytest.approx(0.421926, rel=1e-5)
    with pytest.raises(ProfileError, match=r"profile default.gpu: expected 'any', 'cpu' or a GPU"):
        with_stack_rate({**PROFILE, "gpu": "my-gpu"}, h20)


def test_a_profile_that_extends_another_inherits_its_efficiencies_carried(tmp_path):
    # the base states its efficiencies for the H100 (gpu: any); an overlay for the H20 inherits them as H20 ones
    (tmp_path / "base.json").write_text(json.dumps(PROFILE))
    (tmp_path / "over.json").write_text(json.dumps({"schema_version": 1, "name": "over", "gpu": "h20",
                                                    "extends": "base.json", "provenance": {"source": "test"},
                                                    "operations": {"prefill": {"compute_eff": 0.5}}}))
    doc = load_profile(str(tmp_path / "over.json"))
    assert doc["operations"]["train"]["compute_eff"] == pytest.approx(carried_compute_eff(0.4, "h20"))
    assert doc["operations"]["prefill"]["compute_eff"] == 0.5        # its own, as it states it
    assert doc["operations"]["train"]["memory_eff"] == PROFILE["operations"]["train"]["memory_eff"]
    # priced on the H20 the inherited efficiencies are what the base gives there; its own are not carried again
    on_h20 = with_stack_rate(doc, get_gpu("h20"))
    assert on_h20["operations"]["train"]["compute_eff"] == with_stack_rate(PROFILE, get_gpu("h20"))["operations"]["train"]["compute_eff"]
    assert on_h20["operations"]["prefill"]["compute_eff"] == 0.5


def test_a_compute_bound_pass_on_an_h20():
    cost = CostModel(get_gpu("h20"), with_stack_rate(PROFILE, get_gpu("h20")))
    m = load_model("qwen3-8b")
    w = fl.ShapeCoeffs.of(m, "bfloat16", "lm").train(32768, 16)
    total, active = cost.train(m, "bfloat16", 32768, 16)
    # compute-bound: F / (148e12 x 0.713206), plus the operation's host overheads
    assert active == pytest.approx(w.flops / (148e12 * carried_compute_eff(0.4, "h20")), rel=1e-9)

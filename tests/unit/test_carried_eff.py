"""A derived profile's efficiencies carried from the reference GPU to another (``catalog.carried_compute_eff``,
``costs.model.with_stack_rate``; issue 53), against numbers worked by hand."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from rlhfsim.costs import flops as fl
from rlhfsim.costs.model import CostModel, with_stack_rate
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


def test_only_a_derived_profile_is_carried():
    h20 = get_gpu("h20")
    carried = with_stack_rate(PROFILE, h20)
    assert carried["operations"]["train"]["compute_eff"] == pytest.approx(carried_compute_eff(0.4, "h20"))
    assert carried["operations"]["train"]["memory_eff"] == PROFILE["operations"]["train"]["memory_eff"]
    assert "carried to h20" in carried["provenance"]["source"]
    assert with_stack_rate(PROFILE, get_gpu("h100-sxm")) is PROFILE
    fitted = copy.deepcopy(PROFILE)
    fitted["gpu"] = "h20"           # efficiencies fitted on the GPU itself: as they are
    assert with_stack_rate(fitted, h20) is fitted


def test_a_compute_bound_pass_on_an_h20():
    cost = CostModel(get_gpu("h20"), with_stack_rate(PROFILE, get_gpu("h20")))
    m = load_model("qwen3-8b")
    w = fl.ShapeCoeffs.of(m, "bfloat16", "lm").train(32768, 16)
    total, active = cost.train(m, "bfloat16", 32768, 16)
    # compute-bound: F / (148e12 x 0.713206), plus the operation's host overheads
    assert active == pytest.approx(w.flops / (148e12 * carried_compute_eff(0.4, "h20")), rel=1e-9)

"""The driver's advantage step (``rlhfsim.costs.driver``; issue 53) against numbers worked by hand, and the importer's
choice of verl's code path by release."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhfsim.costs import driver
from rlhfsim.costs.driver import AdvantageCode, AdvantageCosts, advantage_parts
from rlhfsim.costs.stepcosts import ADV_HOST_SCALE, ADV_MEASURED_HERE, STEP_DEFAULTS
from rlhfsim.importers import ImportOptions
from rlhfsim.importers.verl import import_verl

ROOT = Path(__file__).resolve().parents[2]
C = AdvantageCosts(adv_per_op_s=2e-6, adv_per_strided_s=3e-9, adv_per_element_s=1e-9, adv_per_row_s=1e-5)


def test_gae_plain_and_masked_by_hand():
    # 5,120 rows padded to 1,024 positions (verl 0.3): loop 1,024 x 5 x (2e-6 + 5,120 x 3e-9) = 1,024 x 5 x 1.736e-5
    # = 0.0888832 s; passes 16 x 5,242,880 x 1e-9 = 0.08388608 s
    p = advantage_parts(C, AdvantageCode("plain"), 5120, 1024, gae=True)
    assert p["loop"] == pytest.approx(0.0888832) and p["passes"] == pytest.approx(0.08388608)
    assert "metrics" not in p
    # masked (verl >= 0.5): 13 ops and 22 passes: 1,024 x 13 x 1.736e-5 = 0.23109632; 22 x 5,242,880e-9 = 0.11534336
    q = advantage_parts(C, AdvantageCode("masked"), 5120, 1024, gae=True)
    assert q["loop"] == pytest.approx(0.23109632) and q["passes"] == pytest.approx(0.11534336)


def test_grpo_with_rollout_metrics_by_hand():
    # 128 rows padded to 8,192 (verl 0.9): rows 128 x 1e-5 = 1.28e-3; passes 2 x 1,048,576e-9 = 2.097152e-3;
    # metrics 41 x 1,048,576e-9 = 0.042991616 s
    p = advantage_parts(C, AdvantageCode("masked", rollout_metrics=True), 128, 8192, gae=False)
    assert p == pytest.approx({"loop": 1.28e-3, "passes": 2.097152e-3, "metrics": 0.042991616})
    # the GAE loop form does not enter GRPO
    assert advantage_parts(C, AdvantageCode("plain"), 128, 8192, gae=False)["loop"] == pytest.approx(1.28e-3)


def test_nothing_to_do_costs_nothing():
    assert advantage_parts(C, AdvantageCode(), 0, 1024, gae=True) == {}
    assert advantage_parts(C, AdvantageCode(), 16, 0, gae=False) == {}


def test_defaults_are_the_measurement_times_the_host_scale():
    for k, v in ADV_MEASURED_HERE.items():
        assert STEP_DEFAULTS[k] == pytest.approx(v * ADV_HOST_SCALE)
    assert set(ADV_MEASURED_HERE) == set(driver.ADV_SCALARS)


@pytest.mark.parametrize("version, loop, metrics", [("0.3", "plain", False), ("0.4", "plain", False),
                                                     ("0.5", "masked", False), ("0.8", "masked", False),
                                                     ("0.9", "masked", True), (None, "masked", True)])
def test_importer_picks_verls_code_by_release(version, loop, metrics):
    launch = ROOT / "scenarios" / "examples" / "verl-grpo.sh"
    opts = ImportOptions(gpu="h100-sxm", verl_version=version)
    adv = import_verl(launch.read_text(), opts, "verl-grpo.sh").scenario["execution"]["advantage"]
    assert adv == {"enabled": True, "gae_loop": loop, "rollout_metrics": metrics}


def test_calculate_log_probs_set_in_the_launch_decides_from_0_7():
    launch = (ROOT / "scenarios" / "examples" / "verl-grpo.sh").read_text().replace(
        "python3 -m verl.trainer.main_ppo", "python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.calculate_log_probs=True")
    for version, want in (("0.6", False), ("0.7", True)):
        res = import_verl(launch, ImportOptions(gpu="h100-sxm", verl_version=version), "x.sh")
        assert res.scenario["execution"]["advantage"]["rollout_metrics"] is want

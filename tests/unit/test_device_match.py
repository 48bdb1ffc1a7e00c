"""Which catalog entry a local device's name matches (``calibrate.measuring.device_info.matches``), for the
entries whose family names lie inside others (l4 / l40s, h20 / h200 / gh200) and the PCIe/SXM pairs."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from calibrate.measuring.device_info import matches  # noqa: E402
from rlhfsim.hardware.catalog import GPUS, GiB  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it

CASES = [
    ("NVIDIA L4", 24 * GiB, "l4"), ("NVIDIA L40S", 48 * GiB, "l40s"), ("NVIDIA H20", 96 * GiB, "h20"),
    ("NVIDIA H200", 141 * GiB, "h200"), ("NVIDIA GH200 480GB", 96 * GiB, "gh200"), ("NVIDIA H100 PCIe", 80 * GiB, "h100-pcie"),
    ("NVIDIA H100 80GB HBM3", 80 * GiB, "h100-sxm"), ("NVIDIA B200", 180 * GiB, "b200"),
    ("NVIDIA A10G", 24 * GiB, "a10g"), ("AMD Instinct MI300X", 192 * GiB, "mi300x"),
    ("NVIDIA A100-SXM4-80GB", 80 * GiB, "a100-80gb"), ("NVIDIA A100-SXM4-40GB", 40 * GiB, "a100-40gb"),
    ("NVIDIA GeForce RTX 4090", 24 * GiB, "rtx-4090"),
]


def test_other_rtx_cards_match_no_entry():
    for device in ("NVIDIA GeForce RTX 3090", "NVIDIA RTX A6000"):
        hits = [name for name, spec in GPUS.items() if spec.kind == "cuda" and matches(spec, device, 24 * GiB)]
        assert hits == [], device


@pytest.mark.parametrize("device,memory,want", CASES)
def test_device_matches_its_entry_only(device, memory, want):
    hits = [name for name, spec in GPUS.items() if spec.kind == "cuda" and matches(spec, device, memory)]
    assert hits == [want]

"""The schedule registry is the only list of schedules: the schema's union, the ``--compare`` choices,
the CLI help, the variant names and the test matrix are derived from it, and no source file restates
the names."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import get_args

from conftest import SCHEDULE_CONFIGS
from rlhfsim.plan.paths import _flatten
from rlhfsim.scenario.schema import Scenario
from rlhfsim.sim.schedules import SCHEDULES, VARIANT_OWNER, VARIANTS

ROOT = Path(__file__).resolve().parents[2]
QUOTE = "[\"']"


def test_schema_union_is_the_registry():
    members = _flatten(Scenario.model_fields["schedule"].annotation)
    assert members == [cls.Config for cls in SCHEDULES.values()]
    compare = Scenario.model_fields["compare"].annotation
    literal = _flatten(get_args(_flatten(compare)[0])[0])[0]
    assert get_args(literal) == VARIANTS


def test_variants_belong_to_one_schedule_each():
    assert len(VARIANTS) == len(set(VARIANTS))
    assert all(name in VARIANT_OWNER[name].variant_names() for name in VARIANTS)
    assert set(SCHEDULES) <= set(VARIANTS)


def test_test_matrix_covers_every_schedule():
    kinds = {cfg["kind"] for cfg in SCHEDULE_CONFIGS.values()}
    assert kinds == set(SCHEDULES)


def test_cli_help_lists_the_variants():
    r = subprocess.run([sys.executable, "-c", "from rlhfsim.cli import main; main()", "simulate", "-h"],
                       capture_output=True, text=True, timeout=60)
    text = " ".join(r.stdout.split())
    assert all(v in text for v in VARIANTS), r.stdout


def test_no_source_file_restates_the_schedule_names():
    """A line naming three or more registered schedules as string literals is a second list (the
    registry and schedule modules themselves excepted; benchmarks pin their own grids on purpose)."""
    names = list(SCHEDULES)
    offenders = []
    for top in ("rlhfsim", "calibrate", "tests"):
        for f in sorted((ROOT / top).rglob("*.py")):
            if "schedules" in f.parts or f.name == Path(__file__).name:
                continue
            for i, line in enumerate(f.read_text().splitlines(), 1):
                if sum(bool(re.search(QUOTE + n + QUOTE, line)) for n in names) >= 3:
                    offenders.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert not offenders, "\n".join(offenders)

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
from rlhfsim.scenario.paths import _flatten
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


def test_a_schedule_can_override_the_post_generation_pipeline():
    """``Schedule.after_generation`` is the pipeline the step runs: a schedule overriding it to run the
    reward, reference and critic passes at once (verl overlaps them when they sit on different pools)
    shortens the step when those roles have pools of their own, and keeps every row trained once."""
    import simpy

    from conftest import make_dict
    from rlhfsim.costs.model import CostModel
    from rlhfsim.scenario import build_setup, load_scenario
    from rlhfsim.sim import stages
    from rlhfsim.sim.simulation import Simulation

    class OverlappedPasses(SCHEDULES["sync"]):
        def after_generation(self, step, rows, streamed=()):
            sim = self.sim
            env, s = sim.env, sim.setup
            rows = sorted(rows, key=lambda r: r.id)
            passes = [env.process(stages.forward_pass(env, sim, step, role, rows))
                      for role in ("reward", "reference", "critic") if role in s.shapes]
            yield simpy.AllOf(env, passes)
            trains = [env.process(stages.train(env, sim, step, r, rows)) for r in ("actor", "critic") if r in s.shapes]
            yield simpy.AllOf(env, trains)
            yield from stages.weight_sync(env, sim, step)

    d = make_dict("gpu", {"cluster": {"gpus_per_node": 8}}, schedule="sync")
    d["placement"] = {"kind": "pools", "pools": [
        {"name": "train", "gpus": 4, "roles": ["actor", "critic", "rollout"]}, {"name": "ref", "gpus": 2, "roles": ["reference"]},
        {"name": "rm", "gpus": 2, "roles": ["reward"]}]}
    setup = build_setup(load_scenario(d))
    runs = {}
    for name, cls in (("sync", SCHEDULES["sync"]), ("overlapped", OverlappedPasses)):
        sim = Simulation(setup, CostModel.load(setup.gpu))
        sim.schedule = cls(sim, setup.scenario.schedule)
        runs[name] = sim.run(3)
    for a, b in zip(runs["sync"], runs["overlapped"]):
        assert sorted(a.trained_ids) == sorted(b.trained_ids)
        assert b.step_time_s < a.step_time_s

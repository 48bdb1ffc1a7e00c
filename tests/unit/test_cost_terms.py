"""The cost-term registry (rlhfsim.costs.terms) and the per-phase breakdown (rlhfsim explain)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from rlhfsim.cli import main
from rlhfsim.costs import terms as T
from rlhfsim.costs.framework import CallParts
from rlhfsim.scenario.loader import load_scenario, parse_set
from rlhfsim.sim.explain import explain

ROOT = Path(__file__).resolve().parents[2]
VERL = ROOT / "scenarios" / "verl-ppo.yaml"


def test_registry_names_are_unique_and_the_docs_table_is_generated_from_it():
    names = [t.name for t in T.TERMS]
    assert len(names) == len(set(names)) and all(t.devices in ("any", "gpu", "cpu") for t in T.TERMS)
    assert T.markdown() in (ROOT / "docs" / "reference" / "cost-terms.md").read_text()


def test_every_term_a_breakdown_returns_is_registered():
    produced = set(CallParts(1.0, 0.5, 0.1, 0.2, 0.01, 2.0).terms())
    produced |= {"framework_piece", "offload", "optimizer", "decode_kernels", "engine_step", "sampling_tail",
                 "interference", "reencode_prefix", "retokenize", "rule_reward", "advantage", "weight_sync"}
    produced |= {"logprob_tail_cpu", "page_faults", "width_rate", "gemm_footprint", "cold_overheads"}  # a CPU's
    assert produced <= set(T.BY_NAME) and T.WAITING not in T.BY_NAME   # waiting is not a cost term


def test_each_phase_is_the_sum_of_its_terms():
    sc = load_scenario(VERL, overrides=[parse_set("execution.sharding=fsdp"), parse_set("execution.entropy=true")])
    doc = explain(sc, steps=3)
    explained = {ph: e for ph, e in doc["phases"].items() if "terms_s" in e}
    assert {"old_log_prob", "reference", "critic_fwd", "actor_train", "critic_train"} <= set(explained)
    for ph, e in explained.items():
        assert sum(e["terms_s"].values()) == pytest.approx(e["span_s"], rel=1e-9), ph
    assert doc["phases"]["actor_train"]["terms_s"]["fsdp_exposed"] > 0
    d = doc["decode_step"]
    assert sum(d["terms_s"].values()) == pytest.approx(d["step_s"]) and d["batch"] >= 1


def test_terms_are_recorded_only_when_asked():
    from rlhfsim.sim.run import simulate
    assert "phase_terms_s" not in simulate(load_scenario(VERL), steps=2).summary


def test_cli_prints_the_breakdown():
    r = CliRunner().invoke(main, ["explain", str(VERL), "--steps", "2"])
    assert r.exit_code == 0, r.output
    assert "actor_train" in r.output and "kernels" in r.output and "decode steps; one of" in r.output
    bad = CliRunner().invoke(main, ["explain", str(VERL), "--set", "execution.sharding=zero9"])
    assert bad.exit_code == 2 and "execution.sharding" in bad.output

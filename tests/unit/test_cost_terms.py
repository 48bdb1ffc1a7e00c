"""The cost-term registry (rlhfsim.costs.terms) and the per-phase breakdown (rlhfsim explain)."""

from __future__ import annotations

import functools
import importlib
import pickle
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


def _registered(keys) -> bool:
    """Every key is the registry's own object (a plain string spelt like a term is not)."""
    return all(type(k) is T.CostTerm and T.BY_NAME.get(k) is k for k in keys)


@pytest.mark.parametrize("path, sets", [
    ("verl-ppo.yaml", ["execution.sharding=fsdp", "execution.entropy=true", "execution.advantage.enabled=true",
                       "execution.weight_sync.kind=reshard", "execution.offload.actor.param=true"]),
    ("oppo.yaml", []),                                        # a streamed reward model, generate() hand-overs
    ("validate/oppo-full.yaml", []),                          # a CPU: co-running interference, the CPU host effects
    ("validate/oppo-encoder-reencode.yaml", []),
    ("validate/grpo-retokenize.yaml", []),
    ("validate/sync-static.yaml", []),
])
def test_every_key_a_breakdown_returns_is_a_registry_object(path, sets):
    doc = explain(load_scenario(ROOT / "scenarios" / path, overrides=[parse_set(s) for s in sets]), steps=2)
    keys = [k for e in doc["phases"].values() for k in e.get("terms_s", {})] + list(doc["decode_step"]["terms_s"])
    assert keys and _registered(keys) and T.WAITING not in T.BY_NAME   # waiting is not a cost term
    assert _registered(CallParts(1.0, 0.5, 0.1, 0.2, 0.01, 2.0).terms())


def test_a_misspelt_term_fails_at_import_and_a_bad_row_at_registration():
    with pytest.raises(ImportError):
        exec("from rlhfsim.costs.terms import INTERFERENSE", {})
    assert T.INTERFERENCE == "interference" and T.term("interference") is T.INTERFERENCE
    with pytest.raises(KeyError, match="interferense"):
        T.term("interferense")
    with pytest.raises(ValueError, match="registered twice"):
        T._row("kernels", "", "", "any", "", "")
    with pytest.raises(ValueError, match="devices"):
        T.CostTerm("tpu_term", "", "", "tpu", "", "")
    assert all(getattr(T, t.name.upper()) is t for t in T.TERMS)   # each row's constant is its name
    assert pickle.loads(pickle.dumps({T.KERNELS: 1.0})) == {"kernels": 1.0} and \
        next(iter(pickle.loads(pickle.dumps({T.KERNELS: 1.0})))) is T.KERNELS


def test_each_term_names_code_that_exists():
    def resolve(path):
        parts, obj = path.split("."), None
        for i, part in enumerate(parts):   # the longest importable module, then attributes of it
            try:
                obj = importlib.import_module(".".join(parts[:i + 1]))
            except ImportError:
                assert obj is not None, path
                return functools.reduce(getattr, parts[i:], obj)
        return obj

    for t in T.TERMS:
        for path in t.module.split(", "):
            assert resolve(path) is not None, (t, path)


def test_each_phase_is_the_sum_of_its_terms():
    sc = load_scenario(VERL, overrides=[parse_set("execution.sharding=fsdp"), parse_set("execution.entropy=true")])
    doc = explain(sc, steps=3)
    explained = {ph: e for ph, e in doc["phases"].items() if "terms_s" in e}
    assert {"old_log_prob", "reference", "critic_fwd", "actor_train", "critic_train"} <= set(explained)
    for ph, e in explained.items():
        assert sum(e["terms_s"].values()) == pytest.approx(e["span_s"], rel=1e-9), ph
    assert doc["phases"]["actor_train"]["terms_s"][T.FSDP_EXPOSED] > 0
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

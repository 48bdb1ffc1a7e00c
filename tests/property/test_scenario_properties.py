"""Bad scenarios never raise anything but the clean error.

A valid scenario mapping is mutated at random (keys dropped, values replaced by wrong types, negative,
huge, NaN or random strings, unknown keys added, whole blocks swapped for scalars); loading it either
succeeds or raises an RlhfsimError whose message is one line naming a YAML path. A mutated scenario
that loads must also simulate (a couple of steps), again raising nothing but RlhfsimError.
"""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import SCHEDULE_CONFIGS
from rlhfsim.errors import RlhfsimError, ScenarioError
from rlhfsim.scenario import load_scenario
from rlhfsim.sim.run import simulate

BAD_VALUES = st.one_of(
    st.none(), st.booleans(),
    st.integers(-10, 10), st.sampled_from([0, -1, 10**9, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, -2.5, 1e-300, float("nan")]),
    st.text(max_size=12), st.sampled_from(["", "kind", "pools", "model", "rule", "fixed", "\n", "oppo"]),
    st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.just({"kind": "fixed", "value": 3}), st.just({"kind": "pools", "pools": []}),
)


def _paths(node, prefix=()):
    """Every (path, value) in a nested mapping/list, parents before children."""
    out = [(prefix, node)]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, prefix + (i,))
    return out


@st.composite
def mutated(draw, make):
    d = make(draw(st.sampled_from(["gpu", "colocated", "cpu"])), schedule=draw(
        st.sampled_from(list(SCHEDULE_CONFIGS))))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p, _ in _paths(d) if p]
        path = draw(st.sampled_from(paths))
        parent = d
        for k in path[:-1]:
            parent = parent[k]
        op = draw(st.sampled_from(["replace", "replace", "drop", "add_key", "negate", "scale"]))
        key = path[-1]
        if op == "drop" and isinstance(parent, dict):
            parent.pop(key)
        elif op == "add_key" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = copy.deepcopy(draw(BAD_VALUES))
        elif op == "negate" and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
            parent[key] = -parent[key]
        elif op == "scale" and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
            parent[key] = parent[key] * draw(st.sampled_from([0, 2, 100, 0.5, 1e6]))
        else:
            parent[key] = copy.deepcopy(draw(BAD_VALUES))  # st.just shares one object between draws
    return d


def _small_enough(sc) -> bool:
    """Mutations may produce valid but enormous scenarios (10^9 prompts, 10^12 GPUs per node: the schema
    has no upper bounds there); those load but are not run."""
    w = sc.workload
    return (sc.workload.prompts_per_step * sc.algorithm.group_size <= 256 and w.max_response_tokens <= 4096
            and w.max_prompt_tokens <= 4096 and sc.generation.max_batch <= 4096
            and sc.cluster.nodes * sc.cluster.gpus_per_node <= 64 and (sc.generation.replicas or 0) <= 64)


def _assert_clean(e: RlhfsimError) -> None:
    msg = str(e)
    assert msg and "\n" not in msg, repr(msg)
    if isinstance(e, ScenarioError) and e.path:
        assert msg.startswith(e.path + ": ")


@given(data=st.data())
def test_mutated_scenarios_fail_cleanly_or_run(data, scenario_dict):
    d = data.draw(mutated(scenario_dict))
    original = copy.deepcopy(d)
    try:
        sc = load_scenario(d)
    except RlhfsimError as e:
        _assert_clean(e)
        return
    assert d == original or any(isinstance(v, float) and math.isnan(v) for _, v in _paths(d))
    if not _small_enough(sc):
        return
    try:
        res = simulate(sc, steps=2)
    except RlhfsimError as e:
        _assert_clean(e)
        return
    assert len(res.steps) == 2
    assert all(r.step_time_s >= 0 for r in res.steps)


@pytest.mark.parametrize("value", [None, True, -1, 0, 10**12, 1e300, float("nan"), float("inf"), "x", [], {}])
@pytest.mark.parametrize("path", [("steps",), ("workload", "prompts_per_step"), ("generation", "max_batch"),
                                  ("cluster", "gpus_per_node"), ("models", "actor", "model"),
                                  ("workload", "response_length", "median"), ("placement", "reward_gpus")])
def test_single_bad_values(path, value, scenario_dict):
    d = scenario_dict("gpu")
    node = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    try:
        sc = load_scenario(d)
    except RlhfsimError as e:
        _assert_clean(e)
        return
    if _small_enough(sc):
        simulate(sc, steps=2)

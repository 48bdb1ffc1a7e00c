"""Counts and articles in output lines: "1 GPU", "a decoder" (issue 54's "1 GPUs", "an decoder")."""

from __future__ import annotations

import pytest

from rlhfsim.errors import ScenarioError
from rlhfsim.scenario import load_scenario
from rlhfsim.words import article, count


def test_count_and_article():
    assert [count(1, "GPU"), count(8, "GPU"), count(0, "GPU")] == ["1 GPU", "8 GPUs", "0 GPUs"]
    assert [article("decoder"), article("encoder")] == ["a decoder", "an encoder"]


def test_a_one_gpu_pool_reads_as_one_gpu(scenario_dict):
    d = scenario_dict()
    d["placement"] = {"kind": "pools", "tp": {"actor": 2}, "pools": [
        {"name": "a", "gpus": 1, "roles": ["actor", "critic", "reference"]},
        {"name": "b", "gpus": 3, "roles": ["reward"]}]}
    d["cluster"] = {**d["cluster"], "nodes": 1, "gpus_per_node": 4}
    with pytest.raises(ScenarioError) as ei:
        load_scenario(d)
    assert "dividing the 1 GPU of pool 'a'" in str(ei.value)


def test_a_decoder_reward_models_streaming_default_reads_a_decoder():
    from pathlib import Path

    from rlhfsim.sim.run import simulate

    root = Path(__file__).resolve().parents[2]
    summary = simulate(load_scenario(root / "scenarios" / "oppo.yaml"), steps=2).summary
    rs = summary["reward_scoring"]
    assert rs["arch"] == "decoder" and rs["streaming_source"].startswith("default for a decoder")

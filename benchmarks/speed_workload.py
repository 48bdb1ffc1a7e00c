"""The step the speed benchmarks time (``sim_speed.py``) and simulate again per iteration (``periter_peer.py``):
synchronous GRPO on one node of 8 H100-SXM, Qwen2.5-7B actor, reference and reward model colocated, continuous
batching (at most 256 sequences per engine), 512-token prompts, response lengths lognormal with median 600 and
p99 8,000 tokens capped at 16,384. One module both import, so that neither imports the other."""

from __future__ import annotations

from rlhfsim.costs.model import CostModel
from rlhfsim.scenario import load_scenario
from rlhfsim.scenario.checks import build_setup
from rlhfsim.sim.simulation import Simulation

GROUP = 8


def scenario(rollouts: int, steps: int = 1) -> dict:
    return {
        "name": f"speed-{rollouts}",
        "models": {"actor": {"model": "qwen2.5-7b"}, "reference": {"model": "qwen2.5-7b"},
                   "reward": {"model": "qwen2.5-7b"}},
        "cluster": {"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 8},
        "placement": {"kind": "colocated"},
        "algorithm": {"kind": "grpo", "group_size": GROUP, "minibatch_size": 256},
        "workload": {"prompts_per_step": rollouts // GROUP,
                     "prompt_length": {"kind": "fixed", "value": 512}, "max_prompt_tokens": 1024,
                     "response_length": {"kind": "lognormal", "median": 600, "p99": 8000},
                     "max_response_tokens": 16384},
        "generation": {"engine": "continuous", "max_batch": 256},
        "schedule": {"kind": "sync"},
        "steps": steps,
        "warmup_steps": 0,
        "seed": 0,
    }


def build(rollouts: int, steps: int = 1) -> Simulation:
    setup = build_setup(load_scenario(scenario(rollouts, steps)))
    return Simulation(setup, CostModel.load(setup.gpu))


def workload(rollouts: int):
    """(setup, cost, lengths): the lengths the simulation's own stream draws for step 0."""
    sim = build(rollouts)
    lengths = [(r.prompt_len, r.response_len) for r in sim.stream.take(sim.setup.rollouts_per_step, 0)]
    return sim.setup, sim.cost, lengths

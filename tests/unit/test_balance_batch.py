"""verl's balance_batch over data-parallel ranks (``rlhfsim.sim.balance``, ``execution.balance_batch``; issue 53),
against a partition worked by hand, in the simulator and in the importer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import make_dict
from rlhfsim.importers import ImportOptions
from rlhfsim.importers.verl import import_verl
from rlhfsim.scenario import load_scenario
from rlhfsim.sim.balance import balanced_ranks
from rlhfsim.sim.run import simulate

ROOT = Path(__file__).resolve().parents[2]
PROFILE = str(ROOT / "tests" / "fixtures" / "profiles" / "default.json")


def test_balanced_ranks_by_hand():
    tokens = np.array([10, 9, 8, 7, 1, 1, 1, 1])
    # longest first to the lightest rank with room (4 rows each): r0 10, 7, 1, 1 = 19; r1 9, 8, 1, 1 = 19;
    # each ordered by length, even positions up then odd positions down: r0 [4, 3, 0, 6], r1 [5, 2, 1, 7]
    r0, r1 = balanced_ranks(tokens, 2)
    assert r0.tolist() == [4, 3, 0, 6] and r1.tolist() == [5, 2, 1, 7]
    assert balanced_ranks(tokens, 1)[0].tolist() == list(range(8))
    rng = np.random.default_rng(0)
    t = rng.lognormal(7, 0.7, 130).astype(np.int64) + 1
    parts = balanced_ranks(t, 4)
    assert sorted(np.concatenate(parts).tolist()) == list(range(130))      # every row once
    assert [len(p) for p in parts] == [33, 33, 32, 32]
    sums = [int(t[p].sum()) for p in parts]
    assert max(sums) - min(sums) <= t.max()


def _grpo(balance: bool, lengths: dict, prompts: dict | None = None) -> dict:
    d = make_dict("gpu", {"execution": {"old_log_prob": True, "balance_batch": balance,
                                        "micro_batch": {"use_remove_padding": True, "use_dynamic_bsz": True,
                                                        "ppo_max_token_len_per_gpu": 4096}}, "steps": 2})
    d["models"].pop("critic", None)
    d["models"]["actor"] = d["models"]["reference"] = {"model": "qwen2.5-7b"}   # device-bound passes
    d["algorithm"] = {"kind": "grpo", "group_size": 4, "minibatch_size": 16}
    d["workload"]["response_length"] = lengths
    if prompts is not None:
        d["workload"]["prompt_length"] = prompts
    return d


def test_balanced_shares_never_slower_and_equal_lengths_unchanged():
    tail = {"kind": "lognormal", "median": 200, "p99": 1500}
    off = simulate(load_scenario(_grpo(False, tail)), profile=PROFILE)
    on = simulate(load_scenario(_grpo(True, tail)), profile=PROFILE)
    for ph in ("old_log_prob", "actor_train"):
        assert on.summary["phases_s"][ph] < off.summary["phases_s"][ph], ph
    same, prompt = {"kind": "fixed", "value": 128}, {"kind": "fixed", "value": 64}   # every row alike
    a = simulate(load_scenario(_grpo(False, same, prompt)), profile=PROFILE)
    b = simulate(load_scenario(_grpo(True, same, prompt)), profile=PROFILE)
    assert a.summary["phases_s"]["old_log_prob"] == pytest.approx(b.summary["phases_s"]["old_log_prob"], rel=1e-12)


@pytest.mark.parametrize("version, want", [("0.2", False), ("0.3", True), ("0.9", True), (None, True)])
def test_importer_maps_balance_batch_by_release(version, want):
    launch = (ROOT / "scenarios" / "examples" / "verl-grpo.sh").read_text()
    res = import_verl(launch, ImportOptions(gpu="h100-sxm", verl_version=version), "verl-grpo.sh")
    assert res.scenario["execution"]["balance_batch"] is want
    off = launch.replace("python3 -m verl.trainer.main_ppo", "python3 -m verl.trainer.main_ppo trainer.balance_batch=False")
    assert import_verl(off, ImportOptions(gpu="h100-sxm", verl_version=version), "x.sh").scenario[
        "execution"]["balance_batch"] is False

"""`rlhfsim import verl` of the async recipes (one_step_off_policy, fully_async_policy): separate pools, the async
schedule, the nccl weight sync, a fully_async step as one sync period; unknown keys stay listed; bad values name the
setting. The launches are the published pairs' (scenarios/examples/async-pairs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhfsim.importers import ImportError_, ImportOptions, import_verl
from rlhfsim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
PAIRS = ROOT / "scenarios" / "examples" / "async-pairs"


def _import(name: str, text: str | None = None, **kw):
    path = PAIRS / f"{name}.sh"
    opts = ImportOptions(**{"gpu": "h20", "mean_response_len": 1000, **kw})
    return import_verl(path.read_text() if text is None else text, opts, str(path.relative_to(ROOT)))


def _setting(res, key):
    return next(s for s in res.settings if s.key == key)


def test_one_step_off_maps_to_two_pools_and_one_step_of_staleness():
    res = _import("osp-async-4-12")
    sc = res.scenario
    assert sc["cluster"] == {"gpu": "h20", "nodes": 2, "gpus_per_node": 8}
    assert [(p["name"], p["gpus"], p["roles"]) for p in sc["placement"]["pools"]] == [
        ("train", 12, ["actor"]), ("rollout", 4, ["rollout"])]
    assert sc["placement"]["tp"]["rollout"] == 2
    assert sc["schedule"] == {"kind": "async", "max_staleness": 1}
    assert sc["execution"]["weight_sync"] == {"kind": "nccl"}
    assert sc["execution"]["old_log_prob"] is True          # one_step_off recomputes them (the doc's old_log_prob)
    assert sc["workload"]["prompts_per_step"] == 512
    for k in ("rollout.nnodes", "rollout.n_gpus_per_node", "trainer.nnodes", "trainer.n_gpus_per_node",
              "actor_rollout_ref.hybrid_engine"):
        s = _setting(res, k)
        assert s.status == "mapped" and "pool" in s.target, (k, s)
    load_scenario(sc)


def test_its_colocated_pair_stays_sync_and_colocated():
    # the pair's on-policy launch names the recipe in a comment only: that is not a recipe launch
    sc = _import("osp-colocate-16").scenario
    assert sc["placement"]["kind"] == "colocated" and sc["schedule"] == {"kind": "sync"}
    assert sc["execution"]["weight_sync"]["kind"] == "reshard"


def test_fully_async_step_is_one_sync_period():
    res = _import("fa-async-16-16")
    sc = res.scenario
    assert sc["workload"]["prompts_per_step"] == 4 * 4 * 32   # trigger x require_batches x ppo_mini_batch_size
    assert sc["schedule"] == {"kind": "async", "max_staleness": 1}   # ceil(0.5)
    assert [p["gpus"] for p in sc["placement"]["pools"]] == [16, 16]
    assert sc["cluster"]["nodes"] == 4
    assert sc["execution"]["old_log_prob"] is False   # use_rollout_log_probs
    assert _setting(res, "async_training.partial_rollout").status == "unmapped"
    assert _setting(res, "async_training.staleness_threshold").status == "mapped"
    assert any("streaming" in a for a in res.assumptions)
    load_scenario(sc)


@pytest.mark.parametrize("thr,k", [(0, 0), (0.1, 1), (1, 1), (2.5, 3), (8, 8)])
def test_staleness_threshold_to_whole_steps(thr, k):
    text = (PAIRS / "fa-async-16-16.sh").read_text().replace(
        "async_training.staleness_threshold=0.5", f"async_training.staleness_threshold={thr}")
    assert _import("fa-async-16-16", text).scenario["schedule"]["max_staleness"] == k


def test_unknown_async_key_stays_listed():
    text = (PAIRS / "fa-async-16-16.sh").read_text().replace(
        "async_training.require_batches=4", "async_training.require_batches=4 \\\n    async_training.new_knob=3")
    s = _setting(_import("fa-async-16-16", text), "async_training.new_knob")
    assert s.status == "unmapped" and s.target == "not recognised by the importer"


def test_compute_prox_log_prob_brings_the_pass_back():
    text = (PAIRS / "fa-async-16-16.sh").read_text().replace(
        "async_training.use_rollout_log_probs=True", "async_training.compute_prox_log_prob=True")
    assert _import("fa-async-16-16", text).scenario["execution"]["old_log_prob"] is True


@pytest.mark.parametrize("old,new,key", [
    ("async_training.staleness_threshold=0.5", "async_training.staleness_threshold=-1",
     "async_training.staleness_threshold"),
    ("rollout.n_gpus_per_node=8", "rollout.n_gpus_per_node=5", "rollout.n_gpus_per_node"),   # not whole TP-4 engines
    ("actor_rollout_ref.hybrid_engine=False", "actor_rollout_ref.hybrid_engine=True", "actor_rollout_ref.hybrid_engine"),
    ("async_training.require_batches=4", "async_training.require_batches=0", "async_training.require_batches"),
])
def test_bad_values_name_the_setting(old, new, key):
    text = (PAIRS / "fa-async-16-16.sh").read_text()
    assert old in text
    with pytest.raises(ImportError_) as e:
        _import("fa-async-16-16", text.replace(old, new))
    assert str(e.value).startswith(key), str(e.value)

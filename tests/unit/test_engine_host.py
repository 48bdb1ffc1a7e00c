"""The engine's host work per step (``generation[RT].step_host_s``, ``step_host_per_seq_s``, ``step_host_overlap``) and
the CUDA-graph limit (``graph_max_batch``, ``eager_runtime``): a decode step composed by hand, the closed-form segment
against a loop over its steps, both clocks alike, the terms ``explain`` shows, and the V0/V1 runtimes a verl launch
gets (rlhfsim.costs.genruntimes, rlhfsim.costs.model._Decode, rlhfsim.importers.verl)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from rlhfsim.costs import terms as T
from rlhfsim.costs.genruntimes import EngineHost, engine_host
from rlhfsim.costs.model import CostModel, _sum_max_linear, decode_sum
from rlhfsim.costs.profile import load_profile, validate_profile
from rlhfsim.errors import ProfileError
from rlhfsim.hardware.catalog import GPUS
from rlhfsim.importers import ImportOptions, import_verl
from rlhfsim.models.catalog import CATALOG
from rlhfsim.scenario.loader import load_scenario
from rlhfsim.sim.engines.base import Engine
from rlhfsim.sim.explain import explain
from rlhfsim.sim.run import simulate

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "tests" / "fixtures" / "profiles" / "default.json"   # the frozen default: no host keys, no graph limits
H100 = GPUS["h100-sxm"]
M = CATALOG["qwen2.5-0.5b"]
H0, H1 = 1.0e-3, 30e-6   # a step's host work: 1 ms + 30 us per running sequence


def _profile(**keys) -> dict:
    """The bundled default profile with ``keys`` set on ``generation[RT]`` (RT -> {key: value})."""
    doc = copy.deepcopy(load_profile(str(BASE)))
    for rt, kv in keys.items():
        doc["generation"].setdefault(rt, {}).update(kv)
    return doc


def test_without_the_keys_a_step_is_priced_as_before():
    plain = CostModel(H100, load_profile(str(BASE)))
    assert engine_host("vllm", plain.generation) == EngineHost() and not EngineHost().any
    keyed = CostModel(H100, _profile(vllm={"step_host_s": 0.0, "step_host_per_seq_s": 0.0}))
    for rt in ("vllm", "vllm_eager", "sglang"):
        for b in (1, 64, 700):
            assert keyed.decoder(M, "bfloat16", 1, runtime=rt).coeffs(b, b * 300.0) == \
                plain.decoder(M, "bfloat16", 1, runtime=rt).coeffs(b, b * 300.0)


def test_serial_host_work_adds_h0_plus_h1_per_running_sequence():
    plain = CostModel(H100, load_profile(str(BASE)))
    cost = CostModel(H100, _profile(vllm={"step_host_s": H0, "step_host_per_seq_s": H1}))
    for b in (1, 64, 256):
        base = decode_sum(plain.decoder(M, "bfloat16", 1, runtime="vllm").coeffs(b, b * 200.0), 1)[0]
        got = decode_sum(cost.decoder(M, "bfloat16", 1, runtime="vllm").coeffs(b, b * 200.0), 1)[0]
        assert got == pytest.approx(base + H0 + H1 * b, rel=1e-12)


def test_the_hidden_share_is_a_floor_under_the_device():
    # phi = 0.8: a step costs (1 - phi) H + max(device, phi H); at 256 rows phi H = 6.9 ms outlasts a 0.5B's device work
    cost = CostModel(H100, _profile(sglang={"step_host_s": H0, "step_host_per_seq_s": H1, "step_host_overlap": 0.8}))
    for m, b, kv0, host_bound in ((CATALOG["qwen2.5-7b"], 4, 4 * 100.0, False), (M, 256, 256 * 300.0, True)):
        d = cost.decoder(m, "bfloat16", 1, "sglang")
        c0, _, u0, _ = d._lines(b, kv0)
        device, h = max(c0, u0), H0 + H1 * b
        want = 0.2 * h + max(device, 0.8 * h) + d.over + d.tail0 + d.tail_row * b
        assert decode_sum(d.coeffs(b, kv0, None), 1)[0] == pytest.approx(want, rel=1e-12)
        assert (0.8 * h > device) == host_bound   # a 7B's 4 rows hide the host work; a 0.5B's 256 rows do not
        terms = d.price(b, kv0, 1).terms()
        assert sum(terms.values()) == pytest.approx(want, rel=1e-12)
        assert terms[T.ENGINE_HOST] == pytest.approx(0.2 * h + max(0.8 * h - device, 0.0), rel=1e-12)


def test_a_batch_past_the_graph_limit_pays_the_eager_launch_floor():
    cost = CostModel(H100, _profile(vllm={"graph_max_batch": 512, "eager_runtime": "vllm_eager"}))
    d = cost.decoder(M, "bfloat16", 1, "vllm")
    floor = cost.ops["decode:vllm_eager"].overhead_per_layer_s * M.layers   # 0.64 ms x 24 layers
    assert d.launch_floor(512) == 0.0 and d.launch_floor(513) == pytest.approx(floor)
    for b in (512, 513):
        c0, _, u0, _ = d._lines(b, b * 150.0)
        lf = floor if b > 512 else 0.0
        want = max(c0, u0, lf) + d.over + d.tail0 + d.tail_row * b
        assert decode_sum(d.coeffs(b, b * 150.0, None), 1)[0] == pytest.approx(want, rel=1e-12)
        assert d.price(b, b * 150.0, 1).terms()[T.HOST_LAUNCH_BOUND] == pytest.approx(max(lf - max(c0, u0), 0.0))
    import numpy as np   # the arrays the detached clock prices agree with the scalars, bit for bit
    arr = d.coeffs(np.array([512, 513]), np.array([512 * 150.0, 513 * 150.0]), None)
    for i, b in enumerate((512, 513)):
        assert tuple(float(x[i]) if hasattr(x, "__len__") else float(x) for x in arr) == d.coeffs(b, b * 150.0, None)


def test_a_segment_is_its_steps_summed_and_its_terms_too():
    cost = CostModel(H100, _profile(vllm_eager={"step_host_s": H0, "step_host_per_seq_s": H1, "step_host_overlap": 0.5}))
    d = cost.decoder(M, "bfloat16", 1, "vllm_eager")
    for b, kv0, n in ((8, 8 * 700.0, 300), (200, 200 * 100.0, 57)):
        p = d.price(b, kv0, n)
        price, terms = p.total_s, p.terms()
        steps = [decode_sum(d.coeffs(b, kv0 + i * b, None), 1)[0] for i in range(n)]
        # the floors folded into the compute line's intercept add its growth cs x i on top of them: under a microsecond
        # a step here (rlhfsim.costs.model._Decode), the one difference from stepping
        assert price == pytest.approx(sum(steps), rel=1e-4) and price >= sum(steps)
        assert sum(terms.values()) == pytest.approx(price, rel=1e-12) and set(terms) <= set(T.BY_NAME)
        by_step: dict = {}
        for i in range(n):
            for k, v in d.price(b, kv0 + i * b, 1).terms().items():
                by_step[k] = by_step.get(k, 0.0) + v
        for k in (T.ENGINE_HOST, T.HOST_LAUNCH_BOUND, T.ENGINE_STEP, T.SAMPLING_TAIL):
            assert terms.get(k, 0.0) == pytest.approx(by_step.get(k, 0.0), rel=1e-4, abs=1e-9), k
    c0, cs, u0, us = d._lines(8, 8 * 700.0)   # the closed form is the series of max(...) it claims
    assert _sum_max_linear(c0, cs, u0, us, 10) == pytest.approx(sum(max(c0 + cs * i, u0 + us * i) for i in range(10)))


def _scenario(runtime: str, max_batch: int = 64) -> dict:
    return {"name": "host", "models": {"actor": {"model": "qwen2.5-0.5b"}, "reward": {"kind": "rule"}},
            "cluster": {"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 2}, "placement": {"kind": "colocated"},
            "algorithm": {"kind": "grpo", "group_size": 4, "minibatch_size": 64},
            "workload": {"prompts_per_step": 64, "prompt_length": {"kind": "fixed", "value": 100},
                         "response_length": {"kind": "lognormal", "median": 150, "p99": 600}, "max_prompt_tokens": 128,
                         "max_response_tokens": 700},
            "generation": {"engine": "continuous", "runtime": runtime, "max_batch": max_batch},
            "schedule": {"kind": "sync"}, "steps": 3, "warmup_steps": 1, "seed": 0}


def test_both_clocks_agree_and_explain_names_the_term(tmp_path, monkeypatch):
    path = tmp_path / "host.json"
    path.write_text(json.dumps(_profile(vllm={"step_host_s": H0, "step_host_per_seq_s": H1, "step_host_overlap": 0.3,
                                              "graph_max_batch": 48, "eager_runtime": "vllm_eager"})))
    sc = load_scenario(_scenario("vllm"))
    detached = simulate(sc, profile=str(path)).summary
    monkeypatch.setattr(Engine, "DETACH", False)
    event = simulate(sc, profile=str(path)).summary
    monkeypatch.setattr(Engine, "DETACH", True)
    assert detached["step_time_s"] == event["step_time_s"] and detached["phases_s"] == event["phases_s"]
    assert detached["generation_runtime"]["engine_host"]["per_seq_s"] == H1
    plain = simulate(sc, profile=str(BASE)).summary
    assert detached["phases_s"]["generate"] > plain["phases_s"]["generate"]
    doc = explain(sc, profile=str(path), steps=3)
    terms = doc["phases"]["generate"]["terms_s"]
    assert terms[T.ENGINE_HOST] > 0 and terms[T.HOST_LAUNCH_BOUND] > 0   # 128 rows a replica: past the limit of 48
    assert sum(terms.values()) + doc["phases"]["generate"].get("waiting_s", 0.0) == pytest.approx(
        doc["phases"]["generate"]["span_s"], rel=1e-9)
    assert T.ENGINE_HOST in doc["decode_step"]["terms_s"]


def test_the_profile_keys_are_checked():
    for bad, msg in (({"step_host_per_seq_s": -1e-6}, "step_host_per_seq_s: expected a finite number of seconds"),
                     ({"step_host_overlap": 1.5}, r"step_host_overlap: expected a share in \[0, 1\]"),
                     ({"graph_max_batch": 0, "eager_runtime": "vllm_eager"}, "graph_max_batch: expected a whole number"),
                     ({"graph_max_batch": 512}, "eager_runtime: expected the runtime")):
        with pytest.raises(ProfileError, match=msg):
            validate_profile(_profile(vllm=bad))


# --- the V0 and V1 engines of a verl launch -----------------------------------------------------------------------
LAUNCH = """{env}python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo data.train_batch_size=64 \\
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct actor_rollout_ref.rollout.n=4 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=16 trainer.n_gpus_per_node=2 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 {extra}
"""


def _runtime(env: str = "", extra: str = "", version: str | None = None) -> str:
    res = import_verl(LAUNCH.format(env=env, extra=extra), ImportOptions(gpu="h100-sxm", verl_version=version))
    return res.scenario["generation"]["runtime"], res.assumptions


@pytest.mark.parametrize("env, version, eager, want", [
    ("", None, False, "vllm"),                                                   # today's verl: V1, CUDA graphs
    ("", "0.2", True, "vllm_v0_eager"),                                          # vLLM 0.6.3: V0 only
    ("", "0.4", True, "vllm_eager"),                                             # vLLM 0.8: V1 by default
    ("export VLLM_ATTENTION_BACKEND=XFORMERS\n", "0.3", True, "vllm_v0_eager"),  # V1 lacks xformers: falls back to V0
    ("export VLLM_ATTENTION_BACKEND=FLASH_ATTN\n", "0.3", True, "vllm_eager"),
    ("VLLM_USE_V1=1 ", "0.2", False, "vllm"),                                    # an explicit choice wins
    ("export VLLM_USE_V1=0\n", "0.6", False, "vllm_v0"),
])
def test_the_importer_chooses_v0_or_v1_by_release_and_environment(env, version, eager, want):
    got, assumptions = _runtime(env, f"actor_rollout_ref.rollout.enforce_eager={eager} actor_rollout_ref.rollout.mode=sync",
                                version)
    assert got == want
    assert any(a.startswith(f"vLLM engine {'V0' if 'v0' in want else 'V1'}") for a in assumptions)
    # the async server mode (verl's default from v0.7.0) is vLLM's V1 AsyncLLM whatever the environment says
    got, assumptions = _runtime(env, f"actor_rollout_ref.rollout.enforce_eager={eager} actor_rollout_ref.rollout.mode=async",
                                version)
    assert got == want.replace("_v0", "") and any(a.startswith("rollout.mode=async") for a in assumptions)


def test_a_v0_runtime_is_priced_as_its_v1_twin_but_not_its_host_work():
    cost = CostModel(H100, _profile(vllm_eager={"step_host_s": H0}))
    assert cost.gen_params("decode", "vllm_v0_eager") == cost.ops["decode:vllm_eager"]
    assert cost.has_gen_runtime("vllm_v0") and cost.gen_scalar("vllm_v0", "handoff_s") == cost.gen_scalar("vllm", "handoff_s")
    assert not cost.engine_host("vllm_v0_eager").any and cost.engine_host("vllm_eager").step_s == H0
    twin = decode_sum(CostModel(H100, load_profile(str(BASE))).decoder(M, "bfloat16", 1, runtime="vllm_eager").coeffs(32, 3200.0), 1)[0]
    assert decode_sum(cost.decoder(M, "bfloat16", 1, runtime="vllm_v0_eager").coeffs(32, 3200.0), 1)[0] == twin


# --- the tensor-parallel all-reduce of a decode step: never under the measured small-message time -----------------
def test_collective_floor_prices_small_all_reduces_at_their_measured_time():
    from rlhfsim.costs import flops as fl
    from rlhfsim.costs.model import LINK_EFF, LINK_LATENCY_S
    import numpy as np
    base = load_profile(str(BASE))
    floored = {**copy.deepcopy(base), "collectives": {"all_reduce": {"by_workers": {"2": {"small_message_s": 31e-6}}}}}
    plain, cost = CostModel(H100, base), CostModel(H100, floored)
    m7 = CATALOG["qwen2.5-7b"]
    calls = 2 * m7.layers
    for tokens in (64, 256, 100_000):   # decode steps of 64 and 256 rows: small calls; a long prefill: bandwidth-bound
        nbytes = fl.tp_allreduce_bytes(m7, "bfloat16", tokens, 2)
        line = nbytes / (H100.intra_node_bw * LINK_EFF) + calls * LINK_LATENCY_S
        assert plain._tp_comm_s(m7, "bfloat16", tokens, 2) == line
        assert cost._tp_comm_s(m7, "bfloat16", tokens, 2) == pytest.approx(max(line, calls * 31e-6), rel=1e-12)
        assert (line < calls * 31e-6) == (tokens < 100_000)
    got = cost._tp_comm_s(m7, "bfloat16", np.array([64.0, 100_000.0]), 2)   # the detached clock's arrays, elementwise
    assert got.tolist() == [cost._tp_comm_s(m7, "bfloat16", 64.0, 2), cost._tp_comm_s(m7, "bfloat16", 100_000.0, 2)]
    assert cost._tp_comm_s(m7, "bfloat16", 64, 1) == 0.0
    with pytest.raises(ProfileError, match="small_message_s: expected a finite number >= 0"):
        validate_profile({**floored, "collectives": {"all_reduce": {"by_workers": {"2": {"small_message_s": -1}}}}})

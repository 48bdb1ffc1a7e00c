"""The sampled tokens' log-probs (``generation.sampling_logprobs``): rlhfsim's executor records them inside
``generate()`` with a ``LogprobRecorder`` (TRL does not). The calibration measures ``hf_generate``'s sampling
tail a second time with that recorder (``calibrate.measuring.sampling``: points with ``logprobs``), the assembly keeps
that fit apart from the plain tail (``generation.RT.sampling_logprobs``, never subtracted from a point), and
the simulator prices a flagged scenario's prefill and decode steps with it, through every engine path and in
``validate``'s per-call prices alike; a profile without it prices the plain tail and says so."""

from __future__ import annotations

import copy

import pytest

from rlhfsim.costs.genruntimes import logprob_tail_priced, sample_tail
from rlhfsim.costs.model import CostModel
from rlhfsim.costs.profile import ProfileError, load_profile, validate_profile
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import CATALOG

CPU = get_gpu("cpu")
PLAIN, RECORDED = (4e-4, 3e-8), (6e-4, 5e-8)


def _pt(rows, vocab, t, logprobs=False):
    return {"op": "sample", "runtime": "hf_generate", "batch": rows, "vocab": vocab, "tmean_s": t, "median_s": t,
            **({"logprobs": True} if logprobs else {})}


def _profile(recorded: bool = True) -> dict:
    doc = copy.deepcopy(load_profile("cpu"))
    doc.pop("kernels", None)            # no cold factor: the tails add as measured
    g = doc["generation"]["hf_generate"]
    g.update(sample_s=PLAIN[0], sample_per_logit_s=PLAIN[1])
    g.pop("sampling_logprobs", None)
    if recorded:
        g["sampling_logprobs"] = {"sample_s": RECORDED[0], "sample_per_logit_s": RECORDED[1]}
    return doc


@pytest.mark.hw
def test_the_recorded_twins_are_fitted_apart_and_stored_beside_the_plain_tail():
    pytest.importorskip("torch")
    from calibrate.fitting.assemble import _put_tail, sampling_summary, with_tails

    pts = [_pt(r, v, PLAIN[0] + PLAIN[1] * r * v) for r in (1, 4, 16) for v in (1024, 8192)]
    pts += [_pt(r, v, RECORDED[0] + RECORDED[1] * r * v, True) for r in (1, 4, 16) for v in (1024, 8192)]
    tails = sampling_summary(pts)
    assert list(tails) == ["hf_generate"]
    fit = tails["hf_generate"]
    assert (fit["sample_s"], fit["sample_per_logit_s"]) == pytest.approx(PLAIN, rel=1e-6)     # not contaminated
    assert (fit["logprobs"]["sample_s"], fit["logprobs"]["sample_per_logit_s"]) == pytest.approx(RECORDED, rel=1e-6)
    assert fit["n_points"] == fit["logprobs"]["n_points"] == 6
    info: dict = {}
    assert _put_tail(info, "hf_generate", tails)
    assert info["sample_per_logit_s"] == pytest.approx(PLAIN[1]) and "logprobs" not in info["sampling"]
    assert info["sampling_logprobs"]["sample_per_logit_s"] == pytest.approx(RECORDED[1])
    # the generation points are fitted less the plain tail: generate() runs there as TRL calls it
    dec = {"op": "decode", "runtime": "hf_generate", "model": "tiny-qwen2", "shape": CATALOG["tiny-qwen2"].to_dict(),
           "dtype": "float32", "head": "lm", "batch": 4, "prefix_len": 64, "tokens": 4, "tmean_s": 0.01, "median_s": 0.01}
    tagged = [p for p in with_tails([dec], tails) if p["op"] == "decode"][0]
    assert tagged["sampling_tail_s"] == pytest.approx(PLAIN[0] + PLAIN[1] * 4 * CATALOG["tiny-qwen2"].vocab)
    # without recorded points: no twin fit, nothing stored
    alone = sampling_summary([p for p in pts if not p.get("logprobs")])
    info2: dict = {}
    _put_tail(info2, "hf_generate", alone)
    assert "logprobs" not in alone["hf_generate"] and "sampling_logprobs" not in info2


def test_which_tail_a_flagged_runtime_takes():
    gen = {"kv_decoder": {"sample_s": 1.0, "sample_per_logit_s": 2.0},
           "hf_generate": {"sample_s": 3.0, "sample_per_logit_s": 4.0,
                           "sampling_logprobs": {"sample_s": 5.0, "sample_per_logit_s": 6.0}},
           "hf_static": {"sampling": {"shared_with": "hf_generate"}}}
    assert sample_tail("hf_generate", gen, True, logprobs=True) == (5.0, 6.0)
    assert sample_tail("hf_generate", gen, True) == (3.0, 4.0)                 # TRL: no recorder
    assert sample_tail("hf_static", gen, True, logprobs=True) == (5.0, 6.0)    # the same generate() loop
    assert sample_tail("kv_decoder", gen, True, logprobs=True) == (1.0, 2.0)   # its sampler records them always
    assert sample_tail(None, gen, False, logprobs=True) == (1.0, 2.0)
    assert sample_tail("vllm", gen, True, logprobs=True) == (0.0, 0.0)        # its own ops carry its sampler
    no_rec = {**gen, "hf_generate": {"sample_s": 3.0, "sample_per_logit_s": 4.0}}
    assert sample_tail("hf_generate", no_rec, True, logprobs=True) == (3.0, 4.0)   # unmeasured: the plain tail
    assert logprob_tail_priced("hf_generate", gen, True) and logprob_tail_priced("hf_static", gen, True)
    assert not logprob_tail_priced("hf_generate", no_rec, True) and not logprob_tail_priced("vllm", gen, True)
    assert logprob_tail_priced("kv_decoder", gen, True) and not logprob_tail_priced("kv_decoder", {}, True)


def test_the_cost_model_prices_the_recorded_tail_per_decode_step_and_prefill_only_when_asked():
    m = CATALOG["small-qwen2"]
    c = CostModel(CPU, _profile())
    d_lp = RECORDED[0] - PLAIN[0], RECORDED[1] - PLAIN[1]
    for batch in (1, 8):
        plain = c.decode_steps(m, "float32", batch, batch * 100, 10, runtime="hf_generate").total_s
        rec = c.decode_steps(m, "float32", batch, batch * 100, 10, runtime="hf_generate", logprobs=True).total_s
        assert rec - plain == pytest.approx(10 * (d_lp[0] + d_lp[1] * batch * m.vocab), rel=1e-9)
        p0 = c.forward(m, "float32", batch * 64, batch, head="lm", gen_runtime="hf_generate").total_s
        p1 = c.forward(m, "float32", batch * 64, batch, head="lm", gen_runtime="hf_generate", gen_logprobs=True).total_s
        assert p1 - p0 == pytest.approx(d_lp[0] + d_lp[1] * batch * m.vocab, rel=1e-9)
    # kv_decoder's one tail already carries them: the flag changes nothing there
    assert (c.decode_steps(m, "float32", 8, 800, 10, runtime="kv_decoder", logprobs=True).total_s
            == c.decode_steps(m, "float32", 8, 800, 10, runtime="kv_decoder").total_s)
    # a profile without the recorded tail prices the plain one
    c0 = CostModel(CPU, _profile(recorded=False))
    assert (c0.decode_steps(m, "float32", 8, 800, 10, runtime="hf_generate", logprobs=True).total_s
            == c0.decode_steps(m, "float32", 8, 800, 10, runtime="hf_generate").total_s)


def _static(scenario_dict, logprobs: bool) -> dict:
    d = scenario_dict("cpu", {"generation": {"engine": "static", "max_batch": 4, "runtime": "hf_generate",
                                             "sampling_logprobs": logprobs}})
    d["workload"]["prompts_per_step"] = 1            # GRPO group of 4: one batch of 4 rows
    d["algorithm"]["minibatch_size"] = 4
    return d


@pytest.mark.hw
def test_a_flagged_static_call_is_what_validate_prices_and_costs_its_recorder_per_step(scenario_dict, tracked):
    pytest.importorskip("torch")
    from calibrate.validation.compare import price_op
    from rlhfsim.scenario import load_scenario
    from rlhfsim.scenario.checks import build_setup

    setup = build_setup(load_scenario(_static(scenario_dict, True)))
    cost = CostModel(setup.gpu, _profile())
    m, dt = setup.shapes["actor"], setup.dtypes["actor"]
    shape = {"rows": 4, "width": 32, "steps": 20, "first": True}
    runs = {lp: tracked(_static(scenario_dict, lp), steps=1, rollouts=[(32, 20)] * 4, cost=cost) for lp in (False, True)}
    for lp, run in runs.items():
        assert run.records[0].phases_s["generate"] == pytest.approx(
            price_op(cost, m, dt, "hf_generate", "generate_call", shape, lp).total_s, rel=1e-9)
    # 20 sampled tokens a row: the prefill's and 19 decode steps', each with the recorder's extra over 4 rows
    extra = 20 * (RECORDED[0] - PLAIN[0] + (RECORDED[1] - PLAIN[1]) * 4 * m.vocab)
    assert runs[True].records[0].phases_s["generate"] - runs[False].records[0].phases_s["generate"] == pytest.approx(extra, rel=1e-6)


def test_the_summary_says_whether_the_recorder_is_priced(scenario_dict):
    from rlhfsim.scenario import load_scenario
    from rlhfsim.scenario.checks import build_setup
    from rlhfsim.sim.simulation import Simulation, generation_runtime

    sc = load_scenario(_static(scenario_dict, True))
    setup = build_setup(sc)
    g = generation_runtime(Simulation(setup, CostModel(setup.gpu, _profile())))
    assert g["sampling_logprobs"] and g["logprobs_priced"]
    g0 = generation_runtime(Simulation(setup, CostModel(setup.gpu, _profile(recorded=False))))
    assert g0["sampling_logprobs"] and not g0["logprobs_priced"]
    assert load_scenario(_static(scenario_dict, False)).generation.sampling_logprobs is False


def test_a_bad_recorded_tail_is_refused_with_its_path():
    doc = _profile()
    doc["generation"]["hf_generate"]["sampling_logprobs"]["sample_per_logit_s"] = -1.0
    with pytest.raises(ProfileError, match=r"generation\.hf_generate\.sampling_logprobs\.sample_per_logit_s: expected a finite"):
        validate_profile(doc, "p")
    doc["generation"]["hf_generate"]["sampling_logprobs"] = [1, 2]
    with pytest.raises(ProfileError, match=r"generation\.hf_generate\.sampling_logprobs: expected an object"):
        validate_profile(doc, "p")

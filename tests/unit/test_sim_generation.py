"""Generation engines against hand-computed cost sums, the interrupted-segment inversion, the recorder."""

from __future__ import annotations

import pytest

from rlhfsim.scenario import load_scenario
from rlhfsim.scenario.checks import build_setup
from rlhfsim.costs.model import CostModel, decode_sum
from rlhfsim.sim.engines.clock import Clock, steps_done
from rlhfsim.sim.generation import Generation, GenRequest
from rlhfsim.sim.recorder import Recorder
from rlhfsim.sim.simulation import Simulation

REL = 1e-9


def _two_rollout_dict(scenario_dict, engine: str, max_batch: int = 2, prompts: int = 2) -> dict:
    """CPU, PPO without critic, ``prompts`` rollouts per step, one generation replica."""
    d = scenario_dict("cpu", {"generation": {"engine": engine, "max_batch": max_batch}})
    d["algorithm"] = {"kind": "ppo", "minibatch_size": prompts}
    d["workload"]["prompts_per_step"] = prompts
    return d


def _gen_time(run, step: int = 0) -> float:
    return run.records[step].phases_s["generate"]


class _Priced:
    """The run's cost model with the generation runtime filled in (hf_generate for the static engine,
    vllm for the continuous one: the engines price prefill and decode with their runtime's costs: its
    ``prefill:RT``/``decode:RT`` fits where the profile has them (the bundled ``cpu`` profile measures
    hf_generate), its mechanisms in any case: hf_generate's decode step moves the K/V cache three times
    (its dynamic cache re-concatenates it, ``KV_PASSES``) and each generate() call pays the runtime's
    ``call_overhead_s``), which is why the static sums below name the runtime."""

    def __init__(self, run):
        self.cost = run.sim.cost
        self.rt = run.sim.setup.scenario.generation.resolved_runtime

    def forward(self, m, dt, n_tokens, n_seqs, tp=1, **kw):
        return self.cost.forward(m, dt, n_tokens, n_seqs, tp, gen_runtime=self.rt, **kw)

    def decode_steps(self, m, dt, batch, kv0, n, tp=1):
        return self.cost.decode_steps(m, dt, batch, kv0, n, tp, runtime=self.rt)

    def call(self):
        """The runtime's fixed host cost of one generate() call (a static batch is one call)."""
        return self.cost.call_overhead_s(self.rt)


def _parts(run):
    s = run.sim.setup
    return _Priced(run), s.shapes["actor"], s.dtypes["actor"]


# Engine semantics (as in vLLM and HF generate): the prefill's logits give a fresh row its first response
# token, so a response of R tokens costs one prefill and R - 1 decode steps, and a decode step's
# attention spans every token of the row so far (prompt + generated). Static: one padded prefill per
# batch. Continuous: one prefill call per admitted row.
def _prefill_row(cost, m, dt, tokens):
    return cost.forward(m, dt, tokens, 1, 1, op="prefill", head="lm").total_s


def test_static_equal_lengths_is_padded_prefill_plus_decode_sum(scenario_dict, tracked):
    run = tracked(_two_rollout_dict(scenario_dict, "static", max_batch=4, prompts=4), steps=2, rollouts=[(32, 48)] * 8)
    cost, m, dt = _parts(run)
    assert cost.rt == "hf_generate"
    want = (cost.call() + cost.forward(m, dt, 4 * 32, 4, 1, op="prefill", head="lm").total_s
            + cost.decode_steps(m, dt, 4, 4 * 33, 47).total_s)
    assert _gen_time(run) == pytest.approx(want, rel=REL)
    assert _gen_time(run, 1) == pytest.approx(want, rel=REL)


def test_continuous_equal_lengths_is_row_prefills_plus_decode_sum(scenario_dict, tracked):
    run = tracked(_two_rollout_dict(scenario_dict, "continuous", max_batch=4, prompts=4), steps=2,
                  rollouts=[(32, 48)] * 8)
    cost, m, dt = _parts(run)
    want = 4 * _prefill_row(cost, m, dt, 32) + cost.decode_steps(m, dt, 4, 4 * 33, 47).total_s
    assert _gen_time(run) == pytest.approx(want, rel=REL)


def test_static_batch_decodes_until_its_longest_member_ends(scenario_dict, tracked):
    run = tracked(_two_rollout_dict(scenario_dict, "static"), steps=1, rollouts=[(20, 10), (32, 50)])
    cost, m, dt = _parts(run)
    # Both rows are padded to the longest prompt; the short one keeps decoding as padding.
    want = (cost.call() + cost.forward(m, dt, 2 * 32, 2, 1, op="prefill", head="lm").total_s
            + cost.decode_steps(m, dt, 2, 2 * 33, 49).total_s)
    assert _gen_time(run) == pytest.approx(want, rel=REL)


def test_continuous_batch_shrinks_when_a_sequence_ends(scenario_dict, tracked):
    run = tracked(_two_rollout_dict(scenario_dict, "continuous"), steps=1, rollouts=[(20, 10), (32, 50)])
    cost, m, dt = _parts(run)
    want = (_prefill_row(cost, m, dt, 20) + _prefill_row(cost, m, dt, 32)
            + cost.decode_steps(m, dt, 2, 21 + 33, 9).total_s
            + cost.decode_steps(m, dt, 1, 32 + 10, 40).total_s)
    assert _gen_time(run) == pytest.approx(want, rel=REL)


def test_continuous_batch_refills_a_freed_slot(scenario_dict, tracked):
    # Three rollouts, two slots: the third enters (and is prefilled) when the first ends.
    d = _two_rollout_dict(scenario_dict, "continuous", max_batch=2, prompts=3)
    run = tracked(d, steps=1, rollouts=[(16, 10), (16, 30), (8, 5)])
    cost, m, dt = _parts(run)
    want = (2 * _prefill_row(cost, m, dt, 16)
            + cost.decode_steps(m, dt, 2, 2 * 17, 9).total_s
            + _prefill_row(cost, m, dt, 8)
            + cost.decode_steps(m, dt, 2, 16 + 10 + 8 + 1, 4).total_s
            + cost.decode_steps(m, dt, 1, 16 + 14, 16).total_s)
    assert _gen_time(run) == pytest.approx(want, rel=REL)


def test_one_token_responses_need_no_decode(scenario_dict, tracked):
    for engine in ("static", "continuous"):
        run = tracked(_two_rollout_dict(scenario_dict, engine), steps=1, rollouts=[(16, 1), (16, 1)])
        cost, m, dt = _parts(run)
        want = (cost.call() + cost.forward(m, dt, 32, 2, 1, op="prefill", head="lm").total_s if engine == "static"
                else 2 * _prefill_row(cost, m, dt, 16))
        assert _gen_time(run) == pytest.approx(want, rel=REL), engine
        assert run.records[0].generated_tokens == 2


def test_static_engine_pads_and_continuous_engine_does_not(scenario_dict, tracked):
    # Each static batch of four holds one long response, so every batch decodes for its whole length;
    # the continuous engine refills the short rows' slots and runs the long ones side by side.
    lengths = ([(32, 8)] * 3 + [(32, 400)]) * 4
    st = tracked(_two_rollout_dict(scenario_dict, "static", max_batch=4, prompts=16), steps=1, rollouts=lengths)
    co = tracked(_two_rollout_dict(scenario_dict, "continuous", max_batch=4, prompts=16), steps=1, rollouts=lengths)
    assert _gen_time(st) > 2 * _gen_time(co)
    assert st.records[0].generated_tokens == co.records[0].generated_tokens == 12 * 8 + 4 * 400


@pytest.mark.parametrize("engine", ["static", "continuous"])
def test_chunk_boundaries_do_not_change_decode_time(engine, scenario_dict, tracked, free_cost):
    # Streaming splits the decode into segments at chunk boundaries; with free scoring the closed-form
    # sums over the pieces must add up to the unsplit sum.
    d = _two_rollout_dict(scenario_dict, engine, max_batch=4, prompts=4)
    lengths = [(24, 37), (30, 100), (12, 64), (40, 5)]
    sync = load_scenario(d)
    d["schedule"] = {"kind": "oppo", "intra": {"chunk_tokens": 16}, "inter": {"enabled": False}}
    cost = free_cost(sync)
    a = tracked(sync, steps=1, rollouts=lengths, cost=cost)
    b = tracked(load_scenario(d), steps=1, rollouts=lengths, cost=cost)
    assert b.sim.scorers["reward"].chunks >= sum(-(-n // 16) for _, n in lengths)
    assert _gen_time(b) == pytest.approx(_gen_time(a), rel=REL)


@pytest.mark.parametrize("k", [0, 1, 7, 63, 64])
def test_steps_done_inverts_the_decode_sum(k, scenario_dict):
    sc = load_scenario(scenario_dict("gpu"))
    setup = build_setup(sc)
    sim = Simulation(setup, CostModel.load(setup.gpu))
    gen = Generation(sim, GenRequest(0, []))
    coeffs = Clock(gen.engine, 0, {}).coeffs(8, 4000)
    # The clock prices a segment with the engine's runtime: the same sum as the cost model's.
    assert decode_sum(coeffs, 64)[0] == sim.cost.decode_steps(setup.shapes["actor"], setup.dtypes["actor"], 8, 4000, 64,
                                                             runtime=sc.generation.resolved_runtime).total_s

    def t(n, factor=1.0):
        return factor * decode_sum(coeffs, n)[0]

    elapsed = t(k)
    done, frac = steps_done(coeffs, 64, elapsed)
    assert done == k and frac == pytest.approx(0.0, abs=1e-6)
    if k:
        done, frac = steps_done(coeffs, 64, elapsed * (1 - 1e-6))
        assert done == k - 1 and frac == pytest.approx(1.0, abs=1e-3)
    if k < 64:   # halfway through step k + 1
        half = (t(k) + t(k + 1)) / 2
        done, frac = steps_done(coeffs, 64, half)
        assert done == k and frac == pytest.approx(0.5, rel=1e-6)
    slow = t(k, 2.0)
    assert slow == pytest.approx(2 * elapsed) and steps_done(coeffs, 64, slow, 2.0)[0] == k


def test_recorder_spans_and_negative_intervals():
    rec = Recorder()
    rec.busy(0, "p", 0, 2, "actor", "generate", 1.0, 3.0)
    rec.busy(0, "p", 2, 2, "actor", "generate", 0.5, 2.0)
    rec.busy(1, "p", 0, 4, "actor", "actor_train", 4.0, 5.0)
    assert rec.spans(0) == {"generate": (0.5, 3.0)}
    assert rec.spans(1) == {"actor_train": (4.0, 5.0)}
    with pytest.raises(ValueError):
        rec.busy(0, "p", 0, 1, "actor", "generate", 2.0, 1.0)


# --- co-running decode and chunk scoring (colocated OPPO intra-step) --------------------------------
def _intra_sim(scenario_dict, engine: str, decode_slowdown: float, lengths, handover: bool = False, live: list | None = None,
               added: dict | None = None, overlap: tuple[float, float] | None = None):
    """One intra-step OPPO step; ``handover``: the slowdown measured in the hand-over pattern for the
    scenario's generation runtime (window ``live``) instead of the busy loops'; ``live`` collects
    (time, +1/-1) of the scorer's live window; ``added``: the hand-over's added-time fit (``handover``);
    ``overlap``: its (idle_x, busy_x) fit (``handover``, ``CostModel.corun_overlap``)."""
    import copy

    d = _two_rollout_dict(scenario_dict, engine, max_batch=4, prompts=4)
    d["schedule"] = {"kind": "oppo", "intra": {"chunk_tokens": 16}, "inter": {"enabled": False}}
    sc = load_scenario(d)
    setup = build_setup(sc)
    prof = copy.deepcopy(CostModel.load(setup.gpu).profile)
    if handover:
        prof["interference"] = {"decode_slowdown": 1.0, "prefill_slowdown": 1.0,
                                "handover": {sc.generation.resolved_runtime: {"decode_slowdown": decode_slowdown,
                                                                              "prefill_slowdown": 1.0}}}
        if added is not None:
            prof["interference"]["handover"][sc.generation.resolved_runtime]["added"] = added
        if overlap is not None:
            prof["interference"]["handover"][sc.generation.resolved_runtime]["overlap"] = {
                "idle_x": overlap[0], "busy_x": overlap[1]}
    else:   # the busy loops' slowdown (window "overlap"), whatever the bundled profile measured
        prof["interference"] = {"decode_slowdown": decode_slowdown, "prefill_slowdown": 1.0}
    sim = Simulation(setup, CostModel(setup.gpu, prof), rollouts=lengths)
    calls = []
    changed = sim.interference_changed
    sim.interference_changed = lambda pool, gpus: (calls.append(pool), changed(pool, gpus))
    if live is not None:
        set_active = sim.set_active
        sim.set_active = lambda pool, kind, gpus, delta: (
            live.append((sim.env.now, delta)) if kind == "live" else None, set_active(pool, kind, gpus, delta))
    recs = sim.run(1)
    scoring = sum(iv.end_s - iv.start_s for iv in sim.rec.intervals if iv.role == "reward" and iv.step == 0)
    return recs[0], scoring, len(calls)


LENGTHS = [(24, 37), (30, 100), (12, 64), (40, 5)]


@pytest.mark.parametrize("engine", ["static", "continuous"])
def test_rate_changes_keep_partial_steps(engine, scenario_dict):
    # Every start and end of a chunk-scoring busy period cuts the decode segment in progress; the
    # fraction of the step in flight is carried, so a slowdown of 1 + 1e-9 must leave the generation
    # time as it was.
    base, _, _ = _intra_sim(scenario_dict, engine, 1.0, LENGTHS)
    tiny, _, n_changes = _intra_sim(scenario_dict, engine, 1.0 + 1e-9, LENGTHS)
    assert n_changes >= 4 and n_changes % 2 == 0   # several busy periods, each started and ended
    assert tiny.phases_s["generate"] == pytest.approx(base.phases_s["generate"], rel=1e-6)
    assert tiny.generated_tokens == base.generated_tokens


@pytest.mark.parametrize("engine", ["static", "continuous"])
def test_decode_slows_only_while_chunks_are_scored(engine, scenario_dict):
    # Decode runs `s` times slower exactly while a chunk prefill runs: the generation grows by at most
    # (1 - 1/s) x the scoring time, and by something (chunks do overlap decode here).
    base, _, _ = _intra_sim(scenario_dict, engine, 1.0, LENGTHS)
    slow, scoring, _ = _intra_sim(scenario_dict, engine, 2.0, LENGTHS)
    g0, g1 = base.phases_s["generate"], slow.phases_s["generate"]
    assert g0 < g1 <= g0 + (1 - 1 / 2.0) * scoring + 1e-12
    assert slow.generated_tokens == base.generated_tokens


@pytest.mark.parametrize("engine", ["static", "continuous"])
def test_handover_slowdown_holds_from_first_handover_to_drain(engine, scenario_dict):
    # Measured in the hand-over pattern (calibrate.cpu.corun), the decode slowdown holds over the whole window
    # a scorer is live beside generation, busy or not: from the step's first chunk to the drain after
    # generation. Before the first chunk decode runs at full speed, so the generation stretches by
    # exactly (s - 1) x the time it had left then (decode alone fills the window up to its end).
    live_base: list = []
    base, _, _ = _intra_sim(scenario_dict, engine, 1.0, LENGTHS, handover=True, live=live_base)
    s = 1.7
    live: list = []
    slow, scoring, _ = _intra_sim(scenario_dict, engine, s, LENGTHS, handover=True, live=live)
    opened = live_base[0]
    assert opened[1] == +1 and [d for _, d in live] == [+1, -1] and [d for _, d in live_base] == [+1, -1]
    assert live[0][0] == pytest.approx(opened[0], rel=1e-12)    # the first chunk comes before any slowdown
    g0, g1 = base.phases_s["generate"], slow.phases_s["generate"]
    assert g1 == pytest.approx(opened[0] + s * (g0 - opened[0]), rel=1e-9)
    assert live[1][0] >= g1 - 1e-12    # closed at the drain, after generation
    # the busy-loop slowdown of the same size stretches it less: only while calls run
    overlap, _, _ = _intra_sim(scenario_dict, engine, s, LENGTHS)
    assert g0 < overlap.phases_s["generate"] < g1
    assert slow.generated_tokens == base.generated_tokens


@pytest.mark.parametrize("engine", ["static", "continuous"])
def test_overlap_fit_slows_decode_by_the_scorers_busy_time(engine, scenario_dict):
    # With the hand-over's overlap fit (CostModel.corun_overlap) decode runs at busy_x while a chunk call
    # runs and at idle_x while the scorer is live and waits: idle_x = busy_x = s is the live-window slowdown
    # s exactly; idle_x = 1 is the busy loops' window (slow only while calls run); an idle factor above 1
    # adds to that, and the added-time fit is not used beside it.
    s = 1.7
    base, _, _ = _intra_sim(scenario_dict, engine, 1.0, LENGTHS, handover=True)
    live, _, _ = _intra_sim(scenario_dict, engine, s, LENGTHS, handover=True)
    both, _, _ = _intra_sim(scenario_dict, engine, 1.0, LENGTHS, handover=True, overlap=(s, s),
                            added=_added(per_layer_s=1e-3))
    assert both.phases_s["generate"] == pytest.approx(live.phases_s["generate"], rel=1e-9)
    busy, _, _ = _intra_sim(scenario_dict, engine, 1.0, LENGTHS, handover=True, overlap=(1.0, s))
    loops, _, _ = _intra_sim(scenario_dict, engine, s, LENGTHS)
    g0, g = base.phases_s["generate"], busy.phases_s["generate"]
    assert g0 < g < live.phases_s["generate"]
    assert g == pytest.approx(loops.phases_s["generate"], rel=1e-6)
    idle, _, _ = _intra_sim(scenario_dict, engine, 1.0, LENGTHS, handover=True, overlap=(1.2, s))
    assert g < idle.phases_s["generate"] < live.phases_s["generate"]
    assert busy.generated_tokens == idle.generated_tokens == base.generated_tokens


def test_corun_overlap_reads_the_profile():
    from rlhfsim.costs.model import CostModel
    from rlhfsim.costs.profile import ProfileError, _check_interference
    from rlhfsim.models.catalog import CATALOG

    import math

    tiny, small = CATALOG["tiny-qwen2"], CATALOG["small-qwen2"]
    cm = CostModel.__new__(CostModel)
    cm.handover = {"kv_decoder": {"decode_slowdown": 2.0, "prefill_slowdown": 3.0, "overlap": {"idle_x": 1.1, "busy_x": 2.4}}}
    assert cm.corun_overlap("kv_decoder", tiny, tiny) == (1.1, 2.4)
    assert cm.corun_overlap("hf_generate", tiny, tiny) is None             # not measured in the pattern
    cm.handover["hf_generate"] = {"decode_slowdown": 1.2, "prefill_slowdown": 2.0}
    assert cm.corun_overlap("hf_generate", tiny, tiny) is None             # measured, no fit of its own: none
    cm.handover["hf_generate"]["overlap"] = {"idle_x": 1.3, "busy_x": 1.9}
    assert cm.corun_overlap("hf_generate", tiny, tiny) == (1.3, 1.9)
    del cm.handover["hf_generate"]
    assert cm.corun_overlap("kv_decoder", tiny, None) is None               # rule reward: no scorer
    # with the line of the share of a call's time lost by the actor's size: busy_x = idle_x / (1 - lost)
    cm.handover["kv_decoder"]["overlap"]["lost"] = {"intercept": 2.0, "per_log_params": -0.1}
    lost = 2.0 - 0.1 * math.log(small.params())
    assert cm.corun_overlap("kv_decoder", small, tiny) == pytest.approx((1.1, 1.1 / (1 - lost)))
    assert cm.corun_overlap("kv_decoder", tiny, tiny)[1] > cm.corun_overlap("kv_decoder", small, tiny)[1]
    cm.handover["kv_decoder"]["overlap"]["lost"] = {"intercept": 5.0, "per_log_params": 0.0}   # held at the cap
    from rlhfsim.costs.model import OVERLAP_LOST_MAX
    assert cm.corun_overlap("kv_decoder", small, tiny)[1] == pytest.approx(1.1 / (1 - OVERLAP_LOST_MAX))
    ok = {"decode_slowdown": 1.4, "prefill_slowdown": 2.0}
    _check_interference({"handover": {"kv_decoder": {**ok, "overlap": {"idle_x": 1.0, "busy_x": 2.0}}}}, "p")
    for bad in ({"idle_x": 1.2, "busy_x": 1.1}, {"idle_x": 0.9, "busy_x": 2.0}, {"busy_x": 2.0}, [1.0, 2.0]):
        with pytest.raises(ProfileError, match=r"p\.handover\.kv_decoder\.overlap: expected idle_x and busy_x"):
            _check_interference({"handover": {"kv_decoder": {**ok, "overlap": bad}}}, "p")
    with pytest.raises(ProfileError, match=r"p\.handover\.kv_decoder\.overlap\.lost: expected intercept and per_log_params"):
        _check_interference({"handover": {"kv_decoder": {**ok, "overlap": {"idle_x": 1.0, "busy_x": 2.0,
                                                                           "lost": {"intercept": "x"}}}}}, "p")


def _added(per_layer_s=0.0, per_alone=0.0, prefill_s=0.0):
    zero = {"const_s": 0.0, "per_layer_s": 0.0, "per_alone": 0.0}
    return {"decode": {**zero, "per_layer_s": per_layer_s, "per_alone": per_alone}, "prefill": {**zero, "const_s": prefill_s}}


@pytest.mark.parametrize("engine", ["static", "continuous"])
def test_handover_added_time_is_per_decode_step_in_the_live_window(engine, scenario_dict):
    # With the added-time fit (CostModel.corun_added) a decode step beside a live scorer takes
    # t (1 + per_alone) + per_layer_s x L: the per-alone part is the slowdown factor over the window
    # (as above), and the per-layer part adds the same seconds to every step in it, so the generation
    # grows linearly in it, by a number of steps no larger than the longest response.
    live: list = []
    base, _, _ = _intra_sim(scenario_dict, engine, 1.0, LENGTHS, handover=True, live=live)
    opened = live[0][0]
    m = 0.7
    mult, _, _ = _intra_sim(scenario_dict, engine, 1.0, LENGTHS, handover=True, added=_added(per_alone=m))
    g0 = base.phases_s["generate"]
    assert mult.phases_s["generate"] == pytest.approx(opened + (1 + m) * (g0 - opened), rel=1e-9)
    a = 1e-4
    one, _, _ = _intra_sim(scenario_dict, engine, 1.0, LENGTHS, handover=True, added=_added(per_layer_s=a))
    two, _, _ = _intra_sim(scenario_dict, engine, 1.0, LENGTHS, handover=True, added=_added(per_layer_s=2 * a))
    layers = build_setup(load_scenario(_two_rollout_dict(scenario_dict, engine, max_batch=4, prompts=4))).shapes["actor"].layers
    steps = (one.phases_s["generate"] - g0) / (a * layers)
    assert 1 <= steps <= max(n for _, n in LENGTHS)
    assert two.phases_s["generate"] - g0 == pytest.approx(2 * (one.phases_s["generate"] - g0), rel=1e-6)
    assert one.generated_tokens == base.generated_tokens


def test_corun_added_prices_by_each_sides_layers():
    from dataclasses import replace

    from rlhfsim.costs.model import CostModel
    from rlhfsim.models.catalog import CATALOG

    tiny = CATALOG["tiny-qwen2"]
    cm = CostModel.__new__(CostModel)
    cm.handover = {"kv_decoder": {"decode_slowdown": 2.0, "prefill_slowdown": 3.0, "added": {
        "decode": {"const_s": 1e-4, "per_layer_s": 5e-4, "per_alone": 0.25},
        "prefill": {"const_s": 2e-4, "per_layer_s": 1e-3, "per_alone": 0.5}}}}
    actor, reward = replace(tiny, name="a", layers=4), replace(tiny, name="r", layers=3)
    assert cm.corun_added("kv_decoder", actor, reward) == pytest.approx((1.25, 1e-4 + 4 * 5e-4, 1.5, 2e-4 + 3 * 1e-3))
    assert cm.corun_added("hf_generate", actor, reward) is None      # no fit for that runtime: corun_factors
    assert cm.corun_added("kv_decoder", actor, None) is None         # rule reward: no scorer model


def test_profile_interference_handover_is_checked():
    from rlhfsim.costs.profile import ProfileError, _check_interference

    _check_interference({"decode_slowdown": 1.2, "handover": {"hf_generate": {"decode_slowdown": 1.4, "prefill_slowdown": 2.0}}}, "p")
    with pytest.raises(ProfileError, match=r"p\.handover\.hf_generate\.prefill_slowdown: expected a finite number > 0, got None"):
        _check_interference({"handover": {"hf_generate": {"decode_slowdown": 1.4}}}, "p")
    with pytest.raises(ProfileError, match=r"p\.handover: expected an object"):
        _check_interference({"handover": [1]}, "p")
    with pytest.raises(ProfileError, match=r"p\.handover\.kv_decoder\.configs\[0\]: expected an object with side"):
        _check_interference({"handover": {"kv_decoder": {"decode_slowdown": 1.4, "prefill_slowdown": 2.0,
                                                         "configs": [{"side": "decode", "model": "a"}]}}}, "p")
    with pytest.raises(ProfileError, match=r"model_params > 0 or none"):
        _check_interference({"handover": {"kv_decoder": {"decode_slowdown": 1.4, "prefill_slowdown": 2.0, "configs": [
            {"side": "decode", "model": "a", "partner": "a", "slowdown": 1.2, "model_params": "big"}]}}}, "p")


def test_handover_factors_come_from_the_nearest_measured_actor():
    from dataclasses import replace

    from rlhfsim.costs.model import CostModel
    from rlhfsim.models.catalog import CATALOG

    tiny, small, deb = CATALOG["tiny-qwen2"], CATALOG["small-qwen2"], CATALOG["tiny-deberta"]

    def cfg(side, model, partner, s):
        m = {"tiny-qwen2": tiny, "small-qwen2": small, "tiny-deberta": deb}[model]
        return {"side": side, "model": model, "partner": partner, "slowdown": s,
                "model_params": m.params("lm" if side == "decode" else "value")}

    cm = CostModel.__new__(CostModel)
    cm.decode_slowdown, cm.prefill_slowdown = 1.1, 1.2
    cm.handover = {"hf_generate": {"decode_slowdown": 1.9, "prefill_slowdown": 2.9, "configs": [
        cfg("decode", "tiny-qwen2", "tiny-qwen2", 2.2), cfg("prefill", "tiny-qwen2", "tiny-qwen2", 3.6),
        cfg("decode", "small-qwen2", "small-qwen2", 1.6), cfg("prefill", "small-qwen2", "small-qwen2", 2.4),
        cfg("decode", "small-qwen2", "tiny-deberta", 1.4), cfg("prefill", "tiny-deberta", "small-qwen2", 2.6)]}}
    assert cm.corun_factors("hf_generate", small, deb) == (1.4, 2.6, "live")       # its own pair
    assert cm.corun_factors("hf_generate", small, tiny) == (1.5, 2.5, "live")      # its own actor, every scorer
    assert cm.corun_factors("hf_generate", tiny, tiny) == (2.2, 3.6, "live")
    # an actor never measured takes the measured actor nearest in size: 3 layers of 256 is small-qwen2's kind
    other = replace(small, name="gen-l3-h256", layers=3, vocab=1024)
    assert cm.corun_factors("hf_generate", other, tiny)[:2] == (1.5, 2.5)
    assert cm.corun_factors("hf_generate", replace(tiny, name="gen-l2-h96", hidden=96), tiny)[:2] == (2.2, 3.6)
    assert cm.corun_factors("kv_decoder", small, deb) == (1.1, 1.2, "overlap")   # not measured: the busy loops'
    # configurations without model sizes (older profiles): the runtime's medians
    cm.handover["hf_generate"]["configs"] = [{k: v for k, v in c.items() if k != "model_params"}
                                             for c in cm.handover["hf_generate"]["configs"]]
    assert cm.corun_factors("hf_generate", small, deb) == (1.9, 2.9, "live")


def test_co_running_is_per_gpu(scenario_dict):
    # A chunk prefill on GPU 1 slows the decode replica on GPU 1, not the one on GPU 0; only the
    # transitions of a GPU's chunk-prefill count (0 <-> non-zero) re-time decode there.
    sc = load_scenario(scenario_dict("gpu"))
    setup = build_setup(sc)
    sim = Simulation(setup, CostModel.load(setup.gpu))
    seen = []
    sim.interference_changed = lambda pool, gpus: seen.append((pool, gpus))
    sim.set_active("p", "prefill", range(1, 2), +1)
    sim.set_active("p", "prefill", range(1, 2), +1)      # a second call on the same GPU: no change
    assert sim.corun("p", "decode", range(1, 2)) and not sim.corun("p", "decode", range(0, 1))
    assert sim.corun("p", "decode", range(0, 4)) and not sim.corun("q", "decode", range(0, 4))
    sim.set_active("p", "prefill", range(1, 2), -1)
    sim.set_active("p", "prefill", range(1, 2), -1)
    sim.set_active("p", "decode", range(0, 2), +1)        # decode starting re-times nothing
    assert seen == [("p", range(1, 2)), ("p", range(1, 2))]
    assert sim.corun("p", "prefill", range(1, 2)) and not sim.corun("p", "prefill", range(2, 3))


def test_scorer_replicas_take_a_burst_of_calls_in_turn(scenario_dict):
    # Five equal chunks made ready at once for a reward pool of two replicas: call by call, replica 0
    # takes chunks 0, 2, 4 and replica 1 chunks 1, 3 (each takes the next as it frees up, the one that
    # started first at a tie). Each replica runs its calls as one chain: one busy interval.
    from rlhfsim.sim.rollouts import Rollout

    d = scenario_dict("gpu", schedule="oppo-intra")
    d["cluster"]["gpus_per_node"] = 5
    d["placement"] = {"kind": "dedicated_reward", "reward_gpus": 2}
    setup = build_setup(load_scenario(d))
    sim = Simulation(setup, CostModel.load(setup.gpu))
    scorer = sim.scorer("reward")
    for i in range(5):
        r = Rollout(i, 40, 100)
        r.generated = 24
        scorer.emit(0, r, final=False)
    sim.env.run(until=scorer.wait_drained())
    call = sim.cost.chunk_prefill(setup.shapes["reward"], setup.dtypes["reward"], 64, 1, 0, 1, setup.head("reward")).total_s
    ivs = sorted((iv.gpu0, iv.start_s, iv.end_s) for iv in sim.rec.intervals if iv.phase == "reward")
    assert [(g, s) for g, s, _ in ivs] == [(0, 0.0), (1, 0.0)]
    assert ivs[0][2] == pytest.approx(3 * call, rel=REL) and ivs[1][2] == pytest.approx(2 * call, rel=REL)
    assert (scorer.chunks, scorer.tokens, scorer.outstanding) == (5, 5 * 64, 0)

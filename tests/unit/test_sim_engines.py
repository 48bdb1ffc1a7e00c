"""The generation engines (rlhfsim.sim.engines): the registry, TRL dealing for static batches, the
generation runtime's call overhead and chunk handoff, kernel (active) time, vLLM's admission watermark,
and values pinned from before the engines were split (zero handoff must change nothing)."""

from __future__ import annotations

import copy
import typing

import pytest

from rlhfsim.costs.model import CostModel, decode_sum
from rlhfsim.costs.profile import load_profile
from rlhfsim.scenario import load_scenario
from rlhfsim.scenario.checks import build_setup
from rlhfsim.scenario.schema import Generation as GenerationConfig
from rlhfsim.sim import stages
from rlhfsim.sim.engines import ENGINES
from rlhfsim.sim.engines.continuous import ContinuousEngine
from rlhfsim.sim.generation import Generation, GenRequest
from rlhfsim.sim.rollouts import Rollout
from rlhfsim.sim.simulation import Simulation

REL = 1e-9


def _dict(scenario_dict, engine: str, prompts: int, max_batch: int, base: str = "gpu", **gen) -> dict:
    """``base`` with PPO, no critic, ``prompts`` rollouts per step, the given engine settings."""
    d = scenario_dict(base, {"generation": {"engine": engine, "max_batch": max_batch, **gen}})
    d["models"].pop("critic", None)
    d["algorithm"] = {"kind": "ppo", "minibatch_size": prompts}
    d["workload"]["prompts_per_step"] = prompts
    return d


def _intra(d: dict, chunk: int) -> dict:
    d["schedule"] = {"kind": "oppo", "intra": {"chunk_tokens": chunk}, "inter": {"enabled": False}}
    return d


def _cost(sc, generation: dict | None = None) -> CostModel:
    """The bundled profile of the scenario's GPU with ``generation`` entries (runtime -> scalars)
    replaced; None: without any (no call overhead, no handoff)."""
    setup = build_setup(sc)
    # a GPU's datasheet-derived profile by name (no longer what a GPU gets without --profile), its efficiencies as
    # stated (not carried to the GPU: the pinned values' prices); a CPU's bundled one
    prof = copy.deepcopy(CostModel.load(setup.gpu).profile if setup.gpu.kind == "cpu" else load_profile("default"))
    prof["generation"] = generation if generation is not None else {}
    prof.pop("framework", None)  # the engines' own costs: no framework host time on the forward and training calls
    prof.pop("collectives", None)  # ... and the link constants' all-reduces (no measured small-message floor)
    if setup.gpu.host_cpu:   # host terms stated for the GPU's own host: the engines' mechanics, no host factor
        prof["host_cpu"] = setup.gpu.host_cpu
    return CostModel(setup.gpu, prof)


class _Costs:
    """Hand composition of generation costs with the scenario's runtime (tp 1)."""

    def __init__(self, sim):
        s = sim.setup
        self.cost, self.m, self.dt = sim.cost, s.shapes["actor"], s.dtypes["actor"]
        self.rt = s.scenario.generation.resolved_runtime

    def prefill(self, tokens, seqs):
        return self.cost.forward(self.m, self.dt, tokens, seqs, 1, op="prefill", head="lm", gen_runtime=self.rt).total_s

    def prefill_active(self, tokens, seqs):
        return self.cost.forward(self.m, self.dt, tokens, seqs, 1, op="prefill", head="lm",
                                       gen_runtime=self.rt).active_s

    def decode(self, batch, kv0, n):
        return self.cost.decode_steps(self.m, self.dt, batch, kv0, n, 1, runtime=self.rt).total_s

    def call(self):
        """The runtime's fixed cost of one generate() call (one per static batch)."""
        return self.cost.call_overhead_s(self.rt)

    def decode_active(self, batch, kv0, n):
        return decode_sum(self.cost.decoder(self.m, self.dt, 1, runtime=self.rt).coeffs(batch, kv0), n)[1]


def _gen_intervals(sim, step: int = 0) -> dict[int, object]:
    """gpu0 -> the generate interval of that replica in ``step``."""
    return {iv.gpu0: iv for iv in sim.rec.intervals if iv.step == step and iv.phase == "generate"}


def _run_request(sc, rollouts: list[Rollout], cost: CostModel | None = None):
    """One step's generation of exactly these rollouts, outside any schedule: (sim, GenResult)."""
    setup = build_setup(sc)
    sim = Simulation(setup, cost or _cost(sc))
    proc = sim.env.process(Generation(sim, GenRequest(0, rollouts)).run())
    sim.env.run(proc)
    return sim, proc.value


# --- the registry -------------------------------------------------------------------------------------
def test_registry_names_match_the_schema():
    kinds = typing.get_args(GenerationConfig.model_fields["engine"].annotation)
    assert set(ENGINES) == set(kinds)
    for name, cls in ENGINES.items():
        assert cls.NAME == name


# --- static engine: TRL dealing -----------------------------------------------------------------------
def test_static_deals_rows_round_robin_then_cuts_micro_batches(scenario_dict, tracked):
    # Three replicas, max_batch 2, seven rows: replica i takes rows i, i+3, i+6 and runs them as
    # micro-batches of 2 in order: replica 0 = [0, 3] then [6]; replica 1 = [1, 4]; replica 2 = [2, 5].
    # (Batches of two dealt to replicas would have given replica 0 = [0, 1] then [6, ...].)
    lengths = [(20, 10), (30, 40), (10, 5), (40, 25), (16, 8), (24, 30), (12, 50)]
    run = tracked(_dict(scenario_dict, "static", prompts=7, max_batch=2), steps=1, rollouts=lengths)
    c = _Costs(run.sim)
    # A batch: one generate() call (its fixed overhead), one prefill padded to its longest context ctx0,
    # then (longest response - 1) decode steps of the whole batch from batch x (ctx0 + 1) cached tokens
    # (the prefill gave each row a token).
    want = {
        0: 2 * c.call() + c.prefill(2 * 40, 2) + c.decode(2, 2 * 41, 24) + c.prefill(12, 1) + c.decode(1, 13, 49),
        1: c.call() + c.prefill(2 * 30, 2) + c.decode(2, 2 * 31, 39),
        2: c.call() + c.prefill(2 * 24, 2) + c.decode(2, 2 * 25, 29),
    }
    got = _gen_intervals(run.sim)
    assert set(got) == set(want)
    for g, t in want.items():
        assert got[g].end_s - got[g].start_s == pytest.approx(t, rel=REL), g


def test_static_spreads_carried_rows_over_replicas(scenario_dict):
    # OPPO carries deferred rows first. Three carried rows (30 of 60 tokens done, KV resident) and
    # three fresh rows (10 tokens) on three replicas of max_batch 2: each replica gets one carried row
    # and one fresh row, so every batch is [carried, fresh].
    sc = load_scenario(_dict(scenario_dict, "static", prompts=6, max_batch=2))
    carried = [Rollout(i, 20, 60, generated=30, kv_resident=True) for i in range(3)]
    fresh = [Rollout(3 + i, 20, 10) for i in range(3)]
    sim, res = _run_request(sc, carried + fresh)
    c = _Costs(sim)
    # ctx0 = max(20 + 30, 20) = 50; only the fresh row is prefilled (padded to 50 tokens); then the
    # batch of 2 decodes from 2 x (50 + 1) cached tokens until the carried row's 30 remaining tokens are
    # done (the fresh row's 9 decode steps end inside them).
    per_replica = c.prefill(50, 1) + c.decode(2, 2 * 51, 30)
    got = _gen_intervals(sim)
    assert sorted(got) == [0, 1, 2]
    for iv in got.values():
        assert iv.end_s - iv.start_s == pytest.approx(per_replica, rel=REL)
    assert sorted(r.id for r in res.finished) == list(range(6)) and not res.unfinished
    assert res.generated_tokens == 3 * 30 + 3 * 10


# --- generation runtime costs ---------------------------------------------------------------------------
def test_static_call_overhead_is_paid_once_per_batch_and_is_not_active(scenario_dict, tracked):
    # One replica, 8 rows, max_batch 4: two generate() calls, each paying the call overhead once.
    d = _dict(scenario_dict, "static", prompts=8, max_batch=4, base="cpu")
    sc = load_scenario(d)
    lengths = [(32, 20)] * 8
    a = tracked(sc, steps=1, rollouts=lengths, cost=_cost(sc))
    b = tracked(sc, steps=1, rollouts=lengths, cost=_cost(sc, {"hf_generate": {"call_overhead_s": 0.25}}))
    ia, ib = _gen_intervals(a.sim)[0], _gen_intervals(b.sim)[0]
    assert ib.end_s - ib.start_s == pytest.approx(ia.end_s - ia.start_s + 2 * 0.25, rel=REL)
    assert ib.active_s == pytest.approx(ia.active_s, rel=REL)


@pytest.mark.parametrize("stream", [False, True])
def test_a_left_padded_static_batch_pays_the_padding_term_at_every_decode_step(stream, scenario_dict, tracked):
    # Two batches of 2 rows: the first of equal prompts (no padding), the second of unequal ones
    # (left-padded): only the second's decode steps pay pad_step_s + pad_step_per_row_s x 2. Detached
    # (no stream) on the deferred clock, streamed (intra, chunk 8) on the event clock.
    d = _dict(scenario_dict, "static", prompts=4, max_batch=2, base="cpu")
    if stream:
        d = _intra(d, 8)
    sc = load_scenario(d)
    lengths = [(32, 20), (32, 20), (20, 30), (32, 30)]
    pad = {"pad_step_s": 0.004, "pad_step_per_row_s": 0.001, "pad_prefill_s": 0.05}
    a = tracked(sc, steps=1, rollouts=lengths, cost=_cost(sc))
    b = tracked(sc, steps=1, rollouts=lengths, cost=_cost(sc, {"hf_generate": pad}))
    ia, ib = _gen_intervals(a.sim)[0], _gen_intervals(b.sim)[0]
    # the padded batch: its prefill (+ pad_prefill_s) gives the first token, then 29 decode steps
    # (streamed, the chunk scorer co-running beside them slows those steps, the padding term with them)
    added = 0.05 + 29 * (0.004 + 2 * 0.001)
    if stream:
        assert ib.end_s - ib.start_s >= ia.end_s - ia.start_s + added * (1 - 1e-9)
    else:
        assert ib.end_s - ib.start_s == pytest.approx(ia.end_s - ia.start_s + added, rel=1e-6)
    if not stream:   # (streamed, the scorer's chunks land at other times, and its co-running with them)
        assert ib.active_s == pytest.approx(ia.active_s, rel=REL)   # host time, not kernels
    # equal prompts everywhere: nothing changes
    same = [(32, 20)] * 4
    c = tracked(sc, steps=1, rollouts=same, cost=_cost(sc))
    e = tracked(sc, steps=1, rollouts=same, cost=_cost(sc, {"hf_generate": pad}))
    ic, ie = _gen_intervals(c.sim)[0], _gen_intervals(e.sim)[0]
    assert ie.end_s - ie.start_s == pytest.approx(ic.end_s - ic.start_s, rel=REL)


def test_pad_step_cost_model():
    from rlhfsim.hardware.catalog import get_gpu
    prof = copy.deepcopy(CostModel.load(get_gpu("cpu")).profile)
    prof["generation"] = {"hf_generate": {"pad_step_s": 0.004, "pad_step_per_row_s": 0.001, "pad_prefill_s": 0.05}}
    cm = CostModel(get_gpu("cpu"), prof)
    assert cm.pad_step_s("hf_generate", 4) == pytest.approx(0.008) and cm.pad_prefill_s("hf_generate") == 0.05
    assert cm.pad_prefill_s("kv_decoder") == 0.0
    assert cm.pad_step_s("hf_generate", 1) == 0.0          # one row has nothing to pad
    assert cm.pad_step_s("kv_decoder", 4) == 0.0 and cm.pad_step_s(None, 4) == 0.0


@pytest.mark.parametrize("engine", ["static", "continuous"])
def test_active_time_is_prefill_and_decode_kernels(engine, scenario_dict, tracked):
    lengths = [(20, 10), (32, 50)]
    run = tracked(_dict(scenario_dict, engine, prompts=2, max_batch=2, base="cpu"), steps=1, rollouts=lengths)
    c = _Costs(run.sim)
    if engine == "static":
        # One generate() call (its fixed host cost), one padded prefill (2 x 32 tokens), then 49 steps
        # of the batch of 2.
        total = c.call() + c.prefill(64, 2) + c.decode(2, 2 * 33, 49)
        active = c.prefill_active(64, 2) + c.decode_active(2, 2 * 33, 49)
    else:
        # One call per row, then 9 steps of both rows, then 40 of the long one (its context 32 + 10).
        total = c.prefill(20, 1) + c.prefill(32, 1) + c.decode(2, 21 + 33, 9) + c.decode(1, 42, 40)
        active = (c.prefill_active(20, 1) + c.prefill_active(32, 1) + c.decode_active(2, 21 + 33, 9)
                  + c.decode_active(1, 42, 40))
    iv = _gen_intervals(run.sim)[0]
    assert iv.end_s - iv.start_s == pytest.approx(total, rel=REL)
    assert iv.active_s == pytest.approx(active, rel=REL)
    assert 0 < iv.active_s < iv.end_s - iv.start_s  # per-step and per-call overheads are not active


# --- chunk handoff ------------------------------------------------------------------------------------
H, PER_ROW = 0.03, 0.002
HANDOFF = {"hf_generate": {"handoff_s": H, "handoff_per_row_s": PER_ROW},
           "vllm": {"handoff_s": H, "handoff_per_row_s": PER_ROW}}


@pytest.fixture
def emits(monkeypatch):
    """Every chunk the scorers receive: (time, rollout id, tokens generated so far, final)."""
    seen = []
    orig = stages.ChunkScorer.emit

    def emit(self, step, r, final):
        seen.append((self.env.now, r.id, r.generated, final))
        return orig(self, step, r, final)

    monkeypatch.setattr(stages.ChunkScorer, "emit", emit)
    return seen


def test_static_batch_hands_off_every_chunk_positions(scenario_dict, tracked, emits):
    # One replica (the reward model has its own GPU), four rows in one batch, chunk 16. The batch's
    # positions after the prefill are 1, 2, ...; boundaries at 16, 32, ..., 96 fall while the 100-token
    # row is still live: 6 pauses of H + 4 x PER_ROW (all 4 rows of the batch, finished ones included).
    # The boundary at 100 would be the batch's end: no pause.
    lengths = [(24, 37), (30, 100), (12, 64), (40, 5)]
    d = _intra(_dict(scenario_dict, "static", prompts=4, max_batch=4, replicas=1), 16)
    sc = load_scenario(d)
    run = tracked(sc, steps=1, rollouts=lengths, cost=_cost(sc, HANDOFF))
    c = _Costs(run.sim)
    pause = H + 4 * PER_ROW
    base = c.prefill(4 * 40, 4)
    want = base + c.decode(4, 4 * 41, 99) + 6 * pause
    iv = _gen_intervals(run.sim)[0]
    assert iv.end_s - iv.start_s == pytest.approx(want, rel=REL)
    # Kernels only: the pauses are not active time.
    assert iv.active_s == pytest.approx(c.prefill_active(160, 4) + c.decode_active(4, 164, 99), rel=1e-6)

    def boundary_at(k):  # the k-th boundary (position 16 k: 16 k - 1 decode steps), before its pause
        return base + c.decode(4, 4 * 41, 16 * k - 1) + (k - 1) * pause

    got = {}
    for t, rid, gen, final in emits:
        got.setdefault(rid, []).append((t, gen, final))
    # The 5-token row ended at position 5: its tokens reach the scorer when the call returns, at the
    # first boundary. The 37-token row: 16 and 32 at boundaries 1, 2, its last tokens at boundary 3.
    # The 64-token row ends exactly at boundary 4. The 100-token row: 6 boundaries, then the end.
    assert [(g, f) for _, g, f in got[3]] == [(5, True)]
    assert [(g, f) for _, g, f in got[0]] == [(16, False), (32, False), (37, True)]
    assert [(g, f) for _, g, f in got[2]] == [(16, False), (32, False), (48, False), (64, True)]
    assert [(g, f) for _, g, f in got[1]] == [(16 * k, False) for k in range(1, 7)] + [(100, True)]
    assert got[3][0][0] == pytest.approx(boundary_at(1), rel=REL)
    assert got[0][2][0] == pytest.approx(boundary_at(3), rel=REL)
    assert got[2][3][0] == pytest.approx(boundary_at(4), rel=REL)
    assert got[1][-1][0] == pytest.approx(iv.end_s, rel=REL)


def test_static_batch_of_a_step_loop_runtime_hands_each_row_over_at_its_own_boundaries_and_end(scenario_dict, tracked, emits):
    # The same batch as above with kv_decoder (genruntimes.ROW_HANDOVER: a decode loop of one step per
    # call, no generate() call to return): each row hands its tokens over at its own chunk boundaries
    # (every 16 generated tokens) and its last ones the moment it ends, and the rows crossing a boundary
    # at the same step share one pause of H + rows x PER_ROW. All four rows got their first token from
    # the prefill, so their boundaries fall together: at positions 16 and 32 three rows cross (the 5-token
    # row has ended), at 48 two (the 37-token row has ended), at 64 one (64 is the 64-token row's end: no
    # pause for it), at 80 and 96 one.
    lengths = [(24, 37), (30, 100), (12, 64), (40, 5)]
    d = _intra(_dict(scenario_dict, "static", prompts=4, max_batch=4, replicas=1, runtime="kv_decoder"), 16)
    sc = load_scenario(d)
    kv = {"kv_decoder": {"handoff_s": H, "handoff_per_row_s": PER_ROW}}
    run = tracked(sc, steps=1, rollouts=lengths, cost=_cost(sc, kv))
    c = _Costs(run.sim)
    pauses = [H + k * PER_ROW for k in (3, 3, 2, 1, 1, 1)]
    base = c.prefill(4 * 40, 4)
    want = base + c.decode(4, 4 * 41, 99) + sum(pauses)
    iv = _gen_intervals(run.sim)[0]
    assert iv.end_s - iv.start_s == pytest.approx(want, rel=REL)

    def at(pos, k):  # position pos of the batch (pos - 1 decode steps), after the first k pauses
        return base + c.decode(4, 4 * 41, pos - 1) + sum(pauses[:k])

    got = {}
    for t, rid, gen, final in emits:
        got.setdefault(rid, []).append((t, gen, final))
    assert [(g, f) for _, g, f in got[3]] == [(5, True)]            # at its end, not at the first boundary
    assert [(g, f) for _, g, f in got[0]] == [(16, False), (32, False), (37, True)]
    assert [(g, f) for _, g, f in got[2]] == [(16, False), (32, False), (48, False), (64, True)]
    assert [(g, f) for _, g, f in got[1]] == [(16 * k, False) for k in range(1, 7)] + [(100, True)]
    assert got[3][0][0] == pytest.approx(at(5, 0), rel=REL)
    assert got[0][2][0] == pytest.approx(at(37, 2), rel=REL)
    assert got[2][3][0] == pytest.approx(at(64, 3), rel=REL)
    assert got[1][-1][0] == pytest.approx(iv.end_s, rel=REL)


def test_continuous_rows_crossing_together_share_one_pause(scenario_dict, tracked):
    # Four rows admitted together: four prefill calls, then each row's first token; their own chunk
    # boundaries (16 and 32 generated tokens) fall at the same decode steps, so each boundary is one
    # pause of H + 4 x PER_ROW. The 48th token is the end, not a boundary.
    d = _intra(_dict(scenario_dict, "continuous", prompts=4, max_batch=4, replicas=1), 16)
    sc = load_scenario(d)
    run = tracked(sc, steps=1, rollouts=[(32, 48)] * 4, cost=_cost(sc, HANDOFF))
    c = _Costs(run.sim)
    want = 4 * c.prefill(32, 1) + c.decode(4, 4 * 33, 47) + 2 * (H + 4 * PER_ROW)
    assert run.records[0].phases_s["generate"] == pytest.approx(want, rel=REL)


def test_continuous_rows_crossing_apart_pause_apart(scenario_dict, tracked):
    # max_batch 1: the rows run one after another, each crossing its boundaries alone (rows = 1).
    d = _intra(_dict(scenario_dict, "continuous", prompts=3, max_batch=1, replicas=1), 16)
    sc = load_scenario(d)
    run = tracked(sc, steps=1, rollouts=[(32, 48), (20, 40), (8, 16)], cost=_cost(sc, HANDOFF))
    c = _Costs(run.sim)
    # 48 tokens: boundaries at 16, 32; 40 tokens: 16, 32; 16 tokens: none (16 is its end).
    want = (c.prefill(32, 1) + c.decode(1, 33, 47) + c.prefill(20, 1) + c.decode(1, 21, 39)
            + c.prefill(8, 1) + c.decode(1, 9, 15) + 4 * (H + PER_ROW))
    assert run.records[0].phases_s["generate"] == pytest.approx(want, rel=REL)


@pytest.mark.parametrize("engine", ["static", "continuous"])
@pytest.mark.parametrize("base", ["gpu", "colocated"])
def test_zero_handoff_is_no_handoff(engine, base, scenario_dict, tracked):
    # A profile whose runtimes cost nothing at a boundary gives exactly the run of a profile without
    # them: same records, same intervals (no zero-length pause events that could reorder anything).
    d = scenario_dict(base, {"generation": {"engine": engine}}, schedule="oppo")
    d["schedule"]["intra"]["chunk_tokens"] = 16
    sc = load_scenario(d)
    zeros = {rt: {"handoff_s": 0.0, "handoff_per_row_s": 0.0, "call_overhead_s": 0.0} for rt in ("hf_generate", "vllm")}
    a = tracked(sc, steps=3, cost=_cost(sc))
    b = tracked(sc, steps=3, cost=_cost(sc, zeros))
    assert [r.__dict__ for r in a.records] == [r.__dict__ for r in b.records]
    assert a.sim.rec.intervals == b.sim.rec.intervals
    # ...and a non-zero handoff does cost something here.
    c = tracked(sc, steps=3, cost=_cost(sc, HANDOFF))
    assert sum(c.step_times) > sum(a.step_times)


# Step times pinned from the generation code before it was split into engines (same semantics: the
# continuous engine without KV pressure, the static engine with one replica, so that dealing is the
# same, and the kv_decoder runtime, whose costs are the plain prefill/decode the old code used and whose
# decode moves the K/V cache once per step as before).
PINNED = [
    ("gpu", {"engine": "continuous", "runtime": "kv_decoder"}, "oppo-intra",
     [6.569415225656997, 4.866321158897775, 2.488248866704497, 3.737997451730239]),
    ("colocated", {"engine": "continuous", "runtime": "kv_decoder"}, "oppo",
     [3.2836524729564553, 4.163499588513687, 2.6023881747031608, 2.9832362783989144]),
    ("gpu", {"engine": "static", "replicas": 1, "runtime": "kv_decoder"}, "oppo-inter",
     [10.786694438218397, 8.031909055091731, 4.568945744229264, 5.777942219259348]),
]


@pytest.mark.parametrize("base,gen,schedule,want", PINNED)
def test_pinned_step_times_without_handoff(base, gen, schedule, want, scenario_dict, tracked):
    sc = load_scenario(scenario_dict(base, {"generation": gen}, schedule=schedule))
    run = tracked(sc, steps=4, cost=_cost(sc))
    assert run.step_times == pytest.approx(want, rel=1e-12)


# --- continuous engine: the admission watermark ---------------------------------------------------------
@pytest.mark.parametrize("over", [0, 1])
def test_watermark_holds_back_an_admission_that_would_leave_less_free(over, scenario_dict):
    # Two rows of 5 tokens. They are admitted together only if the cache keeps W = floor(0.01 C) tokens
    # free after admitting both (each needs prompt + 1); one token more and the second waits for the
    # first to finish.
    sc = load_scenario(_dict(scenario_dict, "continuous", prompts=2, max_batch=2, replicas=1,
                             kv_cache_fraction=0.0003))
    cap = build_setup(sc).kv_capacity_tokens
    w = int(0.01 * cap)
    assert w >= 10
    a = (cap - w) // 2 - 1
    b = cap - w - 2 - a + over  # (a + 1) + (b + 1) = C - W + over
    sim, res = _run_request(sc, [Rollout(0, a, 5), Rollout(1, b, 5)])
    c = _Costs(sim)
    if over:
        want = c.prefill(a, 1) + c.decode(1, a + 1, 4) + c.prefill(b, 1) + c.decode(1, b + 1, 4)
    else:
        want = c.prefill(a, 1) + c.prefill(b, 1) + c.decode(2, a + b + 2, 4)
    assert res.end_s - res.start_s == pytest.approx(want, rel=REL)
    assert res.preemptions == 0 and len(res.finished) == 2


def _large_kv_tight(n: int, watermark: float, monkeypatch):
    """One replica of the sim_speed benchmark's engines (Qwen2.5-7B on 8 H100-SXM beside its reference and
    reward model: a KV cache of about 439k tokens, 256 sequences at most) given ``n`` rollouts of
    512-token prompts and lognormal(600, p99 8000) responses: at 256 sequences the batch needs more
    cache than there is, so admission and preemption decide its size."""
    monkeypatch.setattr(ContinuousEngine, "WATERMARK", watermark)
    d = {
        "name": "kv-tight",
        "models": {"actor": {"model": "qwen2.5-7b"}, "reference": {"model": "qwen2.5-7b"},
                   "reward": {"model": "qwen2.5-7b"}},
        "cluster": {"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 8},
        "placement": {"kind": "colocated"},
        "algorithm": {"kind": "grpo", "group_size": 8, "minibatch_size": 256},
        "workload": {"prompts_per_step": n // 8, "prompt_length": {"kind": "fixed", "value": 512},
                     "max_prompt_tokens": 1024,
                     "response_length": {"kind": "lognormal", "median": 600, "p99": 8000},
                     "max_response_tokens": 16384},
        "generation": {"engine": "continuous", "max_batch": 256, "replicas": 1},
        "seed": 0,
    }
    setup = build_setup(load_scenario(d))
    sim = Simulation(setup, CostModel.load(setup.gpu, "default"))
    rollouts = sim.stream.take(n, 0)
    proc = sim.env.process(Generation(sim, GenRequest(0, rollouts)).run())
    sim.env.run(proc)
    res = proc.value
    return setup, rollouts, res


def test_watermark_ends_preempt_readmit_churn(monkeypatch):
    n = 4096
    assert ContinuousEngine.WATERMARK == 0.01  # vLLM's default
    setup, rollouts, res = _large_kv_tight(n, 0.0, monkeypatch)
    assert 400_000 < setup.kv_capacity_tokens < 480_000
    churn = res.preemptions / n
    setup, rollouts, res = _large_kv_tight(n, 0.01, monkeypatch)
    calm = res.preemptions / n
    # Without the watermark a preempted row is readmitted as soon as anything ends and evicted again:
    # about one recompute per rollout. With vLLM's 1% watermark the batch has room to grow first.
    assert churn > 0.5
    assert calm < 0.1
    # Nothing lost or counted twice: every rollout finished once, every token decoded once.
    assert sorted(r.id for r in res.finished) == [r.id for r in rollouts] and not res.unfinished
    assert res.generated_tokens == sum(r.response_len for r in rollouts)

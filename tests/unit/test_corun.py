"""Co-running in the hand-over pattern (calibrate.cpu.corun): the grid field, the plan of points, the points'
fields and the profile's summary. The measurement itself runs in tests/integration/test_calibrate_cli.py."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from calibrate.fitting.assemble import interference_summary  # noqa: E402
from calibrate.cpu.corun import handover_plan  # noqa: E402
from calibrate.running.grid import QUICK_CPU, QUICK_GPU, with_overrides  # noqa: E402
from rlhfsim.errors import RlhfsimError  # noqa: E402
from rlhfsim.models.catalog import CATALOG  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it

TINY, SMALL, DEB = CATALOG["tiny-qwen2"], CATALOG["small-qwen2"], CATALOG["tiny-deberta"]


def test_plan_resolves_default_and_named_models():
    grid = with_overrides(QUICK_CPU, {"handover": [["kv_decoder", "", "", 4, 64, 32],
                                                   ["hf_generate", "small-qwen2", "tiny-deberta", 2, 48, 16]]})
    plan = handover_plan(grid, [DEB, TINY, SMALL], [TINY, SMALL])
    assert plan == [("kv_decoder", TINY, TINY, 4, 64, 32), ("hf_generate", SMALL, DEB, 2, 48, 16)]
    assert handover_plan(grid, [DEB], []) == []                   # no decoder: nothing to generate with
    assert QUICK_GPU.handover == ()                               # not measured on GPUs yet (docs/cost-model.md)


@pytest.mark.parametrize("entry, message", [
    (["trt_llm", "", "", 4, 64, 32], "grid.handover: expected a list of \\[runtime"),
    (["kv_decoder", "", "", 0, 64, 32], "grid.handover: expected a list of \\[runtime"),
    (["kv_decoder", 3, "", 4, 64, 32], "grid.handover: expected a list of \\[runtime"),
])
def test_bad_grid_entries_name_the_field(entry, message):
    with pytest.raises(RlhfsimError, match=message):
        with_overrides(QUICK_CPU, {"handover": [entry]})


def test_plan_refuses_models_not_calibrated_and_encoder_actors():
    grid = with_overrides(QUICK_CPU, {"handover": [["kv_decoder", "qwen2.5-7b", "", 4, 64, 32]]})
    with pytest.raises(RlhfsimError, match="grid.handover: expected a calibrated model as the actor, got 'qwen2.5-7b'"):
        handover_plan(grid, [TINY], [TINY])
    grid = with_overrides(QUICK_CPU, {"handover": [["kv_decoder", "tiny-deberta", "", 4, 64, 32]]})
    with pytest.raises(RlhfsimError, match="expected a decoder as the actor"):
        handover_plan(grid, [TINY, DEB], [TINY])


def _pt(rt, side, model, partner, slowdown, pattern="handover"):
    return {"op": "interference", "runtime": rt, "side": side, "model": model, "partner": partner, "batch": 4,
            "seq_len": 32, "prefix_len": 64, "alone_median_s": 1.0, "median_s": slowdown, "alone_tmean_s": 1.0,
            "tmean_s": slowdown, "slowdown": slowdown, "chunk": 32, **({"corun_pattern": pattern} if pattern else {})}


def test_summary_keeps_busy_loops_and_hand_over_apart():
    pts = [_pt("kv_decoder", "decode", "a", "a", 1.1, None), _pt("kv_decoder", "prefill", "a", "a", 1.3, None),
           _pt("hf_generate", "decode", "a", "a", 1.5), _pt("hf_generate", "prefill", "a", "a", 2.0),
           _pt("hf_generate", "decode", "b", "b", 2.5), _pt("hf_generate", "prefill", "b", "b", 3.0),
           {**_pt("kv_decoder", "decode", "a", "a", 9.0), "skipped": "invalid"}]
    out = interference_summary(pts, {"decode_slowdown": 1.25, "prefill_slowdown": 1.4})
    assert (out["decode_slowdown"], out["prefill_slowdown"], out["source"]) == (1.1, 1.3, "measured")
    assert set(out["handover"]) == {"hf_generate"}                # a skipped point measures nothing
    h = out["handover"]["hf_generate"]
    assert (h["decode_slowdown"], h["prefill_slowdown"]) == (2.0, 2.5) and len(h["configs"]) == 4
    # hand-over points alone leave the busy-loop figures at their defaults
    only = interference_summary(pts[2:4], {"decode_slowdown": 1.25, "prefill_slowdown": 1.4})
    assert only["source"] == "default" and only["decode_slowdown"] == 1.25 and "hf_generate" in only["handover"]


def test_each_pairing_has_its_own_points():
    # The same actor beside two scorers is two measurements on both sides (the journal skips a key it has).
    from types import SimpleNamespace

    from calibrate.cpu.corun import handover_keys

    s = SimpleNamespace(dtype="float32", device="cpu")
    a = handover_keys(s, "hf_generate", SMALL, SMALL, 4, 48, 32)
    b = handover_keys(s, "hf_generate", SMALL, DEB, 4, 48, 32)
    c = handover_keys(s, "kv_decoder", SMALL, SMALL, 4, 48, 32)
    assert len({a["decode"], b["decode"], c["decode"]}) == 3 and len({a["prefill"], b["prefill"], c["prefill"]}) == 3


def test_extend_adds_hand_over_to_a_measured_profile(tmp_path):
    # python -m calibrate.running.extend PROFILE --handover, on a copy of the test CPU profile: the section, its
    # points and the provenance record are added, nothing else the profile had is changed.
    import json
    import shutil
    from pathlib import Path

    import torch

    from calibrate.running.extend import extend_handover
    from rlhfsim.costs.profile import load_profile

    src = Path(__file__).resolve().parents[1] / "fixtures" / "profiles" / "cpu.json"
    path = tmp_path / "p.json"
    shutil.copy(src, path)
    before = json.loads(path.read_text())
    threads = torch.get_num_threads()
    doc = extend_handover(path, ["tiny-qwen2"], threads=1, batch=2, prompt=8, chunk=4, runtimes=("kv_decoder",))
    assert torch.get_num_threads() == threads                     # restored
    h = doc["interference"]["handover"]["kv_decoder"]
    assert h["decode_slowdown"] > 0 and h["prefill_slowdown"] > 0 and {c["side"] for c in h["configs"]} == {"decode", "prefill"}
    assert doc["provenance"]["extensions"][-1]["added"] == ["interference.handover"]
    assert doc["operations"] == before["operations"]
    assert load_profile(str(path))["interference"]["handover"]["kv_decoder"] == h


@pytest.mark.parametrize("record, why", [
    (None, "generation runtime hf_generate not checked on tiny-qwen2 in this calibration"),
    ({"valid": False, "reason": "tokens differ from eager"}, "tokens differ from eager"),
    ({"valid": False, "reason": ""}, "generation runtime hf_generate invalid on tiny-qwen2"),
])
def test_a_runtime_not_valid_on_the_actor_is_journaled_skipped(tmp_path, record, why):
    from calibrate.cpu.corun import handover_keys, measure_handover
    from calibrate.measuring.genbench import runtime_key
    from calibrate.running.journal import Journal
    from calibrate.running.progress import Progress
    from calibrate.running.session import Session

    with Journal.open(tmp_path / "j.journal.jsonl", {"device_kind": "cpu", "dtype": "float32"}, resume=False) as j:
        if record is not None:
            j.append({"kind": "runtime", "key": runtime_key("hf_generate", TINY.name), **record})
        s = Session("cpu", "float32", QUICK_CPU, j, Progress(2, enabled=False), tmp_path)
        measure_handover(s, "hf_generate", TINY, TINY, 2, 8, 4)
        for key in handover_keys(s, "hf_generate", TINY, TINY, 2, 8, 4).values():
            assert j.get(key)["skipped"] == why


def _cfg(side, layers, alone_s, corun_s, steps=32):
    return {"side": side, "model": f"m{layers}-{alone_s}", "partner": "p", "layers": layers, "seq_len": steps,
            "alone_median_s": alone_s * (steps if side == "decode" else 1),
            "corun_median_s": corun_s * (steps if side == "decode" else 1), "slowdown": corun_s / alone_s}


def test_added_fit_recovers_the_time_per_layer_and_per_second_alone():
    # a decode step beside the scorer takes t (1 + 0.2) + 0.5 ms + 0.6 ms x L: the fit gives those back
    # from the intervals (seq_len steps each), whatever the models' sizes
    from calibrate.fitting.assemble import handover_added_fit

    law = lambda L, t: t * 1.2 + 5e-4 + 6e-4 * L  # noqa: E731
    configs = [_cfg("decode", L, t, law(L, t)) for L, t in ((2, 1e-3), (2, 3e-3), (3, 2e-3), (4, 1.2e-3), (4, 4e-3))]
    fit = handover_added_fit(configs, "decode")
    assert fit["const_s"] == pytest.approx(5e-4, rel=1e-6) and fit["per_layer_s"] == pytest.approx(6e-4, rel=1e-6)
    assert fit["per_alone"] == pytest.approx(0.2, rel=1e-6) and fit["n_configs"] == 5 and fit["rms_resid_s"] < 1e-12
    assert handover_added_fit(configs, "prefill") is None                     # no configurations of that side
    assert handover_added_fit([c for c in configs if c["layers"] == 2] * 2, "decode") is None   # one layer count


def test_added_fit_keeps_every_term_non_negative():
    # time added that falls with the layers is no per-layer cost: the term is 0 and the rest is fitted alone
    from calibrate.fitting.assemble import handover_added_fit

    configs = [_cfg("prefill", L, 1e-3, 1e-3 + a) for L, a in ((2, 3e-3), (3, 2.5e-3), (4, 2e-3))]
    fit = handover_added_fit(configs, "prefill")
    assert fit["per_layer_s"] == 0.0 and min(fit["const_s"], fit["per_alone"]) >= 0.0
    assert fit["const_s"] + fit["per_alone"] * 1e-3 == pytest.approx(2.5e-3, rel=1e-6)   # the mean added time


def test_summary_fits_the_added_time_from_the_points_shapes():
    # interference_summary gives each hand-over configuration its model's layers (from the point's shape)
    # and fits ``added`` per runtime when both sides can be fitted; the profile check accepts it
    from rlhfsim.costs.profile import _check_interference

    models = {L: CATALOG[n] for L, n in ((2, "tiny-qwen2"), (4, "tiny-qwen2-l4"))}
    pts = []
    for L, alone, extra in ((2, 1e-3, 2e-3), (4, 1.5e-3, 3.2e-3), (2, 3e-3, 2.1e-3), (4, 4e-3, 3.1e-3)):
        shape = models[L].to_dict()
        for side, n in (("decode", 32), ("prefill", 1)):
            p = _pt("kv_decoder", side, models[L].name, models[L].name, (alone + extra) / alone)
            p.update(alone_median_s=alone * n, median_s=(alone + extra) * n, seq_len=32, shape=shape)
            pts.append(p)
    h = interference_summary(pts, {"decode_slowdown": 1.25, "prefill_slowdown": 1.4})["handover"]["kv_decoder"]
    assert sorted({c["layers"] for c in h["configs"]}) == [2, 4]
    d = h["added"]["decode"]
    assert d["per_layer_s"] == pytest.approx(0.55e-3, rel=0.05) and d["n_configs"] == 4
    _check_interference({"handover": {"kv_decoder": h}}, "p")
    for bad in ({"decode": d}, {"decode": d, "prefill": {**d, "per_layer_s": -1.0}}):
        with pytest.raises(Exception, match=r"p\.handover\.kv_decoder\.added"):
            _check_interference({"handover": {"kv_decoder": {**h, "added": bad}}}, "p")


def test_overlap_fit_recovers_the_actors_speed_beside_a_waiting_and_a_computing_scorer():
    # Synthetic stamps: alone every step takes 1 ms; in the hand-over rounds a step runs at 1/1.1 of that
    # speed while the scorer waits and 1/2.5 while one of its calls runs. The fit must give both back.
    import numpy as np

    from calibrate.cpu.corun import overlap_fit

    rng = np.random.default_rng(0)
    alone = [(i * 1e-3, (i + 1) * 1e-3) for i in range(40)]
    idle, busy = 1.1, 2.5
    ops, calls, t = [], [], 0.0
    for k in range(60):
        f = rng.uniform(0, 1) if k % 3 else 0.0                 # the share of the step's work under a call
        dur = 1e-3 * (idle * (1 - f) + busy * f)                 # work 1 ms: time = idle (1-f) + busy f
        if f > 0:
            calls.append((t, t + 1e-3 * busy * f))               # a call covers the step's first part
        ops.append((t, t + dur))
        t += dur
    fit = overlap_fit(alone, ops, calls)
    assert fit["idle_x"] == pytest.approx(idle, rel=1e-6) and fit["busy_x"] == pytest.approx(busy, rel=1e-6)
    assert 0 < fit["duty"] < 1 and fit["n_ops"] == 60 and fit["alone_op_s"] == pytest.approx(1e-3)
    # a span of overlap too narrow to say anything of the ends, or too few steps: no fit
    assert overlap_fit(alone, [o for o, c in zip(ops, range(60)) if c % 3 == 0], calls) is None   # f = 0 only
    assert overlap_fit(alone, ops[:5], calls) is None
    # never faster than alone: the factors are at least 1, busy at least idle
    fast = overlap_fit(alone, [(a, a + 0.5 * (b - a)) for a, b in ops], calls)
    assert fast is None or (fast["idle_x"] >= 1.0 and fast["busy_x"] >= fast["idle_x"])


def test_summary_keeps_the_overlap_fits_medians():
    ov = [{"idle_x": 1.0, "busy_x": 2.0, "duty": 0.2, "n_ops": 150, "alone_op_s": 1e-3},
          {"idle_x": 1.2, "busy_x": 3.0, "duty": 0.3, "n_ops": 150, "alone_op_s": 2e-3},
          {"idle_x": 1.1, "busy_x": 2.2, "duty": 0.1, "n_ops": 150, "alone_op_s": 3e-3}]
    from rlhfsim.models.catalog import CATALOG as C

    shapes = [C["tiny-qwen2"], C["small-qwen2-l2"], C["small-qwen2"]]
    pts = [{**_pt("kv_decoder", "decode", m, m, 1.2), "overlap": o, "shape": sh.to_dict()} for m, o, sh in zip("abc", ov, shapes)]
    pts += [_pt("kv_decoder", "prefill", m, m, 2.0) for m in "abc"] + [_pt("hf_generate", "decode", "a", "a", 1.3),
                                                                      _pt("hf_generate", "prefill", "a", "a", 2.0)]
    h = interference_summary(pts, {"decode_slowdown": 1.25, "prefill_slowdown": 1.4})["handover"]
    assert (h["kv_decoder"]["overlap"]["idle_x"], h["kv_decoder"]["overlap"]["busy_x"]) == (1.1, 2.2)
    assert h["kv_decoder"]["overlap"]["n_configs"] == 3 and h["kv_decoder"]["overlap"]["configs"][1]["model"] == "b"
    assert "overlap" not in h["hf_generate"]                      # no point with a fit: the runtime has none
    # the share of a call's time the actor loses, 1 - idle_x / busy_x, as a line in the log of its size
    import numpy as np

    x = np.log([sh.params("lm") for sh in shapes])
    want = np.polyfit(x, [1 - o["idle_x"] / o["busy_x"] for o in ov], 1)
    line = h["kv_decoder"]["overlap"]["lost"]
    assert (line["per_log_params"], line["intercept"]) == pytest.approx(tuple(want))


def test_call_steps_splits_a_generate_call_at_its_forwards():
    # a call of 3 new tokens: its three forwards' starts split it into three decode steps, the last one to the
    # call's end; the setup before the first forward is in none. Forwards not seen one per token: the whole call.
    from calibrate.cpu.corun import call_steps

    assert call_steps(0.0, [0.1, 0.3, 0.6], 1.0, 3) == [(0.1, 0.3), (0.3, 0.6), (0.6, 1.0)]
    assert call_steps(0.0, [0.1, 0.3], 1.0, 3) == [(0.0, 1.0)]
    assert call_steps(0.0, [], 1.0, 3) == [(0.0, 1.0)]


@pytest.mark.parametrize("rt", ["hf_generate", "kv_decoder"])
def test_the_actors_operations_are_its_decode_steps(tmp_path, rt):
    # calibrate.cpu.corun._Actor.interval: c operations per interval for either runtime (a generate() call's
    # decode steps come from forward hooks), in order and back to back for a generate() call; every row is
    # handed over once per interval; the hook is removed with the actor.
    import torch

    from calibrate.cpu.corun import _Actor
    from calibrate.running.journal import Journal
    from calibrate.running.progress import Progress
    from calibrate.running.session import Session

    b, p, c = 2, 8, 4
    with Journal.open(tmp_path / "j.journal.jsonl", {"device_kind": "cpu", "dtype": "float32"}, resume=False) as j:
        s = Session("cpu", "float32", QUICK_CPU, j, Progress(1, enabled=False), tmp_path)
        actor = _Actor(s, rt, TINY, b, p, c, p + 4 * c)
        try:
            with torch.inference_mode():
                actor.begin()
                for _ in range(3):
                    ops, handed = [], []
                    actor.interval(handed.append, ops)
                    assert len(ops) == c and sorted(handed) == list(range(b))
                    assert all(t0 < t1 for t0, t1 in ops) and all(a[1] <= b_[0] for a, b_ in zip(ops, ops[1:]))
                    if rt == "hf_generate":
                        assert all(a[1] == b_[0] for a, b_ in zip(ops, ops[1:]))
        finally:
            actor.close()
        if rt == "hf_generate":
            actor.starts.clear()
            actor.model(input_ids=torch.ones((1, 2), dtype=torch.long))
            assert actor.starts == []                                   # hook removed


def test_generate_runtimes_points_are_measured_again_with_their_steps():
    # a journal's hand-over points of a generate() runtime from before the per-step stamps have other keys
    from types import SimpleNamespace

    from calibrate.cpu.corun import handover_keys

    s = SimpleNamespace(dtype="float32", device="cpu")
    hf = handover_keys(s, "hf_generate", SMALL, SMALL, 4, 48, 32)
    kv = handover_keys(s, "kv_decoder", SMALL, SMALL, 4, 48, 32)
    assert all(":steps" in k for k in hf.values())
    assert not any(":steps" in k for k in kv.values())

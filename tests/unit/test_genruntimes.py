"""Generation runtimes on the hardware side: the registry matches the contract, each runtime's greedy
tokens equal eager's (and a broken one is caught), per-row stopping gives exact lengths, a chunked
continuation gives one call's tokens, genbench journals its points and a resume skips them, assemble
writes the contract's keys, and ``rlhfsim runtimes`` reports them."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from calibrate.fitting.assemble import _handoff_fit, build_profile  # noqa: E402
from calibrate.cli import runtimes_command  # noqa: E402
from calibrate.fitting.fit import point_work  # noqa: E402
from calibrate.measuring.genbench import measure_gen_runtimes, pad_lengths, plan, plan_size  # noqa: E402
from calibrate.genruntimes import GEN_RUNTIMES_IMPL, GumbelNoise, check_prompts, check_runtime, eager_greedy  # noqa: E402
from calibrate.genruntimes.hf_generate import HfGenerate, RowStop  # noqa: E402
from calibrate.running.grid import QUICK_CPU, with_overrides  # noqa: E402
from calibrate.running.journal import Journal  # noqa: E402
from calibrate.measuring.models import PAD_ID, build_hf_model  # noqa: E402
from calibrate.running.progress import Progress  # noqa: E402
from calibrate.running.session import Session  # noqa: E402
from rlhfsim.costs.genruntimes import GEN_RUNTIMES, GEN_SCALARS  # noqa: E402
from rlhfsim.costs.model import CostModel  # noqa: E402
from rlhfsim.costs.profile import validate_profile  # noqa: E402
from rlhfsim.errors import RlhfsimError  # noqa: E402
from rlhfsim.hardware.catalog import get_gpu  # noqa: E402
from rlhfsim.models.catalog import CATALOG  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it

TINY = CATALOG["tiny-qwen2"]
META = {"device_kind": "cpu", "device_name": "test", "dtype": "float32", "threads": 1}
GRID = {"gen_runtimes": ["hf_generate", "kv_decoder", "vllm"], "gen_prefill": [[1, 16], [2, 32]],
        "gen_decode": [[1, 16], [2, 32]], "gen_decode_steps": 3, "handoff": [[1, 8, 8, 4], [2, 8, 8, 4]],
        "gen_pad": [[1, 16], [4, 16]],
        "warmup": 0, "min_iters": 2, "max_iters": 3, "point_budget_s": 0.0, "gen_point_budget_s": 0.0,
        "quiet_wait_s": 0.0}
CONTRACT_KEYS = {"valid", "available", "reason", "semantics", *GEN_SCALARS, "tokens_match_eager", "source",
                 "n_points", "ms_per_step"}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_hf_model(TINY, "lm", "float32", "cpu", seed=0)


def _loaded(name: str, model, max_batch: int = 4, max_len: int = 64):
    rt = GEN_RUNTIMES_IMPL[name]()
    rt.load(model, TINY, max_batch=max_batch, max_len=max_len)
    return rt


def test_registry_matches_the_contract():
    assert list(GEN_RUNTIMES_IMPL) == list(GEN_RUNTIMES)
    for name, cls in GEN_RUNTIMES_IMPL.items():
        rt = cls()
        assert cls.NAME == name and rt.semantics == GEN_RUNTIMES[name]
        ok, why = rt.available("cpu")
        assert isinstance(ok, bool) and isinstance(why, str) and (ok or why)
    # the engines with paged caches need CUDA and their package: skipped here with the reason
    for name in ("vllm", "sglang"):
        ok, why = GEN_RUNTIMES_IMPL[name]().available("cpu")
        if not torch.cuda.is_available():
            assert not ok and ("not importable" in why or "CUDA" in why)


@pytest.mark.parametrize("name", ["hf_generate", "kv_decoder"])
def test_greedy_tokens_equal_eager(model, name):
    ids, mask = check_prompts(TINY.vocab, 4, "cpu")
    assert (mask == 0).any()                                   # left padding is exercised
    noise = GumbelNoise(8, 4, TINY.vocab, "cpu")
    ref, ref_logits = eager_greedy(model, ids, mask, 8, noise)
    assert len(set(ref.flatten().tolist())) > 8                 # not the last prompt token repeated
    res = check_runtime(_loaded(name, model), ids, mask, ref, ref_logits, "float32", noise)
    assert res["valid"] and res["tokens_match_eager"] and res["chunked_match"], res
    assert res["first_divergence"] is None and res["max_abs_diff"] < 1e-4


class _NoMask(HfGenerate):
    """A broken runtime: it attends to the left padding."""

    def generate(self, ids, mask, max_new_tokens, **kw):
        return super().generate(ids, torch.ones_like(mask), max_new_tokens, **kw)


def test_the_check_catches_a_runtime_that_differs_from_eager(model):
    ids, mask = check_prompts(TINY.vocab, 4, "cpu")
    noise = GumbelNoise(8, 4, TINY.vocab, "cpu")
    ref, ref_logits = eager_greedy(model, ids, mask, 8, noise)
    rt = _NoMask()
    rt.load(model, TINY, max_batch=4, max_len=64)
    res = check_runtime(rt, ids, mask, ref, ref_logits, "float32", noise)
    assert not res["valid"] and not res["tokens_match_eager"] and res["first_divergence"] is not None
    assert f"differ from eager at token {res['first_divergence']} of 8" in res["reason"]


def test_row_stop_gives_exact_lengths_and_pads_finished_rows(model):
    ids, mask = check_prompts(TINY.vocab, 3, "cpu")
    rt = _loaded("hf_generate", model)
    lens = [3, 7, 10]
    for sample in (True, False):
        gen = rt.generate(ids, mask, 10, sample=sample, stopping=(RowStop(lens, "cpu"),))
        new = gen.new_tokens(ids.shape[1])
        assert new.shape == (3, 10)
        for row, n in zip(new.tolist(), lens):
            assert all(t != PAD_ID for t in row[:n]) and all(t == PAD_ID for t in row[n:]), (row, n)


def test_a_chunked_continuation_gives_the_tokens_of_one_call(model):
    ids, mask = check_prompts(TINY.vocab, 3, "cpu")
    noise = GumbelNoise(12, 3, TINY.vocab, "cpu")
    rt = _loaded("hf_generate", model)
    one = rt.generate(ids, mask, 12, sample=False, processors=(noise,))
    noise.reset()
    seq, m, state = ids, mask, None
    for k in range(3):
        g = rt.generate(seq, m, 4, sample=False, state=state, keep_state=True, processors=(noise,))
        assert g.sequences.shape[1] == ids.shape[1] + 4 * (k + 1)
        seq, m, state = g.sequences, g.mask, g.state
    assert torch.equal(seq, one.sequences)
    assert state.get_seq_length() == ids.shape[1] + 12 - 1      # the last token is not yet fed


# -- genbench -> journal -> profile -> report ---------------------------------------------------------------
@pytest.fixture(scope="module")
def journaled(tmp_path_factory):
    path = tmp_path_factory.mktemp("gen") / "cpu.journal.jsonl"
    grid = with_overrides(QUICK_CPU, GRID)
    with Journal.open(path, META, resume=False) as j:
        s = Session("cpu", "float32", grid, j, Progress(plan_size(grid, [TINY]), enabled=False), path.parent)
        measure_gen_runtimes(s, [TINY])
        assert s.progress.done == s.progress.total == plan_size(grid, [TINY]) == 8 + 6   # hf_generate's 8, vllm's 6 skipped
        records = list(j.records)
    return path, grid, records


def test_genbench_journals_points_and_records(journaled):
    _, grid, records = journaled
    pts = {r["key"]: r for r in records if r.get("kind") == "point"}
    assert len(pts) == 8 and all(p["runtime"] == "hf_generate" for p in pts.values())
    ops = sorted(p["op"] for p in pts.values())
    assert ops == ["decode", "decode", "handoff", "handoff", "pad", "pad", "prefill", "prefill"]
    one_row = [p for p in pts.values() if p["op"] == "pad" and p["batch"] == 1]
    assert len(one_row) == 1 and "one row has nothing to pad" in one_row[0]["skipped"]
    for p in pts.values():
        if "skipped" in p:
            continue
        if p["op"] == "pad":         # per-step difference, padded against uniform, from two pairs of calls
            k = p["steps"]
            assert k == 3 and p["padded_lengths"] == [16, 14, 11, 8] and p["prompt_len"] == 16
            assert p["samples_s"] == pytest.approx([((d - c) - (b - a)) / k for a, b, c, d in zip(
                p["short_samples_s"], p["long_samples_s"], p["padded_short_samples_s"], p["padded_long_samples_s"])])
            assert p["prefill_pad_s"] is not None
            continue
        assert p["samples_s"] and p["tmean_s"] is not None
        if p["op"] == "prefill":     # in-call forward times, the whole calls kept beside them
            assert len(p["call_samples_s"]) == len(p["samples_s"]) and p["call_tmean_s"] > p["tmean_s"] > 0
            assert p["call_overhead_s"] == pytest.approx(p["call_tmean_s"] - p["tmean_s"])
        if p["op"] == "decode":      # per-step samples from pairs of calls of 1 and 1 + K tokens
            k = p["steps"]
            assert k == 3 and p["prefix_len"] == p["prompt_len"] + (k - 1) / 2 == p["context"]
            assert p["samples_s"] == pytest.approx([(b - a) / k for a, b in zip(p["short_samples_s"], p["long_samples_s"])])
        if p["op"] == "handoff":
            assert p["boundaries"] == 1 and len(p["one_samples_s"]) == len(p["chunked_samples_s"])
    recs = {r["runtime"]: r for r in records if r.get("kind") == "runtime"}
    assert all(r["family"] == "generation" for r in recs.values())
    assert recs["hf_generate"]["valid"] and recs["hf_generate"]["tokens_match_eager"]
    assert recs["kv_decoder"]["valid"] and recs["kv_decoder"]["tokens_match_eager"]
    if not torch.cuda.is_available():
        assert not recs["vllm"]["available"] and not recs["vllm"]["valid"] and recs["vllm"]["reason"]


def test_a_resume_measures_nothing_again(journaled, monkeypatch, tmp_path):
    path, grid, records = journaled
    copy = tmp_path / "cpu.journal.jsonl"
    copy.write_bytes(path.read_bytes())

    def boom(*a, **k):
        raise AssertionError("a journaled point was measured again")

    monkeypatch.setattr(HfGenerate, "generate", boom)
    with Journal.open(copy, META, resume=True) as j:
        s = Session("cpu", "float32", grid, j, Progress(plan_size(grid, [TINY]), enabled=False), tmp_path)
        measure_gen_runtimes(s, [TINY])
        assert s.progress.done == plan_size(grid, [TINY])
        assert len(j.records) == len(records)


def test_plan_limits_compiled_runtimes_to_their_batch_and_models():
    grid = with_overrides(QUICK_CPU, {"gen_runtimes": ["hf_generate", "hf_static", "kv_decoder"], "gen_compiled_models": 1})
    small = CATALOG["small-qwen2"]
    jobs = {(rt, m.name): pts for rt, m, pts in plan(grid, [TINY, small])}
    quick = with_overrides(QUICK_CPU, {"gen_runtimes": ["hf_generate", "hf_static", "kv_decoder"]})
    assert not [rt for rt, _, _ in plan(quick, [TINY, small]) if rt == "hf_static"]   # the quick CPU grid: none
    assert ("hf_static", "small-qwen2") not in jobs                      # gen_compiled_models = 1
    assert {p.batch for p in jobs[("hf_static", "tiny-qwen2")]} == {grid.gen_compiled_batch}
    assert jobs[("kv_decoder", "tiny-qwen2")] == []                       # its points are the plain ones
    assert len(jobs[("hf_generate", "small-qwen2")]) == (len(grid.gen_prefill) + len(grid.gen_decode) + len(grid.handoff)
                                                         + len(grid.gen_pad))
    assert sum(p.op == "pad" for p in jobs[("hf_static", "tiny-qwen2")]) == sum(b == grid.gen_compiled_batch for b, _ in grid.gen_pad)


def test_pad_lengths_span_the_width_down_to_half():
    assert pad_lengths(1, 64) == [64]
    for b, n in ((2, 64), (4, 64), (16, 64), (4, 256), (3, 7)):
        lens = pad_lengths(b, n)
        assert len(lens) == b and lens[0] == n and lens[-1] == n - n // 2
        assert all(x >= y for x, y in zip(lens, lens[1:])) and len(set(lens)) > 1
    with pytest.raises(RlhfsimError, match="grid.gen_runtimes: expected a list of generation runtimes"):
        with_overrides(QUICK_CPU, {"gen_runtimes": ["trt_llm"]})


def _profile(records) -> dict:
    points = [r for r in records if r.get("kind") == "point"]
    runtimes = [r for r in records if r.get("kind") == "runtime"]
    return build_profile(name="cpu", gpu=get_gpu("cpu"), dtype="float32", device={"kind": "cpu", "threads": 1},
                         command="test", quick=True, points=points, records=runtimes,
                         grid={"gen_runtimes": GRID["gen_runtimes"]})


def test_assemble_writes_runtime_operations_and_the_generation_section(journaled):
    prof = validate_profile(_profile(journaled[2]))
    ops = prof["operations"]
    for op in ("prefill:hf_generate", "decode:hf_generate"):
        # two points are fewer than parameters + 2: kept for the simulator, never marked measured
        assert ops[op]["source"] == "underdetermined" and ops[op]["n_points"] == 2, op
    # runtime points never feed the plain fits: no plain prefill/decode was measured here
    assert ops["prefill"]["source"] == ops["decode"]["source"] == "default"
    assert prof["runtimes"] == {}                       # generation checks are not scoring runtimes
    gen = prof["generation"]
    assert set(gen) == {"hf_generate", "kv_decoder", "vllm"}
    hf = gen["hf_generate"]
    assert CONTRACT_KEYS <= set(hf)
    assert hf["valid"] and hf["available"] and hf["tokens_match_eager"] and hf["source"] == "measured"
    assert hf["semantics"] == "static" and hf["n_points"] == 7     # the one-row pad point was skipped
    assert hf["pad_step_s"] >= 0 and hf["pad_step_per_row_s"] == 0.0      # one batch size measured
    assert hf["pad_prefill_s"] == max(hf["pad_points"][0]["prefill_pad_s"], 0.0)
    assert [(p["batch"], p["prompt"]) for p in hf["pad_points"]] == [(4, 16)]
    assert hf["call_overhead_s"] >= 0 and hf["handoff_s"] >= 0 and hf["handoff_per_row_s"] >= 0
    assert sorted((r["batch"], r["context"]) for r in hf["ms_per_step"]) == [(1, 16.0), (2, 32.0)]
    assert gen["kv_decoder"]["handoff_s"] == gen["kv_decoder"]["call_overhead_s"] == 0.0
    assert gen["kv_decoder"]["pad_step_s"] == gen["kv_decoder"]["pad_step_per_row_s"] == gen["kv_decoder"]["pad_prefill_s"] == 0.0
    if not torch.cuda.is_available():
        v = gen["vllm"]
        assert CONTRACT_KEYS <= set(v) and not v["valid"] and not v["available"] and v["source"] == "skipped"
        assert all(v[k] is None for k in GEN_SCALARS) and "prefill:vllm" not in ops
    cm = CostModel(get_gpu("cpu"), prof)
    assert cm.has_gen_runtime("hf_generate") and cm.call_overhead_s("hf_generate") == hf["call_overhead_s"]


def test_point_work_of_a_runtime_decode_point_counts_its_kv_passes():
    p = {"op": "decode", "shape": TINY.to_dict(), "dtype": "float32", "batch": 4, "prefix_len": 64, "tokens": 4}
    plain, hf = point_work(p), point_work({**p, "runtime": "hf_generate"})
    kv = 2 * TINY.layers * TINY.kv_dim * 4 * 4 * 64       # K and V bytes of 4 rows x 64 cached tokens
    assert hf.flops == plain.flops and hf.bytes - plain.bytes == pytest.approx(2 * kv)   # 3 passes, not 1


def test_handoff_fit_recovers_a_line_and_stays_non_negative():
    pts = [{"batch": b, "tmean_s": 1e-3 + 2e-5 * b, "median_s": 0.0} for b in (1, 4, 16)]
    a, c = _handoff_fit(pts)
    assert a == pytest.approx(1e-3, rel=1e-6) and c == pytest.approx(2e-5, rel=1e-6)
    assert _handoff_fit([{"batch": 4, "tmean_s": 2e-3, "median_s": 0.0}] * 2) == pytest.approx((2e-3, 0.0))
    falling = [{"batch": 1, "tmean_s": 3e-3, "median_s": 0.0}, {"batch": 16, "tmean_s": 1e-3, "median_s": 0.0}]
    a, c = _handoff_fit(falling)
    assert c == 0.0 and a > 0


def test_runtimes_command_reports_generation(journaled, tmp_path):
    path = tmp_path / "gen.json"
    path.write_text(json.dumps(_profile(journaled[2])))
    table = CliRunner().invoke(runtimes_command, ["--profile", str(path)])
    assert table.exit_code == 0, table.output
    assert "generation runtimes" in table.stdout and "hf_generate" in table.stdout and "kv_decoder" in table.stdout
    res = CliRunner().invoke(runtimes_command, ["--profile", str(path), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    hf = doc["generation"]["hf_generate"]
    assert {"valid", "reason", "ms_per_step", "tokens_per_s", *GEN_SCALARS, "tokens_match_eager"} <= set(hf)
    assert doc["generation_reference"] == {"model": "tiny-qwen2", "batch": 2, "context": 32.0}
    assert hf["ms_per_step"] > 0 and hf["tokens_per_s"] == pytest.approx(2e3 / hf["ms_per_step"])
    assert doc["generation"]["vllm"]["ms_per_step"] is None or torch.cuda.is_available()
    # a profile without a generation section says so
    bare = json.loads(path.read_text())
    del bare["generation"]
    path.write_text(json.dumps(bare))
    table = CliRunner().invoke(runtimes_command, ["--profile", str(path)])
    assert "no generation runtimes measured" in table.stdout
    doc = json.loads(CliRunner().invoke(runtimes_command, ["--profile", str(path), "--format", "json"]).stdout)
    assert doc["generation"] == {} and doc["generation_reference"] is None

"""Runtime checks inside a calibration: a runtime whose scores disagree with eager is marked invalid,
measured no further and gets no score:RUNTIME operation; a runtime that fails is recorded unavailable
with its reason; one that fails after some shapes keeps them."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from calibrate.fitting.assemble import build_profile  # noqa: E402
from calibrate.running.grid import QUICK_CPU, with_overrides  # noqa: E402
from calibrate.running.journal import Journal  # noqa: E402
from calibrate.measuring.models import build_hf_model  # noqa: E402
from calibrate.running.progress import Progress  # noqa: E402
from calibrate.measuring.interleave import Prepared  # noqa: E402
from calibrate.runtimes import Runtime, ScoreModule  # noqa: E402
from calibrate.runtimes.eager import Eager  # noqa: E402
from calibrate.measuring.scoring import measure_runtime  # noqa: E402
from calibrate.running.session import Session  # noqa: E402
from rlhfsim.costs.model import CostModel  # noqa: E402
from rlhfsim.errors import RlhfsimError  # noqa: E402
from rlhfsim.hardware.catalog import get_gpu  # noqa: E402
from rlhfsim.models.catalog import CATALOG  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it

SHAPES = ((1, 8), (2, 8), (2, 16))


class Offset(Runtime):
    """Eager plus a constant: wrong scores."""

    NAME = "offset"

    def __init__(self, offset: float):
        self.offset, self.calls = offset, 0

    def prepare(self, model, input_ids, attention_mask, *, device, cache_dir: Path) -> Prepared:
        self.calls += 1

        def call():
            with torch.inference_mode():
                return ScoreModule(model)(input_ids, attention_mask).float() + self.offset

        return Prepared(call, 0.5)


class FailsAt(Offset):
    NAME = "flaky"

    def __init__(self, at: int):
        super().__init__(0.0)
        self.at = at

    def prepare(self, *a, **kw) -> Prepared:
        if self.calls == self.at:
            raise RlhfsimError("flaky: cannot export this shape")
        return super().prepare(*a, **kw)


@pytest.fixture
def session(tmp_path):
    grid = with_overrides(QUICK_CPU, {"warmup": 0, "min_iters": 2, "max_iters": 2, "rounds": 2, "per_round": 1})
    meta = {"device_kind": "cpu", "device_name": "t", "dtype": "float32", "threads": 1}
    with Journal.open(tmp_path / "j.jsonl", meta, resume=False) as j:
        yield Session("cpu", "float32", grid, j, Progress(0, enabled=False), tmp_path)


def _profile(s: Session) -> dict:
    return build_profile(name="t", gpu=get_gpu("cpu"), dtype="float32", device={"kind": "cpu"}, command="test",
                         quick=True, points=s.journal.points(), records=s.journal.runtimes(), grid={})


def test_invalid_runtime_is_marked_and_not_used(session):
    shape = CATALOG["tiny-qwen2"]
    model = build_hf_model(shape, "value", "float32", "cpu")
    measure_runtime(session, Eager(), model, shape, SHAPES)
    bad, ok = Offset(0.5), Offset(1e-6)
    ok.NAME = "close"
    measure_runtime(session, bad, model, shape, SHAPES)
    measure_runtime(session, ok, model, shape, SHAPES)
    assert bad.calls == 1  # checked first, then not measured further
    assert ok.calls == len(SHAPES)
    prof = _profile(session)
    assert not prof["runtimes"]["offset"]["valid"]
    assert "exceeds tolerance" in prof["runtimes"]["offset"]["reason"]
    assert prof["runtimes"]["offset"]["max_abs_diff"] == pytest.approx(0.5, abs=1e-5)
    assert prof["runtimes"]["close"]["valid"]
    assert "score:offset" not in prof["operations"] and "score:close" in prof["operations"]
    assert CostModel(get_gpu("cpu"), prof).runtimes == ["close", "eager"]
    assert session.progress.done == 3 * len(SHAPES)


def test_failing_runtime_is_unavailable_or_keeps_measured_shapes(session):
    shape = CATALOG["tiny-deberta"]
    model = build_hf_model(shape, "value", "float32", "cpu")
    measure_runtime(session, Eager(), model, shape, SHAPES)
    never = FailsAt(0)
    measure_runtime(session, never, model, shape, SHAPES)
    prof = _profile(session)
    assert not prof["runtimes"]["flaky"]["valid"]
    assert prof["runtimes"]["flaky"]["reason"].endswith("flaky: cannot export this shape")
    late = FailsAt(2)
    late.NAME = "late"
    measure_runtime(session, late, model, shape, SHAPES)
    prof = _profile(session)
    info = prof["runtimes"]["late"]
    assert info["valid"] and info["n_points"] == 2
    assert info["models"]["tiny-deberta"]["reason"].startswith("stopped at batch 2, length 16")
    assert "score:late" in prof["operations"]


def test_reencode_points_fit_per_runtime_and_price_encoders(session):
    """``calibrate.measuring.reencode``: one response's growing prefixes at batch 1, every runtime checked against
    eager; a runtime with wrong scores is journaled as skipped and gets no ``reencode:RUNTIME``; the fit
    prices an encoder's re-encode passes (``CostModel.rescore``) and only an encoder's."""
    from dataclasses import replace

    from calibrate.measuring.reencode import measure_reencode

    s = replace(session, grid=with_overrides(session.grid, {"reencode_lengths": [8, 16, 24, 32, 48],
                                                            "reencode_static_lengths": [16]}))
    shape = CATALOG["tiny-deberta"]
    model = build_hf_model(shape, "value", "float32", "cpu")
    measure_reencode(s, {"eager": Eager(), "offset": Offset(0.5)}, model, shape)
    pts = [p for p in s.journal.points() if p["op"] == "reencode"]
    assert sorted(p["seq_len"] for p in pts if p["runtime"] == "eager" and "skipped" not in p) == [8, 16, 24, 32, 48]
    assert [p["prefix_len"] for p in sorted(pts, key=lambda p: p["seq_len"]) if p["runtime"] == "eager"] == [0, 8, 16, 24, 32]
    assert all("skipped" in p for p in pts if p["runtime"] == "offset")
    prof = _profile(s)
    assert "reencode:eager" in prof["operations"] and "reencode:offset" not in prof["operations"]
    assert prof["operations"]["reencode:eager"]["source"] == "measured"
    assert len(prof["reencode"]["offset"]["skipped"]) == 5
    cost = CostModel(get_gpu("cpu"), prof)
    enc, dec = CATALOG["tiny-deberta"], CATALOG["tiny-qwen2"]
    assert cost.rescore(enc, "float32", 64, 1, runtime="eager") == \
        cost.forward(enc, "float32", 64, 1, op="reencode:eager", head="value")
    assert cost.rescore(dec, "float32", 64, 1, runtime="eager") == \
        cost.forward(dec, "float32", 64, 1, op="prefill", head="value")   # no score:eager here: prefill

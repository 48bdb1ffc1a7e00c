"""Batching strategies score the same sequences identically (batch1, padded, bucketed, packed), packing
is first-fit decreasing without overflow, the runtime tolerance scales with dtype, and each encoder
family is built as itself (an ELECTRA shape as ELECTRA, never as DeBERTa)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from calibrate.measuring.models import build_hf_model  # noqa: E402
from calibrate.measuring.scoring import _pack, draw_lengths, strategy_calls, tolerance  # noqa: E402
from rlhfsim.models.catalog import CATALOG  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-deberta", "tiny-electra"])
def test_strategies_give_the_padded_scores(name):
    shape = CATALOG[name]
    model = build_hf_model(shape, "value", "float32", "cpu", seed=1)
    lengths = [5, 17, 3, 32, 9, 11]
    calls = strategy_calls(model, shape, lengths, "cpu")
    with torch.inference_mode():
        out = {k: fn().float() for k, (fn, _) in calls.items()}
    assert out["padded"].shape == (6,)
    assert torch.allclose(out["bucketed"], out["padded"], atol=1e-5)
    assert torch.allclose(out["packed"], out["padded"], atol=1e-5)
    assert torch.allclose(out["batch1"], out["padded"], atol=1e-5)
    assert calls["padded"][1] == 6 * 32 and calls["batch1"][1] == sum(lengths)
    assert sum(lengths) <= calls["packed"][1] <= calls["padded"][1]
    assert sum(lengths) <= calls["bucketed"][1] <= calls["padded"][1]


def test_packing_fills_rows_without_overflow():
    lengths = draw_lengths(32, 512)
    assert min(lengths) >= 64 and max(lengths) <= 512
    rows = _pack(lengths)
    assert sorted(i for r in rows for i in r) == list(range(32))
    assert all(sum(lengths[i] for i in r) <= max(lengths) for r in rows)
    assert len(rows) < 32


def test_tolerance_depends_on_dtype_and_scale():
    ref = torch.tensor([0.1, -3.0])
    assert tolerance("float32", ref) == pytest.approx(3e-3)
    assert tolerance("bfloat16", torch.tensor([0.1])) == pytest.approx(5e-2)


def test_encoders_are_built_as_themselves():
    from dataclasses import replace

    from calibrate.measuring.models import build_hf_model
    from rlhfsim.errors import RlhfsimError

    assert type(build_hf_model(CATALOG["tiny-electra"], "value", "float32", "cpu")).__name__ == "ElectraForSequenceClassification"
    assert type(build_hf_model(CATALOG["tiny-deberta"], "value", "float32", "cpu")).__name__ == "DebertaV2ForSequenceClassification"
    for name in ("electra-large", "deberta-v3-large"):
        assert CATALOG[name].layers == 24 and CATALOG[name].hidden == 1024
    with pytest.raises(RlhfsimError, match="no builder"):
        build_hf_model(replace(CATALOG["tiny-deberta"], hf_model_type="roberta"), "value", "float32", "cpu")

"""lab/diagnostics/decode_parts.py: its price parts add up to the simulator's price of the step, and its clocks time one
LM-head product and one sampling call per decode step, then put the executor's names back."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab" / "diagnostics"))  # decode_parts and _common

from decode_parts import part_clocks, price_parts  # noqa: E402
from rlhfsim.costs.model import CostModel  # noqa: E402
from rlhfsim.hardware.catalog import get_gpu  # noqa: E402
from rlhfsim.models.catalog import CATALOG  # noqa: E402


@pytest.mark.parametrize("rows", [1, 2, 4, 16])
def test_price_parts_add_up_to_the_step_price(rows):
    cost = CostModel.load(get_gpu("cpu"))
    m = CATALOG["tiny-qwen2-v8k"]
    p = price_parts(cost, m, rows)
    whole = 1e3 * cost.decode_steps(m, "float32", rows, rows * 64, 1, runtime="kv_decoder").total_s
    assert p["total_ms"] == pytest.approx(whole, rel=1e-9)
    assert p["body_ms"] + p["head_ms"] + p["sample_ms"] == pytest.approx(p["total_ms"], rel=1e-9)
    assert p["head_ms"] > 0 and p["sample_ms"] > 0 and p["body_ms"] > 0


def test_the_head_part_grows_with_the_vocabulary():
    cost = CostModel.load(get_gpu("cpu"))
    small, large = CATALOG["tiny-qwen2"], CATALOG["tiny-qwen2-v8k"]   # the same shape at vocabulary 1,024 and 8,192
    assert (small.hidden, small.layers) == (large.hidden, large.layers) and large.vocab > small.vocab
    a, b = price_parts(cost, small, 1), price_parts(cost, large, 1)
    assert b["head_ms"] > 4 * a["head_ms"]
    assert b["sample_ms"] > a["sample_ms"]
    assert b["body_ms"] == pytest.approx(a["body_ms"], rel=0.05)


@pytest.mark.hw
def test_part_clocks_time_each_step_once_and_restore_the_names():
    torch = pytest.importorskip("torch")
    import calibrate.measuring.decoder as dec_mod
    import calibrate.executor.generation as gen_mod
    from _common import decode_step_ms
    from calibrate.measuring.decoder import StaticKVDecoder

    m = CATALOG["tiny-qwen2"]
    f, sample = dec_mod.F, gen_mod.sample_next
    dec = StaticKVDecoder(m, dtype=torch.float32, device=torch.device("cpu"), max_slots=2, max_len=16, head="lm", seed=0)
    with torch.inference_mode(), part_clocks(m.vocab) as acc:
        ms = decode_step_ms(dec, m.vocab, 2, 8, iters=4)
    assert dec_mod.F is f and gen_mod.sample_next is sample
    # time_calls' first call, 10 untimed calls and 4 timed ones; the prefill of the context is one more head product
    assert len(acc["sample"]) == 15 and len(acc["head"]) == 16
    assert all(t > 0 for t in acc["head"] + acc["sample"])
    # the parts are within a step: the fastest timed call of each (a preempted call on a shared CPU only runs long, so
    # the minimum is the call's own time; the maximum flaked under load) against the step's time, with 10x slack
    assert min(acc["head"][-4:]) + min(acc["sample"][-4:]) < 10 * ms * 1e-3

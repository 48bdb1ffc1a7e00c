"""Micro-batch cuts (rlhfsim.sim.microbatch): every row in exactly one piece, in order; pieces within their
row count and token budget (a row over the budget alone); packing never costs more tokens or attention
than padding; a packed piece's forward never costs more than the padded one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rlhfsim.costs.model import CostModel
from rlhfsim.hardware.catalog import GPUS
from rlhfsim.models.catalog import CATALOG
from rlhfsim.sim import microbatch as mb
from rlhfsim.sim.rollouts import Rollout

LENGTHS = st.lists(st.integers(1, 4096), min_size=1, max_size=64)


def _rows(lengths):
    return [Rollout(i, 0, n) for i, n in enumerate(lengths)]


@given(lengths=LENGTHS, size=st.one_of(st.none(), st.integers(1, 16)), budget=st.one_of(st.none(), st.integers(1, 8192)))
def test_every_row_once_in_order_within_limits(lengths, size, budget):
    groups = mb.groups(_rows(lengths), size, budget)
    assert [r.id for g in groups for r in g] == list(range(len(lengths)))
    for g in groups:
        assert g
        tokens = sum(r.response_len for r in g)
        if budget is not None:
            assert tokens <= budget or len(g) == 1
        elif size is not None:
            assert len(g) <= size
    if budget is not None:  # greedy: a piece ends only when the next row would not fit
        for a, b in zip(groups, groups[1:]):
            assert sum(r.response_len for r in a) + b[0].response_len > budget


@given(lengths=LENGTHS, size=st.integers(1, 16))
def test_packing_never_costs_more_than_padding(lengths, size):
    rows = _rows(lengths)
    cost, m = CostModel.load(GPUS["h200"]), CATALOG["qwen2.5-0.5b"]
    for padded, packed in zip(mb.pieces(rows, size), mb.pieces(rows, size, packed=True)):
        assert packed.rows == padded.rows and packed.tokens <= padded.tokens
        even = padded.tokens / padded.rows
        assert packed.attn_pairs <= padded.rows * even * (even + 1) / 2 + 1e-6
        t_pad = cost.forward(m, "bfloat16", padded.tokens, padded.rows, head="lm", all_logits=True).total_s
        t_pack = cost.forward(m, "bfloat16", packed.tokens, packed.rows, head="lm", all_logits=True,
                                    attn_pairs=packed.attn_pairs).total_s
        assert t_pack <= t_pad * (1 + 1e-12)

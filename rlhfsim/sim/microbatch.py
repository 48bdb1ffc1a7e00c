"""How a data-parallel rank's rows are cut into calls (``execution.micro_batch`` of the scenario), and
what each call is priced on.

* By rows: pieces of ``size`` rows in order (verl's ``*_micro_batch_size_per_gpu``); ``size`` None is
  one piece of every row (the simulator's older training call).
* By tokens (``use_dynamic_bsz``): rows are taken in order into a piece while the piece's real tokens
  (prompt + response) stay within ``budget``; a row longer than the budget is a piece of its own. verl
  balances its pieces (Karmarkar-Karp over ceil(total / budget) pieces); the greedy cut here makes at
  least as many pieces, and the same number when rows are short against the budget.
* Padded (the default): a piece of n rows whose longest is L costs n x L tokens, attention spread evenly.
  Packed (``use_remove_padding``): it costs the sum of its real tokens, attention within each row
  (``rlhfsim.costs.stepcosts.packed_attn_pairs``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhfsim.costs.stepcosts import packed_attn_pairs
from rlhfsim.sim.rollouts import Rollout


@dataclass(frozen=True)
class Piece:
    """One call: ``rows`` sequences priced as ``tokens`` tokens; ``attn_pairs`` the attention pairs of
    packed rows (None: padded rows, attention spread evenly over ``tokens``)."""

    rows: int
    tokens: int
    attn_pairs: float | None = None


def _length(r: Rollout) -> int:
    return r.prompt_len + r.response_len


def groups(rows: list[Rollout], size: int | None, budget: int | None) -> list[list[Rollout]]:
    """Rows cut into calls, in order: by token ``budget`` when given, else by ``size`` rows (None: one)."""
    if not rows:
        return []
    if budget is not None:
        out: list[list[Rollout]] = []
        cur: list[Rollout] = []
        tokens = 0
        for r in rows:
            n = _length(r)
            if cur and tokens + n > budget:
                out.append(cur)
                cur, tokens = [], 0
            cur.append(r)
            tokens += n
        out.append(cur)
        return out
    if size is None:
        return [rows]
    return [rows[i:i + size] for i in range(0, len(rows), size)]


def pieces(rows: list[Rollout], size: int | None, budget: int | None = None, packed: bool = False,
           encoder: bool = False, pad_len: int | None = None) -> list[Piece]:
    """The calls of ``rows`` (``groups``), each priced padded or packed; ``pad_len``: unpacked rows padded
    to this length (the configured maximum) instead of the piece's longest row."""
    out = []
    for g in groups(rows, size, budget):
        if packed:
            lengths = [_length(r) for r in g]
            out.append(Piece(len(g), sum(lengths), packed_attn_pairs(lengths, encoder)))
        else:
            out.append(Piece(len(g), len(g) * (pad_len or max(_length(r) for r in g))))
    return out

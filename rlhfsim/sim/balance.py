"""verl's sequence-length balancing over data-parallel ranks (``trainer.balance_batch``, on by default from verl 0.3):
before the forward passes the driver reorders the batch so that each rank's share (the dispatcher hands rank k the
k-th of dp equal slices) holds about the same number of tokens (``verl/trainer/ppo/ray_trainer.py``,
``_balance_batch``: ``get_seqlen_balanced_partitions(..., equal_size=True)``, a Karmarkar-Karp partition of the rows'
lengths into dp parts of equal row counts), and from verl 0.9 orders each part smallest first at both ends
(``partition.sort(...)``, ``partition[::2] + partition[1::2][::-1]``), so that the part's mini-batches, its slices in
that order, each get rows of every length.

Here the partition is the greedy one (longest row first to the rank with the fewest tokens among those with room):
within a row's length of Karmarkar-Karp's on batches of hundreds of rows, and what it balances is the same. Without
balancing the simulator deals rows round-robin (``rows[k::dp]``), which leaves the slowest rank holding more than its
share when lengths are long-tailed; with it a forward pass takes each rank's (equal) share, and training's
mini-batch m on rank k is the m-th slice of rank k's ordered rows.
"""

from __future__ import annotations

import heapq

import numpy as np


def balanced_ranks(tokens: np.ndarray, k: int) -> list[np.ndarray]:
    """Row indices of each of ``k`` ranks: equal row counts (the first ``len % k`` ranks one more), token sums
    balanced greedily (longest row first to the lightest rank with room); each rank's rows ordered as verl 0.9 does:
    by length, even positions ascending then odd positions descending."""
    n = len(tokens)
    if k <= 1 or n == 0:
        return [np.arange(n)]
    cap = [n // k + (1 if r < n % k else 0) for r in range(k)]
    heap = [(0, r) for r in range(k)]     # (tokens so far, rank)
    parts: list[list[int]] = [[] for _ in range(k)]
    order = np.argsort(-tokens, kind="stable")
    for i in order.tolist():
        load, r = heapq.heappop(heap)
        parts[r].append(i)
        if len(parts[r]) < cap[r]:
            heapq.heappush(heap, (load + int(tokens[i]), r))
    out = []
    for p in parts:
        p.sort(key=lambda j: (int(tokens[j]), j))
        out.append(np.array(p[::2] + p[1::2][::-1], dtype=np.int64))
    return out

"""``multipack``: FFD across ranks with token balance (imoneoi/multipack_sampler, MIT).

As ``MultipackDistributedBatchSampler.allocate``: over the documents in the batch's shuffled
order, find (binary search) the longest prefix that first-fit-decreasing packs into ``dp``
bins of ``context`` tokens; bin ``i`` becomes rank ``i``'s next micro-batch; repeat on the
rest. Documents longer than the context are split into independent pieces first. Balances
tokens, not time; memory is not enforced.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slimdata.cost import CostModel
from slimdata.plan.types import Document, StepPlan
from slimdata.solver.layout import Layout
from slimdata.solver.strategies.base import baseline_plan, now, pieces_view

__all__ = ["ffd", "multipack"]


def ffd(lengths: np.ndarray, capacity: int, n: int) -> list[list[int]] | None:
    """First-fit-decreasing of item indices into ``n`` bins, or None if they do not fit."""
    rooms = np.full(n, capacity, dtype=np.int64)
    bins: list[list[int]] = [[] for _ in range(n)]
    for i in np.argsort(-lengths, kind="stable").tolist():
        fits = rooms >= lengths[i]
        b = int(np.argmax(fits))
        if not fits[b]:
            return None
        rooms[b] -= lengths[i]
        bins[b].append(i)
    return bins


def multipack(
    batch: Sequence[Document],
    layout: Layout,
    seed: int = 0,
    cost: CostModel | None = None,
    *,
    step: int = 0,
    validate: bool = True,
) -> StepPlan:
    t0 = now()
    view, cost = pieces_view(batch, layout, cost)
    lengths = view.doc_len
    dp, cap = layout.dp, layout.token_cap
    rank_packs: list[list[list[int]]] = [[] for _ in range(dp)]
    start = 0
    while start < len(lengths):
        lo, hi = start + 1, len(lengths)  # lo always fits: one piece <= cap
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ffd(lengths[start:mid], cap, dp) is not None:
                lo = mid
            else:
                hi = mid - 1
        bins = ffd(lengths[start:lo], cap, dp)
        assert bins is not None
        for r, b in enumerate(bins):
            if b:
                rank_packs[r].append([start + i for i in b])
        start = lo
    return baseline_plan(
        view,
        cost,
        layout,
        rank_packs,
        strategy="multipack",
        step=step,
        seed=seed,
        t0=t0,
        validate=validate,
    )

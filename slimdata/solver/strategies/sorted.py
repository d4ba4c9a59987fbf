"""``sorted``: length-sorted micro-batches (LongAlign's sorted batching, arXiv 2401.18058).

Documents (longer ones split into independent pieces of ``context`` tokens) are sorted by
length and grouped consecutively into micro-batches of at most ``context`` tokens, so each
micro-batch holds documents of similar length; the micro-batches are shuffled with the seed
(LongAlign draws batches in random order) and dealt round-robin to DP ranks. Memory is not
enforced.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slimdata.cost import CostModel
from slimdata.plan.types import Document, StepPlan
from slimdata.solver.layout import Layout
from slimdata.solver.strategies.base import (
    baseline_plan,
    deal_to_ranks,
    now,
    pieces_view,
    shuffled,
)

__all__ = ["sorted_batches"]


def sorted_batches(
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
    cap = layout.token_cap
    packs: list[list[int]] = []
    fill = cap
    for i in np.argsort(view.doc_len, kind="stable").tolist():
        n = int(view.doc_len[i])
        if fill + n > cap:
            packs.append([])
            fill = 0
        packs[-1].append(i)
        fill += n
    return baseline_plan(
        view,
        cost,
        layout,
        deal_to_ranks(shuffled(packs, seed, step), layout.dp),
        strategy="sorted",
        step=step,
        seed=seed,
        t0=t0,
        validate=validate,
    )

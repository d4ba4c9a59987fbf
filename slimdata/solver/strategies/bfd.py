"""``bfd``: Best-fit-decreasing by tokens (Ding et al., "Fewer Truncations Improve Language
Modeling", ICML'24, arXiv 2404.10830).

Documents longer than the context are split into independent pieces of at most ``context``
tokens (the paper splits only those); pieces are sorted by decreasing length and each goes
to the open bin of ``context`` tokens with the *smallest* remaining room that still fits it, a
new bin otherwise. The bins are then shuffled with the seed (they are ordinary training
sequences) and dealt round-robin to DP ranks as micro-batches. Balances tokens per bin, not
time; memory is not enforced (the simulator reports peaks).
"""

from __future__ import annotations

import bisect
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

__all__ = ["best_fit_decreasing", "bfd"]


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Bins (lists of item indices) by best-fit-decreasing; every item must be <= capacity."""
    order = np.argsort(-lengths, kind="stable")
    rooms: list[tuple[int, int]] = []  # sorted (remaining room, bin id)
    bins: list[list[int]] = []
    for i in order.tolist():
        n = int(lengths[i])
        k = bisect.bisect_left(rooms, (n, -1))
        if k < len(rooms):
            room, b = rooms.pop(k)
        else:
            room, b = capacity, len(bins)
            bins.append([])
        bins[b].append(i)
        if room - n > 0:
            bisect.insort(rooms, (room - n, b))
    return bins


def bfd(
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
    bins = best_fit_decreasing(view.doc_len, layout.token_cap)
    return baseline_plan(
        view,
        cost,
        layout,
        deal_to_ranks(shuffled(bins, seed, step), layout.dp),
        strategy="bfd",
        step=step,
        seed=seed,
        t0=t0,
        validate=validate,
        meta={"bins": len(bins)},
    )

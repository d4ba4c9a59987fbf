"""Shared tail of the token-packing baselines: whole documents (or independent pieces) per
pack, the same pack for forward and backward (no asymmetry, no slicing), packs dealt to ranks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from slimdata.cost import CostModel
from slimdata.plan.types import Document, StepPlan
from slimdata.solver.common import BatchView, assemble_plan, default_cost, split_into_pieces
from slimdata.solver.layout import Layout

__all__ = ["baseline_plan", "deal_to_ranks", "pieces_view", "shuffled"]


def pieces_view(
    batch: Sequence[Document], layout: Layout, cost: CostModel | None
) -> tuple[BatchView, CostModel]:
    """View over ``batch`` with documents longer than the token cap cut into independent pieces."""
    cost = cost or default_cost()
    return BatchView.build(split_into_pieces(batch, layout.token_cap), cost), cost


def baseline_plan(
    view: BatchView,
    cost: CostModel,
    layout: Layout,
    rank_packs: list[list[list[int]]],
    *,
    strategy: str,
    step: int,
    seed: int,
    t0: float,
    meta: dict[str, Any] | None = None,
    validate: bool = True,
) -> StepPlan:
    """Plan from ``rank_packs[r][i]`` = document indices of rank r's pack i.

    Forward pack i and backward pack i hold the same documents (a document's slices in order
    forward, reversed backward); in lockstep mode ranks with fewer packs get empty packs so that
    every rank runs the same count.
    """
    if layout.mode == "lockstep":
        m = max((len(p) for p in rank_packs), default=0)
        rank_packs = [p + [[] for _ in range(m - len(p))] for p in rank_packs]
    forward = [
        [[i for d in pack for i in view.slices_of(d)] for pack in packs] for packs in rank_packs
    ]
    backward = [
        [[i for d in pack for i in reversed(view.slices_of(d))] for pack in packs]
        for packs in rank_packs
    ]
    meta = {"seed": seed, **(meta or {})}
    return assemble_plan(
        view=view,
        layout=layout,
        cost=cost,
        strategy=strategy,
        step=step,
        forward=forward,
        backward=backward,
        mode=layout.mode,
        meta=meta,
        t0=t0,
        validate=validate,
    )


def shuffled(packs: list[list[int]], seed: int, step: int) -> list[list[int]]:
    """``packs`` in the order of the step's seeded permutation (the baselines' packs are
    ordinary training sequences, dealt in random order)."""
    return [packs[p] for p in np.random.default_rng([seed, step]).permutation(len(packs)).tolist()]


def deal_to_ranks(packs: list[list[int]], dp: int) -> list[list[list[int]]]:
    """Pack ``j`` to rank ``j % dp`` as its ``j // dp``-th (empty ones dropped)."""
    rank_packs: list[list[list[int]]] = [[] for _ in range(dp)]
    for j, pack in enumerate(packs):
        if pack:
            rank_packs[j % dp].append(pack)
    return rank_packs


def now() -> float:
    return time.perf_counter()

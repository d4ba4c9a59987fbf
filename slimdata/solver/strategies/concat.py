"""``concat``: concatenate-and-cut to the context length (the Megatron-LM pretraining default).

Documents, in the batch's (already shuffled) order, are laid end to end and cut into rows of
``layout.context`` tokens; row ``j`` goes to DP rank ``j % dp`` as its micro-batch ``j // dp``
(Megatron's pretraining sampler hands consecutive micro-batches to consecutive DP ranks). A
document cut by a row boundary becomes independent pieces: in Megatron a row does not attend to
the previous row, so a piece does *not* continue its document (each piece is its own
:class:`~slimdata.plan.types.Document` with ``offset``). Attention is masked at document
boundaries (varlen / ``--reset-attention-mask``), as for every strategy here; the unmasked
Megatron default would only add cross-document work. The last row may be short (kept, not
padded or carried over). Memory is not enforced: rows are what Megatron would run; the
simulator reports their peak memory.
"""

from __future__ import annotations

from collections.abc import Sequence

from slimdata.cost import CostModel
from slimdata.plan.types import Document, StepPlan
from slimdata.solver.common import BatchView, cut_document, default_cost
from slimdata.solver.layout import Layout
from slimdata.solver.strategies.base import baseline_plan, deal_to_ranks, now

__all__ = ["concat"]


def concat(
    batch: Sequence[Document],
    layout: Layout,
    seed: int = 0,
    cost: CostModel | None = None,
    *,
    step: int = 0,
    validate: bool = True,
) -> StepPlan:
    t0 = now()
    cost = cost or default_cost()
    row = layout.context
    pieces: list[Document] = []
    rows: list[list[int]] = [[]]
    fill = 0
    for d in batch:
        # a 10-token document starting at fill 6 of 8-token rows: bounds 0 2 10 -> pieces
        # [0,2) closing row 0 and [2,10) filling row 1
        bounds, where = [0], []
        while bounds[-1] < d.length:
            if fill == row:
                rows.append([])
                fill = 0
            b = min(d.length, bounds[-1] + row - fill)
            fill += b - bounds[-1]
            bounds.append(b)
            where.append(len(rows) - 1)
        for piece, j in zip(
            [d] if len(bounds) == 2 else cut_document(d, bounds), where, strict=True
        ):
            pieces.append(piece)
            rows[j].append(len(pieces) - 1)
    if not rows[-1]:
        rows.pop()
    view = BatchView.build(pieces, cost)
    return baseline_plan(
        view,
        cost,
        layout,
        deal_to_ranks(rows, layout.dp),
        strategy="concat",
        step=step,
        seed=seed,
        t0=t0,
        validate=validate,
        meta={"rows": len(rows), "row_tokens": row},
    )

"""Finer slices for the costly ends of long documents (finer DP-Merge shares).

A slice near the end of a long document is expensive: a 2048-token slice at a 108K prefix
costs about half of a rank's balanced time when a 1M-token batch is spread over 64 ranks, and
its backward/forward ratio is the attention's (~4.1 with full recompute), not the batch
mean (~3.3). A merge member holding one such slice cannot be balanced on forward and backward
time by filling it with other documents, so those slices set the imbalance floor. This module
halves such slices (boundaries stay multiples of :data:`~slimdata.slicing.ALIGN`) until each
costs at most ``share`` of the balanced per-rank time or reaches ``min_tokens``.

Only the solver's slicing changes: a document's tokens, ``doc_id``, ``offset`` and loss are
untouched; its ``cuts`` gain boundaries (plans refer to slices by ``[start, end)``, and
consecutive slices that land in the same packs are fused again by
:func:`~slimdata.solver.common.assemble_plan`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from slimdata.cost import CostModel
from slimdata.plan.types import Document
from slimdata.slicing import ALIGN
from slimdata.solver.common import BatchView

__all__ = ["REFINE_SHARE", "refine_costly_slices"]

REFINE_SHARE = 0.25
"""Largest slice time, as a fraction of the balanced per-rank time, left uncut."""

MIN_TOKENS = 512
"""Slices are never cut below this many tokens."""


def refine_costly_slices(
    view: BatchView,
    dp: int,
    cost: CostModel,
    *,
    share: float = REFINE_SHARE,
    min_tokens: int = MIN_TOKENS,
) -> list[Document] | None:
    """The batch's documents with every slice costlier than ``share`` x the balanced per-rank
    time (forward + backward) halved until it is not (or is shorter than ``2 * min_tokens``);
    ``None`` when no slice needs it (the caller keeps its view).

    Example: at a balanced time of 1 s, a slice ``[106496, 108544)`` costing 0.9 s becomes
    ``[106496, 107520)`` and ``[107520, 108544)`` (about 0.45 s each), then halves again.
    """
    if dp <= 1 or len(view.doc) == 0:
        return None
    time = view.fwd + view.bwd
    limit = share * float(time.sum()) / dp
    tok = view.end - view.start
    hot = np.flatnonzero((time > limit) & (tok >= 2 * min_tokens))
    if len(hot) == 0:
        return None
    docs = list(view.docs)
    for d in np.unique(view.doc[hot]).tolist():
        cuts: list[int] = []
        for i in view.slices_of(d):
            cuts.extend(_split(int(view.start[i]), int(view.end[i]), cost, limit, min_tokens))
        cuts.append(int(view.end[view.off[d + 1] - 1]))
        docs[d] = replace(docs[d], cuts=tuple(cuts))
    return docs


def _split(a: int, b: int, cost: CostModel, limit: float, min_tokens: int) -> Sequence[int]:
    """Start points of the pieces of slice ``[a, b)`` (``a`` first)."""
    t = float(cost.forward(a, b) + cost.backward(a, b))
    if t <= limit or b - a < 2 * min_tokens:
        return [a]
    mid = a + ((b - a) // 2 // ALIGN) * ALIGN
    if mid <= a or mid >= b:
        return [a]
    return [*_split(a, mid, cost, limit, min_tokens), *_split(mid, b, cost, limit, min_tokens)]

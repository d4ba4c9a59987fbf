"""``wlb``: WLB-LLM variable-length packing (Wang et al., OSDI'25, arXiv 2503.17924, Alg. 1).

Micro-batches are balanced on the profiled workload ``W_att(d) + W_lin(d)`` (here: the cost
model's forward + backward seconds of the document run whole) under a token cap ``S_max``
(``layout.token_cap``): documents sorted by decreasing length, each to the micro-batch with the
least workload if it fits under ``S_max``, else to the micro-batch with the fewest tokens if it
fits there. The iteration has ``dp * m`` micro-batches (``m`` the smallest count that holds the
batch); micro-batch ``j`` runs on rank ``j % dp`` as its ``j // dp``-th.

Deviations, stated: (1) no outlier delay queues inside :func:`solve` (a per-step call has no
next step to defer to; this is the "WLB-ideal" variant DistCA compares against), so a document
that fits nowhere opens one more micro-batch round instead of waiting; (2) documents longer
than ``S_max`` are split into independent pieces (WLB shards them over its CP group, a
dimension this layout does not have). Memory is not enforced.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slimdata.cost import CostModel
from slimdata.plan.types import Document, StepPlan
from slimdata.solver.layout import Layout
from slimdata.solver.strategies.base import baseline_plan, now, pieces_view

__all__ = ["wlb", "wlb_pack"]


def wlb_pack(lengths: np.ndarray, work: np.ndarray, n: int, cap: int) -> list[list[int]] | None:
    """Alg. 1 of WLB-LLM over ``n`` micro-batches; None if some document fits nowhere."""
    load = np.zeros(n)
    tok = np.zeros(n, dtype=np.int64)
    bins: list[list[int]] = [[] for _ in range(n)]
    for i in np.argsort(-lengths, kind="stable").tolist():
        L = int(lengths[i])
        j = int(np.argmin(load))
        if tok[j] + L > cap:
            j = int(np.argmin(tok))
            if tok[j] + L > cap:
                return None
        bins[j].append(i)
        load[j] += work[i]
        tok[j] += L
    return bins


def wlb(
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
    dp, cap = layout.dp, layout.token_cap
    work = view.doc_fwd + view.doc_bwd
    m = max(1, -(-int(view.doc_len.sum()) // (dp * cap)))
    while (bins := wlb_pack(view.doc_len, work, dp * m, cap)) is None:
        m += 1
    rank_packs: list[list[list[int]]] = [[] for _ in range(dp)]
    for j, b in enumerate(bins):
        if b:
            rank_packs[j % dp].append(b)
    return baseline_plan(
        view,
        cost,
        layout,
        rank_packs,
        strategy="wlb",
        step=step,
        seed=seed,
        t0=t0,
        validate=validate,
        meta={"microbatches": m},
    )

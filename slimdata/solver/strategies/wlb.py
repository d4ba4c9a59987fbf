"""``wlb-ideal``: WLB-LLM variable-length packing of one step, without outlier delay.

WLB-LLM (Wang et al., OSDI'25, arXiv 2503.17924, Alg. 1) balances micro-batches on the
profiled workload ``W_att(d) + W_lin(d)`` (here: the cost model's forward + backward seconds
of the document run whole) under a token cap ``S_max`` (``layout.token_cap``): documents
sorted by decreasing length, each to the micro-batch with the least workload if it fits under
``S_max``, else to the micro-batch with the fewest tokens if it fits there, else deferred.

The faithful ``wlb``, with the outlier delay queues and deferral to the next iteration, packs a
stream of steps: :mod:`slimdata.solver.strategies.wlb_queue`. This module is its per-step
variant, the "WLB-ideal" DistCA compares against: (1) no delay, so a document that fits nowhere
opens one more micro-batch round instead of waiting; (2) documents longer than ``S_max`` are
split into independent pieces (WLB shards them over its CP group, a dimension this layout does
not have). The iteration has ``dp * m`` micro-batches (``m`` the smallest count that holds the
batch); micro-batch ``j`` runs on rank ``j % dp`` as its ``j // dp``-th. Memory is not enforced.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slimdata.cost import CostModel
from slimdata.plan.types import Document, StepPlan
from slimdata.solver.layout import Layout
from slimdata.solver.strategies.base import baseline_plan, deal_to_ranks, now, pieces_view

__all__ = ["Bins", "wlb_ideal", "wlb_pack"]


class Bins:
    """``n`` micro-batches being filled: their items, workload and tokens."""

    def __init__(self, n: int, cap: int) -> None:
        self.cap = cap
        self.items: list[list[int]] = [[] for _ in range(n)]
        self.load = np.zeros(n)
        self.tokens = np.zeros(n, dtype=np.int64)

    def put(self, j: int, item: int, length: int, work: float) -> None:
        self.items[j].append(item)
        self.load[j] += work
        self.tokens[j] += length

    def place(self, order: Sequence[int], lengths: np.ndarray, work: np.ndarray) -> list[int]:
        """Alg. 1's greedy over ``order``: the least-loaded micro-batch if the item fits under
        the cap, else the one with the fewest tokens if it fits there; returns the items that
        fit nowhere (deferred), in order."""
        deferred = []
        for i in order:
            L = int(lengths[i])
            j = int(np.argmin(self.load))
            if self.tokens[j] + L > self.cap:
                j = int(np.argmin(self.tokens))
                if self.tokens[j] + L > self.cap:
                    deferred.append(i)
                    continue
            self.put(j, i, L, float(work[i]))
        return deferred


def wlb_pack(lengths: np.ndarray, work: np.ndarray, n: int, cap: int) -> list[list[int]] | None:
    """Alg. 1 of WLB-LLM over ``n`` micro-batches, longest first; None if some document fits
    nowhere."""
    bins = Bins(n, cap)
    deferred = bins.place(np.argsort(-lengths, kind="stable").tolist(), lengths, work)
    return None if deferred else bins.items


def wlb_ideal(
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
    return baseline_plan(
        view,
        cost,
        layout,
        deal_to_ranks(bins, dp),
        strategy="wlb-ideal",
        step=step,
        seed=seed,
        t0=t0,
        validate=validate,
        meta={"microbatches": m},
    )

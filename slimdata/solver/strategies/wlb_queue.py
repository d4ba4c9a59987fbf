"""``wlb``: WLB-LLM packing with outlier delay, over the run's stream of steps.

WLB-LLM (Wang et al., OSDI'25, arXiv 2503.17924, §4.1 and Alg. 1), as the paper runs it:

- **outlier queues**: ``n`` FIFO queues with length thresholds ``L_1 < ... < L_n`` (and
  ``L_{n+1} = inf``); a document with ``L_i <= d < L_{i+1}`` waits in queue ``i``. When a queue
  holds ``N`` documents (``N = dp * m``, the micro-batches of one iteration) they are popped,
  one per micro-batch (longest to the least-loaded);
- **var-length packing** (Alg. 1) of the rest on the workload ``W(d) = W_att(d) + W_lin(d)``
  (the cost model's forward + backward seconds of the document run whole) under the token cap
  ``S_max = layout.token_cap``: the leftovers of the last iteration are placed first, then the
  new documents sorted by decreasing length; each goes to the micro-batch with the least
  workload if it fits under ``S_max``, else to the one with the fewest tokens, else it is
  deferred to the next iteration;
- the plan of iteration ``t`` therefore trains documents of earlier steps: over the whole run
  every document is trained exactly once. After the last step, :meth:`WlbStream.flush` trains
  what still waits (queued outliers and deferred documents) in extra iterations, which the
  simulator runs and counts: a run is compared on its total time over the same documents.

Choices and deviations, stated:

- ``m`` (micro-batches per rank) is fixed for the run, the smallest that holds the first step's
  tokens (the global batch is fixed);
- thresholds: the paper tunes ``L_i`` on a sample of the data. Here they are set on the first
  step: ``L_1`` is the shortest length whose workload alone reaches the mean micro-batch
  workload of that step (``W(L_1) >= W(step 0) / N``: any micro-batch holding such a document
  is the slowest of the iteration), and ``W(L_{i+1}) = 2 W(L_i)``; ``queues=2`` by default
  (the paper's imbalance table uses 1 to 3). ``thresholds=`` sets them explicitly;
- flush iterations pop every queue whatever its size (the run ends) and pack with Alg. 1; so
  does a step whose documents would all wait (an empty iteration is never run);
- documents longer than ``S_max`` are split into independent pieces first (WLB shards them
  over its CP group, a dimension this layout does not have); memory is not enforced.

The mean token delay (tokens x iterations waited / tokens) is reported; the paper gives 0.5
iterations on its workload.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slimdata.cost import CostModel
from slimdata.errors import ConfigError
from slimdata.plan.types import Document, StepPlan
from slimdata.solver.common import BatchView, default_cost, split_into_pieces
from slimdata.solver.layout import Layout
from slimdata.solver.strategies.base import baseline_plan, deal_to_ranks, now
from slimdata.solver.strategies.wlb import Bins

__all__ = ["OutlierQueues", "WlbStream", "tuned_thresholds"]


@dataclass(frozen=True)
class Waiting:
    """A document (or piece) not yet trained: its arrival step, length and workload."""

    doc: Document
    arrived: int
    work: float


class OutlierQueues:
    """``len(thresholds)`` FIFO queues; queue ``i`` holds ``thresholds[i] <= d <
    thresholds[i + 1]``."""

    def __init__(self, thresholds: Sequence[int], n: int) -> None:
        if any(b <= a for a, b in itertools.pairwise(thresholds)) or min(thresholds, default=1) < 1:
            raise ConfigError(
                f"wlb thresholds={list(thresholds)!r}: give increasing lengths >= 1 (L_1 < L_2 ...)"
            )
        self.thresholds = list(thresholds)
        self.n = n
        self.queues: list[deque[Waiting]] = [deque() for _ in thresholds]

    def queue_of(self, length: int) -> int:
        """Index of the queue for ``length``, -1 below ``L_1`` (not an outlier)."""
        return int(np.searchsorted(self.thresholds, length, side="right")) - 1

    def push(self, w: Waiting) -> bool:
        """Queue ``w`` if it is an outlier; False if it is not."""
        q = self.queue_of(w.doc.length)
        if q < 0:
            return False
        self.queues[q].append(w)
        return True

    def pop_full(self) -> list[list[Waiting]]:
        """The first ``n`` documents of every queue that holds ``n``: one group per queue."""
        return [[q.popleft() for _ in range(self.n)] for q in self.queues if len(q) >= self.n]

    def drain(self) -> list[Waiting]:
        out = [w for q in self.queues for w in q]
        for q in self.queues:
            q.clear()
        return out

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues)


def tuned_thresholds(cost: CostModel, mean_mb_work: float, cap: int, queues: int = 2) -> list[int]:
    """``L_1``: the shortest length whose workload reaches ``mean_mb_work``; ``W(L_{i+1}) = 2
    W(L_i)``; only lengths up to ``cap`` (longer documents are cut to ``cap``)."""
    lengths = np.arange(1, cap + 1)
    w = cost.forward(0, lengths) + cost.backward(0, lengths)
    out: list[int] = []
    for i in range(queues):
        k = int(np.searchsorted(w, mean_mb_work * 2**i))
        if k >= cap:
            break
        if not out or lengths[k] > out[-1]:
            out.append(int(lengths[k]))
    return out


class WlbStream:
    """The faithful ``wlb`` over a run: :meth:`step` per step in order, then :meth:`flush`."""

    def __init__(
        self,
        layout: Layout,
        seed: int = 0,
        cost: CostModel | None = None,
        *,
        thresholds: Sequence[int] | None = None,
        queues: int = 2,
        validate: bool = True,
    ) -> None:
        self.layout, self.seed, self.cost = layout, seed, cost or default_cost()
        self.validate, self.queues_wanted = validate, queues
        self.thresholds = list(thresholds) if thresholds is not None else None
        self.m = 0
        self.queues: OutlierQueues | None = None
        self.leftovers: list[Waiting] = []
        self.delayed_tokens = 0.0
        self.trained_tokens = 0

    @property
    def n(self) -> int:
        """Micro-batches per iteration."""
        return self.layout.dp * self.m

    def mean_token_delay(self) -> float:
        """Tokens x iterations waited, over tokens trained so far."""
        return self.delayed_tokens / self.trained_tokens if self.trained_tokens else 0.0

    def waiting(self) -> int:
        """Documents queued or deferred."""
        return len(self.leftovers) + (len(self.queues) if self.queues else 0)

    def step(self, batch: Sequence[Document], step: int) -> StepPlan:
        """Iteration ``step``: full queues, then leftovers, then ``batch`` (longest first)."""
        t0 = now()
        pieces = split_into_pieces(batch, self.layout.token_cap)
        work = BatchView.build(pieces, self.cost)
        new = [
            Waiting(d, step, float(f + b))
            for d, f, b in zip(pieces, work.doc_fwd, work.doc_bwd, strict=True)
        ]
        if self.queues is None:
            self._start(new)
        assert self.queues is not None
        fresh = sorted((w for w in new if not self.queues.push(w)), key=lambda w: -w.doc.length)
        groups = self.queues.pop_full()
        order = self.leftovers + fresh
        if not groups and not order:  # everything waits: release the queues, never idle
            order = sorted(self.queues.drain(), key=lambda w: -w.doc.length)
        return self._iteration(groups, order, step, t0)

    def flush(self, step: int) -> list[StepPlan]:
        """Iterations ``step, step + 1, ...`` that train every document still waiting."""
        plans: list[StepPlan] = []
        while self.waiting():
            t0 = now()
            rest = self.leftovers + (self.queues.drain() if self.queues else [])
            rest.sort(key=lambda w: -w.doc.length)
            plans.append(self._iteration([], rest, step + len(plans), t0))
        return plans

    def _start(self, first: list[Waiting]) -> None:
        """``m`` and the thresholds from the first step (module docstring)."""
        dp, cap = self.layout.dp, self.layout.token_cap
        self.m = max(1, -(-sum(w.doc.length for w in first) // (dp * cap)))
        if self.thresholds is None:
            mean = sum(w.work for w in first) / self.n
            self.thresholds = tuned_thresholds(self.cost, mean, cap, self.queues_wanted)
        self.queues = OutlierQueues(self.thresholds, self.n)

    def _iteration(
        self, groups: list[list[Waiting]], order: list[Waiting], step: int, t0: float
    ) -> StepPlan:
        """Each popped group one per micro-batch, then Alg. 1 over ``order``; what fits nowhere
        becomes the next iteration's leftovers."""
        popped = [w for g in groups for w in g]
        items = popped + order
        lengths = np.fromiter((w.doc.length for w in items), dtype=np.int64, count=len(items))
        work = np.fromiter((w.work for w in items), dtype=np.float64, count=len(items))
        bins = Bins(self.n, self.layout.token_cap)
        deferred = []
        first = 0
        for g in groups:
            deferred += self._one_per_microbatch(bins, range(first, first + len(g)), lengths, work)
            first += len(g)
        deferred += bins.place(range(len(popped), len(items)), lengths, work)
        assert not items or len(deferred) < len(items), "an empty iteration would defer forever"
        self.leftovers = [items[i] for i in deferred]
        return self._plan(items, bins, deferred, step, t0)

    @staticmethod
    def _one_per_microbatch(
        bins: Bins, group: range, lengths: np.ndarray, work: np.ndarray
    ) -> list[int]:
        """A popped group's ``N`` documents, longest to the least-loaded micro-batch; one that
        does not fit there (a second group in the same iteration) goes through Alg. 1."""
        order = sorted(group, key=lambda i: -lengths[i])
        targets = np.argsort(bins.load, kind="stable")
        deferred = []
        for i, j in zip(order, targets, strict=True):
            if bins.tokens[j] + lengths[i] <= bins.cap:
                bins.put(int(j), i, int(lengths[i]), float(work[i]))
            else:
                deferred += bins.place([i], lengths, work)
        return deferred

    def _plan(
        self, items: list[Waiting], bins: Bins, deferred: list[int], step: int, t0: float
    ) -> StepPlan:
        """The iteration's plan over the documents it trains, with the delay counted."""
        skip = set(deferred)
        keep = [i for i in range(len(items)) if i not in skip]
        local = {i: k for k, i in enumerate(keep)}
        docs = [items[i].doc for i in keep]
        for i in keep:
            self.delayed_tokens += items[i].doc.length * (step - items[i].arrived)
            self.trained_tokens += items[i].doc.length
        packs = [[local[i] for i in b] for b in bins.items]
        view = BatchView.build(docs, self.cost)
        return baseline_plan(
            view,
            self.cost,
            self.layout,
            deal_to_ranks(packs, self.layout.dp),
            strategy="wlb",
            step=step,
            seed=self.seed,
            t0=t0,
            validate=self.validate,
            meta={
                "microbatches": self.m,
                "thresholds": list(self.thresholds or []),
                "waiting": self.waiting(),
            },
        )

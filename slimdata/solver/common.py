"""Shared machinery of every packing strategy: a vectorized view of a global batch, pieces of
documents cut without continuation, and the assembly of a validated :class:`StepPlan`.

A strategy works on slice *indices* into a :class:`BatchView` (flat numpy arrays over all
slices of the batch) and hands back, per rank, lists of forward and backward packs of slice
indices; :func:`assemble_plan` fuses consecutive slices of a document that
share both their forward and their backward pack (equivalent to one larger slice, and one
fixed per-slice cost less), prices every pack by the execution model
(:func:`~slimdata.execution.pack_prices`), and validates the result.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

from slimdata.cost import CostModel
from slimdata.execution import ExecutionConfig, PackCompute, PackTimes, pack_prices
from slimdata.plan import loss_token_count
from slimdata.plan.pipeline import interleave
from slimdata.plan.types import Document, MergeGroup, MicroPack, RankStep, Slice, StepPlan
from slimdata.solver.layout import Layout

__all__ = [
    "BatchView",
    "assemble_plan",
    "assemble_priced",
    "cut_document",
    "default_cost",
    "interleaved_order",
    "rank_seconds",
    "split_into_pieces",
]


_CUTS = operator.attrgetter("cuts")
_LENGTH = operator.attrgetter("length")


@lru_cache(maxsize=1)
def default_cost() -> CostModel:
    """``CostModel.analytic("llama-8b")``: the cost model used when a caller passes none."""
    return CostModel.analytic("llama-8b")


@dataclass(frozen=True)
class BatchView:
    """Flat per-slice arrays of a batch (slice ``i`` belongs to document ``doc[i]``).

    Slices of a document are consecutive and in order: ``off[d]:off[d+1]`` are document d's.
    """

    docs: tuple[Document, ...]
    doc: np.ndarray
    start: np.ndarray
    end: np.ndarray
    fwd: np.ndarray
    bwd: np.ndarray
    act: np.ndarray
    off: np.ndarray
    doc_fwd: np.ndarray
    """Forward seconds of each document's own work run in the fewest pieces the pack token
    cap allows (:func:`_fewest_calls_prices`: what a rank that holds the document whole runs,
    its slices fused; priced apiece they would add per-slice constants, ``fwd_const``, that
    fused slices do not pay). A load to balance, not a pack's price: the per-call constant
    (``fwd_pack_const``) is the pack's, shared by its documents, and the execution model
    charges it when the plan is priced (:func:`assemble_priced`)."""
    doc_bwd: np.ndarray
    doc_len: np.ndarray
    doc_mem: np.ndarray
    """Peak bytes of a document run alone on one rank: all activations + K/V of its length."""
    kv_per_token: float
    gathered_kv_per_token: float
    """One layer's K/V bytes per token (:meth:`CostModel.gathered_kv_bytes`): a merge member's
    gathered buffer per token of its group."""

    @classmethod
    def build(cls, docs: Sequence[Document], cost: CostModel, cap: int | None = None) -> BatchView:
        """The batch's slices and their costs; each document priced as it runs in the fewest
        calls the pack token ``cap`` allows (one without it)."""
        docs = tuple(docs)
        cuts = list(map(_CUTS, docs))
        # lists then arrays: np.fromiter over an iterator costs ~0.3 us an item, a list ~0.02
        ncuts = np.array(list(map(len, cuts)), dtype=np.int64)
        counts = ncuts - 1
        off = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum(counts, out=off[1:])
        # cut lists laid end to end: docs (0,4,6) and (0,3) -> 0 4 6 0 3; starts drop each
        # document's last cut (0 4 0), ends drop its first (4 6 3)
        allcuts = np.array(list(itertools.chain.from_iterable(cuts)), dtype=np.int64)
        pos = off[:-1] + np.arange(len(docs))  # index of each document's first cut in allcuts
        is_last = np.zeros(len(allcuts), dtype=bool)
        is_last[pos + counts] = True
        is_first = np.zeros(len(allcuts), dtype=bool)
        is_first[pos] = True
        start = allcuts[~is_last]
        end = allcuts[~is_first]
        doc = np.repeat(np.arange(len(docs), dtype=np.int64), counts)
        sc = cost.slice_costs(start, end)
        doc_len = np.array(list(map(_LENGTH, docs)), dtype=np.int64)
        doc_fwd, doc_bwd = _fewest_calls_prices(cost, doc_len, cap)
        doc_act = np.add.reduceat(sc.act_bytes, off[:-1]) if len(start) else np.zeros(len(docs))
        empty = counts == 0
        for arr in (doc_fwd, doc_bwd, doc_act):
            arr[empty] = 0.0
        return cls(
            docs=docs,
            doc=doc,
            start=start,
            end=end,
            fwd=sc.fwd,
            bwd=sc.bwd,
            act=sc.act_bytes,
            off=off,
            doc_fwd=doc_fwd,
            doc_bwd=doc_bwd,
            doc_len=doc_len,
            doc_mem=doc_act + cost.kv_bytes_per_token * doc_len,
            kv_per_token=cost.kv_bytes_per_token,
            gathered_kv_per_token=float(cost.gathered_kv_bytes(1)),
        )

    @cached_property
    def tokens(self) -> np.ndarray:
        """Tokens of every slice (``end - start``)."""
        return self.end - self.start

    @cached_property
    def lists(self) -> tuple[list[int], list[float], list[float], list[float], list[int]]:
        """Python lists ``(tokens, fwd, bwd, act, doc)`` per slice, for per-slice loops."""
        return (
            (self.end - self.start).tolist(),
            self.fwd.tolist(),
            self.bwd.tolist(),
            self.act.tolist(),
            self.doc.tolist(),
        )

    @cached_property
    def packing_lists(self) -> tuple[list[float], list[float], list[float], list[float]]:
        """Python lists ``(act + K/V bytes, K/V bytes, fwd / 2, bwd / 2)`` per slice, for the
        packers' per-slice loops: what a slice adds to a rank's memory when it runs forward,
        its keys and values alone, and its forward and backward midpoints (a pack closes
        before a slice whose midpoint passes the pack's cost quantile)."""
        kv = self.kv_per_token * (self.end - self.start)
        return (
            (self.act + kv).tolist(),
            kv.tolist(),
            (self.fwd / 2).tolist(),
            (self.bwd / 2).tolist(),
        )

    def summed(self) -> BatchView:
        """This batch with every slice's and document's backward seconds added to its forward
        and none left: one load per item, its total time. Free mode balances on it: a DDP
        rank meets the others only at the gradient all-reduce, so only its total counts (the
        balance of forward and backward apiece, which lockstep packs need, is a stricter goal
        that a local search stops short of)."""
        return replace(
            self,
            fwd=self.fwd + self.bwd,
            bwd=np.zeros_like(self.bwd),
            doc_fwd=self.doc_fwd + self.doc_bwd,
            doc_bwd=np.zeros_like(self.doc_bwd),
        )

    @cached_property
    def memo(self) -> dict[Any, Any]:
        """Results of pure functions of this batch that its planner asks for more than once
        (merge splits, :func:`slimdata.solver.merge.split_group`), by their arguments."""
        return {}

    @cached_property
    def ranges(self) -> list[range]:
        """``ranges[d]``: the slice indices of document ``d`` (``range(off[d], off[d+1])``)."""
        return list(map(range, self.off[:-1].tolist(), self.off[1:].tolist()))

    def slices_of(self, d: int) -> range:
        return self.ranges[d]


def split_into_pieces(docs: Sequence[Document], max_tokens: int) -> list[Document]:
    """Cut every document longer than ``max_tokens`` into independent pieces of at most that.

    Pieces do *not* attend to each other (the behaviour of fixed-length packing, e.g. Megatron
    rows or Best-fit Packing's split of long documents); each piece is its own
    :class:`Document` with ``offset`` = its first token in the source sample and the source's
    ``sample`` and ``doc_id``. Loss tokens: see :func:`cut_document`.
    """
    out: list[Document] = []
    for d in docs:
        if d.length <= max_tokens:
            out.append(d)
            continue
        out.extend(cut_document(d, [*range(0, d.length, max_tokens), d.length]))
    return out


def cut_document(d: Document, bounds: Sequence[int]) -> list[Document]:
    """Pieces ``[bounds[i], bounds[i+1])`` of ``d`` as independent documents (see above).

    Each piece is trained as its own sequence, so its last token has no label: a piece
    carries :func:`~slimdata.plan.types.loss_token_count` of its length. A 10-token document
    cut at 4 and 8: pieces of 4, 4 and 2 tokens carry 3 + 3 + 1 = 7 labels, not the 9 of the
    whole document. A source whose ``loss_tokens`` is below that count of its own length
    (labels masked out) loses the difference from its pieces in order, as far as each piece
    has labels: the plan does not know where the masked tokens are.
    """
    pieces = []
    masked = max(loss_token_count(d.length) - d.loss_tokens, 0)
    for a, b in itertools.pairwise(bounds):
        own = loss_token_count(b - a)
        drop = min(own, masked)
        masked -= drop
        # the cuts strictly inside the piece (d.cuts increase): found by bisection, so a
        # document of a million slices is cut in pieces in linear time
        inside = d.cuts[bisect.bisect_right(d.cuts, a) : bisect.bisect_left(d.cuts, b)]
        cuts = tuple(c - a for c in inside)
        pieces.append(
            replace(
                d, length=b - a, loss_tokens=own - drop, cuts=(0, *cuts, b - a), offset=d.offset + a
            )
        )
    return pieces


def interleaved_order(n_fwd: int, n_bwd: int, lag: int = 0) -> tuple[tuple[str, int], ...]:
    """The fixed 1F1B-like order of lockstep plans: backward pack ``j`` right after forward
    pack ``j + lag``, then any remaining packs.

    ``interleaved_order(3, 3) == F0 B0 F1 B1 F2 B2``; ``interleaved_order(3, 3, 1) == F0 F1 B0
    F2 B1 B2``.
    """
    return interleave(n_fwd, [j + lag for j in range(n_bwd)])


Prices = tuple[PackTimes, PackCompute]
"""A plan's packs at the execution model's price (:func:`~slimdata.execution.pack_prices`)."""


def assemble_plan(**kwargs: Any) -> StepPlan:
    """:func:`assemble_priced`'s plan alone."""
    return assemble_priced(**kwargs)[0]


def assemble_priced(
    *,
    view: BatchView,
    layout: Layout,
    cost: CostModel,
    strategy: str,
    step: int,
    forward: list[list[list[int]]],
    backward: list[list[list[int]]],
    merges: Sequence[tuple[tuple[int, ...], tuple[int, ...]]] = (),
    merge_rank_pack: dict[int, tuple[int, int]] | None = None,
    mode: str = "free",
    lag: int = 0,
    meta: dict[str, Any] | None = None,
    t0: float | None = None,
    validate: bool = True,
    execution: ExecutionConfig | None = None,
) -> tuple[StepPlan, Prices]:
    """Build, price and validate a :class:`StepPlan` from per-rank packs of slice indices;
    with its packs' prices.

    ``forward[r][i]`` lists the slice indices (into ``view``) of rank r's forward pack i, in
    execution order; ``backward`` likewise. Consecutive slices of a document sharing both their
    forward and their backward pack are fused into one :class:`Slice` (same tokens, one fixed
    per-slice cost less). ``merge_rank_pack[rank] = (forward index, backward index)`` of a
    merge member's merge packs. Order: :func:`interleaved_order` (with ``lag``) in ``lockstep``
    mode (identical on every rank), :func:`~slimdata.plan.types.eager_order` in ``free`` mode.
    ``validate=False`` skips :meth:`StepPlan.validate` (a per-step caller that trusts the
    solver; tests and plan-shard writing always validate).

    Every pack is priced by the execution model (:func:`~slimdata.execution.pack_prices`)
    as the plan is meant to run (``execution``, default :attr:`Layout.execution`): its
    ``MicroPack.cost`` is the seconds one device computes of the pass (a static-CP member's
    share, a merge member's at its chunk efficiency), and ``meta["imbalance"]`` (with
    ``imbalance_fwd``, ``imbalance_bwd``) is ``max * n / sum`` of the ranks' work
    (:func:`rank_seconds`).
    """
    runs = _SliceRuns.of(view, forward, backward, layout.dp)
    merge_rank_pack = merge_rank_pack or {}
    rank_merge = {r: g for g, (ranks, _d) in enumerate(merges) for r in ranks}
    ranks: list[RankStep] = []
    for r in range(layout.dp):
        mf, mb = merge_rank_pack.get(r, (-1, -1))
        g = rank_merge.get(r)
        fpacks = runs.packs(forward[r], mf, g)
        bpacks = runs.packs(backward[r], mb, g)
        order = interleaved_order(len(fpacks), len(bpacks), lag) if mode == "lockstep" else ()
        ranks.append(RankStep(rank=r, forward=fpacks, backward=bpacks, order=order))
    plan = StepPlan(
        step=step,
        strategy=strategy,
        docs=view.docs,
        ranks=tuple(ranks),
        merges=tuple(MergeGroup(tuple(rk), tuple(ds)) for rk, ds in merges),
        mode=mode,
        meta={},
    )
    prices = pack_prices(plan, cost, execution or layout.execution)
    meta = dict(meta or {})
    meta.setdefault("strategy", strategy)
    meta.update(_balance_meta(plan, prices))
    if t0 is not None:
        meta["solve_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    plan = replace(plan, ranks=_priced_ranks(plan, prices), meta=meta)
    return (plan.validate() if validate else plan), prices


@dataclass(frozen=True, eq=False)
class _SliceRuns:
    """The plan's slices after fusion: a *run* is a maximal stretch of consecutive slices of
    one document on one rank in the same forward and the same backward pack, one
    :class:`Slice`. ``run[i]``: the run of view slice ``i``."""

    run: np.ndarray
    slices: list[Slice]

    @classmethod
    def of(
        cls,
        view: BatchView,
        forward: list[list[list[int]]],
        backward: list[list[list[int]]],
        dp: int,
    ) -> _SliceRuns:
        # a document of slices [0,4) [4,8) [8,10) all in forward pack 0 and backward pack 1
        # of one rank is one run, the Slice [0,10)
        n = len(view.doc)
        fp, owner = _pack_of_slice(n, forward[:dp])
        bp, _owner = _pack_of_slice(n, backward[:dp])
        # run ids: a new run starts at a document's first slice or where a pack changes
        new = np.ones(n, dtype=bool)
        if n > 1:
            new[1:] = (
                (view.doc[1:] != view.doc[:-1])
                | (fp[1:] != fp[:-1])
                | (bp[1:] != bp[:-1])
                | (owner[1:] != owner[:-1])
            )
        first = np.flatnonzero(new)
        last = np.append(first[1:] - 1, n - 1) if n else first
        # tolist() gives Python ints already
        slices = list(
            map(
                Slice,
                view.doc[first].tolist(),
                view.start[first].tolist(),
                view.end[last].tolist(),
            )
        )
        return cls(run=np.cumsum(new) - 1, slices=slices)

    def packs(self, lists: list[list[int]], merge_at: int, g: int | None) -> tuple[MicroPack, ...]:
        """MicroPacks of one rank's packs of view slices (``lists``), not priced yet; pack
        ``merge_at`` is merge group ``g``'s."""
        run, slices = self.run_list, self.slices
        out = []
        for i, pack in enumerate(lists):
            # a pack's slices of one run are consecutive: one entry per run
            ids = [k for k, _ in itertools.groupby(map(run.__getitem__, pack))]
            out.append(
                MicroPack(tuple(map(slices.__getitem__, ids)), merge=g if i == merge_at else None)
            )
        return tuple(out)

    @cached_property
    def run_list(self) -> list[int]:
        return self.run.tolist()


def _priced_ranks(plan: StepPlan, prices: Prices) -> tuple[RankStep, ...]:
    """``plan``'s ranks with every pack's ``cost`` its price in ``prices``."""
    pt, price = prices
    fwd, bwd = price.fwd.tolist(), price.bwd.tolist()
    out = []
    for rs in plan.ranks:
        fo, bo = int(pt.f_offset[rs.rank]), int(pt.b_offset[rs.rank])
        out.append(
            replace(
                rs,
                forward=tuple(
                    MicroPack(p.slices, fwd[fo + i], p.merge) for i, p in enumerate(rs.forward)
                ),
                backward=tuple(
                    MicroPack(p.slices, bwd[bo + j], p.merge) for j, p in enumerate(rs.backward)
                ),
            )
        )
    return tuple(out)


def _fewest_calls_prices(
    cost: CostModel, lengths: np.ndarray, cap: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of documents of ``lengths`` tokens, each run as pieces of
    ``cap`` tokens from its start (one slice each, with its per-slice constant; every piece
    attending to the prefix before it); one piece each without a cap. ``cap=512``: a
    700-token document runs ``[0, 512)`` and ``[512, 700)``. No per-call constant
    (``fwd_pack_const``): a model call runs a pack, whose documents share it
    (:attr:`BatchView.doc_fwd`)."""
    if cap is None:
        zero = np.zeros_like(lengths)
        fwd, bwd = cost.forward(zero, lengths), cost.backward(zero, lengths)
        return np.asarray(fwd, dtype=float), np.asarray(bwd, dtype=float)
    if not len(lengths):
        return np.zeros(0), np.zeros(0)
    calls = np.maximum(1, -(-lengths // cap))
    first = np.cumsum(calls) - calls
    starts = (np.arange(int(calls.sum())) - np.repeat(first, calls)) * cap
    ends = np.minimum(starts + cap, np.repeat(lengths, calls))
    fwd = np.add.reduceat(np.asarray(cost.forward(starts, ends), dtype=float), first)
    bwd = np.add.reduceat(np.asarray(cost.backward(starts, ends), dtype=float), first)
    return fwd, bwd


def _pack_of_slice(n: int, packs: list[list[list[int]]]) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``n`` view slices, its pack's index in its rank's ``packs[rank]`` and the
    rank (-1: in no pack); a slice listed twice keeps the later pack, as assigning pack by
    pack would (a plan that validation then refuses)."""
    lens = [len(p) for ps in packs for p in ps]
    flat = np.array(
        list(itertools.chain.from_iterable(itertools.chain.from_iterable(packs))), np.int64
    )
    index = np.concatenate([np.arange(len(ps)) for ps in packs]) if packs else np.zeros(0)
    rank = np.repeat(np.arange(len(packs)), [len(ps) for ps in packs])
    pack, owner = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    order = np.arange(len(flat))
    last = np.full(n, -1, dtype=np.int64)
    np.maximum.at(last, flat, order)  # the later listing of a slice listed twice
    keep = last[flat] == order
    pack[flat[keep]] = np.repeat(index.astype(np.int64), lens)[keep]
    owner[flat[keep]] = np.repeat(rank, lens)[keep]
    return pack, owner


def rank_seconds(plan: StepPlan, prices: Prices) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's forward and backward work: its packs' seconds by the executor's rules
    (``prices[0]``, :func:`~slimdata.execution.pack_times`: per-call constants, recomputed
    and graph-free passes, padding calls), summed. The work a rank was dealt, as phase 1
    balances it: what a merge group's or a static-CP group's devices each compute of it
    (chunk efficiency, padding to ``2 cp``, ``prices[1]``) is left to the step estimate."""
    pt, dp = prices[0], len(plan.ranks)
    rank_f = np.repeat(np.arange(dp), [len(rs.forward) for rs in plan.ranks])
    rank_b = np.repeat(np.arange(dp), [len(rs.backward) for rs in plan.ranks])
    return (
        np.bincount(rank_f, weights=pt.fwd, minlength=dp),
        np.bincount(rank_b, weights=pt.bwd, minlength=dp),
    )


def _balance_meta(plan: StepPlan, prices: Prices) -> dict[str, float]:
    """Imbalance degrees (``max * n / sum``) of the ranks' forward, backward and total work
    (:func:`rank_seconds`)."""
    f, b = rank_seconds(plan, prices)

    def deg(x: np.ndarray) -> float:
        return float(x.max() / x.mean()) if x.sum() > 0 else 1.0

    return {
        "imbalance_fwd": round(deg(f), 6),
        "imbalance_bwd": round(deg(b), 6),
        "imbalance": round(deg(f + b), 6),
    }

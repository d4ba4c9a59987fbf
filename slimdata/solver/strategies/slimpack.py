"""SlimPack: two-phase, cost-balanced packing with DP-Merge and asymmetric MicroPacks.

Phase 1 (DP-aware distribution, design §6): documents too long for one rank's memory, or
costlier than the balanced per-rank time, become DP-Merge groups of the fewest ranks that fit
(:mod:`slimdata.solver.merge`); every other document goes whole to one rank by a
two-dimensional LPT on *predicted time*: documents in decreasing time order, each to the rank
minimising ``max(fwd_load / fwd_share, bwd_load / bwd_share)`` after adding it (forward and
backward scale differently, ~2x vs ~3x for attention, so both are balanced, not their sum),
then a local search trades documents between the most loaded rank and any other. In free mode
slices costing more than a quarter of a rank's time are cut finer first
(:mod:`slimdata.solver.refine`) and documents too backward-heavy to balance whole are merged
(:func:`~slimdata.solver.merge.skew_group_sizes`). No document is delayed to another step.

Phase 2 (asymmetric MicroPacks, :mod:`slimdata.solver.micropack`): per rank, forward packs
balanced on forward cost and backward packs balanced on backward cost, under the token cap
(``layout.token_cap``) and the memory cap (``layout.memory_bytes``). In lockstep mode every
rank gets the same pack count ``m`` (``layout.microbatches`` or, among candidates, the one
with the smallest estimated step) and pack ``i`` is the ``i``-th cost quantile of each rank's
(balanced) load; memory is checked per pipeline stage as the simulator accounts it (first
stage's share of the layers, 1F1B's extra packs in flight, merge buffers;
:func:`~slimdata.solver.micropack.pack_rank_lockstep`); under the interleaved schedule, whose
warm-up keeps more packs in flight, and under static CP, whose passes hold gathered K/V, the
assembled plan is checked on every device by the execution model's memory rule, the
next-best candidate taken while it does not fit and the packer's budget calibrated when none
does (:func:`_lockstep_plan`); free plans under static CP are checked and calibrated so too
(:func:`_free_plan`). The estimate is the execution model's compute-only critical
path under the schedule the plan will run (``layout.schedule``, 1F1B or interleaved over
``layout.virtual_stages``; :mod:`slimdata.execution.critical`), recorded as
``plan.meta["pipeline_estimate"]``.

An optional MILP refinement (``milp_seconds > 0``, :mod:`slimdata.solver.milp`) improves the
phase-1 assignment under a wall-time budget, warm-started from it; the heuristic answer is kept
when the budget runs out. Off by default: the heuristic meets the imbalance target and the
per-step latency target, the MILP does not meet the latter.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from slimdata.cost import CostModel
from slimdata.errors import PlanError
from slimdata.execution.critical import critical_path_under, members_wait, plan_critical_path
from slimdata.execution.pricing import prices_calls
from slimdata.execution.program import ExecutionConfig, pack_prices
from slimdata.gcpause import cyclic_gc_paused
from slimdata.plan.pipeline import stage_share
from slimdata.plan.types import Document, StepPlan
from slimdata.solver.budget import MemoryBudget
from slimdata.solver.common import (
    BatchView,
    Prices,
    assemble_priced,
    default_cost,
    interleaved_order,
    rank_seconds,
)
from slimdata.solver.freepack import documents_alone, longest_backward_last, pack_rank_by_runs
from slimdata.solver.layout import GIB, Layout
from slimdata.solver.memory import device_peak_memory, slice_peak_memory
from slimdata.solver.merge import (
    MergePlan,
    group_buffer,
    member_peak,
    member_tokens,
    plan_merges,
)
from slimdata.solver.micropack import LockstepWork, RankDocs, RankPacks, pack_rank
from slimdata.solver.options import DEFAULT_OPTIONS, SolveOptions
from slimdata.solver.refine import REFINE_SHARE, refine_costly_slices
from slimdata.solver.strategies.wlb import wlb_pack
from slimdata.units import gib

__all__ = ["assign_lpt", "slimpack", "stage_share"]

MORE_PACKS = (4, 6)
"""With ``pp > 1``, when the best plan of the usual pack counts (1x, 2x, 3x the fewest) has a
lag below its pack count minus one (memory held the warm-up down), these multiples are tried
too: smaller packs let the first pipeline stage hold more of them in flight."""

MERGE_GATHER = 2.0
"""Merge members are sized for the merge buffers (:meth:`CostModel.gathered_kv_bytes`): one
layer's gathered K/V of the group while the merge forward pack runs and twice that (K/V and
their gradients) while the merge backward pack runs."""

IMPROVE_TARGET = 1.004
"""The local search stops once every rank is within this factor of the balanced forward and
backward time (the plan target is 1.02; the margin covers slice fusion and pack pricing)."""


def assign_lpt(
    view: BatchView,
    docs: np.ndarray,
    dp: int,
    groups: Sequence[tuple[tuple[int, ...], Sequence[int]]] = (),
) -> tuple[list[list[int]], list[list[int]]]:
    """Two-dimensional LPT with eligibility: whole ``docs`` on any rank, the slices of each merge
    group ``(ranks, slice indices)`` only on its members.

    Merge slices go first (they have the fewest choices, and members' shares come out even in
    both dimensions), then documents, each part in decreasing time order; every item goes to
    the eligible rank minimising
    ``max(fwd_load / fwd_share, bwd_load / bwd_share)`` after adding it; once items are below
    4% of a share, whole documents go by a (lazy) heap on the summed load, equivalent for small,
    nearly proportional items and O(log dp). Returns per-rank document lists and per-rank merge
    slice lists.
    """
    items = _lpt_items(view, docs, dp, groups)
    out_docs: list[list[int]] = [[] for _ in range(dp)]
    out_merge: list[list[int]] = [[] for _ in range(dp)]
    members = [list(r) for r, _s in groups]
    load = _place_by_both_loads(items, members, dp, out_docs, out_merge)
    _place_by_summed_load(items, members, load, out_docs, out_merge)
    for ms in out_merge:
        ms.sort()
    return out_docs, out_merge


@dataclass
class _LptItems:
    """What :func:`assign_lpt` places, in placement order: normalized forward and backward
    cost (over the balanced per-rank share), the document or slice index, and its merge
    group (-1: a whole document); ``next`` is the first not placed yet."""

    fn: list[float]
    bn: list[float]
    ids: list[int]
    grp: list[int]
    next: int = 0


def _lpt_items(
    view: BatchView,
    docs: np.ndarray,
    dp: int,
    groups: Sequence[tuple[tuple[int, ...], Sequence[int]]],
) -> _LptItems:
    """Merge slices first (they can only go to their members; a group's merge pack runs in
    lockstep on its members, so their shares should be equal), then documents; each part in
    decreasing time order."""
    gslices = [np.asarray(sl, dtype=np.int64) for _r, sl in groups]
    f = np.concatenate([view.doc_fwd[docs], *[view.fwd[s] for s in gslices]])
    b = np.concatenate([view.doc_bwd[docs], *[view.bwd[s] for s in gslices]])
    ids = np.concatenate([docs, *gslices]).astype(np.int64)
    grp = np.concatenate(
        [np.full(len(docs), -1), *[np.full(len(s), g) for g, s in enumerate(gslices)]]
    ).astype(np.int64)
    fshare = max(float(f.sum()) / dp, 1e-30)
    bshare = max(float(b.sum()) / dp, 1e-30)
    order = np.lexsort((-(f / fshare + b / bshare), grp < 0))
    return _LptItems(
        fn=(f / fshare)[order].tolist(),
        bn=(b / bshare)[order].tolist(),
        ids=ids[order].tolist(),
        grp=grp[order].tolist(),
    )


def _place_by_both_loads(
    items: _LptItems,
    members: list[list[int]],
    dp: int,
    out_docs: list[list[int]],
    out_merge: list[list[int]],
) -> list[float]:
    """Merge slices and items of at least 4% of a share: each to the eligible rank whose
    ``max(forward, backward)`` load is lowest after adding it. Returns the summed loads."""
    fn, bn, ids, grp = items.fn, items.bn, items.ids, items.grp
    cands = [np.asarray(r, dtype=np.int64) for r in members]
    F = np.zeros(dp)
    Bl = np.zeros(dp)
    # every rank's loads after adding a whole document, in buffers (no arrays per item)
    add, maximum = np.add, np.maximum
    F_with, B_with, worse = np.empty(dp), np.empty(dp), np.empty(dp)
    k = items.next
    while k < len(ids) and (grp[k] >= 0 or fn[k] + bn[k] >= 0.04):
        g = grp[k]
        if g < 0:
            add(F, fn[k], out=F_with)
            add(Bl, bn[k], out=B_with)
            maximum(F_with, B_with, out=worse)
            r = int(worse.argmin())
            out_docs[r].append(ids[k])
            F[r], Bl[r] = F_with[r], B_with[r]
        else:
            cand = cands[g]
            r = int(cand[np.maximum(F[cand] + fn[k], Bl[cand] + bn[k]).argmin()])
            out_merge[r].append(ids[k])
            F[r] += fn[k]
            Bl[r] += bn[k]
        k += 1
    items.next = k
    return (F + Bl).tolist()


def _place_by_summed_load(
    items: _LptItems,
    members: list[list[int]],
    load: list[float],
    out_docs: list[list[int]],
    out_merge: list[list[int]],
) -> None:
    """The small items left: each to the rank with the lowest summed load (a lazy heap,
    O(log dp); equivalent for small, nearly proportional items), merge slices to their first
    least loaded member."""
    heap = [(load[r], r) for r in range(len(load))]
    heapq.heapify(heap)
    fn, bn, grp, ids = items.fn, items.bn, items.grp, items.ids
    for k in range(items.next, len(ids)):
        c = fn[k] + bn[k]
        g = grp[k]
        if g >= 0:
            r = min(members[g], key=load.__getitem__)
            out_merge[r].append(ids[k])
            load[r] += c
            continue
        lr, r = heap[0]
        while lr != load[r]:  # stale (a merge slice raised it): the current load goes back
            heapq.heapreplace(heap, (load[r], r))
            lr, r = heap[0]
        out_docs[r].append(ids[k])
        load[r] += c
        heapq.heapreplace(heap, (load[r], r))  # the heap's entries are distinct: same order
    items.next = len(ids)


def improve(
    view: BatchView,
    assign: list[list[int]],
    shares: dict[int, list[int]],
    groups: Sequence[tuple[int, ...]],
    mem: float | MemoryBudget,
    *,
    rounds: int = 400,
    top: int = 32,
    min_gain: float = 1e-4,
    target: float = IMPROVE_TARGET,
    buffers: Sequence[float] = (),
    cap: float = math.inf,
) -> int:
    """Local search after LPT on the two-dimensional load ``max(F/F_share, B/B_share)``.

    Repeatedly takes the most loaded rank ``hi`` and applies the best single move or swap that
    lowers the larger load of the pair: one of ``hi``'s ``top`` costliest whole documents to
    any other rank, or swapped with any document of another rank (vectorized over all of
    them: a backward-heavy rank trades a long document for a shorter, forward-heavy one), or a
    merge slice to/with another member of its group (if no member's share then exceeds the
    group's largest, in either dimension: the merge pack runs in lockstep on the members and
    takes the largest share; and both members' merge memory stays within ``mem`` minus the
    group's merge ``buffers`` bytes, default 0, and both shares within the pack token ``cap``;
    a :class:`~slimdata.solver.budget.MemoryBudget` records these questions).
    Stops when no move lowers the top load by ``min_gain`` (relative), when the top load is at
    most ``target`` (default :data:`IMPROVE_TARGET`: good enough, saves time) or after
    ``rounds`` moves. Returns the number of moves; deterministic.
    """
    budget = mem if isinstance(mem, MemoryBudget) else MemoryBudget(mem)
    search = _LocalSearch(view, assign, shares, groups, budget, buffers, cap)
    moves = 0
    for _ in range(rounds):
        load = np.maximum(search.F, search.B)
        hi = int(load.argmax())
        if load[hi] <= target:
            break
        best = search.best_move(hi, load[hi] - min_gain, top)
        if best is None:
            break
        search.apply(hi, *best)
        moves += 1
    return moves


_Candidates = tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, float]
"""Moves of one kind off the most loaded rank: ``(kind, xs, yid, yown, xf, xb, top_f, top_b)``:
item ``xs[i]`` goes to rank ``yown[k]`` in exchange for item ``yid[k]`` (``-1``: none);
``xf, xb`` are the items' normalized costs; ``top_f, top_b`` bound a merge share's growth."""


class _LocalSearch:
    """The state of :func:`improve`: normalized per-rank loads ``F, B`` (forward, backward over
    their balanced shares), who holds each document and merge slice, and the merge groups'
    limits; its steps find and apply the best move off the most loaded rank."""

    def __init__(
        self,
        view: BatchView,
        assign: list[list[int]],
        shares: dict[int, list[int]],
        groups: Sequence[tuple[int, ...]],
        budget: MemoryBudget,
        buffers: Sequence[float],
        cap: float,
    ):
        self.view, self.assign, self.shares, self.groups, self.budget, self.cap = (
            view,
            assign,
            shares,
            groups,
            budget,
            cap,
        )
        dp = len(assign)
        fs = max(float(view.doc_fwd.sum()) / dp, 1e-30)
        bs = max(float(view.doc_bwd.sum()) / dp, 1e-30)
        self.cf = view.doc_fwd / fs
        self.cb = view.doc_bwd / bs
        self.sf = view.fwd / fs
        self.sb = view.bwd / bs
        held = [np.asarray(a, dtype=np.int64) for a in assign]
        self.F = np.array([self.cf[a].sum() for a in held])
        self.B = np.array([self.cb[a].sum() for a in held])
        self.owner = np.full(len(view.docs), -1, dtype=np.int64)
        for r, a in enumerate(held):
            self.owner[a] = r
        self.placed = np.flatnonzero(self.owner >= 0)
        self.ranks = np.arange(dp)
        self._add_merge_groups(buffers)

    def _add_merge_groups(self, buffers: Sequence[float]) -> None:
        """Members' merge shares join their loads; each group's merge buffers (the budget a
        member's merge share may hold is the rank's less these)."""
        view, shares, dp = self.view, self.shares, len(self.assign)
        self.group_of: dict[int, int] = {}
        self.sowner = np.full(len(view.doc), -1, dtype=np.int64)
        self.gslices: list[np.ndarray] = []
        self.roomy: list[bool] = []  # the group's documents fit one rank whole: no memory check
        self.reserve: list[float] = []  # the group's merge buffers, bytes
        self.SF = np.zeros(dp)  # members' merge shares (normalized forward, backward)
        self.SB = np.zeros(dp)
        for g, grp in enumerate(self.groups):
            for r in grp:
                self.group_of[r] = g
                share = np.asarray(shares[r], dtype=np.int64)
                self.sowner[share] = r
                self.SF[r] = self.sf[share].sum()
                self.SB[r] = self.sb[share].sum()
                self.F[r] += self.SF[r]
                self.B[r] += self.SB[r]
            gs = np.concatenate([np.asarray(shares[r], dtype=np.int64) for r in grp])
            self.gslices.append(gs)
            self.reserve.append(buffers[g] if len(buffers) else 0.0)
            whole = float(view.doc_mem[np.unique(view.doc[gs])].sum())
            self.roomy.append(self.budget.fits(whole, self.reserve[g]))

    def candidates(self, hi: int, top: int) -> list[_Candidates]:
        """``hi``'s ``top`` costliest documents against every other rank's documents and an
        empty slot on every other rank; ``hi``'s merge slices against its group's other
        members' slices and empty slots."""
        cands: list[_Candidates] = []
        if self.assign[hi]:
            cf, cb, owner, placed, ranks = self.cf, self.cb, self.owner, self.placed, self.ranks
            xs = np.asarray(self.assign[hi], dtype=np.int64)
            if len(xs) > top:
                xs = xs[np.argsort(-(cf[xs] + cb[xs]), kind="stable")[:top]]
            ys = placed[owner[placed] != hi]
            los = ranks[ranks != hi]
            yid = np.concatenate([ys, np.full(len(los), -1)])
            yown = np.concatenate([owner[ys], los])
            cands.append(("doc", xs, yid, yown, cf, cb, 0.0, 0.0))
        if hi in self.group_of and self.shares[hi]:
            g = self.group_of[hi]
            gs = self.gslices[g]
            sowner = self.sowner
            xs = np.asarray(self.shares[hi], dtype=np.int64)
            ys = gs[sowner[gs] != hi]
            los = np.asarray([r for r in self.groups[g] if r != hi], dtype=np.int64)
            yid = np.concatenate([ys, np.full(len(los), -1)])
            yown = np.concatenate([sowner[ys], los])
            # the merge pack runs in lockstep on the members: it takes the largest share, so a
            # member's share may only grow up to the group's largest
            members = np.asarray(self.groups[g], dtype=np.int64)
            top_f, top_b = float(self.SF[members].max()), float(self.SB[members].max())
            cands.append(("slice", xs, yid, yown, self.sf, self.sb, top_f, top_b))
        return cands

    def pair_max(self, hi: int, cand: _Candidates) -> np.ndarray:
        """The larger load of ``hi`` and the other rank after each move of ``cand`` (``inf``
        where a merge share would outgrow the group's largest)."""
        kind, xs, yid, yown, xf, xb, top_f, top_b = cand
        F, B = self.F, self.B
        real = yid >= 0
        yf = np.where(real, xf[yid], 0.0)
        yb = np.where(real, xb[yid], 0.0)
        df = xf[xs][:, None] - yf[None, :]
        db = xb[xs][:, None] - yb[None, :]
        grow = None
        if kind == "slice":  # a merge share may only grow up to the group's largest
            grow = (self.SF[yown][None, :] + df > top_f + 1e-12) | (
                self.SB[yown][None, :] + db > top_b + 1e-12
            )
        # max(F[hi] - df, B[hi] - db, F[lo] + df, B[lo] + db) in three matrices: each term is
        # written over the difference it was computed from once that is no longer read
        maximum = np.maximum
        pm = F[hi] - df
        np.add(F[yown][None, :], df, out=df)
        maximum(pm, df, out=pm)
        np.subtract(B[hi], db, out=df)
        maximum(pm, df, out=pm)
        np.add(B[yown][None, :], db, out=db)
        maximum(pm, db, out=pm)
        if grow is not None:
            pm[grow] = np.inf
        return pm

    def best_move(self, hi: int, bar: float, top: int) -> tuple[str, int, int, int] | None:
        """The allowed move off ``hi`` whose pair load is lowest and below ``bar``, as
        ``(kind, lo, x, y)``; the 8 lowest of each kind are checked in order."""
        best = None  # (pair max, kind, lo, x, y or -1)
        for cand in self.candidates(hi, top):
            kind, xs, yid, yown = cand[:4]
            pm = self.pair_max(hi, cand)
            flat = pm.ravel()
            first = int(flat.argmin())
            low = flat[first]
            if float(low) >= bar:
                continue
            if kind == "doc" and np.count_nonzero(flat == low) == 1:
                # a document move is always allowed, so only the lowest is looked at: when it
                # is unique, it is the first of the 8 lowest below (no partial sort needed)
                lowest = [first]
            else:
                few = np.argpartition(flat, 8)[:8] if len(flat) > 8 else np.arange(len(flat))
                lowest = few[np.argsort(flat[few], kind="stable")].tolist()
            for jj in lowest:
                val = float(pm.flat[jj])
                if val >= bar or (best is not None and val >= best[0]):
                    break
                i, k = divmod(jj, len(yid))
                x, y, lo = int(xs[i]), int(yid[k]), int(yown[k])
                if kind == "slice" and not self.slice_move_allowed(hi, lo, x, y, len(xs)):
                    continue
                best = (val, kind, lo, x, y)
                break
        return None if best is None else best[1:]

    def slice_move_allowed(self, hi: int, lo: int, x: int, y: int, n_hi: int) -> bool:
        """A member keeps at least one slice, and both members' merge shares stay within the
        group's memory limit (unless the group is roomy) and the token cap."""
        g = self.group_of[hi]
        return not (
            (y < 0 and n_hi == 1)
            or not (
                self.roomy[g]
                or _slice_move_fits(
                    self.view, self.shares, hi, lo, x, y, self.budget, self.reserve[g]
                )
            )
            or not _slice_move_within_cap(self.view, self.shares, hi, lo, x, y, self.cap)
        )

    def apply(self, hi: int, kind: str, lo: int, x: int, y: int) -> None:
        """Move item ``x`` from ``hi`` to ``lo`` (and ``y``, if ``>= 0``, back), updating the
        loads and owners."""
        F, B = self.F, self.B
        src = self.assign if kind == "doc" else self.shares
        xf, xb = (self.cf, self.cb) if kind == "doc" else (self.sf, self.sb)
        src[hi].remove(x)
        src[lo].append(x)
        F[hi] -= xf[x]
        B[hi] -= xb[x]
        F[lo] += xf[x]
        B[lo] += xb[x]
        if kind == "doc":
            self.owner[x] = lo
        if y >= 0:
            src[lo].remove(y)
            src[hi].append(y)
            F[lo] -= xf[y]
            B[lo] -= xb[y]
            F[hi] += xf[y]
            B[hi] += xb[y]
            if kind == "doc":
                self.owner[y] = hi
        if kind == "slice":
            self._move_share_loads(hi, lo, x, y)

    def _move_share_loads(self, hi: int, lo: int, x: int, y: int) -> None:
        """Merge slice ``x`` moved to ``lo`` (and ``y``, if ``>= 0``, to ``hi``): update the
        members' share loads and slice owners; shares stay sorted."""
        SF, SB, xf, xb = self.SF, self.SB, self.sf, self.sb
        self.sowner[x] = lo
        SF[hi] -= xf[x]
        SB[hi] -= xb[x]
        SF[lo] += xf[x]
        SB[lo] += xb[x]
        if y >= 0:
            self.sowner[y] = hi
            SF[lo] -= xf[y]
            SB[lo] -= xb[y]
            SF[hi] += xf[y]
            SB[hi] += xb[y]
        self.shares[hi].sort()
        self.shares[lo].sort()


def _slice_move_fits(
    view: BatchView,
    shares: dict[int, list[int]],
    hi: int,
    lo: int,
    x: int,
    y: int,
    budget: MemoryBudget,
    reserve: float,
) -> bool:
    """Do both members' merge shares fit ``budget`` less ``reserve`` after slice ``x`` moves
    from ``hi`` to ``lo`` (and slice ``y``, if ``>= 0``, from ``lo`` to ``hi``)?"""
    new_lo = [s for s in shares[lo] if s != y] + [x]
    new_hi = [s for s in shares[hi] if s != x] + ([y] if y >= 0 else [])
    return budget.fits(member_peak(view, sorted(new_lo)), reserve) and budget.fits(
        member_peak(view, sorted(new_hi)), reserve
    )


def _slice_move_within_cap(
    view: BatchView, shares: dict[int, list[int]], hi: int, lo: int, x: int, y: int, cap: float
) -> bool:
    """Does ``lo``'s merge share (one pack) stay within ``cap`` tokens after the move of
    :func:`_slice_move_fits` (and ``hi``'s)?"""
    tok = view.lists[0]
    new_lo = member_tokens(view, shares[lo]) + tok[x] - (tok[y] if y >= 0 else 0)
    new_hi = member_tokens(view, shares[hi]) - tok[x] + (tok[y] if y >= 0 else 0)
    return max(new_lo, new_hi) <= cap


@cyclic_gc_paused()
def slimpack(
    batch: Sequence[Document],
    layout: Layout,
    seed: int = 0,
    cost: CostModel | None = None,
    *,
    step: int = 0,
    validate: bool = True,
    options: SolveOptions = DEFAULT_OPTIONS,
) -> StepPlan:
    """Plan one step with SlimPack (see the module docstring); reads ``options.merge_share``,
    ``improve_rounds``, ``milp_seconds``, ``refine_share`` and ``skew_merge``
    (:class:`~slimdata.solver.options.SolveOptions`). ``seed`` only breaks ties (the heuristic
    is deterministic for a batch).
    """
    t0 = time.perf_counter()
    cost = cost or default_cost()
    view = _batch_view(batch, layout, cost, options.refine_share)
    with _recompute_advice(cost):
        _check_slices(view, layout, cost)
    assembly = _Assembly(view, layout, cost, step, seed, options, t0, validate)
    try:
        solve = _free_plan if layout.mode == "free" else _lockstep_plan
        return _merges_that_pay(assembly, functools.partial(_coarse_merge, solve=solve))
    finally:
        # the memo's merge splits refer back to the view: with that cycle broken, reference
        # counting frees the solve's state here, not the next cyclic collection (about 2 ms
        # of a 4M-token lockstep solve, 64 ranks)
        view.memo.clear()


def _merges_that_pay(assembly: _Assembly, solve: Callable[[_Assembly], StepPlan]) -> StepPlan:
    """``solve``'s plan, or the plan with only the merges memory forces when that one is at
    least as fast: merges memory does not force (a document costlier than a rank's share, the
    skew, a too coarse document) are kept only when they pay, by the execution model's compute time
    (:meth:`_Stages.plan_estimate`). That estimate leaves out the merge groups' K/V exchange,
    which only the plan with more merges pays, so a plan it puts ahead (or level) without them
    is ahead in the step too. Either plan fits every device: ``solve`` checks it
    (:func:`_free_plan`, :func:`_lockstep_plan`)."""
    plan = solve(assembly)
    forced = assembly.options.forced_merges_only()
    if not plan.merges or forced == assembly.options:
        return plan
    stages = _Stages.of(assembly.layout, assembly.cost)
    estimate = assembly.estimate(plan)
    view = assembly.view
    merged = np.array([d for g in plan.merges for d in g.docs], dtype=np.int64)
    # without its merge a document runs whole on one rank: when the costliest merged one
    # alone takes longer than this plan's step, the plan without merges cannot be ahead (a
    # rank's cp devices each compute at least 1 / cp of it, padding and fixed costs apart)
    most = float((view.doc_fwd[merged] + view.doc_bwd[merged]).max())
    alone = stages.share * most / stages.cp
    if alone > 1.01 * estimate:
        return plan
    try:
        fewer = solve(dataclasses.replace(assembly, options=forced))
    except PlanError:
        return plan
    if assembly.estimate(fewer) > estimate:
        return plan
    # the options asked for, and that the merges they allow did not pay (meta is JSON: no inf)
    fewer.meta.update(merge_share=assembly.options.merge_share, unforced_merges="dropped")
    return fewer


def _free_plan(assembly: _Assembly) -> StepPlan:
    """Free mode: phase 1 and every rank packed on its own (:func:`_free_at`). Under static
    CP the packer counts every pass's gathered K/V (:func:`pack_rank`) on the view's slices,
    which the plan fuses (a run pads its chunks as one slice), so the assembled plan is read
    off the execution model's memory rule on every device (:meth:`_Stages.peak`), as lockstep
    plans are (:func:`_quantile_plan`): while it does not fit, phase 1 and the packer run
    again with the budget scaled by the overshoot (:data:`CALIBRATIONS` times at most), then
    a :class:`PlanError` gives the best peak reached. Without static CP the packer's check
    is the execution model's rule on one stage (docs/solver.md, *Memory accounting*)."""
    layout = assembly.layout
    fitting = _Fitting(assembly, _Stages.of(layout, assembly.cost))
    packer = layout
    for attempt in range(CALIBRATIONS + 1):
        try:
            plan = _free_at(assembly, packer)
        except PlanError:
            if attempt == 0:
                raise
            break  # a smaller budget fits no plan: the overshoot is the answer
        if layout.cp == 1:
            return plan  # the packer's check is the execution model's rule (docs/solver.md)
        held = fitting._peak(plan)
        if held <= fitting.limit:
            return plan
        fitting.failed.append((held, plan))
        packer = dataclasses.replace(
            packer, memory_gib=packer.memory_gib * fitting.limit / fitting.lowest * (1 - 1e-3)
        )
    raise PlanError(
        f"free: no plan fits {gib(layout.memory_gib)} per device with static CP {layout.cp} "
        f"(the execution model's peak of every plan is above it, at best "
        f"{gib(fitting.lowest / GIB)}): raise --memory-gib"
    )


def _free_at(assembly: _Assembly, packer: Layout) -> StepPlan:
    """The free plan of phase 1 and every rank's packs under ``packer``'s memory budget
    (the layout's, or a calibrated one: :func:`_free_plan`)."""
    view = assembly.view
    with _recompute_advice(assembly.cost):
        p1 = _phase1(
            view,
            packer,
            assembly.options,
            packs=1,
            mem=packer.memory_bytes,
            coarse=assembly.coarse,
            alone=documents_alone(view, packer.cp),
        )
        packs = _free(view, p1, packer)
    return assembly.plan((math.nan, packs, 0, p1))


def _coarse_merge(assembly: _Assembly, solve: Callable[[_Assembly], StepPlan]) -> StepPlan:
    """``solve``'s plan, or its plan with too coarse documents merged over two ranks or more,
    when whole documents are too coarse for the ranks to balance (the plan's imbalance above
    :data:`COARSE_IMBALANCE`; e.g. 7 documents of 8K tokens over 2 ranks: 4 against 3, where
    one merged document gives 3.5 each) and that plan's estimate is lower by
    :data:`COARSE_GAIN` (the estimate has no communication: the margin stands for the merge
    group's K/V exchange that context parallelism's overlap leaves exposed). Tried: the
    costliest whole document of every rank above the imbalance (:func:`_too_coarse`: several
    ranks may be equally slow, and relieving one of them does not shorten the step), then,
    when that is more than one document and does not pay, the slowest rank's alone.
    ``meta["coarse_merge"]`` lists those of them the kept plan merges (their indices in the
    batch)."""
    plan = solve(assembly)
    if (
        not assembly.options.coarse_merge
        or assembly.layout.dp < 2
        or plan.meta["imbalance"] <= COARSE_IMBALANCE
    ):
        return plan
    every = _too_coarse(assembly.view, plan, assembly.prices(plan))
    for coarse in dict.fromkeys([tuple(every), tuple(every[:1])]):
        if not coarse:
            continue
        try:
            merged = solve(dataclasses.replace(assembly, coarse=coarse))
        except PlanError:
            continue
        if assembly.estimate(merged) < assembly.estimate(plan) * (1 - COARSE_GAIN):
            held = {d for g in merged.merges for d in g.docs}
            merged.meta["coarse_merge"] = [d for d in coarse if d in held]
            return merged
    return plan


def _too_coarse(view: BatchView, plan: StepPlan, prices: Prices) -> list[int]:
    """Per rank whose load (its packs' seconds at the execution model's ``prices``) is above
    :data:`COARSE_IMBALANCE` times the mean, slowest first: the costliest document (forward
    plus backward seconds) it holds whole (not merged) that a merge can share, one of two
    slices or more, if any."""
    f, b = rank_seconds(plan, prices)
    load = f + b
    merged = {d for g in plan.merges for d in g.docs}
    out = []
    for r in np.argsort(-load, kind="stable").tolist():
        if load[r] <= COARSE_IMBALANCE * load.mean():
            break
        held = {
            s.doc for p in plan.ranks[r].forward for s in p.slices if len(view.ranges[s.doc]) > 1
        } - merged
        if held:
            out.append(max(sorted(held), key=lambda d: float(view.doc_fwd[d] + view.doc_bwd[d])))
    return out


COARSE_IMBALANCE = 1.02
"""A plan whose rank loads are further apart than this (slowest over mean) tries a too
coarse document merged (:func:`_coarse_merge`)."""

COARSE_GAIN = 0.01
"""How much lower the estimate of the plan with a coarse document merged must be to be kept
(:func:`_coarse_merge`)."""


RERANKED = 4
"""Lockstep candidates under static CP whose assembled plans are ordered by the execution
model's estimate (:meth:`_Fitting.ranked`)."""

WHOLE_TRIED = 3
"""Candidates that keep documents whole assembled at most, by estimate, for the first that
fits every device (:meth:`_Fitting.whole`)."""

CALIBRATIONS = 3
"""Lockstep solves with a smaller packer budget when every candidate's peak on some device
(the execution model's, :meth:`_Stages.peak`) is above the budget: the packer scaled down by
the overshoot each time."""


def _lockstep_plan(assembly: _Assembly) -> StepPlan:
    """The plan of the forward-cost quantile cuts (:func:`_quantile_plan`), or the one that
    keeps documents whole (:meth:`_Fitting.whole`) when its estimate is lower or the cuts fit
    no plan."""
    fitting = _Fitting(assembly, _Stages.of(assembly.layout, assembly.cost))
    try:
        plan = _quantile_plan(fitting)
    except PlanError:
        whole = fitting.whole()
        if whole is None:
            raise
        return whole
    whole = fitting.whole(below=assembly.estimate(plan))
    if whole is not None and assembly.estimate(whole) < assembly.estimate(plan):
        return whole
    return plan


def _quantile_plan(fitting: _Fitting) -> StepPlan:
    """The best lockstep candidate of the quantile cuts whose every device fits
    ``layout.memory_gib`` (:meth:`_Stages.peak`). When the best by estimate does not fit,
    memory binds: the first that fits competes with the first that fits at twice and four
    times the winner's pack count (smaller packs hold less each), the best estimate wins;
    while none fits, the candidates again from a packer whose budget is scaled by the
    smallest overshoot (:data:`CALIBRATIONS` times at most)."""
    layout = fitting.assembly.layout
    packer = layout
    for attempt in range(CALIBRATIONS + 1):
        try:
            candidates = fitting.candidates(packer)
        except PlanError:
            if attempt == 0:
                raise
            break  # a smaller packer budget fits no candidate: the overshoot is the answer
        plan = fitting.first(candidates)
        if plan is not None and fitting.leader_fits:
            return plan  # the winner fits (always, where the packer's check is exact)
        m = len(candidates[0][1][0].forward)
        pool = [p for p in (plan, *fitting.with_more_packs(packer, m)) if p is not None]
        if pool:
            return min(pool, key=lambda p: p.meta["pipeline_estimate"])
        packer = dataclasses.replace(
            packer, memory_gib=packer.memory_gib * fitting.limit / fitting.lowest * (1 - 1e-3)
        )
    how = f"the {layout.schedule} schedule" if fitting.stages.v > 1 else "1F1B"
    raise PlanError(
        f"lockstep: no plan fits {gib(layout.memory_gib)} per device under {how}"
        + (f" with static CP {layout.cp}" if layout.cp > 1 else "")
        + f" (the execution model's peak of every candidate is above it, at best "
        f"{gib(fitting.lowest / GIB)})"
    )


@dataclass(frozen=True)
class _Assembly:
    """What turns a candidate's packs into the step's plan."""

    view: BatchView
    layout: Layout
    cost: CostModel
    step: int
    seed: int
    options: SolveOptions
    t0: float
    validate: bool
    coarse: tuple[int, ...] = ()
    """Documents phase 1 merges over at least two ranks (:func:`_coarse_merge`)."""
    estimates: dict[int, tuple[StepPlan, float]] = field(default_factory=dict, compare=False)
    """:meth:`estimate` of the plans of this solve, by ``id`` (shared by the assemblies
    ``dataclasses.replace`` makes of this one)."""
    priced: dict[int, tuple[StepPlan, Prices]] = field(default_factory=dict, compare=False)
    """:meth:`prices` of the plans of this solve, by ``id`` (kept from their assembly)."""

    @cached_property
    def stages(self) -> _Stages:
        return _Stages.of(self.layout, self.cost)

    def prices(self, plan: StepPlan) -> Prices:
        """The execution model's price of every pack of ``plan`` as it will run
        (:attr:`_Stages.config`), computed once per plan of the solve."""
        known = self.priced.get(id(plan))
        if known is None or known[0] is not plan:
            known = (plan, pack_prices(plan, self.cost, self.stages.config))
            self.priced[id(plan)] = known
        return known[1]

    def estimate(self, plan: StepPlan) -> float:
        """:meth:`_Stages.plan_estimate` of ``plan``, computed once per plan of the solve."""
        known = self.estimates.get(id(plan))
        if known is None or known[0] is not plan:
            known = (plan, self.stages.plan_estimate(plan, self.cost, self.prices(plan)))
            self.estimates[id(plan)] = known
        return known[1]

    def plan(self, candidate: _Candidate) -> StepPlan:
        """The plan of one candidate's packs; a lockstep plan records the execution model's
        estimate of it as assembled (fused slices priced)."""
        estimate, packs, lag, p1 = candidate
        view, layout = self.view, self.layout
        plan, prices = assemble_priced(
            view=view,
            layout=layout,
            cost=self.cost,
            strategy="slimpack",
            step=self.step,
            forward=[p.forward for p in packs],
            backward=[p.backward for p in packs],
            merges=p1.merges.groups,
            merge_rank_pack={
                r: p.merge_pack for r, p in enumerate(packs) if p.merge_pack is not None
            },
            mode=layout.mode,
            lag=lag,
            meta=_meta(
                self.seed,
                layout,
                self.options,
                p1,
                None if math.isnan(estimate) else estimate,
                lag,
                packs,
            ),
            t0=self.t0,
            validate=self.validate,
            execution=self.stages.config,
        )
        self.priced[id(plan)] = (plan, prices)
        _check_pack_cap(view, packs, layout.token_cap, self.step)
        if layout.mode != "free":
            plan.meta["pipeline_estimate"] = round(self.estimate(plan), 6)
        return plan


@dataclass
class _Fitting:
    """Assembles lockstep candidates and keeps the first whose every device fits the budget
    (:meth:`_Stages.peak`), remembering the lowest peak of those that do not (free plans
    under static CP too, one per calibration: :func:`_free_plan`)."""

    assembly: _Assembly
    stages: _Stages
    leader_fits: bool = False
    """Whether the last :meth:`first`'s probes' winner fits (memory does not bind)."""
    _lead: dict[int, StepPlan] = field(default_factory=dict, repr=False)
    """The last :meth:`ranked`'s leading plans (:meth:`leading`), by candidate index."""
    failed: list[tuple[float, StepPlan | None]] = field(default_factory=list)
    """Per candidate that did not fit: a device peak above the budget and its plan, or its
    largest device peak and None once computed (:attr:`lowest`)."""
    wholes: list[_Candidate] = field(default_factory=list)
    """The candidates that keep documents whole, of every :meth:`candidates` call."""

    @property
    def limit(self) -> float:
        return self.assembly.layout.memory_gib * GIB

    @property
    def lowest(self) -> float:
        """The smallest largest-device peak of the candidates that did not fit (``inf``:
        none). Each is known by a device above the budget, at most its largest; the largest
        is computed from the smallest of those up, until the smallest known is exact."""
        a = self.assembly
        while self.failed:
            self.failed.sort(key=lambda f: f[0])
            held, plan = self.failed[0]
            if plan is None:
                return held
            self.failed[0] = (self.stages.peak(plan, a.cost, a.layout), None)
        return math.inf

    def candidates(self, packer: Layout) -> list[_Candidate]:
        """:func:`_solve_lockstep` with the packer's layout, phase 1's placements shared with
        the earlier solves (they differ in budget and pack count only): the quantile cuts'
        candidates; those that keep documents whole are kept for :meth:`whole`."""
        a = self.assembly
        with _recompute_advice(a.cost):
            return _solve_lockstep(
                a.view, packer, a.options, self.stages, self.placements, self.wholes, a.coarse
            )

    def whole(self, below: float = math.inf) -> StepPlan | None:
        """The plan of the candidate that keeps documents whole with the lowest estimate
        whose every device fits (:data:`WHOLE_TRIED` tried at most, by their probes; every
        one by its plan's estimate under a cost model that prices model calls, whose probes
        leave the calls out, :meth:`leading`), or None. Without static CP or merge shares a
        candidate whose probe is not ``below`` is not assembled: its packs are priced as
        their documents run whole on one device, which its plan's estimate can only exceed
        (pack constants, FSDP's padding calls; a whole-document pack is its own backward
        pack, so nothing runs graph-free)."""
        a = self.assembly
        wholes = sorted(self.wholes, key=lambda c: c[0])
        if self.stages.cp == 1:
            wholes = [c for c in wholes if c[0] < below or any(p.merge_pack for p in c[1])]
        if prices_calls(a.cost):
            tried: Iterable[StepPlan] = sorted(map(a.plan, wholes), key=a.estimate)
        else:
            tried = map(a.plan, wholes[:WHOLE_TRIED])
        for plan in tried:
            if self._peak(plan) <= self.limit:
                return plan
        return None

    @cached_property
    def placements(self) -> _Placements:
        a = self.assembly
        return _Placements(a.view, a.layout, a.options)

    def first(self, candidates: Sequence[_Candidate]) -> StepPlan | None:
        """The plan of the first of ``candidates`` that fits every device, or None; the
        leading ones in the order of their plans' estimates (:meth:`ranked`).
        :attr:`leader_fits`: whether the probes' winner (``candidates[0]``) fits, where
        memory does not bind."""
        self.leader_fits = False
        fits: dict[int, bool] = {}
        for index, plan in self.ranked(candidates):
            held = self._peak(plan)
            fits[index] = held <= self.limit
            if fits[index]:
                self.leader_fits = fits.get(0, False) or (0 not in fits and self._fits(0))
                return plan
            self.failed.append((held, plan))
        return None

    def ranked(self, candidates: Sequence[_Candidate]) -> Iterator[tuple[int, StepPlan]]:
        """The plans of ``candidates`` in order, with their indices; the :meth:`leading` ones
        first, by the execution model's estimate of their assembled plans (ties: the smaller
        backward lag), then the others in the probes' order."""
        self._lead = {i: self.assembly.plan(candidates[i]) for i in self.leading(candidates)}
        # ties (to 9 digits: the same packs in another order sum in another order): the
        # smaller backward lag, which holds less
        yield from sorted(
            self._lead.items(),
            key=lambda ip: (float(f"{self.assembly.estimate(ip[1]):.9g}"), candidates[ip[0]][2]),
        )
        yield from (
            (i, self.assembly.plan(c)) for i, c in enumerate(candidates) if i not in self._lead
        )

    def leading(self, candidates: Sequence[_Candidate]) -> list[int]:
        """The candidates whose order the probes (each pack priced as one device runs it
        whole, its slices' costs summed) may have wrong. Under a cost model that prices
        model calls (:func:`~slimdata.execution.pricing.prices_calls`: a profiled model's
        per-call constants or graph-free scale) they miss what the calls cost, which grows
        with the pack count and, where forward packs are split by backward pack or
        recomputed, with the lag: every candidate (probe 3 of the review: the probes' winner,
        76 packs, 61.5 s by its plan's estimate, against 39.9 s at 38 packs). Under static CP
        they miss what a CP group pays per pack and per slice (padding, fixed costs, chunk
        efficiency; :func:`~slimdata.execution.pack_compute`): the :data:`RERANKED` first.
        Under FSDP they miss the forward that a backward pack which is not a union of
        forward packs re-runs first (:mod:`slimdata.execution.pricing`), and a larger
        backward lag makes more of them (:attr:`_Stages.lag_matters`): the winner and the
        first candidate at its pack count's smallest lag (the winner of the probes without
        larger lags)."""
        if prices_calls(self.assembly.cost):
            return list(range(len(candidates)))
        if self.stages.cp > 1:
            return list(range(min(RERANKED, len(candidates))))
        if not self.stages.config.ranks_meet_every_pass or not candidates:
            return []
        smallest: dict[int, int] = {}
        for _e, packs, lag, _p1 in candidates:
            m = len(packs[0].forward)
            smallest[m] = min(smallest.get(m, lag), lag)
        first = next(
            i
            for i, (_e, packs, lag, _p1) in enumerate(candidates)
            if lag == smallest[len(packs[0].forward)]
        )
        return [0] if first == 0 else [0, first]

    def _fits(self, index: int) -> bool:
        """Whether the lead candidate ``index`` of the last :meth:`ranked` fits every device."""
        return self._peak(self._lead[index]) <= self.limit

    def _peak(self, plan: StepPlan) -> float:
        """:meth:`_Stages.peak` of ``plan`` against the budget."""
        a = self.assembly
        return self.stages.peak(plan, a.cost, a.layout, self.limit)

    def with_more_packs(self, packer: Layout, m: int) -> list[StepPlan | None]:
        """:meth:`first` of the candidates at ``2 m`` and ``4 m`` packs (none when the
        user fixed the count)."""
        out = []
        for more in (2 * m, 4 * m) if self.assembly.layout.microbatches is None else ():
            try:
                at = dataclasses.replace(packer, microbatches=more)
                out.append(self.first(self.candidates(at)))
            except PlanError:
                continue
        return out


def _batch_view(
    batch: Sequence[Document], layout: Layout, cost: CostModel, refine_share: float
) -> BatchView:
    """The batch's slices; in free mode, slices costlier than ``refine_share`` of the balanced
    per-rank time cut finer first (:func:`~slimdata.solver.refine.refine_costly_slices`)."""
    view = BatchView.build(batch, cost, layout.token_cap)
    if refine_share > 0 and layout.mode == "free":
        finer = refine_costly_slices(view, layout.dp, cost, share=refine_share)
        if finer is not None:
            view = BatchView.build(finer, cost, layout.token_cap)
    return view


def _meta(
    seed: int,
    layout: Layout,
    options: SolveOptions,
    p1: _Phase1,
    estimate: float | None,
    lag: int,
    packs: list[RankPacks],
) -> dict[str, Any]:
    """What a slimpack plan records of how it was found (``StepPlan.meta``)."""
    meta: dict[str, Any] = {
        "seed": seed,
        "merge_share": options.merge_share,
        "layout": _layout_meta(layout),
    }
    if options.refine_share != REFINE_SHARE:
        meta["refine_share"] = options.refine_share
    if estimate is not None:
        meta["pipeline_estimate"] = round(estimate, 6)
    meta.update(improve_moves=p1.moves, lag=lag, microbatches=len(packs[0].forward) if packs else 0)
    if packs and packs[0].whole:
        meta["whole_documents"] = True  # :func:`_lockstep_whole`'s packs
    if p1.milp is not None:
        meta["milp"] = p1.milp
    return meta


@contextmanager
def _recompute_advice(cost: CostModel) -> Iterator[None]:
    """A memory refusal also names the recompute policy when the cost model keeps more than
    full recompute does (at long context, activations dominate what a rank must hold)."""
    try:
        yield
    except PlanError as exc:
        if cost.recompute == "full" or "--memory-gib" not in str(exc):
            raise
        raise PlanError(f"{exc}{recompute_advice(cost.recompute)}") from None


def recompute_advice(policy: str) -> str:
    """What a memory refusal adds under a cost model of recompute ``policy`` (not "full")."""
    return f"; or use --recompute full (this cost model assumes {policy} recompute)"


def _check_pack_cap(view: BatchView, packs: list[RankPacks], cap: int, step: int) -> None:
    """``Layout.pack_tokens`` is a hard cap for every pack, merge shares included (the packs'
    tokens summed over view slices at once: fusing slices keeps their tokens)."""
    lists = [(r, p) for r, rp in enumerate(packs) for p in (*rp.forward, *rp.backward) if p]
    lens = np.array([len(p) for _r, p in lists], dtype=np.int64)
    flat = np.array(list(itertools.chain.from_iterable(p for _r, p in lists)), dtype=np.int64)
    tokens = np.add.reduceat((view.end - view.start)[flat], np.cumsum(lens) - lens)
    if len(tokens) and tokens.max() > cap:  # pragma: no cover - packers respect the cap
        worst = int(tokens.argmax())
        raise PlanError(
            f"step {step} rank {lists[worst][0]}: a pack of {tokens[worst]} tokens exceeds "
            f"pack_tokens={cap}"
        )


@dataclass
class _Phase1:
    merges: MergePlan
    member_slices: dict[int, list[int]]
    moves: int
    milp: dict | None
    docs: list[list[int]]
    """Each rank's whole documents."""
    view: BatchView

    @cached_property
    def units(self) -> list[list[range]]:
        """Each rank's documents as runs of slice indices (built when asked: free mode packs
        from ``docs`` alone, :func:`~slimdata.solver.freepack.pack_rank_by_runs`)."""
        return [list(map(self.view.ranges.__getitem__, ds)) for ds in self.docs]

    @cached_property
    def rank_docs(self) -> list[RankDocs]:
        """Each rank's documents as the lockstep packer reads them, whatever the pack count
        (a placement is shared by the counts whose merge plans agree, :class:`_Placements`)."""
        return [
            RankDocs.of(self.view, units, self.member_slices.get(r, ()))
            for r, units in enumerate(self.units)
        ]


def _phase1(
    view: BatchView,
    layout: Layout,
    options: SolveOptions,
    *,
    packs: int,
    mem: float,
    gather: float = MERGE_GATHER,
    layer_share: float = 1.0,
    placements: _Placements | None = None,
    coarse: Sequence[int] = (),
    alone: np.ndarray | None = None,
) -> _Phase1:
    """DP-Merge groups (member shares sized to one of ``packs`` packs), then their placement:
    two-dimensional LPT (one-dimensional in free mode: a rank's total time), local search,
    optional MILP (:func:`_place`). ``mem``: bytes a rank may hold (full-model bytes: the
    device cap over the first pipeline stage's share of the layers); ``gather``: merge
    members also hold that many times their group's K/V
    (:func:`~slimdata.solver.merge.plan_merges`); ``placements``: the placements found so far
    in this solve, reused where they apply (:class:`_Placements`); ``coarse``: documents merged
    over at least two ranks (:func:`_coarse_merge`); ``alone``: the bytes each document needs
    alone on a rank (:func:`~slimdata.solver.merge.plan_merges`)."""
    merges = plan_merges(
        view,
        layout.dp,
        mem,
        share=options.merge_share,
        packs=packs,
        gather=gather,
        layer_share=layer_share,
        balance_ratio=options.skew_merge,
        cap=layout.token_cap,
        devices=layout.cp,
        coarse=coarse,
        alone=alone,
    )
    placements = placements or _Placements(view, layout, options)
    return placements.place(merges, mem, gather / layer_share)


@dataclass
class _Placements:
    """Phase 1's placements (:func:`_place`) found in one solve, by merge plan: the lockstep
    candidate pack counts whose merge plans agree share one. Their memory budgets differ (each
    count reserves room for its packs in flight), but a placement reads its budget only by
    asking whether bytes fit (:class:`~slimdata.solver.budget.MemoryBudget`), so it is reused
    for a budget that answers every question it asked alike: the same placement, computed
    once (a batch without merges asks none)."""

    view: BatchView
    layout: Layout
    options: SolveOptions
    found: dict[tuple, list[tuple[MemoryBudget, _Phase1]]] = field(default_factory=dict)
    """Per merge plan (:func:`_merge_key`) and buffer scale: each placement and its budget."""

    def place(self, merges: MergePlan, mem: float, scale: float) -> _Phase1:
        """:func:`_place` of ``merges`` under ``mem`` bytes, or the one found before that
        answers alike."""
        key = (_merge_key(merges), scale)  # before placing: the placement may edit the shares
        for budget, p1 in self.found.get(key, ()):
            if budget.answers_alike(mem):
                return p1
        budget = MemoryBudget(mem)
        p1 = _place(self.view, self.layout, self.options, merges, budget, scale)
        self.found.setdefault(key, []).append((budget, p1))
        return p1


def _merge_key(merges: MergePlan) -> tuple:
    """Everything a placement reads of a merge plan, as a hashable snapshot: the groups, each
    member's slices (in the plan's order) and the merged documents."""
    return (
        tuple(merges.groups),
        tuple((r, tuple(s)) for r, s in merges.member_slices.items()),
        tuple(sorted(merges.merged_docs)),
    )


def _place(
    view: BatchView,
    layout: Layout,
    options: SolveOptions,
    merges: MergePlan,
    budget: MemoryBudget,
    scale: float,
) -> _Phase1:
    """The documents not merged and the merge groups' slices over the ranks (joint LPT,
    :func:`_distribute`), the local search (:func:`improve`) and the optional MILP; ``budget``:
    bytes a rank may hold, ``scale`` x its group's gathered K/V held by a merge member."""
    unmerged = np.ones(len(view.docs), dtype=bool)
    unmerged[list(merges.merged_docs)] = False
    rest = np.flatnonzero(unmerged)  # the documents not merged, in order
    # free mode: only a rank's total time counts (BatchView.summed)
    load = view.summed() if layout.mode == "free" else view
    assign, member_slices, held = _distribute(load, layout, merges, rest, budget, scale)
    group_ranks = [ranks for ranks, _d in merges.groups]
    moves = (
        improve(
            load,
            assign,
            member_slices,
            group_ranks,
            budget,
            rounds=options.improve_rounds,
            buffers=[held[g[0]] for g in group_ranks],
            cap=layout.token_cap,
        )
        if options.improve_rounds
        else 0
    )
    info = None
    if options.milp_seconds > 0:
        from slimdata.solver.milp import refine_assignment

        assign, info = refine_assignment(
            load, rest, assign, layout.dp, member_slices, seconds=options.milp_seconds
        )
    return _Phase1(merges, member_slices, moves, info, assign, view)


def _distribute(
    view: BatchView,
    layout: Layout,
    merges: MergePlan,
    rest: np.ndarray,
    budget: MemoryBudget,
    scale: float,
) -> tuple[list[list[int]], dict[int, list[int]], dict[int, float]]:
    """Documents ``rest`` and the merge groups' slices over the ranks by one joint LPT
    (:func:`assign_lpt`); if that overloads a member's memory (its share plus ``scale`` x its
    group's gathered K/V above ``budget``) or its merge pack (above the token cap), the merge
    planner's own split is kept and only the documents are dealt. Returns per-rank documents,
    each member's merge slices and each member's merge buffer bytes."""
    dp = layout.dp
    groups = [
        (ranks, sorted(i for r in ranks for i in merges.member_slices[r]))
        for ranks, _d in merges.groups
    ]
    assign, shares = assign_lpt(view, rest, dp, groups)
    held = _member_buffers(view, merges.groups, shares, scale, layout.cp)
    if any(
        not budget.fits(member_peak(view, shares[r]) + held[r])
        or member_tokens(view, shares[r]) > layout.token_cap
        for r in merges.member_slices
    ):
        shares = [merges.member_slices.get(r, []) for r in range(dp)]
        assign, _ = assign_lpt(view, rest, dp, [((r,), shares[r]) for r in merges.member_slices])
        held = _member_buffers(view, merges.groups, shares, scale, layout.cp)
    return assign, {r: shares[r] for r in merges.member_slices}, held


def _member_buffers(view: BatchView, groups, shares, scale: float, cp: int = 1) -> dict[int, float]:
    """``scale`` x one layer's gathered K/V of its group, for every merge member
    (:func:`~slimdata.solver.merge.group_buffer`; ``shares[r]``: member ``r``'s slices;
    ``cp``: static CP, the bytes of a DP rank's devices together)."""
    out: dict[int, float] = {}
    for ranks, _docs in groups:
        nbytes = scale * group_buffer(view, [shares[m] for m in ranks], 1.0, cp)
        out.update(dict.fromkeys(ranks, nbytes))
    return out


def _free(view: BatchView, p1: _Phase1, layout: Layout) -> list[RankPacks]:
    """Free mode: every rank packed on its own (:func:`pack_rank`'s packs, found a pack at a
    time by :func:`~slimdata.solver.freepack.pack_rank_by_runs` where it applies), the
    segment with the longest backward last
    (:func:`~slimdata.solver.freepack.longest_backward_last`: it hides the all-reduce)."""
    dp, cap, mem, cp = layout.dp, layout.token_cap, layout.memory_bytes, layout.cp
    out = []
    for r in range(dp):
        merge = p1.member_slices.get(r, ())
        p = pack_rank_by_runs(view, p1.docs[r], merge, cap=cap, mem=mem, cp=cp)
        if p is None:
            p = pack_rank(view, p1.units[r], merge, cap=cap, mem=mem, cp=cp)
        if p is None:  # pragma: no cover - phase 1 guarantees every document fits alone
            raise PlanError(
                f"rank {r}: cannot pack its documents under the memory cap {gib(mem / GIB)}"
            )
        out.append(longest_backward_last(view, p))
    return out


def _pack_counts(view: BatchView, layout: Layout) -> list[int]:
    """Lockstep pack counts to try: ``layout.microbatches`` when given, else the fewest packs
    the token cap allows raised to ``pp``, and with ``pp > 1`` also 2x and 3x that (more
    micro-batches shrink the pipeline bubble)."""
    if layout.microbatches is not None:
        return [layout.microbatches]
    m0 = _packs_estimate(view, layout)
    return [m0, 2 * m0, 3 * m0] if layout.pp > 1 else [m0]


@dataclass(frozen=True)
class _Stages:
    """The pipeline a lockstep plan is solved for: what its memory check and its step-time
    estimate need."""

    pp: int
    layers: int
    """The model's layers: the execution model's split of the model into pipeline chunks."""
    schedule: str = "1f1b"
    """The schedule the plan will run under (``Layout.schedule``): the estimate's stage order."""
    v: int = 1
    """Model chunks per device (``Layout.chunks_per_device``; 1 unless interleaved)."""
    cp: int = 1
    """Static CP (``Layout.cp``): devices per DP rank."""
    parallelism: str = "ddp"
    """The executor's rules the plan runs by: FSDP for lockstep packs on one stage, DDP /
    ZeRO-1 otherwise (free packs, pipelines)."""

    @classmethod
    def of(cls, layout: Layout, cost: CostModel) -> _Stages:
        """The pipeline of ``layout`` for a model of ``cost.layers`` layers."""
        fsdp = layout.mode == "lockstep" and layout.pp == 1
        return cls(
            layout.pp,
            cost.layers,
            layout.schedule,
            layout.chunks_per_device,
            layout.cp,
            "fsdp" if fsdp else "ddp",
        )

    @cached_property
    def config(self) -> ExecutionConfig:
        """How the execution model runs the plan."""
        return ExecutionConfig(
            pp=self.pp,
            parallelism=self.parallelism,
            schedule=self.schedule,
            virtual_stages=self.v,
            cp=self.cp,
        )

    @property
    def lag_matters(self) -> bool:
        """Whether the backward lag can change :meth:`estimate`, so that lags above the first
        that fits are worth packing. In a pipeline a longer warm-up shrinks the bubble. Under
        FSDP the ranks meet before every pass, so each backward pack costs its slowest rank's:
        a document spanning forward packs ``0 .. j`` feeds only the backward packs from
        ``j - lag`` on (lag 1 of 3 packs, a document in all three: backward pack 0 holds none
        of it, packs 1 and 2 hold it all), and a larger lag spreads it over more of them
        (measured: 14.35 s at lag 1, 11.48 s at lag 2 in the first step of the Wikipedia FSDP
        case at static CP 2, docs/solver.md). Only ranks that meet at the gradient reduction
        alone (each rank's packs summed, one stage) are indifferent to it."""
        return self.pp > 1 or self.config.ranks_meet_every_pass

    @property
    def share(self) -> float:
        """The first (largest) stage's share of the layers (:func:`stage_share`); the packer
        checks memory with 1F1B's packs in flight under every schedule, and :meth:`peak`
        reads the interleaved schedule's own (and static CP's) off the execution model."""
        return stage_share(self.layers, self.pp)

    def peak(
        self, plan: StepPlan, cost: CostModel, layout: Layout, over: float | None = None
    ) -> float:
        """The largest device peak of ``plan`` (bytes) where the packer's memory check is
        not the execution model's, else 0. The packer's check is exact for 1F1B without
        static CP. The interleaved schedule's warm-up keeps more packs in flight on the
        first devices (``(pp - 1) * 2 + (v - 1) * pp`` chunk passes), and under static CP
        every pass holds one layer's gathered K/V, which the lockstep packer does not count
        and the free packer counts on the view's slices, not the plan's fused ones; those
        plans are read off the execution model's memory rule
        (:func:`~slimdata.execution.memory.peak` of every program, under the rules lockstep
        plans run by: FSDP on one stage, DDP / ZeRO-1 in a pipeline). ``over``: a budget the
        caller only needs to know is exceeded (:func:`device_peak_memory`)."""
        if layout.cp == 1 and (self.pp == 1 or self.v == 1):
            return 0.0
        return device_peak_memory(plan, cost, self.config, over)

    def estimate(
        self, fwd: np.ndarray, bwd: np.ndarray, order, members: Sequence[Sequence[int]] = ()
    ) -> float:
        """Step time of ranks sharing ``order`` (``fwd``, ``bwd``: per-pack seconds, a column
        per rank): the slowest rank's compute-only critical path under the plan's schedule,
        the execution model's stage order (:func:`~slimdata.execution.critical.critical_path`):
        under the interleaved schedule the count and lag are chosen for its smaller bubble;
        under FSDP the ranks meet before every pass (pack ``i`` costs its slowest rank's);
        ``inf`` for an order the schedule cannot run (interleaved: some counts not a multiple
        of ``pp``), so another count or lag wins. ``members``: the ranks of each merge group,
        whose first packs (their merge packs) run together (:func:`members_wait`)."""
        if len(members):
            fwd = members_wait(fwd.ravel(), members).reshape(fwd.shape)
            bwd = members_wait(bwd.ravel(), members).reshape(bwd.shape)
        try:
            times = critical_path_under(fwd, bwd, order, self.config, self.layers)
        except PlanError:
            return math.inf
        return float(times.max())

    def plan_estimate(self, plan: StepPlan, cost: CostModel, prices: Prices | None = None) -> float:
        """:meth:`estimate` of an assembled plan at the execution model's prices on one
        device (static CP member shares, merged slices' attention efficiency, the executor's
        recomputes), every rank through its own order
        (:func:`~slimdata.execution.critical.plan_critical_path`); ``prices``: the plan's
        under :attr:`config`, where known."""
        return plan_critical_path(plan, cost, self.config, prices)


def _lockstep(
    view: BatchView,
    p1: _Phase1,
    layout: Layout,
    counts: Sequence[int],
    stages: _Stages,
    seen: list[_Candidate] | None = None,
    late_start: bool = False,
    whole: bool = False,
) -> tuple[float, list[RankPacks], int] | None:
    """Lockstep packs of every rank for the pack count in ``counts`` and the backward lag with
    the smallest estimated step time (:meth:`_Stages.estimate`); ``None`` if none fits the
    caps. The lag is the pipeline's warm-up, bounded by memory, not
    by a constant: more forward packs in flight before the first backward shrink the bubble
    and hold more, so the lags that fit are ``0 .. L`` and ``L`` is found by bisection
    where the lag can change the estimate (:attr:`_Stages.lag_matters`: a pipeline, or FSDP's
    ranks meeting before every pass); every lag the bisection packs is estimated. Memory is checked per pipeline stage
    (``stages.share`` of the layers on the first stage, 1F1B's extra packs in flight, merge
    K/V buffers; :func:`pack_rank_lockstep`). Returns ``(estimate, packs, lag)``; the smaller
    lag wins ties. ``seen`` collects every count and lag that fits, with ``p1``, and with
    ``whole`` the candidate that keeps documents whole (:func:`_lockstep_whole`), which
    ``best`` leaves out. A count whose lag 0 does not fit is skipped, unless ``late_start``:
    then the lags that fit start at the first that does (:func:`_first_fitting_lag`)."""
    best: tuple[float, list[RankPacks], int] | None = None
    gather = _member_buffers(
        view, p1.merges.groups, p1.member_slices, 1.0 / stages.share, layout.cp
    )
    members = [list(ranks) for ranks, _docs in p1.merges.groups]
    for m in counts:
        tried: dict[int, tuple[float, list[RankPacks]] | None] = {}
        works = [docs.work(m) for docs in p1.rank_docs]

        def fits(lag: int, works=works, tried=tried) -> bool:
            if lag not in tried:
                tried[lag] = _lockstep_at(works, layout, lag, stages, gather, members)
            return tried[lag] is not None

        first = 0 if fits(0) else _first_fitting_lag(fits, m) if late_start else None
        if first is not None:
            # where the lag cannot change the estimate it only adds memory: the first lag
            # that fits is then the candidate
            _bisect_lags(fits, first, m - 1 if stages.lag_matters else first)
        kept_packs = None
        for lag in sorted(tried):
            found = tried[lag]
            if found is not None and layout.pp == 1:
                # on one stage a larger lag with the same packs runs the same passes and
                # holds more: not a candidate
                if _same_packs(found[1], kept_packs):
                    continue
                kept_packs = found[1]
            if found is not None and seen is not None:
                seen.append((found[0], found[1], lag, p1))
            if found is not None and (best is None or found[0] < best[0] * (1 - 1e-9)):
                best = (found[0], found[1], lag)
        if whole and seen is not None:
            kept = _lockstep_whole(works, layout, stages, gather, members)
            if kept is not None:
                seen.append((kept[0], kept[1], 0, p1))
            dealt = _lockstep_dealt(view, p1, layout, stages, m)
            if dealt is not None:
                seen.append(dealt)
    return best


def _same_packs(packs: Sequence[RankPacks], other: Sequence[RankPacks] | None) -> bool:
    """Whether every rank's forward and backward packs are the same in both."""
    return other is not None and all(
        a.forward == b.forward and a.backward == b.backward
        for a, b in zip(packs, other, strict=True)
    )


def _bisect_lags(fits: Callable[[int], bool], lo: int, hi: int) -> None:
    """Probe the lags ``lo .. hi`` by bisection for the largest that fits (``lo`` fits; the
    lags that fit are contiguous). Invariant: every lag from the first to ``lo`` fits, none
    above ``hi``."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1


def _lockstep_at(
    works: Sequence[LockstepWork],
    layout: Layout,
    lag: int,
    stages: _Stages,
    gather: dict[int, float],
    members: Sequence[Sequence[int]] = (),
) -> tuple[float, list[RankPacks]] | None:
    """Every rank's lockstep packs (``works[r]``: rank ``r``'s documents and pack count) at
    backward ``lag`` (``gather``: each merge member's buffers, full-model bytes), with the
    estimate (:meth:`_Stages.estimate`): the slowest rank's pipeline (ranks meet at the
    gradient reduction, as under DDP or ZeRO-1/2; under FSDP before every pass; ``members``:
    each merge group's ranks, whose merge packs run together); ``None`` when a rank does not
    fit."""
    packs = []
    share = stages.share
    for r, work in enumerate(works):
        p = work.pack(
            cap=layout.token_cap,
            mem=layout.memory_bytes,
            lag=lag,
            pp=layout.pp,
            layer_share=share,
            merge_kv=gather.get(r, 0.0),
            kv_per_slice=layout.pp > 1,
            peak=False,
        )
        if p is None:
            return None
        packs.append(p)
    _tok, fwd, bwd, _act, _doc = works[0].view.lists
    f = np.array(
        [p.forward_cost or [sum(map(fwd.__getitem__, i)) for i in p.forward] for p in packs]
    ).T
    b = np.array(
        [p.backward_cost or [sum(map(bwd.__getitem__, j)) for j in p.backward] for p in packs]
    ).T
    m = works[0].m
    return stages.estimate(f, b, interleaved_order(m, m, lag), members), packs


def _lockstep_whole(
    works: Sequence[LockstepWork],
    layout: Layout,
    stages: _Stages,
    gather: dict[int, float],
    members: Sequence[Sequence[int]] = (),
) -> tuple[float, list[RankPacks]] | None:
    """Every rank's documents kept whole (:meth:`LockstepWork.pack_whole`) in the fewest
    packs, from the works' count up (:data:`WHOLE_COUNTS` counts at most), that every rank
    fills, backward lag 0, with the estimate; ``None`` when none packs so."""
    fewest = min(len(w.stream) + (1 if len(w.merge_slices) else 0) for w in works)
    for m in range(works[0].m, min(fewest, works[0].m + WHOLE_COUNTS - 1) + 1):
        packs = []
        for r, w in enumerate(works):
            p = w.pack_whole(
                m,
                cap=layout.token_cap,
                mem=layout.memory_bytes,
                pp=layout.pp,
                layer_share=stages.share,
                merge_kv=gather.get(r, 0.0),
            )
            if p is None:
                break
            packs.append(p)
        else:
            f = np.array([p.forward_cost for p in packs]).T
            b = np.array([p.backward_cost for p in packs]).T
            return stages.estimate(f, b, interleaved_order(m, m, 0), members), packs
    return None


WHOLE_COUNTS = 4
"""Pack counts :func:`_lockstep_whole` and :func:`_lockstep_dealt` try from a candidate count
up: the greedy fills a few more packs where the token cap leaves one document out."""


def _lockstep_dealt(
    view: BatchView, p1: _Phase1, layout: Layout, stages: _Stages, m: int
) -> _Candidate | None:
    """Under FSDP, documents kept whole in the ``dp x k`` packs of the whole batch at once,
    for the fewest ``k`` from ``m`` up (:data:`WHOLE_COUNTS` counts at most) that fits:
    WLB-LLM's Alg. 1 (:func:`~slimdata.solver.strategies.wlb.wlb_pack`), the packs by
    decreasing seconds, pack ``i`` of every rank one of the ``i``-th ``dp`` of them (every
    pack costs its slowest rank's, so the costliest ``dp`` run together); backward lag 0,
    priced as the
    documents run whole (:meth:`LockstepWork.pack_documents`). Phase 1 balances each rank's
    total time, so where a costly document leaves its rank few tokens the other ranks get
    more tokens than ``m`` packs hold and every rank runs more packs, each pass gathering the
    parameters; packing the batch at once does not. ``None`` in a pipeline (DDP / ZeRO-1
    rules: a rank's total time counts, which phase 1 balances), with merge groups (their
    members' shares are phase 1's) or when no count fits the caps."""
    if p1.merges.groups or not stages.config.ranks_meet_every_pass:
        return None
    dp, cap = layout.dp, layout.token_cap
    seconds = view.doc_fwd + view.doc_bwd
    for k in range(m, m + WHOLE_COUNTS):
        bins = wlb_pack(view.doc_len, seconds, dp * k, cap)
        if bins is None or not all(bins):
            continue
        bins.sort(key=lambda b: -float(seconds[b].sum()))  # stable: ties in Alg. 1's order
        dealt = [bins[r::dp] for r in range(dp)]  # rank r: bins r, r + dp, ...
        packs: list[RankPacks] = []
        for docs in dealt:
            units = [view.ranges[d] for pack in docs for d in pack]
            rank = (
                RankDocs.of(view, units, ())
                .work(k)
                .pack_documents(
                    docs, mem=layout.memory_bytes, pp=layout.pp, layer_share=stages.share
                )
            )
            if rank is None:
                return None
            packs.append(rank)
        fwd = np.array([p.forward_cost for p in packs]).T
        bwd = np.array([p.backward_cost for p in packs]).T
        owned = [[d for pack in docs for d in pack] for docs in dealt]
        placed = dataclasses.replace(p1, docs=owned, moves=0, milp=None)
        return stages.estimate(fwd, bwd, interleaved_order(k, k, 0)), packs, 0, placed
    return None


def _first_fitting_lag(fits: Callable[[int], bool], m: int) -> int | None:
    """The smallest backward lag below ``m`` whose packs fit, or None. Lag 0 usually does. A
    rank holding a document longer than the token cap cannot start its backward work before
    the document's last forward pack closes, so there the smallest lags fail the token cap: a
    larger lag completes more documents before each backward pack, so those failures end at
    the first lag that fits, and memory, which grows with the lag, fails only above it."""
    return next((lag for lag in range(m) if fits(lag)), None)


_Candidate = tuple[float, list["RankPacks"], int, "_Phase1"]
"""A lockstep candidate: ``(estimate, packs, lag, phase 1)``."""


def _solve_lockstep(
    view: BatchView,
    layout: Layout,
    options: SolveOptions,
    stages: _Stages,
    placements: _Placements | None = None,
    wholes: list[_Candidate] | None = None,
    coarse: Sequence[int] = (),
) -> list[_Candidate]:
    """Phase 1 and lockstep packs for the candidate pack counts; the best estimate wins.

    Phase 1 sizes merges for a budget of the device cap (in full-model bytes: over the first
    stage's share of the layers) minus the ``pp - 1`` average packs the first stage holds
    beyond the plan order under 1F1B. With ``pp > 1`` and a best lag that memory held below ``m - 1``,
    :data:`MORE_PACKS` multiples of the fewest packs are tried as well. When no candidate fits, more and smaller packs are
    tried, then phase 1 again with twice and four times that reserve (more documents merged,
    smaller merge shares). Phase 1's placement is computed once for the counts whose merge
    plans agree (:class:`_Placements`; ``placements``: those of earlier solves of the same
    batch, whose budgets differ). Returns the winner ``(estimate, packs, lag, phase
    1)``, then every other count and lag that fit, by estimate: the first whose every device
    fits (:meth:`_Stages.peak`) is the plan. ``wholes`` collects the candidates that keep
    documents whole (:func:`_lockstep_whole`), which the returned ones leave out; ``coarse``:
    documents phase 1 merges over at least two ranks (:func:`_coarse_merge`).
    """
    cap, mem, dp, pp = layout.token_cap, layout.memory_bytes, layout.dp, layout.pp
    share = stages.share
    total = float(view.doc_mem.sum())  # all activations + K/V of the batch
    placements = placements or _Placements(view, layout, options)

    def phase1(m: int, widen: float) -> _Phase1 | None:
        budget = mem / share - widen * (pp - 1) * total / (dp * m)
        if budget <= 0:
            return None
        try:
            return _phase1(
                view,
                layout,
                options,
                packs=m,
                mem=budget,
                layer_share=share,
                placements=placements,
                coarse=coarse,
            )
        except PlanError:
            if widen == 1 and pp == 1:
                raise
            return None

    best: _Candidate | None = None
    seen: list[_Candidate] = []
    counts = _pack_counts(view, layout)
    extra = [k * counts[0] for k in MORE_PACKS] if pp > 1 and layout.microbatches is None else []
    for m in counts + extra:
        if m in extra and (best is None or best[2] >= len(best[1][0].forward) - 1):
            break  # more, smaller packs only when memory held the lag down
        p1 = phase1(m, 1.0)
        if p1 is None:
            continue
        # documents kept whole aim at the fewest packs: tried from the first count only
        found = _lockstep(view, p1, layout, [m], stages, seen, whole=m == counts[0])
        if found is not None and (best is None or found[0] < best[0] * (1 - 1e-9)):
            best = (found[0], found[1], found[2], p1)
    if wholes is not None:
        wholes += [c for c in seen if c[1][0].whole]
    if best is not None:
        return _winner_first(best, [c for c in seen if not c[1][0].whole])
    if layout.microbatches is not None:
        raise PlanError(
            f"lockstep: the ranks' documents do not fit microbatches={layout.microbatches} "
            f"packs of <= {cap} tokens and {gib(layout.memory_gib)} per device; raise "
            "--microbatches or leave it unset"
        )
    m = max(_pack_counts(view, layout))
    for widen in (1.0, 2.0, 4.0):
        p1 = phase1(m, widen)
        if p1 is None:
            continue
        seen = []
        found = _lockstep_fallback(view, p1, layout, stages, seen)
        if found is not None:
            return _winner_first((*found, p1), seen)
    raise PlanError(
        f"lockstep: no pack count fits the memory cap of {gib(layout.memory_gib)} per device with "
        f"pp={pp} (1F1B keeps up to pp packs in flight on the first stage): raise "
        "--memory-gib, cut finer slices or lower --global-batch-tokens"
    )


def _winner_first(best: _Candidate, seen: list[_Candidate]) -> list[_Candidate]:
    """``best``, then the other candidates ``seen`` by estimate (ties: in the order found)."""
    return [best, *sorted((c for c in seen if c[1] is not best[1]), key=lambda c: c[0])]


def _lockstep_fallback(
    view: BatchView,
    p1: _Phase1,
    layout: Layout,
    stages: _Stages,
    seen: list[_Candidate] | None = None,
) -> tuple[float, list[RankPacks], int] | None:
    """More packs until the caps fit (memory-bound ranks need more, smaller packs; a rank
    holding a document longer than the token cap needs a backward lag): pack
    counts growing by half from just above the candidates to the most slices a rank holds,
    then twice and four times the first that fits (memory binds, so smaller packs let more
    be in flight: a longer warm-up, a smaller bubble); the best estimate; ``None`` if none
    fits."""
    start = max(_pack_counts(view, layout)) + 1
    most = 1 + max(
        sum(len(u) for u in p1.units[r]) + (1 if r in p1.member_slices else 0)
        for r in range(layout.dp)
    )
    m = start
    while True:
        found = _lockstep(view, p1, layout, [m], stages, seen, late_start=True)
        if found is not None or m >= most:
            break
        m = min(most, max(m + 1, (3 * m) // 2))
    if found is None:
        return None
    for more in (2 * m, 4 * m):
        # memory binds here: smaller packs hold less each, so more of them fit in flight
        if more <= most:
            smaller = _lockstep(view, p1, layout, [more], stages, seen, late_start=True)
            if smaller is not None and smaller[0] < found[0] * (1 - 1e-9):
                found = smaller
    return found


def _packs_estimate(view: BatchView, layout: Layout) -> int:
    """Micro-batches per rank a lockstep plan will have at least (1 in free mode): the merge
    planner sizes members' shares to one pack."""
    if layout.mode != "lockstep":
        return 1
    if layout.microbatches is not None:
        return layout.microbatches
    return max(layout.pp, math.ceil(float(view.doc_len.sum()) / layout.dp / layout.token_cap))


def _check_slices(view: BatchView, layout: Layout, cost: CostModel) -> None:
    """Every slice within the pack token cap, and within the memory cap on a device alone
    (:func:`~slimdata.solver.memory.slice_peak_memory`, the execution model's peak of a plan
    that runs it alone: the longest slice needs the most), else a :class:`PlanError` naming
    the slice, what it needs and the cap."""
    if len(view.doc) == 0:
        return
    tok = view.tokens
    worst = int(np.argmax(tok))
    cap = layout.token_cap
    d = view.docs[int(view.doc[worst])]
    where = f"slice [{view.start[worst]}, {view.end[worst]}) of document doc_id {d.doc_id!r}"
    if tok[worst] > cap:
        raise PlanError(
            f"{where} has {tok[worst]} tokens, more than the pack token cap {cap}: cut finer "
            "slices or raise pack_tokens"
        )
    need = slice_peak_memory(int(tok[worst]), cost, _Stages.of(layout, cost).config)
    if need > layout.memory_gib * GIB:
        gathered = f", and the K/V its pass gathers under static CP {layout.cp}"
        raise PlanError(
            f"{where} needs {gib(need / GIB, 2)} on a device alone (its activations and K/V"
            f"{gathered if layout.cp > 1 else ''}), above the memory cap "
            f"{gib(layout.memory_gib, 2)} per device: raise --memory-gib or cut finer slices"
        )


def _layout_meta(layout: Layout) -> dict:
    out = {
        "dp": layout.dp,
        "pp": layout.pp,
        "ranks_per_node": layout.ranks_per_node,
        "memory_gib": layout.memory_gib,
        "context": layout.context,
        "pack_tokens": layout.token_cap,
        "mode": layout.mode,
        "microbatches": layout.microbatches,
    }
    if layout.pp > 1 and layout.schedule != "1f1b":  # 1F1B plans' meta as before
        out.update(schedule=layout.schedule, virtual_stages=layout.virtual_stages)
    return out

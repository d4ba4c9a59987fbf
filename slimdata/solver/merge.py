"""DP-Merge: documents too long or too costly for one rank run on a group of ranks.

A document becomes a merge candidate when its whole footprint (all activations plus its K/V,
:mod:`slimdata.solver.memory`) exceeds the memory cap, when its predicted time
(forward + backward) exceeds ``share`` x the balanced per-rank time, or (free mode) when its
backward/forward skew would leave its rank unbalanced (:func:`skew_group_sizes`), or when the
caller names it too coarse for the ranks to balance whole (``coarse``). Its group is
the fewest ranks ``k`` that fit: the smallest ``k >= ceil(time / balanced time)`` (and at
least the skew bound) whose members all fit the memory cap and carry at most the balanced
forward and the balanced backward time (the rest of their time is then filled with short
documents); if no ``k`` is that even, the smallest that fits memory. Members split the
document's slices by LPT on predicted time (each member then holds a set of slices, whose
queries see the gathered prefix); a member holds ``act`` and K/V of its own slices, plus
(``gather``) the per-layer merge buffers: one layer's gathered K/V of the group's documents,
exchanged layer by layer and freed after the layer, as under context parallelism (design §9),
as the execution model allocates them (:func:`group_buffer`; under static CP on each of a
member's devices).
Groups use disjoint ranks, lowest free ranks first (so a small group stays inside a node).
When too few free ranks remain, a document joins the existing group that can absorb it under
the memory cap with the fewest of the remaining free ranks added to it (then the lowest load);
if none can and it does not fit one rank, :class:`PlanError` names it and the limit.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from slimdata.errors import PlanError
from slimdata.execution.memory import gathered_kv_held
from slimdata.execution.merge import merge_share_tokens
from slimdata.solver.common import BatchView
from slimdata.units import GIB, gib

__all__ = [
    "MergePlan",
    "group_buffer",
    "member_peak",
    "member_tokens",
    "plan_merges",
    "skew_group_sizes",
    "split_group",
]


RATIO_TOL = 0.015
"""Backward overload (fraction of the balanced share) a rank may be left with by one whole
document's backward/forward skew before that document is split (:func:`skew_group_sizes`)."""


@dataclass
class MergePlan:
    groups: list[tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    """``(ranks, docs)`` per group."""
    member_slices: dict[int, list[int]] = field(default_factory=dict)
    """rank -> slice indices of its merge share, in (document, start) order."""
    merged_docs: set[int] = field(default_factory=set)


def split_group(
    view: BatchView, slices: Sequence[int], k: int, base: Sequence[float] | None = None
) -> tuple[list[list[int]], np.ndarray, float]:
    """LPT of ``slices`` over ``k`` members on forward+backward time, members starting at loads
    ``base`` (default 0).

    Returns the members' slice lists (sorted), their merge loads and the largest member memory.
    Without ``base`` a split is computed once per batch (the planner tries the same documents
    at several pack counts) and handed out as fresh lists.
    """
    if base is not None:
        members, loads = _lpt(view, slices, k, base)
        return members, loads, float(member_peaks(view, members).max())
    split = _Split.of(view, slices, k)
    return split.fresh_members(), split.loads.copy(), split.peak


ROUGH = 1e-9
"""Relative margin beyond which :attr:`_Split.rough_peak` answers a memory question as the
exact peak would: its sums add the same values (all >= 0) in another order, and two such
sums of ``n`` values differ by at most about ``2 (n - 1)`` x 1.1e-16 of their size (2e-13
for a thousand slices)."""


@dataclass(frozen=True, eq=False)
class _Split:
    """One split of a group's slices over ``k`` members (:func:`_lpt`) and what the planner
    asks of it: the members' tokens, a rough peak, and when first asked their forward and
    backward seconds (``fwd[ms].sum()``) and exact peak (:func:`member_peaks`). Computed once
    per batch (the planner tries the same documents at several pack counts); ``members`` is
    shared: hand out copies."""

    view: BatchView
    members: list[list[int]]
    loads: np.ndarray
    tokens: np.ndarray
    rough_peak: float
    """The largest member's peak bytes, its activations summed in one pass over all the
    members (within :data:`ROUGH` of :attr:`peak`): most memory questions are answered by it
    with room to spare."""
    rough_fwd: np.ndarray
    """Each member's forward seconds summed in that pass (within :data:`ROUGH` of
    :attr:`fwd`): most balance questions are answered by them."""
    rough_bwd: np.ndarray

    @classmethod
    def of(cls, view: BatchView, slices: Sequence[int], k: int) -> _Split:
        key = (tuple(slices), k)
        if key not in view.memo:
            members, loads = _lpt(view, slices, k, None)
            sizes = np.fromiter(map(len, members), dtype=np.int64, count=k)
            owner = np.repeat(np.arange(k), sizes)
            flat = np.fromiter(itertools.chain.from_iterable(members), np.int64, len(slices))
            # token sums are exact in any order (integers below 2**53)
            tokens = np.bincount(owner, view.tokens[flat], minlength=k).astype(np.int64)
            act = np.bincount(owner, view.act[flat], minlength=k)
            view.memo[key] = cls(
                view=view,
                members=members,
                loads=loads,
                tokens=tokens,
                rough_peak=float(_held_bytes(view, act, tokens).max()),
                rough_fwd=np.bincount(owner, view.fwd[flat], minlength=k),
                rough_bwd=np.bincount(owner, view.bwd[flat], minlength=k),
            )
        return view.memo[key]

    @cached_property
    def peak(self) -> float:
        """The largest member's peak bytes (:func:`member_peaks`)."""
        return float(member_peaks(self.view, self.members).max())

    @cached_property
    def fwd(self) -> np.ndarray:
        """Each member's forward seconds."""
        return member_sums(self.view.fwd, self.members)

    @cached_property
    def bwd(self) -> np.ndarray:
        """Each member's backward seconds."""
        return member_sums(self.view.bwd, self.members)

    def fresh_members(self) -> list[list[int]]:
        return [list(ms) for ms in self.members]

    def fits(self, mem: float, buffer_of, cap: float) -> bool:
        """Every member's share plus the group's merge buffers (``buffer_of(members,
        tokens)``, the members' slices and tokens) within ``mem``, shares within ``cap``:
        ``peak + buffers <= mem``, read off :attr:`rough_peak` where it is clear by more
        than :data:`ROUGH`."""
        tokens = self.tokens.tolist()
        buffers = buffer_of(self.members, tokens)
        rough = self.rough_peak + buffers
        if rough * (1 + ROUGH) < mem:
            held = True
        elif rough * (1 - ROUGH) > mem:
            held = False
        else:
            held = self.peak + buffers <= mem
        return held and max(tokens) <= cap

    def within(self, fshare: float, bshare: float) -> bool:
        """Does every member carry at most ``fshare`` forward and ``bshare`` backward
        seconds? Read off :attr:`rough_fwd` and :attr:`rough_bwd` where they are clear by
        more than :data:`ROUGH`, else off the exact sums."""
        f, b = self.rough_fwd, self.rough_bwd
        if (f * (1 - ROUGH) > fshare).any() or (b * (1 - ROUGH) > bshare).any():
            return False
        if ((f * (1 + ROUGH) < fshare) & (b * (1 + ROUGH) < bshare)).all():
            return True
        return bool(((self.fwd <= fshare) & (self.bwd <= bshare)).all())

    def largest_time(self) -> float:
        """The largest member's forward + backward seconds, summed exactly (as :attr:`fwd`
        and :attr:`bwd`) only for the members whose rough sums come within :data:`ROUGH` of
        the largest (no other can be the largest)."""
        rough = self.rough_fwd + self.rough_bwd
        near = np.flatnonzero(rough * (1 + ROUGH) >= rough.max() * (1 - ROUGH)).tolist()
        fwd, bwd = self.view.fwd, self.view.bwd
        return max(
            float(fwd[ms].sum()) + float(bwd[ms].sum())
            for ms in (np.asarray(self.members[j], dtype=np.int64) for j in near)
        )


def _lpt(
    view: BatchView, slices: Sequence[int], k: int, base: Sequence[float] | None
) -> tuple[list[list[int]], np.ndarray]:
    idx = np.asarray(slices, dtype=np.int64)
    cost = view.fwd[idx] + view.bwd[idx]
    order = np.argsort(-cost, kind="stable")
    items, costs = idx[order].tolist(), cost[order].tolist()
    members: list[list[int]] = [[] for _ in range(k)]
    loads = [0.0] * k
    first = 0
    if base is None:
        # from empty members the costliest slices go one to a member, in member order (the
        # heap's (0.0, j) entries before any loaded one), while their costs are positive
        first = min(k, len(costs))
        while first and not costs[first - 1] > 0:
            first -= 1
        for j in range(first):
            members[j].append(items[j])
            loads[j] += costs[j]
    heap = [(loads[j] if base is None else float(base[j]), j) for j in range(k)]
    heapq.heapify(heap)
    for i, c in zip(items[first:], costs[first:], strict=True):
        load, j = heap[0]  # the least loaded member (entries are distinct: one order)
        members[j].append(i)
        loads[j] += c
        heapq.heapreplace(heap, (load + c, j))
    for ms in members:
        ms.sort()
    return members, np.array(loads)


def member_peak(view: BatchView, slices: Sequence[int]) -> float:
    """Bytes a member holds for its merge pack from its forward to its backward: activations
    and K/V of its own slices (the gathered K/V of the others' slices lives for one layer, the
    merge buffer of :func:`plan_merges`)."""
    if len(slices) == 0:
        return 0.0
    act = float(view.act[np.asarray(slices, dtype=np.int64)].sum())
    return _held_bytes(view, act, member_tokens(view, slices))


def member_peaks(view: BatchView, members: Sequence[Sequence[int]]) -> np.ndarray:
    """:func:`member_peak` of each member's slices."""
    return _held_bytes(view, member_sums(view.act, members), member_sums(view.tokens, members))


def _held_bytes(view: BatchView, act, tokens):
    """Bytes of a merge share of ``act`` activation bytes and ``tokens`` tokens (numbers or
    arrays): its activations and its K/V."""
    return act + view.kv_per_token * tokens


def member_sums(values: np.ndarray, members: Sequence[Sequence[int]]) -> np.ndarray:
    """``values[ms].sum()`` for each member's slices ``ms``, the same numbers: members of one
    or two slices at once (a sum of two has one rounding, in either order), the others one
    by one (numpy's summation order)."""
    sizes = np.fromiter(map(len, members), dtype=np.int64, count=len(members))
    out = np.zeros(len(members), dtype=values.dtype)
    for size in (1, 2):
        rows = np.flatnonzero(sizes == size)
        if len(rows):
            idx = np.array([members[r] for r in rows.tolist()], dtype=np.int64)
            out[rows] = values[idx[:, 0]] if size == 1 else values[idx[:, 0]] + values[idx[:, 1]]
    for r in np.flatnonzero(sizes > 2).tolist():
        out[r] = values[np.asarray(members[r], dtype=np.int64)].sum()
    return out


def member_tokens(view: BatchView, slices: Sequence[int]) -> int:
    """Tokens of a member's merge share: it runs as one MicroPack, so they must stay within
    the pack token cap (``Layout.pack_tokens``)."""
    return sum(map(view.lists[0].__getitem__, slices))


def group_buffer(
    view: BatchView, members: Sequence[Sequence[int]], gather: float, cp: int = 1
) -> float:
    """``gather`` x one layer's gathered K/V of a group whose members hold these merge shares,
    as the execution model allocates it on a device
    (:func:`~slimdata.execution.memory.gathered_kv_held` of
    :func:`~slimdata.execution.merge.merge_share_tokens`: shares padded to the largest; on
    top of static CP ``cp`` every process's chunks of the plan's slices, a run of a
    document's consecutive slices in a share fused as the plan fuses it). Under static CP
    the bytes are a DP rank's ``cp`` devices' together (each holds the buffer whole), as
    ``mem`` is (:attr:`~slimdata.solver.layout.Layout.memory_bytes`). Two members of one
    5-token and one 3-token slice: 10 tokens at ``cp = 1``; 12 at ``cp = 2``, on 2 devices
    each."""
    if cp == 1:
        return _gathered_bytes(view, [member_tokens(view, ms) for ms in members], gather)
    lengths = [_plan_slice_lengths(view, ms) for ms in members]
    held = gathered_kv_held(view.gathered_kv_per_token, merge_share_tokens(lengths, cp), "F")
    return cp * gather * held


def _gathered_bytes(view: BatchView, tokens: Sequence[int], gather: float) -> float:
    """:func:`group_buffer` of members holding ``tokens`` tokens each, without static CP
    (where the members' tokens decide it)."""
    held = gathered_kv_held(
        view.gathered_kv_per_token, merge_share_tokens([[t] for t in tokens]), "F"
    )
    return gather * held


def _plan_slice_lengths(view: BatchView, slices: Sequence[int]) -> list[int]:
    """Tokens of the plan's slices of a merge share of view ``slices`` (sorted):
    :func:`~slimdata.solver.common.assemble_plan` fuses consecutive slices of a document
    in one pack into one slice (``[0,4) [4,8) [12,16)`` of one document: 8 and 4)."""
    start, end, doc = view.start, view.end, view.doc
    out: list[int] = []
    prev = -2
    for i in slices:
        if i == prev + 1 and doc[i] == doc[prev]:
            out[-1] += int(end[i] - start[i])
        else:
            out.append(int(end[i] - start[i]))
        prev = i
    return out


def _smallest_k(
    view: BatchView,
    slices: Sequence[int],
    k_min: int,
    k_max: int,
    mem: float,
    fshare: float,
    bshare: float,
    fill: float = 0.9,
    cap: float = math.inf,
    buffer_of=lambda members, tokens: 0.0,
) -> tuple[int, _Split] | tuple[None, None]:
    """Fewest members whose split fits ``mem`` (with the group's ``buffer_of(members,
    tokens)`` bytes: the members' slices, ``tokens`` per member) and the pack token ``cap`` and keeps every member within the
    balanced forward and backward time (falls back to the fewest that fit memory and the
    cap). When one slice alone is above the balanced time, no split keeps every member within
    it: the fewest that fit is the answer, and the larger ``k`` are not split."""
    idx = np.asarray(slices, dtype=np.int64)
    # a member's time is at least its costliest slice's (sums of costs >= 0 only grow)
    balanced = bool(view.fwd[idx].max() <= fill * fshare and view.bwd[idx].max() <= fill * bshare)
    fallback = None
    for k in range(k_min, k_max + 1):
        split = _Split.of(view, slices, k)
        if split.fits(mem, buffer_of, cap):
            if balanced and split.within(fill * fshare, fill * bshare):
                return k, split
            if fallback is None:
                fallback = (k, split)
            if not balanced:
                break
    return fallback or (None, None)


def _closest_to_one_pack(
    view: BatchView, sl, k: int, split: _Split, mem, balanced, packs, cap, buffer_of
) -> tuple[int, _Split]:
    """Between ``k`` members (shares at most one pack) and ``k - 1`` (shares above it), keep
    the split whose largest pack, merge share or ``(balanced - share) / (packs - 1)``, is
    smaller."""

    def worst(split: _Split) -> float:
        s = split.largest_time()
        return max(s, (balanced - s) / (packs - 1))

    fewer = _Split.of(view, sl, k - 1)
    if fewer.fits(mem, buffer_of, cap) and worst(fewer) < worst(split):
        return k - 1, fewer
    return k, split


def skew_group_sizes(
    view: BatchView, dp: int, fixed: np.ndarray, *, tol: float = RATIO_TOL
) -> np.ndarray:
    """Members each document needs so that its ranks can still be balanced on forward AND
    backward time (0 or 1: it can stay whole).

    Backward/forward ratios differ between documents (attention's is ~4.1 with full
    recompute, linear layers' 3.0), so a rank holding a long document is backward-heavy and
    only short, forward-heavy documents can even it out. In units of the balanced per-rank
    forward and backward time, a share ``(f, b)`` filled up with documents of ratio ``rho``
    (the forward-weighted ratio of the batch's documents below the mean ratio: the supply a
    backward-heavy rank draws on) reaches backward ``b + rho (1 - f)`` when its forward is
    full; it must stay within ``1 + tol``. Splitting a document of ``(f, b)`` about evenly
    over ``k`` members (:func:`split_group`, then the joint LPT) needs
    ``k >= (b - rho f) / (1 + tol - rho)``. ``fixed`` marks documents merged anyway (too
    long or too costly); they are left out of the supply.
    """
    fs = float(view.doc_fwd.sum()) / dp
    bs = float(view.doc_bwd.sum()) / dp
    out = np.zeros(len(view.docs), dtype=np.int64)
    if fs <= 0 or bs <= 0:
        return out
    f = view.doc_fwd / fs
    b = view.doc_bwd / bs
    with np.errstate(divide="ignore", invalid="ignore"):
        low = ~fixed & (b < f)
    if not low.any():
        return out
    rho = float(b[low].sum() / f[low].sum())
    if rho >= 1 + tol:  # pragma: no cover - low-ratio documents have rho < 1
        return out
    need = (b - rho * f) / (1 + tol - rho)
    out = np.ceil(need - 1e-9).astype(np.int64)
    out[need <= 1] = 0
    return np.minimum(out, dp)


def plan_merges(
    view: BatchView,
    dp: int,
    mem: float,
    *,
    share: float = 1.0,
    packs: int = 1,
    balance_ratio: bool = True,
    ratio_tol: float = RATIO_TOL,
    gather: float = 0.0,
    layer_share: float = 1.0,
    whole: float | None = None,
    cap: float = math.inf,
    devices: int = 1,
    coarse: Sequence[int] = (),
    alone: np.ndarray | None = None,
) -> MergePlan:
    """Choose merge groups for one batch (see the module docstring).

    ``packs``: micro-batches per rank in lockstep mode; a member's share is then sized to one
    pack (``1/packs`` of the balanced per-rank time), so the merge pack costs about as much as
    every other pack of the member (pipeline micro-batches of similar cost).
    ``balance_ratio`` (free mode, ``packs == 1``): also merge documents that whole would leave
    their rank backward-heavy beyond ``ratio_tol`` (:func:`skew_group_sizes`), with at least
    that many members. ``gather``: a member also holds ``gather`` x one layer's K/V of all its
    group's documents (the merge buffers: one layer's gathered K/V while the merge forward
    runs, with their gradients, 2x, while the merge backward runs); 0 counts only its own
    slices (:func:`member_peak`). ``layer_share``: with pipeline stages, ``mem``
    is the device cap divided by the first stage's share of the layers (bytes are compared as
    full-model bytes); error messages report per-device bytes. ``whole``: a document whose
    footprint exceeds it must merge (default ``mem``; lower leaves room beside it).
    ``cap``: the pack token cap; a member's share runs as one pack, so no share holds more
    tokens (a document that cannot be shared that way stays whole on one rank, in several
    packs). ``devices``: devices per rank (static CP's ``cp``; ``mem`` is theirs together):
    each holds the merge buffers whole (:func:`group_buffer`). ``coarse``: documents merged over at least two ranks whatever their
    cost (too coarse for the ranks to balance whole; the caller decides which). ``alone``:
    the bytes each document needs alone on one rank, compared with ``whole`` (default its
    footprint, ``view.doc_mem``; free mode under static CP adds the gathered K/V of its own
    pass, :func:`~slimdata.solver.freepack.documents_alone`).
    """
    groups = _Groups(free=list(range(dp)))
    if len(view.docs) == 0:
        return groups.plan
    time = view.doc_fwd + view.doc_bwd
    rule = _Rule(
        view, dp, mem, packs, float(time.sum()) / dp, gather, layer_share, cap,
        mem if whole is None else whole,
        float(view.doc_fwd.sum()) / (dp * packs), float(view.doc_bwd.sum()) / (dp * packs),
        devices, view.doc_mem if alone is None else alone,
    )  # fmt: skip
    k_skew = np.zeros(len(view.docs), dtype=np.int64)
    must_or_long = (rule.alone > rule.whole) | (time > share * rule.balanced)
    if packs == 1 and balance_ratio and dp > 1:
        k_skew = skew_group_sizes(view, dp, must_or_long, tol=ratio_tol)
    if dp > 1:
        k_skew[list(coarse)] = np.maximum(k_skew[list(coarse)], 2)
    candidates = np.flatnonzero(must_or_long | (k_skew >= 2))
    for d in candidates[np.argsort(-time[candidates], kind="stable")].tolist():
        must = bool(rule.alone[d] > rule.whole)
        k, members = _group_size(rule, d, float(time[d]), int(k_skew[d]))
        if k is None:
            if must:
                raise _too_large(rule, d)
            continue
        assert members is not None  # _smallest_k returns k and members together
        if k <= len(groups.free):
            groups.open(d, list(view.slices_of(d)), members, float(time[d]) / k)
        elif not groups.join(rule, d) and must:
            raise _no_room(rule, d, k, len(groups.free))
    return groups.plan


@dataclass(frozen=True)
class _Rule:
    """What a merge group must respect in one batch (the arguments of :func:`plan_merges`)."""

    view: BatchView
    dp: int
    mem: float
    packs: int
    balanced: float
    gather: float
    layer_share: float
    cap: float
    whole: float
    fwd_share: float
    """A member's balanced forward seconds (per pack in lockstep mode)."""
    bwd_share: float
    devices: int
    """Devices per rank (static CP); ``mem`` is theirs together."""
    alone: np.ndarray
    """Bytes each document needs alone on one rank (full-model bytes, as ``mem``)."""

    @property
    def cap_words(self) -> str:
        """The memory cap as a user sets it: per device, and per rank under static CP."""
        per_rank = self.mem * self.layer_share / GIB
        if self.devices == 1:
            return f"{gib(per_rank)} per device"
        return (
            f"{gib(per_rank / self.devices)} per device, "
            f"{gib(per_rank)} per DP rank of {self.devices} CP devices"
        )

    def buffer_of(self, members: Sequence[Sequence[int]], tokens: Sequence[int]) -> float:
        """:func:`group_buffer` of members holding these slices, ``tokens`` tokens each
        (full-model bytes, as ``mem``)."""
        if self.devices == 1:
            return _gathered_bytes(self.view, tokens, self.gather) / self.layer_share
        return group_buffer(self.view, members, self.gather, self.devices) / self.layer_share


def _group_size(rule: _Rule, d: int, time: float, k_skew: int):
    """``(k, members)``: the fewest ranks that carry document ``d`` (module docstring), or
    ``(None, None)`` when no group of at most ``dp`` ranks holds it."""
    view, packs, balanced = rule.view, rule.packs, rule.balanced
    sl = list(view.slices_of(d))
    k_max = min(len(sl), rule.dp)
    if k_max < 2:
        return None, None
    k_time = max(2, math.ceil(time * packs / balanced) if balanced > 0 else 2, k_skew)
    k_cap = math.ceil(float(view.doc_len[d]) / rule.cap) if math.isfinite(rule.cap) else 2
    k, split = _smallest_k(
        view,
        sl,
        min(max(k_time, k_cap), k_max),
        k_max,
        rule.mem,
        rule.fwd_share,
        rule.bwd_share,
        fill=0.9 if packs == 1 else 1.0,
        cap=rule.cap,
        buffer_of=rule.buffer_of,
    )
    if k is None or split is None:
        return None, None
    if packs > 1 and k > 2:
        k, split = _closest_to_one_pack(
            view, sl, k, split, rule.mem, balanced, packs, rule.cap, rule.buffer_of
        )
    return k, split.fresh_members()


@dataclass
class _Groups:
    """The groups chosen so far, their slices and loads, and the ranks still free."""

    free: list[int]
    plan: MergePlan = field(default_factory=MergePlan)
    slices: list[list[int]] = field(default_factory=list)
    load: list[float] = field(default_factory=list)

    def open(self, d: int, slices: list[int], members: Sequence[list[int]], load: float) -> None:
        """A new group of the lowest free ranks for document ``d`` (its ``slices``)."""
        ranks = tuple(self.free[: len(members)])
        del self.free[: len(members)]
        self.slices.append(slices)
        self.load.append(load)
        self.plan.groups.append((ranks, (d,)))
        self._assign(ranks, members, d)

    def join(self, rule: _Rule, d: int) -> bool:
        """No free ranks left for ``d``'s own group: join the group that can hold it with the
        fewest free ranks added (then the least loaded); a rank serves one group per step."""
        # fewest free ranks added first, then the least loaded group (ties: the first)
        by_load = sorted(range(len(self.plan.groups)), key=self.load.__getitem__)
        options = ((g, e) for e in range(len(self.free) + 1) for g in by_load)
        for g, extra in options:
            ranks, docs = self.plan.groups[g]
            merged = self.slices[g] + list(rule.view.slices_of(d))
            split = _Split.of(rule.view, merged, len(ranks) + extra)
            if split.fits(rule.mem, rule.buffer_of, rule.cap):
                ranks = (*ranks, *self.free[:extra])
                del self.free[:extra]
                self.slices[g] = merged
                self.load[g] = float(split.loads.max())
                self.plan.groups[g] = (ranks, (*docs, d))
                self._assign(ranks, split.fresh_members(), d)
                return True
        return False

    def _assign(self, ranks, members, d: int) -> None:
        for r, ms in zip(ranks, members, strict=True):
            self.plan.member_slices[r] = ms
        self.plan.merged_docs.add(d)


def _too_large(rule: _Rule, d: int) -> PlanError:
    view, doc = rule.view, rule.view.docs[d]
    slices = len(view.slices_of(d))
    k_max = min(slices, rule.dp)
    buffers = (
        f" (each member also holds {rule.gather:g}x one layer's gathered K/V, "
        f"{gib(rule.gather * view.gathered_kv_per_token * doc.length / GIB)} or more)"
        if rule.gather > 0 and k_max > 1
        else ""
    )
    holders = f"even {k_max} merged ranks" if k_max > 1 else "one rank"
    by_tokens = math.ceil(doc.length / rule.cap) if math.isfinite(rule.cap) else 1
    remedies = ["raise --memory-gib"] if by_tokens <= k_max else []
    if slices < rule.dp:
        remedies.append("cut finer slices (more merged ranks)")
    else:
        remedies.append("use more devices (--nodes, --ranks-per-node)")
    if doc.length > rule.cap:
        remedies.append("use --oversize split|truncate")
    if by_tokens > k_max:  # the pack token cap binds, not memory
        return PlanError(
            f"document doc_id {doc.doc_id!r} ({doc.length} tokens, {slices} slices) needs "
            f"{by_tokens} merged ranks, since a member's share is one pack of at most "
            f"{int(rule.cap):,} tokens, and at most {k_max} can hold it: "
            f"{', or '.join(remedies)}"
        )
    return PlanError(
        f"document doc_id {doc.doc_id!r} ({doc.length} tokens, {slices} slices) "
        f"needs {gib(rule.alone[d] * rule.layer_share / GIB)} but the memory cap is "
        f"{rule.cap_words} and {holders} cannot hold it{buffers}: "
        f"{', or '.join(remedies)}"
    )


def _no_room(rule: _Rule, d: int, k: int, free: int) -> PlanError:
    doc = rule.view.docs[d]
    return PlanError(
        f"document doc_id {doc.doc_id!r} ({doc.length} tokens) needs a merge group of {k} "
        f"ranks (memory cap {rule.cap_words}) but only {free} of {rule.dp} ranks are free "
        "and no existing group can absorb it: raise --memory-gib or the DP size, or lower "
        "--global-batch-tokens"
        + (", or use --oversize split|truncate" if doc.length > rule.cap else "")
    )

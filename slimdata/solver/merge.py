"""DP-Merge: documents too long or too costly for one rank run on a group of ranks.

A document becomes a merge candidate when its whole footprint (all activations plus its K/V,
:mod:`slimdata.solver.memory`) exceeds the memory cap, or when its predicted time
(forward + backward) exceeds ``share`` x the balanced per-rank time. Its group is the fewest
ranks ``k`` that fit: the smallest ``k >= ceil(time / balanced time)`` whose members all fit
the memory cap and carry at most the balanced forward and the balanced backward time (the rest of their time is then filled with
short documents); if no ``k`` is that even, the smallest that fits memory. Members split the
document's slices by LPT on predicted time (each member then holds a set of slices, whose
queries see the gathered prefix); a member holds ``act`` of its slices plus K/V of the prefix
up to its last slice of every group document. Groups use disjoint ranks, lowest free ranks
first (so a small group stays inside a node). When too few free ranks remain, a document joins
the existing group that can absorb it under the memory cap with the lowest load; if none can
and it does not fit one rank, :class:`PlanError` names it and the limit.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from slimdata.errors import PlanError
from slimdata.solver.common import BatchView

__all__ = ["MergePlan", "member_peak", "plan_merges", "split_group"]

GIB = float(1 << 30)


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
    """
    idx = np.asarray(slices, dtype=np.int64)
    cost = view.fwd[idx] + view.bwd[idx]
    order = idx[np.argsort(-cost, kind="stable")]
    heap = [(0.0 if base is None else float(base[j]), j) for j in range(k)]
    heapq.heapify(heap)
    members: list[list[int]] = [[] for _ in range(k)]
    loads = np.zeros(k)
    for i in order.tolist():
        load, j = heapq.heappop(heap)
        members[j].append(i)
        c = float(view.fwd[i] + view.bwd[i])
        loads[j] += c
        heapq.heappush(heap, (load + c, j))
    for ms in members:
        ms.sort()
    return members, loads, max(member_peak(view, ms) for ms in members)


def member_peak(view: BatchView, slices: Sequence[int]) -> float:
    """Bytes a member holds for its merge pack: activations of its slices plus the gathered
    K/V prefix of every group document up to its last slice there (``slices`` sorted)."""
    ms = np.asarray(slices, dtype=np.int64)
    if len(ms) == 0:
        return 0.0
    docs = view.doc[ms]
    last = np.flatnonzero(np.append(docs[1:] != docs[:-1], True))
    return float(view.act[ms].sum()) + view.kv_per_token * float(view.end[ms[last]].sum())


def _smallest_k(
    view: BatchView,
    slices: Sequence[int],
    k_min: int,
    k_max: int,
    mem: float,
    fshare: float,
    bshare: float,
    fill: float = 0.9,
):
    """Fewest members whose split fits ``mem`` and keeps every member within the balanced
    forward and backward time (falls back to the fewest that fit memory)."""
    fallback = None
    for k in range(k_min, k_max + 1):
        members, _loads, peak = split_group(view, slices, k)
        if peak <= mem:
            if all(
                view.fwd[ms].sum() <= fill * fshare and view.bwd[ms].sum() <= fill * bshare
                for ms in members
            ):
                return k, members
            if fallback is None:
                fallback = (k, members)
    return fallback or (None, None)


def _closest_to_one_pack(view, sl, k, members, mem, balanced, packs):
    """Between ``k`` members (shares at most one pack) and ``k - 1`` (shares above it), keep
    the split whose largest pack, merge share or ``(balanced - share) / (packs - 1)``, is
    smaller."""

    def worst(ms) -> float:
        s = max(float(view.fwd[m].sum() + view.bwd[m].sum()) for m in ms)
        return max(s, (balanced - s) / (packs - 1))

    fewer, _loads, peak = split_group(view, sl, k - 1)
    if peak <= mem and worst(fewer) < worst(members):
        return k - 1, fewer
    return k, members


def plan_merges(
    view: BatchView, dp: int, mem: float, *, share: float = 1.0, packs: int = 1
) -> MergePlan:
    """Choose merge groups for one batch (see the module docstring).

    ``packs``: micro-batches per rank in lockstep mode; a member's share is then sized to one
    pack (``1/packs`` of the balanced per-rank time), so the merge pack costs about as much as
    every other pack of the member (pipeline micro-batches of similar cost).
    """
    out = MergePlan()
    n_docs = len(view.docs)
    if n_docs == 0:
        return out
    time = view.doc_fwd + view.doc_bwd
    balanced = float(time.sum()) / dp
    cand = np.flatnonzero((view.doc_mem > mem) | (time > share * balanced))
    cand = cand[np.argsort(-time[cand], kind="stable")]
    free = list(range(dp))
    group_slices: list[list[int]] = []
    group_load: list[float] = []
    for d in cand.tolist():
        sl = list(view.slices_of(d))
        must = bool(view.doc_mem[d] > mem)
        doc = view.docs[d]
        k_time = max(2, math.ceil(time[d] * packs / balanced)) if balanced > 0 else 2
        k_max = min(len(sl), dp)
        k, members = (None, None)
        if k_max >= 2:
            k, members = _smallest_k(
                view,
                sl,
                min(k_time, k_max),
                k_max,
                mem,
                float(view.doc_fwd.sum()) / (dp * packs),
                float(view.doc_bwd.sum()) / (dp * packs),
                fill=0.9 if packs == 1 else 1.0,
            )
            if k is not None and packs > 1 and k > 2:
                k, members = _closest_to_one_pack(view, sl, k, members, mem, balanced, packs)
        if k is None:
            if must:
                raise PlanError(
                    f"document doc_id {doc.doc_id!r} ({doc.length} tokens, {len(sl)} slices) needs "
                    f"{view.doc_mem[d] / GIB:.1f} GiB but the memory cap is {mem / GIB:.1f} GiB per rank and "
                    f"even {k_max} merged ranks cannot hold it: raise --memory-gib, cut finer slices, or "
                    "use --oversize split|truncate"
                )
            continue
        if k <= len(free):
            ranks = tuple(free[:k])
            del free[:k]
            group_slices.append(sl)
            group_load.append(float(time[d]) / k)
            out.groups.append((ranks, (d,)))
            for r, ms in zip(ranks, members, strict=True):
                out.member_slices[r] = ms
            out.merged_docs.add(d)
            continue
        # no free ranks left: join the least loaded group that can hold it
        placed = False
        for g in sorted(range(len(out.groups)), key=lambda g: group_load[g]):
            ranks, gdocs = out.groups[g]
            merged = group_slices[g] + sl
            members, loads, peak = split_group(view, merged, len(ranks))
            if peak <= mem:
                group_slices[g] = merged
                group_load[g] = float(loads.max())
                out.groups[g] = (ranks, (*gdocs, d))
                for r, ms in zip(ranks, members, strict=True):
                    out.member_slices[r] = ms
                out.merged_docs.add(d)
                placed = True
                break
        if not placed and must:
            raise PlanError(
                f"document doc_id {doc.doc_id!r} ({doc.length} tokens) needs a merge group of {k} "
                f"ranks (memory cap {mem / GIB:.1f} GiB per rank) but only {len(free)} of {dp} ranks "
                "are free and no existing group can absorb it: raise --memory-gib or the DP size, "
                "lower --global-batch-tokens, or use --oversize split|truncate"
            )
    return out

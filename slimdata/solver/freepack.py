"""Free-mode packing of one rank a pack at a time: :func:`~slimdata.solver.micropack.pack_rank`'s
exact result, with the per-slice work done by numpy.

``pack_rank`` walks a rank's slices one by one, testing at each the token cap, the memory cap
(the bytes held: every slice's activations and keys/values since the last backward) and, at a
document's first slice, whether the document fits beside what is held. Between two closing
forward packs nothing is released, so the bytes held are a running sum: one
``np.add.accumulate`` (sequential, so bit for bit the sum ``pack_rank`` forms) gives them at
every slice up to the next cut, and the first slice that fails a test is where the pack
closes. Only the cuts and the backward releases (:meth:`_FreeRun.union_backward`, the same
rule as ``pack_rank``'s) are Python loops: a DP-64 step of 6,700 short documents has a few
packs and ~100 slices per rank. ``tests/solver/test_freepack.py`` checks the packs and the
peak equal ``pack_rank``'s.

Example (cap 4 slices, memory never binding; documents of 3, 2 and 2 slices
``a0 a1 a2 | b0 b1 | c0 c1``): forward packs ``[a0 a1 a2 b0] [b1 c0 c1]``; the first cut is
inside ``b``, so nothing runs backward then; at the end both packs run backward, newest first:
``[c1 c0 b1] [b0 a2 a1 a0]``.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slimdata.execution.cp import gathered_tokens, member_rows
from slimdata.execution.memory import gathered_kv_held
from slimdata.solver.common import BatchView
from slimdata.solver.micropack import RankPacks

__all__ = ["documents_alone", "longest_backward_last", "pack_rank_by_runs"]


def pack_rank_by_runs(
    view: BatchView,
    docs: Sequence[int],
    merge_slices: Sequence[int] = (),
    *,
    cap: int,
    mem: float,
    cp: int = 1,
) -> RankPacks | None:
    """``pack_rank(view, [view.slices_of(d) for d in docs], merge_slices, cap=cap, mem=mem,
    cp=cp)``: the same packs and peak, for distinct whole documents ``docs``. ``None`` where
    ``pack_rank`` is needed instead: a document listed twice, no slice, or a slice that does
    not fit the caps (``pack_rank`` then says so)."""
    run = _FreeRun.of(view, np.asarray(docs, dtype=np.int64), merge_slices, cap, cp)
    if run is None:
        return None
    s = 0
    while s < run.n:
        s = run.forward_until_cut(s, cap, mem)
        if s < 0:
            return None
    return RankPacks(run.forward, run.backward, (0, 0) if run.head else None, run.peak)


def documents_alone(view: BatchView, cp: int = 1) -> np.ndarray:
    """Bytes each document of ``view`` needs alone on a rank of ``cp`` devices (together, as
    :attr:`~slimdata.solver.layout.Layout.memory_bytes`) by :func:`pack_rank`'s rule: all its
    activations and K/V (``view.doc_mem``); under static CP also ``cp`` times the gathered
    K/V its last pack's backward holds on a device, its call reading every slice of the
    document (:func:`~slimdata.execution.cp.cp_gather`). A 4,096-token document in 1,024-token
    slices at ``cp = 2``: 4 x 512 rows per member, 4,096 tokens gathered."""
    if cp == 1:
        return view.doc_mem
    key = ("freepack.alone", cp)
    if key not in view.memo:
        rows = np.concatenate(([[0] * cp], np.cumsum(member_rows(view.tokens, cp), axis=0)))
        tokens = gathered_tokens(cp, (rows[view.off[1:]] - rows[view.off[:-1]]).max(axis=1))
        held = gathered_kv_held(view.gathered_kv_per_token, tokens, "B")
        view.memo[key] = view.doc_mem + cp * held
    return view.memo[key]


@dataclass(frozen=True)
class _SliceBytes:
    """Per slice of a batch, what :func:`pack_rank` adds up (as it does, one slice after
    another from 0): ``ext`` the bytes its forward adds (activations + K/V); at a document's
    first slice, ``doc_kv`` the document's K/V bytes (released with that slice's backward) and
    ``usum`` its summed ``ext`` (0 elsewhere)."""

    ext: np.ndarray
    doc_kv: np.ndarray
    usum: np.ndarray
    tok: np.ndarray

    @classmethod
    def of(cls, view: BatchView) -> _SliceBytes:
        key = "freepack.bytes"
        if key not in view.memo:
            tok = view.end - view.start
            kv = view.kv_per_token * tok
            ext = view.act + kv
            doc_kv, usum = np.zeros(len(tok)), np.zeros(len(tok))
            heads, counts = view.off[:-1], np.diff(view.off)
            one = heads[counts == 1]
            doc_kv[one], usum[one] = kv[one], ext[one]
            kvl, extl = kv.tolist(), ext.tolist()
            for a, k in zip(heads[counts > 1].tolist(), counts[counts > 1].tolist(), strict=True):
                doc_kv[a] = sum(kvl[a : a + k], 0.0)
                usum[a] = sum(extl[a : a + k])
            view.memo[key] = cls(ext, doc_kv, usum, tok)
        return view.memo[key]


class _FreeRun:
    """One rank's slice stream (its documents' slices in order) as arrays, and the state of
    :func:`pack_rank_by_runs`: the bytes held, the packs so far."""

    def __init__(
        self,
        view: BatchView,
        idx: np.ndarray,
        starts: np.ndarray,
        lens: np.ndarray,
        cp: int = 1,
    ):
        b = _SliceBytes.of(view)
        self.order, self.n = idx.tolist(), len(idx)
        self.tok, self.ext, self.usum = b.tok[idx], b.ext[idx], b.usum[idx]
        self.act, self.doc_kv = view.act[idx].tolist(), b.doc_kv[idx].tolist()
        self.is_head = np.zeros(self.n, dtype=bool)
        self.is_head[starts] = True
        self.unit_head = np.repeat(starts, lens)  # stream position of each slice's first slice
        self.docl = view.lists[4]
        self.held = 0.0
        self.peak = 0.0
        self.forward: list[list[int]] = []
        self.backward: list[list[int]] = []
        self.pack_start: list[int] = []  # stream position of each forward pack's first slice
        self.head = 0  # 1 with a merge share: forward and backward pack 0
        self.unioned = 0
        self.cp, self.gkv = cp, view.gathered_kv_per_token
        self.rows = np.zeros((0, cp), dtype=np.int64)
        self.alone = np.zeros(0)
        if cp > 1:
            # static CP: each member's rows of the stream's slices summed from the start
            # (rows[j]: those before stream position j), and each document's own buffer
            rows = member_rows(self.tok, cp)
            self.rows = np.concatenate((np.zeros((1, cp), dtype=np.int64), np.cumsum(rows, 0)))
            self.alone = np.zeros(self.n)
            ends = starts + lens
            self.alone[starts] = self.buffer(self.rows[ends] - self.rows[starts])

    def buffer(self, rows: np.ndarray) -> np.ndarray:
        """:meth:`pack_rank`'s static-CP buffer of calls whose members hold ``rows`` (one
        call a row): a device's gathered K/V in the backward, times ``cp``."""
        tokens = gathered_tokens(self.cp, rows.max(axis=1))
        return self.cp * gathered_kv_held(self.gkv, tokens, "B")

    @classmethod
    def of(
        cls, view: BatchView, docs: np.ndarray, merge: Sequence[int], cap: int, cp: int = 1
    ) -> _FreeRun | None:
        """The run of ``docs`` (``None`` if one is listed twice, none has a slice or a slice
        exceeds ``cap``), its merge share as forward and backward pack 0."""
        lens = view.off[docs + 1] - view.off[docs]
        docs, lens = docs[lens > 0], lens[lens > 0]
        if not len(docs) or len(np.unique(docs)) != len(docs):
            return None
        starts = np.cumsum(lens) - lens
        # slices of documents laid end to end: off 0 3 5 and docs (1, 0) -> 3 4 0 1 2
        idx = np.repeat(view.off[docs] - starts, lens) + np.arange(int(lens.sum()))
        run = cls(view, idx, starts, lens, cp)
        if int(run.tok.max()) > cap:
            return None
        if len(merge):
            run.forward.append(list(merge))
            run.backward.append(list(merge))
            run.head = run.unioned = 1
        return run

    def forward_until_cut(self, s: int, cap: int, mem: float) -> int:
        """Forward the open pack from stream position ``s`` (the pack is empty there) up to
        the first slice that closes it: above the token cap, above the memory cap, or a
        document's first slice whose document does not fit beside what is held; close it and
        run the backward it allows. Returns where the next pack starts (``-1``: slice ``s``
        does not fit beside what is held even now)."""
        held = np.add.accumulate(np.concatenate(([self.held], self.ext[s:])))
        # held[j]: bytes held before slice s + j; held[j + 1]: after it
        need = held[1:]
        beside = held[:-1] + self.usum[s:]  # at a document's first slice: it all beside
        if self.cp > 1:  # the pack's call gathers from the first slice of s's document on
            need = need + self.buffer(self.rows[s + 1 :] - self.rows[self.unit_head[s]])
            beside = beside + self.alone[s:]
        over = need > mem
        if over[0]:
            return -1
        close = over | (np.cumsum(self.tok[s:]) > cap)
        close |= self.is_head[s:] & (beside > mem)
        close[0] = False
        j = int(close.argmax()) if close.any() else self.n - s
        self.peak = max(self.peak, float(need[:j].max()))
        self.held = float(held[j])
        end = s + j
        self.pack_start.append(s)
        self.forward.append(self.order[s:end])
        open_pack = None
        if end < self.n and not self.is_head[end]:  # the cut is inside a document
            head = int(self.unit_head[end])
            open_pack = self.head + bisect.bisect_right(self.pack_start, head) - 1
        self.union_backward(open_pack)
        return end

    def union_backward(self, open_pack: int | None) -> None:
        """``pack_rank``'s rule: every forward pack before the latest clean cut (no document
        on both sides) at or before ``open_pack`` (the pack of the open document's first
        slice; ``None``: no document is open) runs its backward, newest first, each as one
        backward pack; their activations are released, and a document's K/V with its first
        slice."""
        F, docl, head = self.forward, self.docl, self.head
        stop = len(F)
        if open_pack is not None:
            stop = open_pack
            while stop > self.unioned and docl[F[stop][0]] == docl[F[stop - 1][-1]]:
                stop -= 1
        if stop <= self.unioned:
            return
        for k in range(stop - 1, self.unioned - 1, -1):
            self.backward.append(F[k][::-1])
        first = self.pack_start[self.unioned - head]
        last = self.pack_start[stop - 1 - head] + len(F[stop - 1])
        held, act, doc_kv = self.held, self.act, self.doc_kv
        for p in range(last - 1, first - 1, -1):  # the order pack_rank takes them back in
            held -= act[p]
            if doc_kv[p]:
                held -= doc_kv[p]
        self.held = held
        self.unioned = stop


def longest_backward_last(view: BatchView, packs: RankPacks) -> RankPacks:
    """``packs`` (free mode's: every backward pack one forward pack's slices) with the segment
    whose backward takes longest moved to the end.

    A segment is a run of forward packs that no document crosses out of, with their backward
    packs. In the eager order (:func:`~slimdata.plan.types.eager_order`) a segment's backward
    packs run right after its last forward, releasing all it holds, so segments run in any
    order at the same peak. DDP's gradient all-reduce streams out during the last backward
    pack and is exposed for whatever of it that backward does not cover
    (:func:`slimdata.sim.dag._gradient_all_reduce`): the longest backward last covers most.
    A merge member's segment of pack 0 stays first: its group meets there.

    Example: forward packs ``[a] [b0] [b1 c]`` (document ``b`` cut after ``b0``), backward
    ``[a] [c b1] [b0]``, backward seconds ``a: 5``, ``b: 2``, ``c: 1``: the segments are
    ``[a]`` (5 s) and ``[b0] [b1 c]`` (3 s); ``[a]`` goes last.
    """
    segments = _segments(view, packs)
    head = 1 if packs.merge_pack is not None else 0
    rest = segments[head:]
    if len(rest) < 2:
        return packs
    at = view.lists[2].__getitem__  # backward seconds of a slice
    seconds = [sum(sum(map(at, packs.backward[j])) for j in bs) for _fs, bs in rest]
    k = max(range(len(rest)), key=lambda i: (seconds[i], i))  # on a tie, the later stays
    if k == len(rest) - 1:
        return packs
    order = [*segments[:head], *rest[:k], *rest[k + 1 :], rest[k]]
    fwd_ids = [i for fs, _bs in order for i in fs]
    bwd_ids = [j for _fs, bs in order for j in bs]

    def pick(items: list | None, ids: list[int]) -> list | None:
        return None if items is None else [items[i] for i in ids]

    return RankPacks(
        pick(packs.forward, fwd_ids),  # type: ignore[arg-type]
        pick(packs.backward, bwd_ids),  # type: ignore[arg-type]
        packs.merge_pack,
        packs.peak,
        pick(packs.forward_cost, fwd_ids),
        pick(packs.backward_cost, bwd_ids),
    )


def _segments(view: BatchView, packs: RankPacks) -> list[tuple[list[int], list[int]]]:
    """``packs``' segments in order (:func:`longest_backward_last`), each as its forward and
    backward pack indices; one segment of everything unless every backward pack holds one
    forward pack's slices. A document's slices are consecutive in free mode's forward stream,
    so a document crosses out of forward pack ``i`` exactly when it ends ``i`` and starts
    ``i + 1``."""
    F, doc_of = packs.forward, view.lists[4]
    # a backward pack starts at its forward pack's last slice (a merge share's at its first)
    start = {p[-1]: i for i, p in enumerate(F) if p}
    if packs.merge_pack is not None and F[0]:
        start[F[0][0]] = 0
    mirror = [start.get(b[0], -1) if b else -1 for b in packs.backward]
    if any(
        i < 0 or (F[i][::-1] != b and sorted(F[i]) != sorted(b))
        for i, b in zip(mirror, packs.backward, strict=True)
    ):
        return [(list(range(len(F))), list(range(len(packs.backward))))]
    out: list[tuple[list[int], list[int]]] = []
    segment_of = []
    for i, p in enumerate(F):
        if i == 0 or not p or not F[i - 1] or doc_of[F[i - 1][-1]] != doc_of[p[0]]:
            out.append(([], []))
        out[-1][0].append(i)
        segment_of.append(len(out) - 1)
    for j, i in enumerate(mirror):
        out[segment_of[i]][1].append(j)
    return out

"""Phase 2 of SlimPack: asymmetric MicroPacks on one rank.

Input: the rank's documents in execution order (each a run of slice indices) and, for a
DP-Merge member, the slices of its merge share. Output: forward packs balanced on *forward*
cost and backward packs balanced on *backward* cost, under the token cap and the memory cap
(:mod:`slimdata.solver.memory`), obeying design §4:

- forward packs take the slice stream in order (rule 1), cut where the token cap, the memory
  cap or (lockstep) the next forward-cost quantile is reached;
- after forward pack ``i`` closes, backward work may run on every document whose forwards are
  all done (rule 3), slices taken from each document's end backwards (rule 2). In *free* mode
  (:func:`pack_rank`; DDP: only the rank's total time matters) the backward packs are the forward packs
  themselves, newest first, as soon as no document spans the cut behind them: a backward pack
  that is not a union of forward packs makes the executor split forward packs into more calls
  or recompute them (:func:`slimdata.plan.execution`), and free mode has no cross-rank balance
  to buy with it.
  A document that does not fit the memory cap beside what the rank holds starts a new forward
  pack after such a clean cut, which frees everything before it. In *lockstep* mode
  (:func:`pack_rank_lockstep`) backward pack ``i`` stops at the ``(i+1)/m`` quantile of the rank's backward cost, so backward packs
  are balanced on backward cost independently of the forward cuts (the pipeline and FSDP
  advance pack by pack, so pack ``i`` must cost alike on every rank);
- a merge member runs its merge share first, as forward pack 0 and backward pack 0 (the same
  index on every member, so the group meets in lockstep and in free mode alike).

Example (lockstep, m=2, no lag, one 4-slice document with forward costs 1,1,1,1 and backward costs
2,2,2,4): F0=[s0,s1], F1=[s2,s3]; nothing is ready after F0, so B0 is empty and B1 holds
[s3,s2,s1,s0]. With two 2-slice documents, F0 completes the first and B0 runs it.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from slimdata.execution.cp import gathered_tokens, member_rows
from slimdata.execution.memory import gathered_kv_held
from slimdata.solver.common import BatchView
from slimdata.solver.merge import member_peak

__all__ = ["LockstepWork", "RankDocs", "RankPacks", "pack_rank", "pack_rank_lockstep"]


@dataclass
class RankPacks:
    forward: list[list[int]]
    backward: list[list[int]]
    merge_pack: tuple[int, int] | None
    peak: float
    forward_cost: list[float] | None = None
    """Per forward pack: its slices' forward seconds summed in pack order, where the packer
    has them at hand (``None``: not given)."""
    backward_cost: list[float] | None = None
    whole: bool = False
    """Packed by :meth:`LockstepWork.pack_whole` (documents kept whole)."""


def pack_rank(
    view: BatchView,
    units: Sequence[Sequence[int] | range],
    merge_slices: Sequence[int] = (),
    *,
    cap: int,
    mem: float,
    cp: int = 1,
) -> RankPacks | None:
    """Free-mode packing of one rank (see the module docstring): forward packs take the slice
    stream in order, cut by the token and memory caps; after every cut, the forward packs
    behind the latest clean cut run their backward, newest first, each as one backward pack.

    Under static CP (``cp > 1``; ``mem`` is the rank's ``cp`` devices' budget together, as
    :attr:`~slimdata.solver.layout.Layout.memory_bytes`) every pack is one model call whose
    backward holds its gathered K/V on every device
    (:func:`~slimdata.execution.memory.gathered_kv_held` of its
    :func:`~slimdata.execution.cp.cp_gather` tokens: the pack's slices and their documents'
    earlier slices): a device holds ``1 / cp`` of the rank's bytes and that buffer whole, so
    the check is ``held + cp * buffer <= mem`` at every slice, and a document starts a new
    pack when it does not fit beside what is held with its own buffer. Every pack forwarded
    after a pack runs its backward before it, so a pack's backward holds what its forward
    held: the check is the execution model's up to the assembled plan's fused slices (a run
    of a document's slices pads its chunks as one slice) and this packer's K/V held until a
    document's first slice runs backward (the execution model frees each slice's with its
    own pack); the planner reads the assembled plan off the execution model
    (:func:`~slimdata.solver.strategies.slimpack.slimpack`).

    Returns ``None`` when one document alone exceeds the memory cap (or a slice the token cap).
    Lockstep packing is :func:`pack_rank_lockstep`.
    """
    rank = _FreeRank(view, merge_slices, cap, mem, cp)
    for u in units:
        if len(u) and not rank.forward_document(u):
            return None
    return rank.finish()


class _FreeRank:
    """The state of :func:`pack_rank` on one rank, and its steps."""

    __slots__ = (
        "B",
        "F",
        "act",
        "call_rows",
        "cap",
        "cp",
        "cur",
        "cur_tok",
        "doc_kv",
        "doc_left",
        "docl",
        "gkv",
        "held",
        "kvp",
        "mem",
        "merge_pack",
        "peak",
        "ready",
        "tok",
        "unioned",
    )

    def __init__(
        self, view: BatchView, merge_slices: Sequence[int], cap: int, mem: float, cp: int = 1
    ):
        self.tok, _fwd, _bwd, self.act, self.docl = view.lists
        self.kvp = view.kv_per_token
        self.gkv = view.gathered_kv_per_token
        self.cap = cap
        self.mem = mem
        self.cp = cp
        self.call_rows = [0] * cp  # static CP: each member's rows the open pack's call gathers
        self.F: list[list[int]] = []
        self.B: list[list[int]] = []
        self.merge_pack: tuple[int, int] | None = None
        if len(merge_slices):  # the merge share runs first: forward and backward pack 0
            self.F.append(list(merge_slices))
            self.B.append(list(merge_slices))
            self.merge_pack = (0, 0)
        self.ready: dict[int, list[int]] = {}  # completed documents: slices not backwarded
        self.held = 0.0  # activation + K/V bytes held now
        self.doc_kv: dict[int, float] = {}
        self.doc_left: dict[int, int] = {}
        self.peak = 0.0
        self.cur: list[int] = []  # the open forward pack (it becomes F[len(F)])
        self.cur_tok = 0
        self.unioned = len(self.F)  # forward packs before this one have run their backward

    def forward_document(self, u: Sequence[int] | range) -> bool:
        """Forward document ``u``'s slices in order into the open pack, closing it first at the
        token cap, at the memory cap, or before ``u`` when ``u`` does not fit beside what is
        held (the clean cut frees everything before it). ``False`` when a slice does not fit
        the caps even in a pack of its own."""
        tok, act, kvp, cap, mem = self.tok, self.act, self.kvp, self.cap, self.mem
        first = u[0]
        d = self.docl[first]
        self.doc_left[d] = len(u)
        self.doc_kv[d] = 0.0
        head_pack = -1  # forward pack of u's first slice
        cp = self.cp
        rows = member_rows([tok[i] for i in u], cp).tolist() if cp > 1 else []
        doc_rows = [0] * cp  # u's rows so far: the prefix a pack opened inside u gathers
        alone = self.buffer(np.sum(rows, axis=0).tolist()) if cp > 1 else 0.0
        clean = self.held + sum(act[i] + kvp * tok[i] for i in u) + alone > mem
        for k, i in enumerate(u):
            extra = act[i] + kvp * tok[i]
            buf = self.buffer(self.call_rows, rows[k]) if cp > 1 else 0.0
            if self.cur and (
                self.cur_tok + tok[i] > cap
                or self.held + extra + buf > mem
                or (clean and i == first)
            ):
                self.close_forward(None if i == first else head_pack)
                if cp > 1:
                    self.call_rows = list(doc_rows)
                    buf = self.buffer(self.call_rows, rows[k])
            if self.held + extra + buf > mem or tok[i] > cap:
                return False
            if i == first:
                head_pack = len(self.F)
            self.cur.append(i)
            self.cur_tok += tok[i]
            self.held += extra
            self.doc_kv[d] += kvp * tok[i]
            self.peak = max(self.peak, self.held + buf)
            if cp > 1:
                self.call_rows = [a + b for a, b in zip(self.call_rows, rows[k], strict=True)]
                doc_rows = [a + b for a, b in zip(doc_rows, rows[k], strict=True)]
        self.ready[d] = list(u)
        return True

    def buffer(self, rows: Sequence[int], more: Sequence[int] = ()) -> float:
        """Static CP: the gathered K/V a device holds while a call of members' ``rows`` (plus
        ``more``) runs its backward, times ``cp`` (the rank's bytes: ``mem`` is its ``cp``
        devices' budget together)."""
        if len(more):
            rows = [a + b for a, b in zip(rows, more, strict=True)]
        tokens = gathered_tokens(self.cp, max(rows))
        return self.cp * gathered_kv_held(self.gkv, tokens, "B")

    def close_forward(self, open_pack: int | None) -> None:
        """Close the open forward pack and run the backward it makes possible
        (:meth:`union_backward`)."""
        self.F.append(self.cur)
        self.cur, self.cur_tok = [], 0
        self.union_backward(open_pack)

    def union_backward(self, open_pack: int | None) -> None:
        """Every forward pack before the latest clean cut (no document on both sides) at or
        before ``open_pack`` (the pack holding the open document's head; ``None``: no document
        is open) runs its backward, newest first, each as one backward pack: a union of
        forward packs, so the executor recomputes nothing."""
        F = self.F
        docl = self.docl
        stop = len(F)
        if open_pack is not None:
            stop = open_pack
            while stop > self.unioned and docl[F[stop][0]] == docl[F[stop - 1][-1]]:
                stop -= 1
        for k in range(stop - 1, self.unioned - 1, -1):
            self.B.append(F[k][::-1])
            for i in self.B[-1]:
                self.take(i)
        self.unioned = max(self.unioned, stop)

    def take(self, i: int) -> None:
        """Backward slice ``i`` (the last of its document not yet backwarded)."""
        d = self.docl[i]
        doc_slices = self.ready[d]
        assert doc_slices[-1] == i, "backward must run from a document's end (rule 2)"
        doc_slices.pop()
        if not doc_slices:
            del self.ready[d]
        self.held -= self.act[i]
        self.doc_left[d] -= 1
        if self.doc_left[d] == 0:
            self.held -= self.doc_kv.pop(d)

    def finish(self) -> RankPacks | None:
        """Close the last forward pack; every slice has then run its backward."""
        if self.cur:
            self.close_forward(None)
        if self.ready:  # pragma: no cover - every close drains what it can
            raise AssertionError("free mode left slices without a backward pack")
        if self.peak > self.mem:  # pragma: no cover - guarded in forward_document
            return None
        return RankPacks(self.F, self.B, self.merge_pack, self.peak)


def pack_rank_lockstep(
    view: BatchView,
    units: Sequence[Sequence[int] | range],
    merge_slices: Sequence[int] = (),
    *,
    cap: int,
    mem: float,
    m: int,
    lag: int = 0,
    pp: int = 1,
    layer_share: float = 1.0,
    merge_kv: float = 0.0,
    kv_per_slice: bool = False,
) -> RankPacks | None:
    """Lockstep packing of one rank into exactly ``m`` forward and ``m`` backward packs, run in
    the order :func:`~slimdata.solver.common.interleaved_order` ``(m, m, lag)``:
    ``F0 .. F(lag) B0 F(lag+1) B1 ...``.

    Forward packs cut the slice stream at its forward-cost quantiles (and the token and memory
    caps); backward pack ``j`` runs after forward pack ``j + lag`` and takes, from the end of
    every document completed by then (oldest first), backward work up to the ``(j+1)/m``
    quantile of the rank's backward cost, so backward packs are balanced on backward cost. A
    lag of ``L`` packs lets a document spanning up to ``L + 1`` forward packs feed the backward
    packs in time, at the price of holding ``L`` packs more activations. Documents longer than
    one pack's forward share go first (they then start at a pack boundary), the rest keep their
    order. A merge member runs its merge share as pack 0. Returns ``None`` when the caps do not
    fit ``m`` packs.

    Memory with ``pp`` pipeline stages (the accounting of :mod:`slimdata.sim.memory` under
    1F1B): a stage holds ``layer_share`` of every byte (its share of the layers; the first
    stage's is the largest), and stage ``s`` runs every backward pack ``pp - 1 - s`` forward
    packs later than the plan order, so the first stage holds the slices of the last
    ``pp - 1`` backward packs the plan has already run, on top of what the plan order holds
    (``lag + pp`` packs in flight). A merge member's first stage also holds one layer's gathered
    K/V of its group's documents (``merge_kv`` bytes, expressed in full-model bytes like
    ``mem``) while its merge forward pack runs, twice that while its merge backward pack runs. The check is
    ``layer_share * held <= mem`` on the first stage at every forward slice and merge pack;
    ``pp=1, layer_share=1, merge_kv=0`` is the single-device rule of
    :mod:`slimdata.solver.memory`. ``kv_per_slice``: a slice's K/V is freed with its
    backward (the simulator's per-slice rule: backward runs from a document's end, so a
    backwarded slice's keys and values are no longer read) instead of when the document's last
    slice is backwarded (:mod:`slimdata.solver.memory`'s rule, the default).
    ``RankPacks.peak`` is the first stage's peak (bytes).
    """
    work = LockstepWork.of(view, units, merge_slices, m)
    return work.pack(
        cap=cap,
        mem=mem,
        lag=lag,
        pp=pp,
        layer_share=layer_share,
        merge_kv=merge_kv,
        kv_per_slice=kv_per_slice,
    )


@dataclass(frozen=True, eq=False)
class LockstepWork:
    """What :func:`pack_rank_lockstep` derives from one rank's documents and pack count alone,
    before any lag or cap: computed once per rank and pack count and packed at every lag the
    planner tries (:meth:`pack`)."""

    view: BatchView
    stream: list[Sequence[int] | range]
    """The rank's non-empty documents, long ones first (:meth:`RankDocs._long_documents_first`)."""
    merge_slices: Sequence[int]
    m: int
    total_f: float
    """Forward seconds of the rank's documents (merge share apart)."""
    total_b: float
    merge_bytes: float
    """Bytes the merge share holds (:func:`~slimdata.solver.merge.member_peak`); 0 without."""
    merge_tokens: int
    bytes: float
    """Activation and K/V bytes of all the rank's slices (merge share apart): the most its
    documents hold at once."""
    _forward: dict[int, _Forward | None] = field(default_factory=dict, repr=False)
    """Per token cap: the forward packs where memory cannot bind (:meth:`_forward_at`)."""
    _unbound: dict[int, tuple[RankPacks | None, list[int]]] = field(
        default_factory=dict, repr=False
    )
    """Per token cap: the packs where neither memory nor the lag binds, and where each
    backward pack ends (:meth:`_backward_at`)."""

    @classmethod
    def of(
        cls,
        view: BatchView,
        units: Sequence[Sequence[int] | range],
        merge_slices: Sequence[int],
        m: int,
    ) -> LockstepWork:
        return RankDocs.of(view, units, merge_slices).work(m)

    def pack(
        self,
        *,
        cap: int,
        mem: float,
        lag: int = 0,
        pp: int = 1,
        layer_share: float = 1.0,
        merge_kv: float = 0.0,
        kv_per_slice: bool = False,
        peak: bool = True,
    ) -> RankPacks | None:
        """:func:`pack_rank_lockstep` of this rank at ``lag`` under these caps. ``peak=False``:
        the caller reads no ``RankPacks.peak`` (it is then ``nan``), which lets a rank whose
        bytes all together fit ``mem`` skip the memory walk: its forward packs are then the
        same at every lag, packed once (:meth:`_forward_at`), and only its backward packs are
        packed per lag (:meth:`_backward_at`), with the same packs as the walk."""
        if self.stream and self.m - (1 if len(self.merge_slices) else 0) < 1:
            return None  # no pack left for the documents
        bound = self.merge_bytes + 2 * merge_kv + self.bytes
        if not peak and bound * (1 + 1e-9) <= mem / layer_share:  # memory cannot bind
            fwd = self._forward_at(cap)
            if fwd is not None:
                return self._backward_at(fwd, cap, lag)
        rank = _LockstepRank(self, cap, mem / layer_share, lag, pp, merge_kv, kv_per_slice)
        if rank.base and not rank.run_merge_forward():
            return None
        if not rank.forward_documents(self.stream):
            return None
        return rank.finish(layer_share)

    @cached_property
    def whole_units(self) -> _WholeUnits:
        """The rank's documents by decreasing tokens (ties in stream order) with their tokens
        and seconds run whole (:meth:`pack_whole`'s items)."""
        view = self.view
        docl = view.lists[4]
        docs = np.array([docl[u[0]] for u in self.stream], dtype=np.int64)
        docs = docs[np.argsort(-view.doc_len[docs], kind="stable")]
        return _WholeUnits(
            [view.ranges[d] for d in docs.tolist()],
            view.doc_len[docs].tolist(),
            view.doc_fwd[docs].tolist(),
            view.doc_bwd[docs].tolist(),
        )

    def pack_whole(
        self,
        m: int,
        *,
        cap: int,
        mem: float,
        pp: int = 1,
        layer_share: float = 1.0,
        merge_kv: float = 0.0,
    ) -> RankPacks | None:
        """The rank's documents kept whole in ``m`` packs (the merge share's first), each
        backward pack its forward pack's slices, at backward lag 0: the documents, most
        tokens first, each to the pack with the least forward-plus-backward seconds if it
        fits there under the token cap, else to the one with the fewest tokens (WLB-LLM's
        Alg. 1 over one rank's packs); packs by decreasing seconds. Where the forward-cost
        quantile cuts of :meth:`pack` run out of packs (cheap documents need more tokens per
        pack than the cap holds), this fills the same count; whole documents also pay each
        slice's fixed costs once. Pack seconds are the documents' run whole (their slices
        fused, as the plan runs them; the merge share's, its slices').

        Memory (:meth:`pack`'s rule at lag 0, where every pack's backward frees all it
        holds): the first stage holds at most ``pp`` packs at once (each backward runs
        ``pp - 1`` packs late there), so the ``pp`` largest packs' bytes, with a merge
        member's share and twice its gathered K/V, must fit ``mem``. ``None`` when they do
        not, when a document fits no pack, or when a pack stays empty (fewer packs hold the
        same documents). ``peak`` is that bound.

        Example (``m = 2``, cap 8, documents of 6, 4 and 3 tokens costing 6, 3, 2): 6 to
        pack 0; 4 to pack 1 (least seconds); 3 to pack 1 (pack 0 would hold 6 + 3 > 8):
        packs ``[6], [4, 3]``."""
        base = 1 if len(self.merge_slices) else 0
        items = self.whole_units
        tokens, n = items.tokens, m - base
        if n < 1 or len(tokens) < n or (tokens and (tokens[0] > cap or sum(tokens) > n * cap)):
            return None
        by_load = [(0.0, j) for j in range(n)]  # a heap of (seconds, pack)
        held = [0] * n
        bins: list[list[int]] = [[] for _ in range(n)]
        for k, (t, f, b) in enumerate(zip(tokens, items.fwd, items.bwd, strict=True)):
            load, j = by_load[0]
            if held[j] + t <= cap:
                heapq.heapreplace(by_load, (load + f + b, j))
            else:
                j = min(range(n), key=held.__getitem__)
                if held[j] + t > cap:
                    return None
                at = next(i for i, (_w, p) in enumerate(by_load) if p == j)
                by_load[at] = (by_load[at][0] + f + b, j)
                heapq.heapify(by_load)
            bins[j].append(k)
            held[j] += t
        if not all(bins):
            return None
        order = [j for _load, j in sorted(by_load, key=lambda x: (-x[0], x[1]))]
        return self._whole_packs([bins[j] for j in order], mem, pp, layer_share, merge_kv)

    def pack_documents(
        self,
        bins: Sequence[Sequence[int]],
        *,
        mem: float,
        pp: int = 1,
        layer_share: float = 1.0,
    ) -> RankPacks | None:
        """The rank's documents kept whole in the packs ``bins`` (document indices, each of
        the rank's documents in one), in that order, as :meth:`pack_whole` keeps them, for a
        rank without a merge share; ``None`` when they do not fit ``mem`` by its rule."""
        docl = self.view.lists[4]
        at = {docl[u[0]]: k for k, u in enumerate(self.whole_units.units)}
        return self._whole_packs([[at[d] for d in b] for b in bins], mem, pp, layer_share, 0.0)

    def _whole_packs(
        self, bins: list[list[int]], mem: float, pp: int, layer_share: float, merge_kv: float
    ) -> RankPacks | None:
        """:meth:`pack_whole`'s packs of ``bins`` (indices into :attr:`whole_units`), if
        they fit."""
        items = self.whole_units
        _tok, fwd, bwd, _act, _doc = self.view.lists
        extra = self.view.packing_lists[0]
        most = sorted(
            (sum(extra[i] for k in b for i in items.units[k]) for b in bins), reverse=True
        )
        peak = self.merge_bytes + 2 * merge_kv + sum(most[:pp])
        if peak > mem / layer_share:
            return None
        merge = list(self.merge_slices)
        head = [merge] if merge else []
        f_head = [sum(map(fwd.__getitem__, merge))] if merge else []
        b_head = [sum(map(bwd.__getitem__, merge))] if merge else []
        return RankPacks(
            head + [[i for k in b for i in items.units[k]] for b in bins],
            head + [[i for k in b for i in reversed(items.units[k])] for b in bins],
            (0, 0) if merge else None,
            peak * layer_share,
            f_head + [sum(items.fwd[k] for k in b) for b in bins],
            b_head + [sum(items.bwd[k] for k in b) for b in bins],
            whole=True,
        )

    def _forward_at(self, cap: int) -> _Forward | None:
        """The forward packs of :meth:`pack` where memory never binds (they then depend on the
        token cap and the forward-cost quantiles alone, not on the lag); ``None`` when the
        token cap does not fit ``m`` packs. Cached per cap."""
        if cap not in self._forward:
            self._forward[cap] = _Forward.pack(self, cap)
        return self._forward[cap]

    def _backward_at(self, fwd: _Forward, cap: int, lag: int) -> RankPacks | None:
        """The packs of :meth:`pack` at ``lag`` when memory never binds (:meth:`_backward_walk`).

        From lag 1 on, a backward pack is cut short by its lag only when the water-filling
        target (or the token cap) would have it take slices of documents not yet complete;
        usually none is: then the packs are those of a lag that never binds (lag ``m``, every
        document complete), packed once per cap and handed out for every such lag. At lag 1
        and up, pack ``k`` may take the slices before ``fwd.avail[k + lag]`` (``k < m -
        lag``); when the unbound pack ends there or before, the walk at ``lag`` takes the
        same slices, pack after pack, and refuses alike."""
        if lag >= 1:
            if cap not in self._unbound:
                self._unbound[cap] = self._backward_walk(fwd, cap, self.m)
            packs, ends = self._unbound[cap]
            avail = fwd.avail
            if all(ends[k] <= avail[k + lag] for k in range(fwd.base, self.m - lag)):
                return packs
        return self._backward_walk(fwd, cap, lag)[0]

    def _backward_walk(
        self, fwd: _Forward, cap: int, lag: int
    ) -> tuple[RankPacks | None, list[int]]:
        """The packs of :meth:`pack` at ``lag`` when memory never binds: backward pack ``j``
        runs after forward pack ``j + lag`` closes (the merge share's first), each taking the
        backward work of completed documents (oldest first, from each end) up to the
        water-filling target, the last of the packs left taking everything; the same float
        operations in the same order as :meth:`_LockstepRank.emit_backward`. Also returns
        where each backward pack ends in ``fwd.seq`` (0 for the merge share's)."""
        tok, bwd = self.view.lists[0], self.view.lists[2]
        half_b = self.view.packing_lists[3]
        seq, avail, base, m = fwd.seq, fwd.avail, fwd.base, self.m
        rest, total_b, end = m - base, self.total_b, len(fwd.seq)
        over = self.merge_tokens > cap
        B: list[list[int]] = [list(self.merge_slices)] if base else []
        costs = [sum(map(bwd.__getitem__, self.merge_slices))] if base else []
        cum_b, pos = 0.0, 0
        ends = [0] * len(B)
        # emissions: one after each forward close c >= lag, then the ones left (last: final)
        for k in range(len(B), m):
            limit = avail[k + lag] if k + lag < m else end
            if pos >= limit:  # nothing completed to take: an empty pack
                B.append([])
                costs.append(0.0)
                ends.append(pos)
                continue
            final = k >= m - lag and k == m - 1
            target = math.inf if final else cum_b + (total_b - cum_b) / (rest - (k - base))
            pack: list[int] = []
            pack_tok, pack_b = 0, 0.0
            while pos < limit:
                i = seq[pos]
                t = tok[i]
                if pack and (cum_b + half_b[i] > target or pack_tok + t > cap):
                    break
                b = bwd[i]
                pack.append(i)
                pack_tok += t
                cum_b += b
                pack_b += b
                pos += 1
            B.append(pack)
            costs.append(pack_b)
            ends.append(pos)
            over = over or pack_tok > cap
        if over or pos < end:
            return None, ends
        # the forward lists are shared by every lag's packs (read-only)
        merge_pack = (0, 0) if base else None
        return RankPacks(fwd.packs, B, merge_pack, math.nan, fwd.costs, costs), ends


@dataclass(frozen=True)
class _Forward:
    """One rank's lockstep forward packs where memory never binds, and what its backward
    packs at any lag read: the order backward work is taken in and how much of it each
    forward close has completed."""

    packs: list[list[int]]
    """All ``m`` forward packs (the merge share's first)."""
    base: int
    """1 for a merge member (its share is pack 0), else 0."""
    seq: list[int]
    """Slices in the order backward packs take them: documents oldest first, each from its
    end (``[[0, 1], [2]]`` -> ``1 0 2``)."""
    avail: list[int]
    """Per forward pack ``c``: slices of ``seq`` whose documents are complete when ``c``
    closes."""
    costs: list[float]
    """Per forward pack: its forward seconds (summed in pack order)."""

    @staticmethod
    def pack(work: LockstepWork, cap: int) -> _Forward | None:
        """:meth:`_LockstepRank.forward_documents` and ``finish`` without the memory cap:
        the same cuts at the token cap and the forward-cost quantiles; ``None`` when they do
        not fit ``m`` packs."""
        tok, fwd = work.view.lists[0], work.view.lists[1]
        half_f = work.view.packing_lists[2]
        base = 1 if len(work.merge_slices) else 0
        rest, total_f, m = work.m - base, work.total_f, work.m
        F: list[list[int]] = [list(work.merge_slices)] if base else []
        done: list[int] = []  # per document: the forward pack of its last slice
        cur: list[int] = []
        cur_tok, cum_f = 0, 0.0
        q = total_f / rest if rest > 1 else math.inf
        for u in work.stream:
            for i in u:
                t = tok[i]
                if cur and (cur_tok + t > cap or cum_f + half_f[i] > q):
                    F.append(cur)
                    cur, cur_tok = [], 0
                    n = len(F) - base
                    if n >= rest:
                        return None
                    q = total_f * (n + 1) / rest if n < rest - 1 else math.inf
                if t > cap:
                    return None
                cur.append(i)
                cur_tok += t
                cum_f += fwd[i]
            done.append(len(F))
        if len(F) < m:  # finish: the open pack closes, then empty ones
            F.append(cur)
        F.extend([] for _ in range(m - len(F)))
        seq = [i for u in work.stream for i in reversed(u)]
        avail, k, count = [], 0, 0
        for c in range(m):
            while k < len(done) and done[k] <= c:
                count += len(work.stream[k])
                k += 1
            avail.append(count)
        costs = [sum(map(fwd.__getitem__, p)) for p in F]
        return _Forward(F, base, seq, avail, costs)


@dataclass(frozen=True)
class _WholeUnits:
    """One rank's documents by decreasing tokens: their slices, tokens and forward and
    backward seconds run whole."""

    units: list[range]
    tokens: list[int]
    fwd: list[float]
    bwd: list[float]


@dataclass(frozen=True, eq=False)
class RankDocs:
    """What :class:`LockstepWork` derives from one rank's documents alone, whatever the pack
    count: computed once per rank and phase-1 placement when several pack counts are tried
    with it (:meth:`work`)."""

    view: BatchView
    units: list[Sequence[int] | range]
    """The rank's non-empty documents, in order."""
    unit_fwd: list[float]
    """Forward seconds of each of :attr:`units`."""
    merge_slices: Sequence[int]
    total_f: float
    total_b: float
    merge_bytes: float
    merge_tokens: int
    bytes: float

    @classmethod
    def of(
        cls,
        view: BatchView,
        units: Sequence[Sequence[int] | range],
        merge_slices: Sequence[int],
    ) -> RankDocs:
        units = [u for u in units if len(u)]
        tok, fwd, bwd, _act, _doc = view.lists
        flat = [i for u in units for i in u]
        return cls(
            view=view,
            units=units,
            unit_fwd=[sum(map(fwd.__getitem__, u)) for u in units],
            merge_slices=merge_slices,
            total_f=sum(map(fwd.__getitem__, flat)),
            total_b=sum(map(bwd.__getitem__, flat)),
            merge_bytes=member_peak(view, sorted(merge_slices)) if len(merge_slices) else 0.0,
            merge_tokens=sum(map(tok.__getitem__, merge_slices)),
            bytes=sum(map(view.packing_lists[0].__getitem__, flat)),
        )

    def work(self, m: int) -> LockstepWork:
        """The rank's :class:`LockstepWork` at ``m`` packs."""
        rest = m - (1 if len(self.merge_slices) else 0)
        return LockstepWork(
            view=self.view,
            stream=self._long_documents_first(self.total_f / max(rest, 1)),
            merge_slices=self.merge_slices,
            m=m,
            total_f=self.total_f,
            total_b=self.total_b,
            merge_bytes=self.merge_bytes,
            merge_tokens=self.merge_tokens,
            bytes=self.bytes,
        )

    def _long_documents_first(self, fstar: float) -> list[Sequence[int] | range]:
        """Documents costlier than one pack's forward share ``fstar`` (costliest first), then
        the rest in their order: a long document then starts at a pack boundary."""
        units, ufwd = self.units, self.unit_fwd
        longs = sorted((k for k in range(len(units)) if ufwd[k] > fstar), key=lambda k: -ufwd[k])
        shorts = [k for k in range(len(units)) if ufwd[k] <= fstar]
        return [units[k] for k in (*longs, *shorts)]


class _LockstepRank:
    """The state of :func:`pack_rank_lockstep` on one rank, and its steps. Bytes are
    full-model bytes (``mem`` is the cap over the first stage's layer share)."""

    __slots__ = (
        "B",
        "F",
        "act",
        "base",
        "bwd",
        "cap",
        "cum_b",
        "cum_f",
        "cur",
        "cur_tok",
        "doc_kv",
        "doc_left",
        "docl",
        "fits",
        "fwd",
        "held",
        "kv_per_slice",
        "lag",
        "late",
        "m",
        "mem",
        "merge_bytes",
        "merge_kv",
        "merge_pack",
        "merge_slices",
        "n_b",
        "over_cap",
        "peak",
        "pending",
        "pp",
        "ready",
        "rest",
        "tok",
        "total_b",
        "total_f",
        "view",
    )

    def __init__(
        self,
        work: LockstepWork,
        cap: int,
        mem: float,
        lag: int,
        pp: int,
        merge_kv: float,
        kv_per_slice: bool,
    ):
        view, merge_slices = work.view, work.merge_slices
        self.view = view
        self.tok, self.fwd, self.bwd, self.act, self.docl = view.lists
        self.cap, self.mem, self.m, self.lag, self.pp = cap, mem, work.m, lag, pp
        self.merge_kv, self.kv_per_slice = merge_kv, kv_per_slice
        self.merge_slices = merge_slices
        self.F: list[list[int]] = []
        self.B: list[list[int]] = []
        self.merge_pack: tuple[int, int] | None = None
        if len(merge_slices):  # the merge share runs first: forward and backward pack 0
            self.F.append(list(merge_slices))
            self.merge_pack = (0, 0)
        self.base = len(self.F)
        self.rest = work.m - self.base  # packs for the documents
        self.total_f, self.total_b = work.total_f, work.total_b
        self.ready: deque[list[int]] = deque()  # completed documents: slices not backwarded
        self.merge_bytes = work.merge_bytes
        # activation + K/V bytes held now (the merge share until its backward)
        self.held = self.merge_bytes
        # backward packs the plan order has run but the first stage has not yet:
        # (bytes they free, is the merge pack); at most pp - 1 after each forward pack
        self.pending: deque[tuple[float, bool]] = deque()
        self.late = 0.0  # bytes of ``pending``: the first stage holds ``held + late``
        self.doc_kv: dict[int, float] = {}
        self.doc_left: dict[int, int] = {}
        self.peak = 0.0
        self.cum_f = 0.0
        self.cum_b = 0.0
        self.cur: list[int] = []  # the open forward pack
        self.cur_tok = 0
        self.n_b = 0  # backward packs emitted (merge pack included)
        self.fits = True  # the merge backward's buffers fit
        # a backward pack above the token cap (the merge share's, or a lone long slice)
        self.over_cap = work.merge_tokens > cap

    def run_merge_forward(self) -> bool:
        """Forward pack 0 is the merge share, with the group's gathered K/V; with no lag its
        backward follows at once. ``False`` when that exceeds the cap."""
        self.peak = self.merge_bytes + self.merge_kv
        if self.merge_bytes + self.merge_kv > self.mem:
            return False
        if self.lag == 0:
            self.emit_backward(False)
        self.first_stage_runs_backward(self.pp - 1)
        return True

    def forward_documents(self, stream: list[Sequence[int] | range]) -> bool:
        """Forward the documents' slices in order into the open pack, closing it first at the
        token cap, at the memory cap (first stage) or at the next forward-cost quantile.
        ``False`` when the caps do not fit ``m`` packs."""
        tok, fwd, cap, mem = self.tok, self.fwd, self.cap, self.mem
        extra_of, kv_of, half_f, _half_b = self.view.packing_lists
        base, rest, total_f, F = self.base, self.rest, self.total_f, self.F
        docl, doc_left, doc_kv, ready = self.docl, self.doc_left, self.doc_kv, self.ready

        def quantile() -> float:  # where the open pack closes on forward cost (not the last)
            n = len(F) - base
            return total_f * (n + 1) / rest if n < rest - 1 else math.inf

        # the hot loop runs on locals, stored back around close_forward and at the end
        cur, cur_tok, cum_f = self.cur, self.cur_tok, self.cum_f
        held, late, peak = self.held, self.late, self.peak
        q = quantile()
        for u in stream:
            d = docl[u[0]]
            doc_left[d] = len(u)
            kv = 0.0  # u's K/V bytes (closing a pack frees only completed documents)
            for i in u:
                extra = extra_of[i]
                if cur and (
                    cur_tok + tok[i] > cap or held + late + extra > mem or cum_f + half_f[i] > q
                ):
                    self.cur, self.held, self.late, self.peak = cur, held, late, peak
                    self.close_forward()
                    cur, cur_tok, held, late, peak = self.cur, 0, self.held, self.late, self.peak
                    if len(F) - base >= rest or not self.fits:
                        return False
                    q = quantile()
                if held + late + extra > mem or tok[i] > cap:
                    return False
                cur.append(i)
                cur_tok += tok[i]
                cum_f += fwd[i]
                held += extra
                kv += kv_of[i]
                if held + late > peak:
                    peak = held + late
            doc_kv[d] = kv
            ready.append(list(u))
        self.cur, self.cur_tok, self.cum_f = cur, cur_tok, cum_f
        self.held, self.late, self.peak = held, late, peak
        return True

    def close_forward(self) -> None:
        """Close the open forward pack; backward pack ``j`` runs after forward pack ``j + lag``,
        and the first stage catches up to ``pp - 1`` backward packs behind."""
        self.F.append(self.cur)
        self.cur, self.cur_tok = [], 0
        if len(self.F) - 1 >= self.lag:
            self.emit_backward(False)
        self.first_stage_runs_backward(self.pp - 1)

    def emit_backward(self, final: bool) -> None:
        """The next backward pack in plan order: the merge share's first, then backward work
        from the ends of completed documents (oldest first) up to the water-filling target: the
        work left spread over the backward packs left (the global quantile
        ``total_b * (j + 1) / rest`` while work keeps up; after packs left empty by a long
        document's late completion, its backward is spread, not lumped); the last pack takes
        everything. What the pack frees reaches the first stage later (``pending``)."""
        if self.n_b < self.base:
            self.B.append(list(self.merge_slices))
            self.held -= self.merge_bytes
            self.pending.append((self.merge_bytes, True))
            self.late += self.merge_bytes
            self.n_b += 1
            return
        tok, bwd, act, docl, cap = self.tok, self.bwd, self.act, self.docl, self.cap
        _extra, kv_of, _half_f, half_b = self.view.packing_lists
        ready, doc_left, doc_kv = self.ready, self.doc_left, self.doc_kv
        kv_per_slice = self.kv_per_slice
        held_before = held = self.held
        cum_b = self.cum_b
        j = self.n_b - self.base
        target = float("inf") if final else cum_b + (self.total_b - cum_b) / (self.rest - j)
        pack: list[int] = []
        pack_tok = 0
        while ready:
            doc_slices = ready[0]
            i = doc_slices[-1]
            if pack and (cum_b + half_b[i] > target or pack_tok + tok[i] > cap):
                break
            doc_slices.pop()
            pack.append(i)
            pack_tok += tok[i]
            cum_b += bwd[i]
            held -= act[i]
            d = docl[i]
            doc_left[d] -= 1
            if kv_per_slice:  # the simulator's rule: a slice's K/V goes with its backward
                held -= kv_of[i]
                doc_kv[d] -= kv_of[i]
            if doc_left[d] == 0:
                held -= doc_kv.pop(d)
            if not doc_slices:
                ready.popleft()
        self.B.append(pack)
        self.over_cap = self.over_cap or pack_tok > cap
        self.held, self.cum_b = held, cum_b
        self.pending.append((held_before - held, False))
        self.late += held_before - held
        self.n_b += 1

    def first_stage_runs_backward(self, keep: int) -> None:
        """The first stage runs the oldest pending backward packs until ``keep`` are left; the
        merge backward holds twice the gathered K/V (K/V and their gradients) while it runs."""
        pending = self.pending
        while len(pending) > keep:
            freed, is_merge = pending[0]
            if is_merge:
                need = self.held + self.late + 2 * self.merge_kv
                self.peak = max(self.peak, need)
                self.fits = self.fits and need <= self.mem
            pending.popleft()
            self.late -= freed

    def finish(self, layer_share: float) -> RankPacks | None:
        """Close the forward packs left (empty), emit the backward packs left (the last takes
        everything) and let the first stage drain; ``None`` when a cap is exceeded."""
        while len(self.F) < self.m:
            self.close_forward()
            self.peak = max(self.peak, self.held + self.late)
        while self.n_b < self.m:
            self.emit_backward(self.n_b == self.m - 1)
        self.first_stage_runs_backward(0)
        if not self.fits or self.ready or self.over_cap:
            return None
        return RankPacks(self.F, self.B, self.merge_pack, self.peak * layer_share)

"""Phase 2 of SlimPack: asymmetric MicroPacks on one rank.

Input: the rank's documents in execution order (each a run of slice indices) and, for a
DP-Merge member, the slices of its merge share. Output: forward packs balanced on *forward*
cost and backward packs balanced on *backward* cost, under the token cap and the memory cap
(:mod:`slimdata.solver.memory`), obeying design §4:

- forward packs take the slice stream in order (rule 1), cut where the token cap, the memory
  cap or (lockstep) the next forward-cost quantile is reached;
- after forward pack ``i`` closes, backward work may run on every document whose forwards are
  all done (rule 3), slices taken from each document's end backwards (rule 2). In *free* mode
  (DDP: only the rank's total time matters) the backward packs are the forward packs
  themselves, newest first, as soon as no document spans the cut behind them: a backward pack
  that is not a union of forward packs makes the executor split forward packs into more calls
  or recompute them (:func:`slimdata.plan.execution`), and free mode has no cross-rank balance
  to buy with it.
  A document that does not fit the memory cap beside what the rank holds starts a new forward
  pack after such a clean cut, which frees everything before it. In *lockstep* mode backward
  pack ``i`` stops at the ``(i+1)/m`` quantile of the rank's backward cost, so backward packs
  are balanced on backward cost independently of the forward cuts (the pipeline and FSDP
  advance pack by pack, so pack ``i`` must cost alike on every rank);
- a merge member runs its merge share first, as forward pack 0 and backward pack 0 (the same
  index on every member, so the group meets in lockstep and in free mode alike).

Example (lockstep, m=2, one 4-slice document with forward costs 1,1,1,1 and backward costs
2,2,2,4): F0=[s0,s1], F1=[s2,s3]; nothing is ready after F0, so B0 is empty and B1 holds
[s3,s2,s1,s0]. With two 2-slice documents, F0 completes the first and B0 runs it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from slimdata.solver.common import BatchView
from slimdata.solver.merge import member_peak

__all__ = ["RankPacks", "pack_rank", "pack_rank_lockstep"]


@dataclass
class RankPacks:
    forward: list[list[int]]
    backward: list[list[int]]
    merge_pack: tuple[int, int] | None
    peak: float


def pack_rank(
    view: BatchView,
    units: Sequence[Sequence[int] | range],
    merge_slices: Sequence[int] = (),
    *,
    cap: int,
    mem: float,
    m: int | None = None,
    balance_backward: bool = True,
) -> RankPacks | None:
    """Pack one rank (see the module docstring); ``m=None`` is free mode.

    Returns ``None`` when ``m`` packs cannot hold the rank's slices under the caps (the caller
    tries a larger ``m``), or, in free mode, when one document alone exceeds the memory cap.
    """
    tok, fwd, bwd, act, docl = view.lists
    kvp = view.kv_per_token
    F: list[list[int]] = []
    B: list[list[int]] = []
    merge_pack = None
    if len(merge_slices):
        F.append(list(merge_slices))
        B.append(list(merge_slices))
        merge_pack = (0, 0)
    base = len(F)
    lockstep = m is not None
    if m is not None and base >= m and any(len(u) for u in units):
        return None
    rest = (m - base) if m is not None else 1
    # the lockstep quantiles' totals (free mode cuts by the caps alone)
    total_f = sum(fwd[i] for u in units for i in u) if lockstep else 0.0
    total_b = sum(bwd[i] for u in units for i in u) if lockstep else 0.0

    ready: dict[int, list[int]] = {}  # completed documents (in order): slices not backwarded
    held = 0.0  # activation + K/V bytes held now
    doc_kv: dict[int, float] = {}
    doc_left: dict[int, int] = {}
    peak = 0.0
    cum_f = 0.0
    cum_b = 0.0
    cur: list[int] = []
    cur_tok = 0
    unioned = base  # free mode: forward packs before this one have run their backward

    def take(i: int) -> None:
        """Backward slice ``i`` (the last of its document not yet backwarded)."""
        nonlocal held, cum_b
        d = docl[i]
        doc_slices = ready[d]
        assert doc_slices[-1] == i, "backward must run from a document's end (rule 2)"
        doc_slices.pop()
        if not doc_slices:
            del ready[d]
        cum_b += bwd[i]
        held -= act[i]
        doc_left[d] -= 1
        if doc_left[d] == 0:
            held -= doc_kv.pop(d)

    def union_backward(open_pack: int | None) -> None:
        """Free mode: every forward pack before the latest clean cut (no document on both sides)
        at or before ``open_pack`` (the pack holding the open document's head; ``None``: no
        document is open) runs its backward, newest first, each as one backward pack: a union
        of forward packs, so the executor recomputes nothing."""
        nonlocal unioned
        stop = len(F)
        if open_pack is not None:
            stop = open_pack
            while stop > unioned and docl[F[stop][0]] == docl[F[stop - 1][-1]]:
                stop -= 1
        for k in range(stop - 1, unioned - 1, -1):
            B.append(F[k][::-1])
            for i in B[-1]:
                take(i)
        unioned = max(unioned, stop)

    def backward_after_close(final: bool, open_pack: int | None = None) -> None:
        """Backward work after a forward pack closes: unions of forward packs in free mode
        (:func:`union_backward`), the next backward-cost quantile in lockstep mode."""
        if not lockstep:
            union_backward(open_pack)
            return
        k = len(F) - base - 1  # index of the closed pack among the stream's packs
        target = total_b * (k + 1) / rest if balance_backward and not final else float("inf")
        pack: list[int] = []
        pack_tok = 0
        while ready:
            i = next(iter(ready.values()))[-1]
            if pack and (cum_b + bwd[i] / 2 > target or pack_tok + tok[i] > cap):
                break
            take(i)
            pack.append(i)
            pack_tok += tok[i]
        B.append(pack)

    for u in units:
        if not len(u):
            continue
        d = docl[u[0]]
        doc_left[d] = len(u)
        doc_kv[d] = 0.0
        head_pack = -1  # forward pack of u's first slice (``cur`` becomes F[len(F)])
        # free mode: a document that does not fit beside what is held starts after a clean cut
        clean = not lockstep and held + sum(act[i] + kvp * tok[i] for i in u) > mem
        for i in u:
            extra = act[i] + kvp * tok[i]
            if cur and (
                cur_tok + tok[i] > cap
                or held + extra > mem
                or (clean and i == u[0])
                or (
                    lockstep
                    and len(F) - base < rest - 1
                    and cum_f + fwd[i] / 2 > total_f * (len(F) - base + 1) / rest
                )
            ):
                F.append(cur)
                cur, cur_tok = [], 0
                backward_after_close(False, None if i == u[0] else head_pack)
                if lockstep and len(F) - base >= rest:
                    return None
            if held + extra > mem or tok[i] > cap:
                return None
            if i == u[0]:
                head_pack = len(F)
            cur.append(i)
            cur_tok += tok[i]
            cum_f += fwd[i]
            held += extra
            doc_kv[d] += kvp * tok[i]
            peak = max(peak, held)
        ready[d] = list(u)
    if cur:
        F.append(cur)
        backward_after_close(True)
    if ready:  # lockstep: whatever the quantiles left behind runs in the last pack
        if lockstep:
            B[-1].extend(i for doc_slices in ready.values() for i in reversed(doc_slices))
        else:  # pragma: no cover - free mode drains everything at each close
            raise AssertionError("free mode left slices without a backward pack")
    if lockstep:
        assert m is not None
        if len(F) > m:
            return None
        if any(sum(tok[i] for i in p) > cap for p in B):
            return None
        while len(F) < m:
            F.append([])
        while len(B) < m:
            B.append([])
    if peak > mem:  # pragma: no cover - guarded above
        return None
    return RankPacks(F, B, merge_pack, peak)


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
    tok, fwd, bwd, act, docl = view.lists
    kvp = view.kv_per_token
    F: list[list[int]] = []
    B: list[list[int]] = []
    merge_pack = None
    units = [u for u in units if len(u)]
    if len(merge_slices):
        F.append(list(merge_slices))
        merge_pack = (0, 0)
    base = len(F)
    rest = m - base
    if rest < 1 and units:
        return None
    total_f = sum(fwd[i] for u in units for i in u)
    total_b = sum(bwd[i] for u in units for i in u)
    fstar = total_f / max(rest, 1)
    ufwd = [sum(fwd[i] for i in u) for u in units]
    longs = sorted((k for k in range(len(units)) if ufwd[k] > fstar), key=lambda k: -ufwd[k])
    shorts = [k for k in range(len(units)) if ufwd[k] <= fstar]
    stream = [units[k] for k in (*longs, *shorts)]

    ready: deque[list[int]] = deque()  # completed documents: slices not yet backwarded
    merge_bytes = member_peak(view, sorted(merge_slices)) if base else 0.0
    held = merge_bytes  # activation + K/V bytes held now (the merge share until its backward)
    mem = mem / layer_share  # compare full-model bytes
    # backward packs the plan order has run but the first stage has not yet:
    # (bytes they free, is the merge pack); at most pp - 1 after each forward pack
    pending: deque[tuple[float, bool]] = deque()
    late = 0.0  # bytes of ``pending``: the first stage holds ``held + late``
    doc_kv: dict[int, float] = {}
    doc_left: dict[int, int] = {}
    peak = 0.0
    cum_f = 0.0
    cum_b = 0.0
    cur: list[int] = []
    cur_tok = 0
    n_b = 0  # backward packs emitted (merge pack included)
    fits = True

    def first_stage_runs_backward(keep: int) -> None:
        """The first stage runs the oldest pending backward packs until ``keep`` are left."""
        nonlocal late, fits, peak
        while len(pending) > keep:
            freed, is_merge = pending[0]
            if is_merge:  # gathered K/V and their gradients while the merge backward runs
                peak = max(peak, held + late + 2 * merge_kv)
                fits = fits and held + late + 2 * merge_kv <= mem
            pending.popleft()
            late -= freed

    def emit_backward(final: bool) -> None:
        nonlocal held, cum_b, n_b, late
        if n_b < base:  # the merge pack runs its own backward first
            B.append(list(merge_slices))
            held -= merge_bytes
            pending.append((merge_bytes, True))
            late += merge_bytes
            n_b += 1
            return
        held_before = held
        j = n_b - base
        # water-filling: the backward work left, spread over the backward packs left (the
        # global quantile ``total_b * (j + 1) / rest`` while work keeps up; after packs left
        # empty by a long document's late completion, its backward is spread, not lumped)
        target = float("inf") if final else cum_b + (total_b - cum_b) / (rest - j)
        pack: list[int] = []
        pack_tok = 0
        while ready:
            doc_slices = ready[0]
            i = doc_slices[-1]
            if pack and (cum_b + bwd[i] / 2 > target or pack_tok + tok[i] > cap):
                break
            doc_slices.pop()
            pack.append(i)
            pack_tok += tok[i]
            cum_b += bwd[i]
            held -= act[i]
            d = docl[i]
            doc_left[d] -= 1
            if kv_per_slice:  # the simulator's rule: a slice's K/V goes with its backward
                held -= kvp * tok[i]
                doc_kv[d] -= kvp * tok[i]
            if doc_left[d] == 0:
                held -= doc_kv.pop(d)
            if not doc_slices:
                ready.popleft()
        B.append(pack)
        pending.append((held_before - held, False))
        late += held_before - held
        n_b += 1

    def close_forward() -> None:
        nonlocal cur, cur_tok
        F.append(cur)
        cur, cur_tok = [], 0
        if len(F) - 1 >= lag:  # B(j) runs after F(j + lag)
            emit_backward(False)
        first_stage_runs_backward(pp - 1)

    if base:
        peak = merge_bytes + merge_kv
        if merge_bytes + merge_kv > mem:
            return None
        if lag == 0:
            emit_backward(False)
        first_stage_runs_backward(pp - 1)
    for u in stream:
        d = docl[u[0]]
        doc_left[d] = len(u)
        doc_kv[d] = 0.0
        for i in u:
            extra = act[i] + kvp * tok[i]
            if cur and (
                cur_tok + tok[i] > cap
                or held + late + extra > mem
                or (
                    len(F) - base < rest - 1
                    and cum_f + fwd[i] / 2 > total_f * (len(F) - base + 1) / rest
                )
            ):
                close_forward()
                if len(F) - base >= rest or not fits:
                    return None
            if held + late + extra > mem or tok[i] > cap:
                return None
            cur.append(i)
            cur_tok += tok[i]
            cum_f += fwd[i]
            held += extra
            doc_kv[d] += kvp * tok[i]
            peak = max(peak, held + late)
        ready.append(list(u))
    while len(F) < m:
        close_forward()
        peak = max(peak, held + late)
    while n_b < m:
        emit_backward(n_b == m - 1)
    first_stage_runs_backward(0)
    if not fits or ready or any(sum(tok[i] for i in p) > cap for p in B):
        return None
    return RankPacks(F, B, merge_pack, peak * layer_share)

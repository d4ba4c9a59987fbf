"""Checks of the ordering rules of design §4 for a :class:`~slimdata.plan.types.StepPlan`.

1. forward: slice j of a document runs in a forward pack no earlier than slice j-1;
2. backward: slice j runs in a backward pack no earlier than slice j+1;
3. a slice's backward follows the forward of every slice of its document (in the rank's order);
4. every token of the batch is in exactly one slice on exactly one rank, or in the merge
   packs of exactly one merge group.

Errors name the slice, its document id and the rank.

Cost: linear in the plan's slices plus a sort, done with numpy on one ``(n, 6)`` integer
table per plan (document, start, end, forward pack, backward pack, rank), so steps of tens
of thousands of short documents validate in milliseconds (``benchmarks/bench_validate.py``).
The per-rank checks run on all ranks at once (:func:`~slimdata.plan.ranktable.plan_table`);
only a plan that fails them is checked rank by rank, to name the failing slice.

:func:`validate_rank_plan` applies the same rules to one rank's view of a plan
(:class:`~slimdata.plan.rankplan.RankPlan`): the rank's own slices, and every member's
merge packs inside its merge group, at a cost linear in the view.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from slimdata.errors import PlanError
from slimdata.plan.ranktable import plan_table

if TYPE_CHECKING:
    from slimdata.plan.rankplan import RankPlan
    from slimdata.plan.types import Document, MergeGroup, MicroPack, RankStep, Slice, StepPlan

__all__ = ["validate_plan", "validate_rank_plan"]


def _no(plan: Any, d: int) -> int:
    """The step-wide number of document ``d`` (a :class:`_Scope` numbers its own)."""
    index = getattr(plan, "doc_index", None)
    return index[d] if index is not None and 0 <= d < len(index) else d


def _name(plan: Any, s: Slice, rank: int | None = None) -> str:
    doc_id = plan.docs[s.doc].doc_id if 0 <= s.doc < len(plan.docs) else "?"
    where = f" on rank {rank}" if rank is not None else ""
    return f"slice [{s.start}, {s.end}) of document #{_no(plan, s.doc)} (doc_id {doc_id!r}){where}"


DOC, START, END, FPACK, BPACK, RANK = range(6)
"""Columns of the slice table (one row per slice of the plan)."""

_BOUNDS = operator.attrgetter("doc", "start", "end")


def _slice(row) -> Slice:
    from slimdata.plan.types import Slice

    return Slice(int(row[DOC]), int(row[START]), int(row[END]))


def _rows(packs: tuple[MicroPack, ...]) -> np.ndarray:
    """``(n, 4)`` table of a pass's slices: doc, start, end, pack index."""
    counts = [len(p.slices) for p in packs]
    flat = itertools.chain.from_iterable(p.slices for p in packs)
    out = np.empty((sum(counts), 4), dtype=np.int64)
    try:  # doc, start, end of every slice, read by C-level attribute getters
        bounds = itertools.chain.from_iterable(map(_BOUNDS, flat))
        out[:, :3] = np.fromiter(bounds, dtype=np.int64, count=3 * len(out)).reshape(-1, 3)
    except (OverflowError, TypeError, ValueError):
        raise PlanError("slice bounds must be integers within int64") from None
    out[:, 3] = np.repeat(np.arange(len(packs)), counts)
    return out


def _by_key(rows: np.ndarray) -> np.ndarray:
    return rows[np.lexsort((rows[:, 2], rows[:, 1], rows[:, 0]))]


def _first(mask: np.ndarray) -> int | None:
    return int(np.argmax(mask)) if mask.any() else None


def _check_passes(plan: StepPlan | _Scope, rs: RankStep, merged: np.ndarray) -> np.ndarray:
    """Per-rank rules: each slice in exactly one forward and one backward pack, merge tags,
    known documents. Returns the rank's table sorted by slice: doc, start, end, forward pack,
    backward pack, rank."""
    fwd, bwd = _by_key(_rows(rs.forward)), _by_key(_rows(rs.backward))
    dup = _first((np.diff(fwd[:, :3], axis=0) == 0).all(axis=1))
    if dup is not None:
        raise PlanError(f"{_name(plan, _slice(fwd[dup]), rs.rank)} is in two forward packs")
    if len(fwd) != len(bwd) or not np.array_equal(fwd[:, :3], bwd[:, :3]):
        odd_keys = {tuple(r) for r in fwd[:, :3].tolist()} ^ {tuple(r) for r in bwd[:, :3].tolist()}
        odd = min(odd_keys) if odd_keys else tuple((bwd if len(bwd) else fwd)[0, :3].tolist())
        raise PlanError(
            f"{_name(plan, _slice(odd), rs.rank)} is not in exactly one forward and one backward pack"
        )
    member_of = plan.merge_of_rank(rs.rank)
    for passname, packs, rows in (("forward", rs.forward, fwd), ("backward", rs.backward, bwd)):
        tags = [p.merge for p in packs]
        for i, tag in enumerate(tags):
            if tag is not None and tag != member_of:
                raise PlanError(
                    f"rank {rs.rank}: {passname} pack {i} is tagged with merge group {tag}, which it is not a member of"
                )
        bad = _first((rows[:, DOC] < 0) | (rows[:, DOC] >= len(plan.docs)))
        if bad is not None:
            raise PlanError(f"{_name(plan, _slice(rows[bad]), rs.rank)}: no such document")
        is_merge = np.array([t is not None for t in tags], dtype=bool)
        bad = _first((merged[rows[:, DOC]] >= 0) != is_merge[rows[:, 3]])
        if bad is not None:
            raise PlanError(
                f"{_name(plan, _slice(rows[bad]), rs.rank)}: slices of merged documents must be in "
                f"their group's merge pack and only there ({passname} pack {rows[bad, 3]})"
            )
        if member_of is not None and int(is_merge.sum()) != 1:
            raise PlanError(
                f"rank {rs.rank}: member of merge group {member_of} needs exactly one {passname} merge pack, has {int(is_merge.sum())}"
            )
    rank = np.full((len(fwd), 1), rs.rank, dtype=np.int64)
    return np.hstack((fwd, bwd[:, 3:4], rank))


def _check_order(plan: StepPlan | _Scope, rs: RankStep, table: np.ndarray) -> None:
    """The order lists every pack once, and rule 3: each backward pack runs after the last
    forward pack of every document it holds (``table``: the rank's rows, sorted by doc)."""
    nf, nb = len(rs.forward), len(rs.backward)
    fs = [i for k, i in rs.order if k == "F"]
    bs = [i for k, i in rs.order if k == "B"]
    if fs != list(range(nf)) or bs != list(range(nb)) or len(rs.order) != nf + nb:
        raise PlanError(
            f"rank {rs.rank}: order must list F0..F{nf - 1} and B0..B{nb - 1} each once and in "
            f"increasing order, got {rs.order}"
        )
    if not len(table):
        return
    fpos, bpos = np.zeros(max(nf, 1), np.int64), np.zeros(max(nb, 1), np.int64)
    for pos, (kind, i) in enumerate(rs.order):
        (fpos if kind == "F" else bpos)[i] = pos
    docs, starts = np.unique(table[:, DOC], return_index=True)
    last_fwd = np.maximum.reduceat(fpos[table[:, FPACK]], starts)
    late = _first(last_fwd[np.searchsorted(docs, table[:, DOC])] > bpos[table[:, BPACK]])
    if late is not None:
        row = table[late]
        missing = sorted(
            {int(f) for f in table[table[:, DOC] == row[DOC], FPACK] if fpos[f] > bpos[row[BPACK]]}
        )
        raise PlanError(
            f"{_name(plan, _slice(row), rs.rank)}: backward pack {row[BPACK]} runs before forward pack(s) "
            f"{missing} of the same document (rule 3)"
        )


def _check_groups(merges: tuple[MergeGroup, ...], dp: int) -> dict[int, int]:
    """Every merge group has >= 2 distinct ranks in ``[0, dp)``; no rank or document is in
    two groups. Returns ``document -> group``."""
    merged_doc: dict[int, int] = {}
    seen_ranks: set[int] = set()
    for g, m in enumerate(merges):
        if len(m.ranks) < 2 or len(set(m.ranks)) != len(m.ranks):
            raise PlanError(f"merge group {g} needs >= 2 distinct ranks, got {m.ranks}")
        for r in m.ranks:
            if not 0 <= r < dp or r in seen_ranks:
                raise PlanError(f"merge group {g}: rank {r} is out of range or in two groups")
            seen_ranks.add(r)
        for d in m.docs:
            if d in merged_doc:
                raise PlanError(f"document #{d} is in merge groups {merged_doc[d]} and {g}")
            merged_doc[d] = g
    return merged_doc


def _check_merges(plan: StepPlan) -> np.ndarray:
    """Merge groups have disjoint ranks and documents; returns ``doc -> group`` (-1: none)."""
    merged = np.full(len(plan.docs), -1, dtype=np.int64)
    for d, g in _check_groups(plan.merges, plan.dp).items():
        if 0 <= d < len(merged):
            merged[d] = g
    return merged


def validate_plan(plan: StepPlan) -> None:
    """Check rules 1-4 (module docstring); raises :class:`PlanError` naming the slice."""
    if plan.mode not in ("free", "lockstep"):
        raise PlanError(f"mode={plan.mode!r} must be 'free' or 'lockstep'")
    if not plan.ranks:
        raise PlanError("a plan needs at least one rank")
    for r, rs in enumerate(plan.ranks):
        if rs.rank != r:
            raise PlanError(f"ranks must be listed in order: position {r} holds rank {rs.rank}")
    merged = _check_merges(plan)
    table = plan_table(plan, merged)  # every rank at once; None: some rank fails a check
    if table is None:
        table = _rank_by_rank(plan, merged)  # the same checks, naming the failing slice
    _check_documents(plan, table[np.lexsort((table[:, START], table[:, DOC]))], merged)
    if plan.mode == "lockstep":
        _check_lockstep(plan)


def _rank_by_rank(plan: StepPlan, merged: np.ndarray) -> np.ndarray:
    """Each rank's pass and order checks in turn; the per-rank tables end to end."""
    tables = []
    for rs in plan.ranks:
        table = _check_passes(plan, rs, merged)
        _check_order(plan, rs, table)
        tables.append(table)
    return np.concatenate(tables) if tables else np.zeros((0, 6), np.int64)


def _doc_failures(
    plan: StepPlan | _Scope, t: np.ndarray, merged: np.ndarray
) -> list[tuple[int, int, int]]:
    """``(doc, kind, row)`` of the first failure of each kind (0 tiling, 1 end, 2 owner,
    3 order within the document); ``t`` is sorted by (doc, start)."""
    lengths = np.array([d.length for d in plan.docs], dtype=np.int64)
    first = np.r_[True, t[1:, DOC] != t[:-1, DOC]] if len(t) else np.zeros(0, bool)
    expect = np.where(first, 0, np.r_[0, t[:-1, END]]) if len(t) else t[:, START]
    out = []
    bad = _first((t[:, START] != expect) | (t[:, END] <= t[:, START]))
    if bad is not None:
        out.append((int(t[bad, DOC]), 0, bad))
    ends = np.zeros(len(lengths), np.int64)
    last = np.r_[t[1:, DOC] != t[:-1, DOC], True] if len(t) else np.zeros(0, bool)
    ends[t[last, DOC]] = t[last, END]
    bad = _first(ends != lengths)
    if bad is not None:
        out.append((bad, 1, -1))
    same = ~first[1:] if len(t) else np.zeros(0, bool)
    other_rank = same & (t[1:, RANK] != t[:-1, RANK]) & (merged[t[1:, DOC]] < 0)
    bad = _first(other_rank)
    if bad is not None:
        out.append((int(t[bad + 1, DOC]), 2, bad + 1))
    solo = same & (merged[t[1:, DOC]] < 0) if len(t) else same
    back = (t[1:, FPACK] < t[:-1, FPACK]) | (t[:-1, BPACK] < t[1:, BPACK]) if len(t) else same
    bad = _first(solo & back)
    if bad is not None:
        out.append((int(t[bad + 1, DOC]), 3, bad + 1))
    return out


def _check_documents(plan: StepPlan | _Scope, t: np.ndarray, merged: np.ndarray) -> None:
    """Rule 4 (each document tiled exactly once, on one rank or inside its merge group) and
    rules 1-2 (slice order across packs) for every document, first failing document first."""
    failures = _doc_failures(plan, t, merged)
    for g, m in enumerate(plan.merges):
        rows = t[merged[t[:, DOC]] == g]
        outside = sorted(set(rows[:, RANK].tolist()) - set(m.ranks))
        if outside:
            d = int(rows[np.isin(rows[:, RANK], outside), DOC][0])
            failures.append((d, 2, -(g + 2)))
    if not failures:
        return
    d, kind, row = min(failures)
    doc = plan.docs[d]
    if kind == 0:
        pos = int(t[row - 1, END]) if row and t[row - 1, DOC] == d else 0
        s = _slice(t[row])
        what = (
            "overlaps an earlier slice"
            if s.start < pos
            else f"leaves tokens [{pos}, {s.start}) unplanned"
        )
        raise PlanError(f"{_name(plan, s)} {what} (rule 4)")
    if kind == 1:
        rows = t[t[:, DOC] == d]
        pos = int(rows[-1, END]) if len(rows) else 0
        raise PlanError(
            f"document #{_no(plan, d)} (doc_id {doc.doc_id!r}, {doc.length} tokens): tokens [{pos}, {doc.length}) are in no slice (rule 4)"
        )
    ranks = sorted(set(t[t[:, DOC] == d, RANK].tolist()))
    if kind == 2 and row < -1:
        g = -row - 2
        raise PlanError(
            f"document #{_no(plan, d)} of merge group {g} has slices on non-member ranks {sorted(set(ranks) - set(plan.merges[g].ranks))}"
        )
    if kind == 2:
        raise PlanError(
            f"document #{_no(plan, d)} (doc_id {doc.doc_id!r}) is split over ranks {ranks} without a merge group"
        )
    a, b = t[row - 1], t[row]
    rank = int(b[RANK])
    if b[FPACK] < a[FPACK]:
        raise PlanError(
            f"{_name(plan, _slice(b), rank)} runs forward in pack {b[FPACK]}, before its predecessor in pack {a[FPACK]} (rule 1)"
        )
    raise PlanError(
        f"{_name(plan, _slice(a), rank)} runs backward in pack {a[BPACK]}, before its successor in pack {b[BPACK]} (rule 2)"
    )


def _check_lockstep(plan: StepPlan) -> None:
    shape = [(len(rs.forward), len(rs.backward), rs.order) for rs in plan.ranks]
    if len(set(shape)) != 1:
        raise PlanError(
            "lockstep plan: every rank needs the same pack counts and order, got "
            + ", ".join(
                f"rank {rs.rank}: {len(rs.forward)}F/{len(rs.backward)}B" for rs in plan.ranks
            )
        )


@dataclass(frozen=True)
class _Scope:
    """The documents and merge groups of a :class:`RankPlan`, numbered ``0..k-1`` for the slice
    table (``doc_index[k]``: the step-wide number, used in messages)."""

    docs: tuple[Document, ...]
    doc_index: tuple[int, ...]
    merges: tuple[MergeGroup, ...]
    dp: int

    def merge_of_rank(self, rank: int) -> int | None:
        return next((g for g, m in enumerate(self.merges) if rank in m.ranks), None)


def _local(rs: RankStep, local: dict[int, int], rank: int) -> RankStep:
    """``rs`` with its slices' documents renumbered by ``local`` (step number -> view number)."""
    from slimdata.plan.types import MicroPack, RankStep, Slice

    def packs(ps: tuple[MicroPack, ...]) -> tuple[MicroPack, ...]:
        out = []
        for p in ps:
            for s in p.slices:
                if s.doc not in local:
                    raise PlanError(
                        f"slice [{s.start}, {s.end}) of document #{s.doc} on rank {rs.rank}: "
                        f"the plan of rank {rank} has no such document"
                    )
            out.append(
                MicroPack(
                    tuple(Slice(local[s.doc], s.start, s.end) for s in p.slices), p.cost, p.merge
                )
            )
        return tuple(out)

    return RankStep(rs.rank, packs(rs.forward), packs(rs.backward), rs.order)


def validate_rank_plan(view: RankPlan) -> None:
    """Check one rank's view of a plan: its own slices follow rules 1-3 and tile each of its
    unmerged documents whole (rule 4: a document outside a merge group lives on one rank);
    inside its merge group, every member's merge packs (one forward, one backward, tagged
    with the group) together tile each of the group's documents; the merge groups are
    well-formed, the documents' loss tokens fit the step's, a lockstep schedule names packs
    the rank has. Raises :class:`PlanError` naming the slice. What needs other ranks' packs
    (rule 4 across ranks, equal pack counts of a lockstep plan) is checked when the whole
    plan is validated, before its views are written."""
    members = _check_view_shape(view)
    scope, local = _view_scope(view)
    merged = np.full(len(scope.docs), -1, dtype=np.int64)
    for k, m in enumerate(scope.merges):
        merged[list(m.docs)] = k
    tables = []
    for r in members:
        rs = _local(view.ranks[r], local, view.rank)
        table = _check_passes(scope, rs, merged)
        _check_order(scope, rs, table)
        tables.append(table)
    table = np.concatenate(tables)
    _check_documents(scope, table[np.lexsort((table[:, START], table[:, DOC]))], merged)
    if sum(d.loss_tokens for d in scope.docs) > view.loss_tokens:
        raise PlanError(
            f"the plan of rank {view.rank} has more loss tokens in its documents than the step's "
            f"{view.loss_tokens}"
        )
    if view.lockstep is not None:
        _check_view_schedule(view)


def _check_view_shape(view: RankPlan) -> list[int]:
    """The view's mode, rank and merge groups are well-formed, it holds exactly the rank and
    the other members of its merge group (those with one merge pack per pass), and every
    document of its group. Returns the members (``[rank]`` outside a group)."""
    if view.mode not in ("free", "lockstep"):
        raise PlanError(f"mode={view.mode!r} must be 'free' or 'lockstep'")
    if not 0 <= view.rank < view.dp:
        raise PlanError(f"plan of rank {view.rank} for a step of {view.dp} ranks")
    for r, rs in view.ranks.items():
        if rs.rank != r:
            raise PlanError(f"the plan of rank {view.rank} files rank {rs.rank} as rank {r}")
    _check_groups(view.merges, view.dp)
    g = view.merge_of_rank(view.rank)
    members = sorted(view.merges[g].ranks) if g is not None else [view.rank]
    if sorted(view.ranks) != members:
        raise PlanError(
            f"the plan of rank {view.rank} holds ranks {sorted(view.ranks)}; it needs {members} "
            "(the rank and the other members of its merge group)"
        )
    if g is not None:
        missing = sorted(set(view.merges[g].docs) - set(view.docs))
        if missing:
            raise PlanError(f"the plan of rank {view.rank} lacks merged documents {missing}")
    for r in members:
        rs = view.ranks[r]
        if r != view.rank and (len(rs.forward), len(rs.backward)) != (1, 1):
            raise PlanError(
                f"the plan of rank {view.rank} must hold exactly the merge packs of member {r}, "
                f"got {len(rs.forward)} forward and {len(rs.backward)} backward packs"
            )
    return members


def _view_scope(view: RankPlan) -> tuple[_Scope, dict[int, int]]:
    """The view's documents numbered ``0..k-1`` in step order, its merge groups over those
    numbers, and ``step number -> view number``."""
    index = tuple(sorted(view.docs))
    local = {d: k for k, d in enumerate(index)}
    scope = _Scope(
        docs=tuple(view.docs[d] for d in index),
        doc_index=index,
        merges=tuple(
            type(m)(m.ranks, tuple(local[d] for d in m.docs if d in local)) for m in view.merges
        ),
        dp=view.dp,
    )
    return scope, local


def _check_view_schedule(view: RankPlan) -> None:
    """A lockstep schedule names only forward and backward packs the rank has."""
    assert view.lockstep is not None
    own = view.ranks[view.rank]
    s = view.lockstep
    nf, nb = len(own.forward), len(own.backward)
    fs = set(s.kept) | set(s.idle_forward) | {i for v in s.unions.values() for i in v}
    bs = set(s.unions) | set(s.idle_backward)
    if (
        view.mode != "lockstep"
        or any(not 0 <= i < nf for i in fs)
        or any(not 0 <= j < nb for j in bs)
    ):
        raise PlanError(
            f"the plan of rank {view.rank} has a lockstep schedule that does not fit its "
            f"{nf} forward and {nb} backward packs (mode {view.mode!r})"
        )

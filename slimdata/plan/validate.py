"""Checks of the ordering rules of design §4 for a :class:`~slimdata.plan.types.StepPlan`.

1. forward: slice j of a document runs in a forward pack no earlier than slice j-1;
2. backward: slice j runs in a backward pack no earlier than slice j+1;
3. a slice's backward follows the forward of every slice of its document (in the rank's order);
4. every token of the batch is in exactly one slice on exactly one rank, or in the merge
   packs of exactly one merge group.

Errors name the slice, its document id and the rank.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import pairwise
from typing import TYPE_CHECKING

from slimdata.errors import PlanError

if TYPE_CHECKING:
    from slimdata.plan.types import Slice, StepPlan

__all__ = ["validate_plan"]


def _name(plan: StepPlan, s: Slice, rank: int | None = None) -> str:
    doc_id = plan.docs[s.doc].doc_id if 0 <= s.doc < len(plan.docs) else "?"
    where = f" on rank {rank}" if rank is not None else ""
    return f"slice [{s.start}, {s.end}) of document #{s.doc} (doc_id {doc_id!r}){where}"


def _check_order(plan: StepPlan, rs) -> None:
    """The order lists every pack once, and rule 3: each backward pack runs after the last
    forward pack of every document it holds. Linear in the rank's slices."""
    nf, nb = len(rs.forward), len(rs.backward)
    fs = [i for k, i in rs.order if k == "F"]
    bs = [i for k, i in rs.order if k == "B"]
    if fs != list(range(nf)) or bs != list(range(nb)) or len(rs.order) != nf + nb:
        raise PlanError(
            f"rank {rs.rank}: order must list F0..F{nf - 1} and B0..B{nb - 1} each once and in "
            f"increasing order, got {rs.order}"
        )
    at = {item: pos for pos, item in enumerate(rs.order)}  # ("F", 2) -> position in order
    last_fwd: dict[int, int] = {}  # doc -> position of its last forward pack
    for i, p in enumerate(rs.forward):
        for s in p.slices:
            last_fwd[s.doc] = max(last_fwd.get(s.doc, -1), at[("F", i)])
    for i, p in enumerate(rs.backward):
        for s in p.slices:
            if last_fwd.get(s.doc, -1) > at[("B", i)]:
                missing = sorted(
                    k
                    for k, q in enumerate(rs.forward)
                    if at[("F", k)] > at[("B", i)] and any(t.doc == s.doc for t in q.slices)
                )
                raise PlanError(
                    f"{_name(plan, s, rs.rank)}: backward pack {i} runs before forward pack(s) "
                    f"{missing} of the same document (rule 3)"
                )


def _check_merges(plan: StepPlan) -> dict[int, int]:
    """Merge groups have disjoint ranks and documents; returns ``doc -> group``."""
    merged_doc: dict[int, int] = {}
    seen_ranks: set[int] = set()
    for g, m in enumerate(plan.merges):
        if len(m.ranks) < 2 or len(set(m.ranks)) != len(m.ranks):
            raise PlanError(f"merge group {g} needs >= 2 distinct ranks, got {m.ranks}")
        for r in m.ranks:
            if not 0 <= r < plan.dp or r in seen_ranks:
                raise PlanError(f"merge group {g}: rank {r} is out of range or in two groups")
            seen_ranks.add(r)
        for d in m.docs:
            if d in merged_doc:
                raise PlanError(f"document #{d} is in merge groups {merged_doc[d]} and {g}")
            merged_doc[d] = g
    return merged_doc


def validate_plan(plan: StepPlan) -> None:
    """Check rules 1-4 (module docstring); linear in the plan's slices (plus a sort of
    each document's slices). Raises :class:`PlanError` naming the slice."""
    if plan.mode not in ("free", "lockstep"):
        raise PlanError(f"mode={plan.mode!r} must be 'free' or 'lockstep'")
    if not plan.ranks:
        raise PlanError("a plan needs at least one rank")
    for r, rs in enumerate(plan.ranks):
        if rs.rank != r:
            raise PlanError(f"ranks must be listed in order: position {r} holds rank {rs.rank}")
    merged_doc = _check_merges(plan)

    owner: dict[int, set[int]] = defaultdict(set)  # doc -> ranks holding it
    pack_of: list[tuple[dict[Slice, int], dict[Slice, int]]] = []  # rank -> (fwd, bwd) pack
    per_doc: dict[int, list[Slice]] = defaultdict(list)
    for rs in plan.ranks:
        fwd = [s for p in rs.forward for s in p.slices]
        bwd = [s for p in rs.backward for s in p.slices]
        if len(set(fwd)) != len(fwd):
            dup = next(s for s, n in Counter(fwd).items() if n > 1)
            raise PlanError(f"{_name(plan, dup, rs.rank)} is in two forward packs")
        if set(fwd) != set(bwd) or len(bwd) != len(fwd):
            odd = next(iter(set(fwd) ^ set(bwd)), bwd[0] if bwd else fwd[0])
            raise PlanError(
                f"{_name(plan, odd, rs.rank)} is not in exactly one forward and one backward pack"
            )
        for passname, packs in (("forward", rs.forward), ("backward", rs.backward)):
            merge_packs = [i for i, p in enumerate(packs) if p.merge is not None]
            member_of = plan.merge_of_rank(rs.rank)
            for i, p in enumerate(packs):
                if p.merge is not None and p.merge != member_of:
                    raise PlanError(
                        f"rank {rs.rank}: {passname} pack {i} is tagged with merge group {p.merge}, which it is not a member of"
                    )
                for s in p.slices:
                    if not 0 <= s.doc < len(plan.docs):
                        raise PlanError(f"{_name(plan, s, rs.rank)}: no such document")
                    in_group = merged_doc.get(s.doc)
                    if (in_group is not None) != (p.merge is not None):
                        raise PlanError(
                            f"{_name(plan, s, rs.rank)}: slices of merged documents must be in "
                            f"their group's merge pack and only there ({passname} pack {i})"
                        )
            if member_of is not None and len(merge_packs) != 1:
                raise PlanError(
                    f"rank {rs.rank}: member of merge group {member_of} needs exactly one {passname} merge pack, has {len(merge_packs)}"
                )
        for s in fwd:
            owner[s.doc].add(rs.rank)
            per_doc[s.doc].append(s)
        _check_order(plan, rs)
        pack_of.append(
            (
                {s: i for i, p in enumerate(rs.forward) for s in p.slices},
                {s: i for i, p in enumerate(rs.backward) for s in p.slices},
            )
        )

    for d, doc in enumerate(plan.docs):
        slices = sorted(per_doc.get(d, []), key=lambda s: s.start)
        pos = 0
        for s in slices:
            if s.start != pos or s.end <= s.start:
                what = (
                    "overlaps an earlier slice"
                    if s.start < pos
                    else f"leaves tokens [{pos}, {s.start}) unplanned"
                )
                raise PlanError(f"{_name(plan, s)} {what} (rule 4)")
            pos = s.end
        if pos != doc.length:
            raise PlanError(
                f"document #{d} (doc_id {doc.doc_id!r}, {doc.length} tokens): tokens [{pos}, {doc.length}) are in no slice (rule 4)"
            )
        group = merged_doc.get(d)
        if group is None:
            if len(owner[d]) > 1:
                raise PlanError(
                    f"document #{d} (doc_id {doc.doc_id!r}) is split over ranks {sorted(owner[d])} without a merge group"
                )
            if slices:
                rank = next(iter(owner[d]))
                _check_monotone(plan, slices, rank, *pack_of[rank])
        elif not owner[d] <= set(plan.merges[group].ranks):
            raise PlanError(
                f"document #{d} of merge group {group} has slices on non-member ranks {sorted(owner[d] - set(plan.merges[group].ranks))}"
            )

    if plan.mode == "lockstep":
        shape = [(len(rs.forward), len(rs.backward), rs.order) for rs in plan.ranks]
        if len(set(shape)) != 1:
            raise PlanError(
                "lockstep plan: every rank needs the same pack counts and order, got "
                + ", ".join(
                    f"rank {r}: {len(f)}F/{len(b)}B"
                    for r, (f, b, _o) in enumerate(
                        (rs.forward, rs.backward, rs.order) for rs in plan.ranks
                    )
                )
            )


def _check_monotone(
    plan: StepPlan,
    slices: list[Slice],
    rank: int,
    fwd_of: dict[Slice, int],
    bwd_of: dict[Slice, int],
) -> None:
    """Rules 1 and 2 for the ``slices`` of one document (in token order) on ``rank``;
    ``fwd_of``/``bwd_of`` map each slice of the rank to its pack (built once per rank)."""
    for a, b in pairwise(slices):
        if fwd_of[b] < fwd_of[a]:
            raise PlanError(
                f"{_name(plan, b, rank)} runs forward in pack {fwd_of[b]}, before its predecessor in pack {fwd_of[a]} (rule 1)"
            )
        if bwd_of[a] < bwd_of[b]:
            raise PlanError(
                f"{_name(plan, a, rank)} runs backward in pack {bwd_of[a]}, before its successor in pack {bwd_of[b]} (rule 2)"
            )

"""The per-rank checks of :func:`slimdata.plan.validate.validate_plan` for every rank at once.

``validate_plan`` checks each rank's passes (every slice in exactly one forward and one
backward pack, merge tags, known documents) and order (rule 3) on a table of the rank's
slices. At 64 ranks and a few thousand short documents per step those checks cost a few
dozen numpy calls per rank, more than the slices themselves. :func:`plan_table` runs the same
checks on one table of all ranks' slices, a few numpy calls per plan, and answers only
"every rank passes" (the table :func:`~slimdata.plan.validate.validate_plan` goes on with)
or ``None``; on ``None`` the per-rank checks run and name the failing slice. It accepts no
plan that they refuse, so a plan it passes is valid and one it refuses gets their message.

Table columns, one row per slice: document, start, end, forward pack, backward pack, rank;
sorted by (rank, document, start), as the per-rank tables laid end to end in rank order.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from slimdata.plan.types import RankStep, StepPlan

__all__ = ["plan_table"]

DOC, START, END, PACK, RANK, GLOBAL_PACK = range(6)
"""Columns of one pass's rows (GLOBAL_PACK: the pack's index among all ranks' packs)."""


def plan_table(plan: StepPlan, merged: np.ndarray) -> np.ndarray | None:
    """The plan's slice table if every rank passes its pass and order checks, else None
    (``merged``: document -> merge group, -1 for none; the groups are already checked)."""
    member = np.full(plan.dp, -1, dtype=np.int64)
    for g, m in enumerate(plan.merges):
        member[list(m.ranks)] = g
    positions = _order_positions(plan.ranks)
    try:
        fwd = _pass_rows(plan.ranks, "forward", len(plan.docs), merged, member)
        bwd = _pass_rows(plan.ranks, "backward", len(plan.docs), merged, member)
    except (OverflowError, TypeError, ValueError):  # not integers: the per-rank checks say so
        return None
    if positions is None or fwd is None or bwd is None:
        return None
    f, b = fwd[_by_rank_and_key(fwd)], bwd[_by_rank_and_key(bwd)]
    keys = [RANK, DOC, START, END]
    if len(f) != len(b) or not np.array_equal(f[:, keys], b[:, keys]):
        return None  # a slice not in exactly one forward and one backward pack of its rank
    if len(f) > 1 and (np.diff(f[:, keys], axis=0) == 0).all(axis=1).any():
        return None  # a slice in two forward packs
    if _backward_before_forward(f, b, *positions):
        return None
    return np.column_stack((f[:, [DOC, START, END, PACK]], b[:, PACK], f[:, RANK]))


def _pass_rows(
    ranks: Sequence[RankStep], which: str, ndocs: int, merged: np.ndarray, member: np.ndarray
) -> np.ndarray | None:
    """Rows of every slice of one pass (``forward`` or ``backward``) of every rank, or None
    if a pack's merge tag is not its rank's group, a slice's document is unknown, a merged
    document's slice is outside its group's merge pack (or an unmerged one inside it), or a
    member does not have exactly one merge pack."""
    per_rank = [getattr(rs, which) for rs in ranks]
    packs = list(itertools.chain.from_iterable(per_rank))
    npacks = np.array([len(ps) for ps in per_rank], dtype=np.int64)
    counts = np.array([len(p.slices) for p in packs], dtype=np.int64)
    slices = [s for p in packs for s in p.slices]
    rows = np.empty((len(slices), 6), dtype=np.int64)
    # one list per column: attribute reads in a comprehension are the fastest Python has
    for col, values in enumerate(
        ([s.doc for s in slices], [s.start for s in slices], [s.end for s in slices])
    ):
        column = np.array(values)
        if len(values) and column.dtype.kind not in "ib":
            return None  # not all integers within int64: the per-rank checks say which
        rows[:, col] = column
    pack_rank = np.repeat(np.arange(len(ranks)), npacks)
    first = np.repeat(np.cumsum(npacks) - npacks, npacks)
    rows[:, GLOBAL_PACK] = np.repeat(np.arange(len(packs)), counts)
    rows[:, PACK] = (np.arange(len(packs)) - first)[rows[:, GLOBAL_PACK]]
    rows[:, RANK] = pack_rank[rows[:, GLOBAL_PACK]]
    tags = [p.merge for p in packs]
    is_merge = np.fromiter((t is not None for t in tags), dtype=bool, count=len(packs))
    tag = np.fromiter((-1 if t is None else t for t in tags), dtype=np.int64, count=len(packs))
    docs = rows[:, DOC]
    if (
        (is_merge & ((tag < 0) | (tag != member[pack_rank]))).any()
        or ((docs < 0) | (docs >= ndocs)).any()
        or ((merged[docs] >= 0) != is_merge[rows[:, GLOBAL_PACK]]).any()
        or ((member >= 0) & (np.bincount(pack_rank[is_merge], minlength=len(ranks)) != 1)).any()
    ):
        return None
    return rows


def _order_positions(ranks: Sequence[RankStep]) -> tuple[np.ndarray, np.ndarray] | None:
    """Position in its rank's order of every forward and every backward pack (indexed like
    :data:`GLOBAL_PACK`), or None if an order does not list F0.. and B0.. each once and in
    increasing order."""
    fpos: list[int] = []
    bpos: list[int] = []
    for rs in ranks:
        kinds = [k for k, _i in rs.order]
        fs = [i for k, i in rs.order if k == "F"]
        bs = [i for k, i in rs.order if k == "B"]
        nf, nb = len(rs.forward), len(rs.backward)
        if fs != list(range(nf)) or bs != list(range(nb)) or len(kinds) != nf + nb:
            return None
        fpos.extend(p for p, k in enumerate(kinds) if k == "F")
        bpos.extend(p for p, k in enumerate(kinds) if k == "B")
    return np.array(fpos, dtype=np.int64), np.array(bpos, dtype=np.int64)


def _by_rank_and_key(rows: np.ndarray) -> np.ndarray:
    return np.lexsort((rows[:, END], rows[:, START], rows[:, DOC], rows[:, RANK]))


def _backward_before_forward(f: np.ndarray, b: np.ndarray, fpos, bpos) -> bool:
    """Rule 3 on aligned tables (row i of ``f`` and ``b``: the same slice): some backward
    pack runs before the last forward pack of a document it holds, on the same rank."""
    if not len(f):
        return False
    new = np.r_[True, (f[1:, RANK] != f[:-1, RANK]) | (f[1:, DOC] != f[:-1, DOC])]
    starts = np.flatnonzero(new)
    last_fwd = np.maximum.reduceat(fpos[f[:, GLOBAL_PACK]], starts)
    return bool(
        (np.repeat(last_fwd, np.diff(np.r_[starts, len(f)])) > bpos[b[:, GLOBAL_PACK]]).any()
    )

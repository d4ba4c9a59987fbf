"""Static context parallelism: which tokens of a slice each member of a CP group holds, and
what a CP group exchanges per layer.

Under static CP ``k`` (``ExecutionConfig.cp``, ``Layout.cp``) every pack of a DP rank runs on
``k`` members. Each slice of ``s`` tokens is padded to ``s' = ceil(s / 2k) * 2k`` tokens
(:func:`slimdata.execution.program.padded`) and cut into ``2k`` chunks of ``c = s' / 2k``
tokens; member ``i`` holds chunks ``i`` and ``2k - 1 - i`` (Megatron's load-balanced
zig-zag), so every member computes ``1 / k`` of the padded slice's tokens and causal pairs.
The padding sits at the slice's end: the last chunks are short or empty, never padded with
real work.

Example, a slice ``[10, 20)`` at ``k = 2``: ``s' = 12``, ``c = 3``, chunks ``[10,13) [13,16)
[16,19) [19,20)``; member 0 holds ``[10,13) [19,20)``, member 1 ``[13,16) [16,19)``.

Per layer, every model call of a pack all-gathers the keys/values its queries read
(:func:`cp_gather`): its slices and the earlier slices of their documents, each member
sending its chunks of them, padded to the longest member's rows. The backward gathers them
again (the attention over them is checkpointed) and reduce-scatters their gradient
(:func:`cp_pass_gathers` lists the calls of every pack pass).

The simulator prices exactly this split and exchange (:mod:`slimdata.sim.cp`), the execution
model lists the collectives (:mod:`slimdata.execution.program`), the runtime executes them
(:mod:`slimdata.hooks.cp`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from slimdata.errors import PlanError
from slimdata.plan import StepPlan, check_lockstep, lockstep_schedule, split_calls
from slimdata.plan.schedule import LockstepSchedule, kept_forward_packs
from slimdata.plan.types import RankStep, Slice

__all__ = [
    "CpGather",
    "PassGathers",
    "cp_chunks",
    "cp_gather",
    "cp_pass_gathers",
    "doc_slices",
    "gathered_tokens",
    "member_rows",
    "member_tokens",
]


def cp_chunks(start: int, end: int, cp: int, member: int) -> list[tuple[int, int]]:
    """Token ranges of slice ``[start, end)`` that ``member`` of a CP group of ``cp`` holds,
    in token order, empty ranges left out (module docstring)."""
    if not 0 <= member < cp:
        raise ValueError(f"member={member} outside a CP group of {cp}")
    if cp == 1:
        return [(start, end)] if end > start else []
    c = -(-(end - start) // (2 * cp))  # ceil(s / 2k) = s' / 2k
    out = []
    for j in (member, 2 * cp - 1 - member):
        a, b = min(start + j * c, end), min(start + (j + 1) * c, end)
        if b > a:
            out.append((a, b))
    return out


def member_tokens(s: Slice, cp: int, member: int) -> int:
    """Tokens of ``s`` that ``member`` holds: ``sum(b - a for a, b in cp_chunks(...))``."""
    n = s.end - s.start
    if cp == 1:
        return n
    c = -(-n // (2 * cp))
    return sum(min(max(n - j * c, 0), c) for j in (member, 2 * cp - 1 - member))


def doc_slices(rs: RankStep, skip_docs: Iterable[int] = ()) -> dict[int, list[Slice]]:
    """The slices a DP rank holds of each document (except ``skip_docs``), sorted by start:
    where a slice's prefix lives (its own pack, or the rank's K/V store)."""
    skip = set(skip_docs)
    out: dict[int, list[Slice]] = {}
    for s in rs.slices():
        if s.doc not in skip:
            out.setdefault(s.doc, []).append(s)
    for sl in out.values():
        sl.sort(key=lambda s: s.start)
    return out


@dataclass(frozen=True)
class CpGather:
    """One layer's K/V all-gather of one static-CP model call (:func:`cp_gather`)."""

    cp: int
    """Members of the CP group."""
    items: tuple[Slice, ...]
    """Slices whose keys/values are gathered, in row order (the same on every member)."""
    rows: tuple[int, ...]
    """Rows (tokens) each member contributes: its chunks of every item."""

    @property
    def padded_rows(self) -> int:
        """Rows every member sends: the longest member's (0 for no item)."""
        return max(self.rows, default=0)

    @property
    def tokens(self) -> int:
        """Tokens of the gathered buffer (:func:`gathered_tokens`): its bytes are
        :meth:`slimdata.cost.CostModel.gathered_kv_bytes` of this."""
        return gathered_tokens(self.cp, self.padded_rows)

    def member_rows(self, member: int) -> list[tuple[Slice, int, int]]:
        """``member``'s rows: its chunks ``(slice, a, b)`` of every item, in row order."""
        return [
            (s, a, b) for s in self.items for a, b in cp_chunks(s.start, s.end, self.cp, member)
        ]


def cp_gather(slices: Sequence[Slice], docs: Mapping[int, Sequence[Slice]], cp: int) -> CpGather:
    """What one model call over ``slices`` gathers per layer under static CP ``cp``: the
    keys/values of its slices and of the earlier slices of their documents (``docs``, the
    DP rank's :func:`doc_slices`), each document's prefix before the slice that reads it.
    Each member holds its :func:`cp_chunks` of every item (earlier slices in its K/V
    store) and sends them padded to the longest member's rows.

    Example, ``cp = 2``, doc 0 of 12 tokens cut ``[0,8) [8,12)``, a call over ``[8,12)``
    and doc 1 ``[0,3)``: items ``[0,8) [8,12) d1[0,3)``; member 0 holds ``[0,2) [6,8)``,
    ``[8,9) [11,12)``, ``[0,1)``: 4 + 2 + 1 = 7 rows; member 1 ``[2,6)``, ``[9,11)``,
    ``[1,3)``: 4 + 2 + 2 = 8 rows; both send 8 rows, the gathered buffer holds 16 tokens
    (the slices alone, each padded to ``2 * cp``, are 4 + 4 = 8).
    """
    items: list[Slice] = []
    seen: set[Slice] = set()
    for s in slices:
        for p in docs[s.doc]:
            if p.start > s.start:
                break
            if p not in seen:
                seen.add(p)
                items.append(p)
    shares = [_member_shares(p.end - p.start, cp) for p in items]
    rows = tuple(map(sum, zip(*shares, strict=True))) if shares else (0,) * cp
    return CpGather(cp, tuple(items), rows)


def gathered_tokens(cp: int, padded_rows):
    """Tokens of a CP group's gathered buffer when its longest member sends ``padded_rows``
    rows (a number or an array): every member sends that many, ``cp * padded_rows``."""
    return cp * padded_rows


def member_rows(lengths: Sequence[int] | np.ndarray, cp: int) -> np.ndarray:
    """Rows each member of a CP group of ``cp`` holds of slices of these ``lengths``, shape
    ``(len(lengths), cp)``: row ``i`` is :func:`member_tokens` of an ``lengths[i]``-token slice
    for every member (lengths ``[10, 3]`` at ``cp = 2``: ``[[4, 6], [1, 2]]``). A call's rows
    are the sums over its items, so a packer that adds slices to a call one by one reads
    :func:`cp_gather`'s rows off their running sums."""
    lengths = np.asarray(lengths, dtype=np.int64)
    uniq, inverse = np.unique(lengths, return_inverse=True)
    table = np.array([_member_shares(n, cp) for n in uniq.tolist()], dtype=np.int64)
    return table.reshape(len(uniq), cp)[inverse.reshape(-1)]


@lru_cache(maxsize=4096)
def _member_shares(n: int, cp: int) -> tuple[int, ...]:
    """:func:`member_tokens` of an ``n``-token slice for every member (it depends on the
    slice's length alone)."""
    return tuple(member_tokens(Slice(0, 0, n), cp, m) for m in range(cp))


@dataclass(frozen=True)
class PassGathers:
    """Static CP: the gathered tokens of one layer of every model call of every flat pack pass
    (:class:`~slimdata.execution.pricing.PackTimes` numbering), in call order; merge packs
    and packs that make no call (or only padding calls) have none."""

    forward: tuple[tuple[int, ...], ...]
    """Per flat forward pack: one gather per layer per call."""
    backward: tuple[tuple[int, ...], ...]
    """Per flat backward pack: per call, per layer last first, a gather again and the
    reduce-scatter of the K/V gradient; :attr:`recomputed` packs first re-run their forward
    (one gather per layer)."""
    recomputed: tuple[bool, ...]
    """Per flat backward pack: its one call re-runs the pack's forward first."""

    def collectives(self, kind: str, k: int) -> int:
        """Collectives per layer of flat pack ``k`` of pass ``kind`` (``"F"``/``"B"``)."""
        if kind == "F":
            return len(self.forward[k])
        return (3 if self.recomputed[k] else 2) * len(self.backward[k])

    def tokens(self, kind: str, k: int) -> int:
        """Tokens of one layer's collectives of flat pack ``k`` summed (each collective moves
        its call's gathered buffer)."""
        if kind == "F":
            return sum(self.forward[k])
        return (3 if self.recomputed[k] else 2) * sum(self.backward[k])

    def largest(self, kind: str, k: int) -> int:
        """Tokens of the largest call's gathered buffer of flat pack ``k``: one layer's K/V
        a member holds while the pass runs."""
        return max(self.forward[k] if kind == "F" else self.backward[k], default=0)


Calls = list[list[tuple[Slice, ...]]]
"""Per pack of a rank, the slices of each static-CP model call, in run order."""


def _rank_calls(
    rs: RankStep, sched: LockstepSchedule | None, split: bool
) -> tuple[Calls, Calls, list[bool]]:
    """The executor's model calls of one rank (:mod:`slimdata.hooks.executor`): forward and
    backward calls that gather (merge packs and padding calls do not), recomputed packs."""
    fwd = [[] if p.merge is not None or not p.slices else [p.slices] for p in rs.forward]
    sc = split_calls(rs.forward, rs.backward) if sched is None and split else None
    if sc is not None:
        share = {(i, j): sl for i, calls in enumerate(sc.forward) for j, sl in calls}
        fwd = [
            [] if rs.forward[i].merge is not None else [sl for _j, sl in calls]
            for i, calls in enumerate(sc.forward)
        ]
        bwd = [
            [] if rs.backward[j].merge is not None else [share[(i, j)] for i in fs]
            for j, fs in enumerate(sc.backward)
        ]
        return fwd, bwd, [False] * len(bwd)
    unions = (
        dict(sched.unions) if sched is not None else kept_forward_packs(rs.forward, rs.backward)[1]
    )
    bwd, rec = [], []
    for j, p in enumerate(rs.backward):
        if p.merge is not None:
            bwd.append([])
            rec.append(False)
        elif j in unions:  # through the forward packs' graphs, latest first
            bwd.append([rs.forward[i].slices for i in reversed(unions[j]) if rs.forward[i].slices])
            rec.append(False)
        else:  # one call re-runs the pack's forward, then its backward
            bwd.append([p.slices] if p.slices else [])
            rec.append(bool(p.slices))
    return fwd, bwd, rec


def cp_pass_gathers(
    plan: StepPlan,
    cp: int,
    lockstep: bool,
    split: bool,
    ranks: Collection[int] | None = None,
    keep: bool = True,
) -> PassGathers:
    """The gathers of every pack pass of ``plan`` under static CP ``cp``, as the executor
    runs them (:func:`slimdata.plan.execution`'s rules: ``lockstep`` FSDP's plan-global
    ones, else per rank, with ``split`` calls; a lockstep plan the FSDP executor refuses
    runs by the per-rank rules, as :func:`~slimdata.execution.pricing.pack_times` prices).
    ``ranks``: only theirs (the other ranks' passes have none); ``keep=False``: FSDP1's
    lockstep rules (every backward pack recomputed)."""
    sched = None
    if lockstep:
        try:
            check_lockstep(plan)
            sched = lockstep_schedule(plan, keep)
        except PlanError:
            sched = None
    fwd: list[tuple[int, ...]] = []
    bwd: list[tuple[int, ...]] = []
    rec: list[bool] = []
    for k, rs in enumerate(plan.ranks):
        if ranks is not None and k not in ranks:
            fwd.extend(() for _ in rs.forward)
            bwd.extend(() for _ in rs.backward)
            rec.extend(False for _ in rs.backward)
            continue
        docs = doc_slices(rs)
        f, b, r = _rank_calls(rs, sched, split)
        fwd.extend(tuple(cp_gather(c, docs, cp).tokens for c in calls) for calls in f)
        bwd.extend(tuple(cp_gather(c, docs, cp).tokens for c in calls) for calls in b)
        rec.extend(r)
    return PassGathers(tuple(fwd), tuple(bwd), tuple(rec))

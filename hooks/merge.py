"""DP-Merge: a merge group runs its documents as a context-parallel group (design §9).

Each member holds some slices (a share of the queries) of the group's documents in exactly
one forward and one backward merge pack. Per layer, members all-gather the keys/values of
their merged slices on the group's process subgroup (forward) and reduce-scatter the
gradient of the gathered tensor (backward): each member receives the summed gradient of its
own rows, so its keys/values carry the gradient from every member's queries. Parameters are
untouched; the ordinary DP gradient reduction sums the members' partial parameter gradients
into the exact gradient.

Memory is context parallelism's: the gathered keys/values of a layer live while that layer's
attention runs and are freed after it (the attention over them is checkpointed,
:mod:`slimdata.hooks.continuation`; under ``recompute="full"`` the layer's checkpoint does it,
:mod:`slimdata.hooks.recompute`, with the same collectives); the backward gathers them again, layer by layer, so a
member holds one layer's gathered keys/values at a time (twice that in the backward, with
their gradient) -- :meth:`slimdata.cost.CostModel.gathered_kv_bytes`, the planner's and the
simulator's rule.

Collective sequence per member and step: ``L`` all-gathers in every forward run of the merge
pack (its forward, and its recomputed forward when its backward pack recomputes it), then per
layer, last first, one all-gather and one reduce-scatter in its backward. Each moves the
keys/values of ``members * largest share`` tokens (every share padded to the largest; on
top of static CP, ``k * members`` processes' chunks padded to the longest), the size the
simulator prices (:func:`slimdata.execution.merge.merge_layer_tokens`,
:func:`slimdata.execution.merge.merge_collectives`). Members of a group share the merge pack's
kept/recomputed status (a merge pack's backward pack holds exactly its forward pack's slices,
so it is kept outside FSDP; under FSDP the status is plan-global), so their sequences match.
Subgroups are created once per rank set and cached; ``new_group`` is collective, so every
rank calls :func:`merge_group` for every group of a plan in plan order.

On top of static CP (``cp = k``, :mod:`slimdata.hooks.cp`) a merge group of DP ranks is the
``k * members`` processes of their CP groups: each process contributes its load-balanced
chunks of its DP rank's merged slices (:func:`slimdata.execution.cp.cp_chunks`) and its
queries are those chunks; the token gather takes each slice from the group's first member.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

from slimdata.errors import PlanError
from slimdata.execution.cp import cp_chunks
from slimdata.execution.merge import merge_layer_tokens, merge_token_width
from slimdata.plan import RankPlan, Slice, StepPlan

__all__ = ["MergeRuntime", "gather_kv", "merge_group"]

_GROUPS: dict[tuple[int, ...], object] = {}


def merge_group(ranks: tuple[int, ...]):
    """The cached process subgroup of ``ranks`` (created on first use, collectively)."""
    key = tuple(sorted(ranks))
    if key not in _GROUPS:
        backend = "nccl" if torch.cuda.is_available() and dist.get_backend() == "nccl" else None
        _GROUPS[key] = dist.new_group(list(key), backend=backend)
    return _GROUPS[key]


def merge_processes(ranks: tuple[int, ...], cp: int = 1) -> tuple[int, ...]:
    """The processes of a merge group of DP ``ranks`` under static CP ``cp``: their CP groups."""
    return tuple(r * cp + i for r in sorted(ranks) for i in range(cp))


def ensure_groups(plan: StepPlan | RankPlan, cp: int = 1) -> None:
    """Create (or look up) the subgroup of every merge group, on every rank, in plan order."""
    for m in plan.merges:
        merge_group(merge_processes(m.ranks, cp))


class _GatherKV(torch.autograd.Function):
    """all-gather of ``own (2, maxlen, H, D)`` -> ``(world, 2, maxlen, H, D)``; backward
    reduce-scatters the gradient, returning the sum of this member's rows."""

    @staticmethod
    def forward(ctx, own, group, index, world):
        ctx.group, ctx.index = group, index
        parts = [torch.empty_like(own) for _ in range(world)]
        dist.all_gather(parts, own.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad):
        # member i receives the sum over members of the gradient of its own rows grad[i]
        # (flat: gloo splits the input along dim 0 into world equal parts)
        flat = grad.contiguous().view(-1)
        own = torch.empty(flat.numel() // grad.shape[0], dtype=grad.dtype, device=grad.device)
        dist.reduce_scatter_tensor(own, flat, group=ctx.group)
        return own.view(grad.shape[1:]), None, None, None


def join_pieces(pieces: dict) -> dict:
    """Per key, its ``(start, [k|v, tokens, ...])`` pieces gathered from a group's members,
    concatenated in token order along dim 1 and split into ``(keys, values)``."""
    out = {}
    for key, ps in pieces.items():
        full = torch.cat([t for _start, t in sorted(ps, key=lambda x: x[0])], dim=1)
        out[key] = (full[0], full[1])
    return out


def gather_kv(own: torch.Tensor, group, index: int, world: int) -> torch.Tensor:
    return _GatherKV.apply(own, group, index, world)


@dataclass
class MergeRuntime:
    """This rank's view of its merge group for one step (``plan.ranks`` holds every member's
    merge packs: a :class:`RankPlan` has exactly those)."""

    plan: StepPlan | RankPlan
    rank: int
    group_index: int
    members: tuple[int, ...] = ()
    layout: dict[int, list[Slice]] = field(default_factory=dict)
    """member rank -> its merged slices sorted by (doc, start): the row order it contributes."""
    maxlen: int = 0
    cp: int = 1
    """Static CP size: every member DP rank is ``cp`` processes."""
    process: int | None = None
    """This process (default ``rank``; under static CP, ``rank * cp + member``)."""

    def __post_init__(self) -> None:
        m = self.plan.merges[self.group_index]
        self.members = tuple(sorted(m.ranks))
        docs = set(m.docs)
        for r in self.members:
            rs = self.plan.ranks[r]
            sl = sorted(
                (s for p in rs.forward if p.merge is not None for s in p.slices if s.doc in docs),
                key=lambda s: (s.doc, s.start),
            )
            for d in docs:
                if not any(s.doc == d for s in sl):
                    raise PlanError(
                        f"merge group {self.group_index}: rank {r} holds no slice of document #{d}; every member needs a share"
                    )
            self.layout[r] = sl
        self.processes = merge_processes(self.members, self.cp)
        # rows every process sends: the one rule the execution model prices
        self.maxlen = merge_layer_tokens(self.plan, self.group_index, self.cp) // len(
            self.processes
        )
        self.group = merge_group(self.processes)
        self.index = self.processes.index(self.rank if self.process is None else self.process)
        self.docs = docs

    def rows(self, process: int) -> list[tuple[Slice, int, int]]:
        """The token ranges of merged slices ``process`` contributes, in its row order."""
        rank, member = divmod(process, self.cp)
        return [
            (s, a, b)
            for s in self.layout[rank]
            for a, b in cp_chunks(s.start, s.end, self.cp, member)
        ]

    def gather(
        self, own: dict[Slice, tuple[torch.Tensor, torch.Tensor]]
    ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Full keys/values of every merged document at one layer from this process's ``own``
        slice -> (k, v) of its rows there: doc -> (k, v) over ``[0, length)``."""
        mine = self.layout[self.rank]
        kv = torch.stack(
            [torch.cat([own[s][0] for s in mine]), torch.cat([own[s][1] for s in mine])]
        )
        kv = F.pad(kv, (0, 0, 0, 0, 0, self.maxlen - kv.shape[1]))
        gathered = gather_kv(kv, self.group, self.index, len(self.processes))
        pieces: dict[int, list[tuple[int, torch.Tensor]]] = {d: [] for d in self.docs}
        for m_i, p in enumerate(self.processes):
            off = 0
            for s, a, b in self.rows(p):
                pieces[s.doc].append((a, gathered[m_i, :, off : off + b - a]))
                off += b - a
        return join_pieces(pieces)

    def gather_documents(
        self, tokens: dict[Slice, torch.Tensor], masks: dict[Slice, torch.Tensor] | None
    ) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor] | None]:
        """All-gather the token ids and loss masks of merged slices (``tokens``, ``masks``:
        this DP rank's merged slices; ``masks=None``: the data has none) in one call of
        :data:`~slimdata.execution.merge.MERGE_TOKEN_ROWS` rows of
        :func:`~slimdata.execution.merge.merge_token_width` integers per process, the
        execution model's step-start exchange: doc -> full row of ids, and of masks. Every
        process sends its DP rank's whole slices; each slice is read once."""
        mine = self.layout[self.rank]
        ids = torch.cat([tokens[s] for s in mine]).long()
        mask = torch.ones_like(ids) if masks is None else torch.cat([masks[s] for s in mine]).long()
        width = merge_token_width(self.plan, self.group_index)
        rows = F.pad(torch.stack([ids, mask]), (0, width - ids.shape[0]))
        parts = [torch.empty_like(rows) for _ in self.processes]
        dist.all_gather(parts, rows, group=self.group)
        pieces: dict[int, list[tuple[int, torch.Tensor]]] = {d: [] for d in self.docs}
        for m_i, p in enumerate(self.processes):
            if p % self.cp:
                continue  # the CP group's first member already sent these slices
            off = 0
            for s in self.layout[p // self.cp]:
                pieces[s.doc].append((s.start, parts[m_i][:, off : off + s.tokens]))
                off += s.tokens
        full = {
            d: torch.cat([t for _s, t in sorted(ps, key=lambda x: x[0])], dim=1)
            for d, ps in pieces.items()
        }
        ids_of = {d: r[0] for d, r in full.items()}
        return ids_of, None if masks is None else {d: r[1] for d, r in full.items()}

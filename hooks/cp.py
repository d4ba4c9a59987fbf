"""Static context parallelism at run time: every pack of a DP rank runs on its CP group.

A plan solved with ``Layout.cp = k`` has one RankStep per DP rank; run with ``k * dp``
processes, rank ``r`` is member ``r % k`` of the CP group of DP rank ``r // k`` (Megatron
orders TP-CP-DP: a group is ``k`` consecutive ranks). Every member runs the DP rank's whole
schedule -- the same packs, calls and collectives in the same order -- on its own tokens of
every slice: the load-balanced chunks of :func:`slimdata.execution.cp.cp_chunks` (``2k``
chunks per slice, member ``i`` holds chunks ``i`` and ``2k - 1 - i``), so the simulator's
static-CP model and the runtime split alike.

Per layer a pack's members all-gather the keys/values its queries read: the pack's own
slices and the earlier slices of their documents (the continuation prefix, which each member
keeps as its own chunks in the :class:`~slimdata.hooks.kvstore.KVStore`, ``1 / k`` of the
bytes). The backward reduce-scatters the gradient of the gathered tensor
(:func:`slimdata.hooks.merge.gather_kv`), so every member's chunks -- in the pack or in the
store -- receive the gradient of every member's queries. As in DP-Merge the attention over
the gathered keys/values is checkpointed: a member holds one layer's gathered keys/values at
a time and the backward gathers them again.

Example, ``k = 2``, doc of 12 tokens cut ``[0,8) [8,12)`` in two packs: in pack 1, member 0
queries ``[8,9) [11,12)`` and member 1 ``[9,10) [10,11)``; both gather their chunks of
``[0,8)`` (from the store) and of ``[8,12)``, rebuild keys ``[0,12)``, and member 0's chunk
``[11,12)`` attends to keys ``[0,12)``, its chunk ``[8,9)`` to ``[0,9)`` (bottom-right
causal per chunk).

A member whose share of a pack is empty (every slice shorter than its chunks reach, e.g. a
pack of one 1-token slice) runs one padding token, as Megatron pads every sequence to a
multiple of ``2k``: it has no label and attends only to itself, so every member makes the
same model calls and collectives.

DP-Merge composes with static CP: a merge group of DP ranks runs on all processes of their
CP groups (:class:`slimdata.hooks.merge.MergeRuntime` with ``cp``), each contributing and
querying its chunks of its DP rank's merged slices.

Loss: each member sums its own query tokens' losses divided by the step's global loss-token
count (counted once per token, never ``k`` times); DP's SUM reduction over all ``k * dp``
ranks gives the exact gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from slimdata.hooks.merge import gather_kv, join_pieces, merge_group

from slimdata.errors import ConfigError, PlanError
from slimdata.execution.cp import CpGather, cp_chunks
from slimdata.plan import RankPlan, Slice, StepPlan

__all__ = ["CpRuntime", "cp_runtime", "plan_cp"]

Chunk = tuple[Slice, int, int]
"""A member's token range ``[a, b)`` of one slice."""


def plan_cp(plan: StepPlan | RankPlan, cp: int | None) -> int:
    """The static CP size to run ``plan`` with: ``cp`` if given, else the planner's
    (``plan.meta["cp"]``), else 1."""
    k = plan.meta.get("cp", 1) if cp is None else cp
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ConfigError(f"cp={k!r}: static context parallelism needs an integer >= 1")
    return k


@dataclass(frozen=True)
class CpRuntime:
    """This process's place in its CP group for one step."""

    cp: int
    """Members per group."""
    member: int
    """This process's index in its group."""
    group: object
    """The group's process subgroup."""

    def chunks(self, s: Slice, member: int | None = None) -> list[tuple[int, int]]:
        """``member``'s (default: this one's) token ranges of ``s``."""
        return cp_chunks(s.start, s.end, self.cp, self.member if member is None else member)

    def local(self, slices: tuple[Slice, ...] | list[Slice]) -> list[Chunk]:
        """This member's chunks of ``slices``, in the row order it runs them."""
        return [(s, a, b) for s in slices for a, b in self.chunks(s)]

    def local_tokens(self, s: Slice) -> int:
        return sum(b - a for a, b in self.chunks(s))

    def gather(
        self, g: CpGather, own: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> dict[Slice, tuple[torch.Tensor, torch.Tensor]]:
        """Whole keys/values of every item of ``g`` (:func:`slimdata.execution.cp.cp_gather`,
        the rule the execution model and simulator price) from this member's chunks ``own``
        (aligned with ``g.items``): one all-gather, each member's rows padded to
        ``g.padded_rows``."""
        kv = torch.stack([torch.cat([k for k, _ in own]), torch.cat([v for _, v in own])])
        kv = F.pad(kv, (0, 0, 0, 0, 0, g.padded_rows - kv.shape[1]))
        gathered = gather_kv(kv, self.group, self.member, self.cp)
        pieces: dict[Slice, list[tuple[int, torch.Tensor]]] = {s: [] for s in g.items}
        for m in range(self.cp):
            off = 0
            for s, a, b in g.member_rows(m):
                pieces[s].append((a, gathered[m, :, off : off + b - a]))
                off += b - a
        return join_pieces(pieces)


def cp_runtime(plan: StepPlan | RankPlan, rank: int, cp: int) -> CpRuntime | None:
    """The CP group of this process (None for ``cp == 1``); creates every group's subgroup,
    collectively, in rank order. ``rank`` is the DP rank the payload is for."""
    if cp == 1:
        return None
    if not dist.is_initialized():
        raise ConfigError(f"cp={cp}: static context parallelism needs torch.distributed")
    world, me = dist.get_world_size(), dist.get_rank()
    if world != plan.dp * cp:
        raise ConfigError(
            f"cp={cp}: the plan has {plan.dp} DP ranks, so it runs on {plan.dp * cp} processes "
            f"({plan.dp} groups of {cp}), not {world}"
        )
    if me // cp != rank:
        raise PlanError(
            f"process {me} is in the CP group of DP rank {me // cp} but got the payload of "
            f"DP rank {rank}: hand process r the payload of DP rank r // {cp}"
        )
    groups = [merge_group(tuple(range(g * cp, (g + 1) * cp))) for g in range(plan.dp)]
    return CpRuntime(cp=cp, member=me % cp, group=groups[rank])

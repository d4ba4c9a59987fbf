"""How a DP-Merge group exchanges keys/values, as the runtime issues it
(:mod:`slimdata.hooks.merge`): the tokens of one layer's gathered K/V and the collectives per
layer, and the step's one exchange of the merged documents' token ids and loss masks
(:func:`merge_token_bytes`). The execution model (:mod:`slimdata.execution.program`) lists them; the simulator's CP
model (:mod:`slimdata.sim.cp`) times them.
"""

from __future__ import annotations

from collections.abc import Sequence

from slimdata.execution.cp import member_rows
from slimdata.plan import RankPlan, StepPlan
from slimdata.plan.pipeline import merge_exchange_tokens

__all__ = [
    "MERGE_TOKEN_ROWS",
    "merge_collectives",
    "merge_layer_tokens",
    "merge_share_tokens",
    "merge_token_bytes",
    "merge_token_width",
]

MERGE_TOKEN_ROWS = 2
"""Rows of the step-start token exchange of a merge group: token ids and the loss mask (all
ones when the data has none), 8-byte integers (:func:`merge_token_bytes`)."""


def merge_layer_tokens(plan: StepPlan | RankPlan, group: int, cp: int = 1) -> int:
    """Tokens of one layer's gathered K/V of merge group ``group``, as the runtime exchanges
    them (:func:`slimdata.plan.pipeline.merge_exchange_tokens` of the members' shares in
    their merge packs). On top of static CP ``cp`` every member DP rank is ``cp`` processes,
    each sending its :func:`~slimdata.execution.cp.cp_chunks` of the rank's merged slices
    padded to the longest process's rows: shares ``[5, 3]`` at ``cp = 2`` (rows 2 and 3 of
    the 5 tokens in chunks of 2, rows 1 and 2 of the 3 in chunks of 1) gather ``4 * 3 = 12``
    tokens (``2 * 5 = 10`` at ``cp = 1``). A member's :class:`~slimdata.plan.RankPlan` holds
    every member's merge packs, so the runtime sizes its gather by this too."""
    return merge_share_tokens(merged_slice_tokens(plan, group), cp)


def merged_slice_tokens(plan: StepPlan | RankPlan, group: int) -> list[list[int]]:
    """Per member of merge group ``group`` (its ranks in order): the tokens of each of its
    slices of the merged documents in its merge packs."""
    m = plan.merges[group]
    docs = set(m.docs)
    return [
        [
            s.tokens
            for p in plan.ranks[r].forward
            if p.merge is not None
            for s in p.slices
            if s.doc in docs
        ]
        for r in m.ranks
    ]


def merge_token_width(plan: StepPlan | RankPlan, group: int) -> int:
    """Tokens every process of merge group ``group`` sends in the step-start token exchange:
    the largest member DP rank's merged slices, whole (under static CP each of a rank's
    processes sends the rank's slices)."""
    return max((sum(sl) for sl in merged_slice_tokens(plan, group)), default=0)


def merge_token_bytes(plan: StepPlan | RankPlan, group: int, cp: int = 1) -> float:
    """Bytes of the step-start exchange of merge group ``group``'s documents: every one of
    its processes (``cp`` per member DP rank) all-gathers :data:`MERGE_TOKEN_ROWS` rows of
    :func:`merge_token_width` 8-byte integers, so that each member can run its share of the
    documents (token ids) and label it (loss masks). Members of 3 and 5 tokens at ``cp = 1``:
    ``2 * 2 * 5 * 8 = 160`` bytes."""
    processes = len(plan.merges[group].ranks) * cp
    return float(processes * MERGE_TOKEN_ROWS * merge_token_width(plan, group) * 8)


def merge_share_tokens(shares: Sequence[Sequence[int]], cp: int = 1) -> int:
    """:func:`merge_layer_tokens` of a group whose members' merged slices have these lengths
    (one list per member; the plan's slices, a run of a document's slices one slice):
    :func:`~slimdata.plan.pipeline.merge_exchange_tokens` of the members' tokens, or on top
    of static CP of every process's rows (:func:`~slimdata.execution.cp.member_rows`).
    ``[[5], [3]]`` at ``cp = 2``: ``12``."""
    if cp == 1:
        return merge_exchange_tokens([sum(sl) for sl in shares])
    return merge_exchange_tokens(
        [int(rows) for sl in shares for rows in member_rows(sl, cp).sum(axis=0)]
    )


def merge_collectives(kind: str, recomputed: bool = False) -> int:
    """Ring collectives per layer of a merge pack, each over :func:`merge_layer_tokens`'s
    keys/values, as the runtime issues them (:mod:`slimdata.hooks.merge`): the forward
    all-gathers the members' keys/values (1); the backward gathers them again (its attention
    is checkpointed, so a member holds one layer's gathered K/V at a time; under
    ``recompute="full"`` the layer's own recomputation is that re-gather) and
    reduce-scatters their gradient, each member receiving the summed gradient of its own rows
    (2); a merge pack ``recomputed`` whole by the executor (lockstep FSDP rules) first
    re-runs its forward, one gather more (3).
    The recompute policy changes no count."""
    if kind == "F":
        return 1
    return 3 if recomputed else 2

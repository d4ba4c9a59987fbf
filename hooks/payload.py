"""What one rank needs for one step: the plan (the whole :class:`StepPlan` or the rank's view
of it, :class:`RankPlan`, as plan shards store it) and the tokens of its slices.

``tokens`` holds this rank's tokens in forward-pack slice order (the plan-shard layout):
for ``forward = [[(0,0,4)], [(0,4,6), (1,0,3)]]`` it is ``doc0[0:4] + doc0[4:6] + doc1[0:3]``.
``loss_mask`` (optional, same alignment) is 1 where the token's next-token prediction counts;
without it every token but a document's last counts (``Document.loss_tokens = length - 1``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from slimdata.errors import PlanError
from slimdata.plan import RankPlan, Slice, StepPlan

__all__ = ["StepPayload", "make_payload"]


@dataclass(frozen=True)
class StepPayload:
    """One rank's share of one step."""

    plan: StepPlan | RankPlan
    rank: int
    tokens: np.ndarray
    """uint32/int64 token ids of this rank's slices, in forward-pack slice order."""
    loss_mask: np.ndarray | None = None
    """Optional 0/1 per token, same alignment as ``tokens``."""

    def __post_init__(self) -> None:
        if isinstance(self.plan, RankPlan) and self.plan.rank != self.rank:
            raise PlanError(
                f"payload for rank {self.rank} carries the plan of rank {self.plan.rank}"
            )
        if not 0 <= self.rank < self.plan.dp:
            raise PlanError(f"payload for rank {self.rank} but the plan has {self.plan.dp} ranks")
        want = self.plan.ranks[self.rank].tokens
        if len(self.tokens) != want:
            why = (
                ": plan shards of `slimdata plan --lengths` carry no tokens; to train, plan from "
                "the build's shards (`slimdata plan SHARDS`) or use a DocumentLoader"
                if len(self.tokens) == 0
                else ""
            )
            raise PlanError(
                f"step {self.plan.step} rank {self.rank}: payload has {len(self.tokens)} tokens, "
                f"plan needs {want}{why}"
            )
        if self.loss_mask is not None and len(self.loss_mask) != want:
            raise PlanError(
                f"step {self.plan.step} rank {self.rank}: loss_mask has {len(self.loss_mask)} entries, plan needs {want}"
            )

    def view(self) -> RankPlan:
        """This rank's view of the plan: what the executor runs from."""
        if isinstance(self.plan, RankPlan):
            return self.plan  # its rank checked on construction
        return self.plan.rank_view(self.rank)

    def slice_tokens(self) -> dict[Slice, np.ndarray]:
        """Slice -> its token ids (views into ``tokens``)."""
        out, off = {}, 0
        for s in self.plan.ranks[self.rank].slices():
            out[s] = self.tokens[off : off + s.tokens]
            off += s.tokens
        return out

    def slice_mask(self) -> dict[Slice, np.ndarray] | None:
        if self.loss_mask is None:
            return None
        out, off = {}, 0
        for s in self.plan.ranks[self.rank].slices():
            out[s] = self.loss_mask[off : off + s.tokens]
            off += s.tokens
        return out


def make_payload(
    plan: StepPlan,
    rank: int,
    doc_tokens: Mapping[int, np.ndarray] | Sequence[np.ndarray],
    doc_masks: Mapping[int, np.ndarray] | Sequence[np.ndarray] | None = None,
) -> StepPayload:
    """Cut documents (indexed like ``plan.docs``) into ``rank``'s payload."""
    slices = list(plan.ranks[rank].slices())
    toks = [np.asarray(doc_tokens[s.doc])[s.start : s.end] for s in slices]
    tokens = np.concatenate(toks) if toks else np.zeros(0, dtype=np.uint32)
    mask = None
    if doc_masks is not None:
        ms = [np.asarray(doc_masks[s.doc])[s.start : s.end] for s in slices]
        mask = np.concatenate(ms) if ms else np.zeros(0, dtype=np.uint8)
    return StepPayload(plan=plan, rank=rank, tokens=tokens, loss_mask=mask)

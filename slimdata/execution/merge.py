"""How a DP-Merge group exchanges keys/values, as the runtime issues it
(:mod:`slimdata.hooks.merge`): the tokens of one layer's gathered K/V and the collectives per
layer. The execution model (:mod:`slimdata.execution.program`) lists them; the simulator's CP
model (:mod:`slimdata.sim.cp`) times them.
"""

from __future__ import annotations

from slimdata.cost import CostModel
from slimdata.plan import StepPlan
from slimdata.plan.pipeline import merge_exchange_tokens

__all__ = ["merge_collectives", "merge_layer_tokens"]


def merge_layer_tokens(plan: StepPlan, group: int) -> int:
    """Tokens of one layer's gathered K/V of merge group ``group``, as the runtime exchanges
    them (:func:`slimdata.plan.pipeline.merge_exchange_tokens` of the members' shares in
    their merge packs)."""
    m = plan.merges[group]
    docs = set(m.docs)
    shares = [
        sum(
            s.tokens
            for p in plan.ranks[r].forward
            if p.merge is not None
            for s in p.slices
            if s.doc in docs
        )
        for r in m.ranks
    ]
    return merge_exchange_tokens(shares)


def merge_collectives(kind: str, cost: CostModel, recomputed: bool = False) -> int:
    """Ring collectives per layer of a merge pack, each over :func:`merge_layer_tokens`'s
    keys/values, as the runtime issues them (:mod:`slimdata.hooks.merge`): the forward
    all-gathers the members' keys/values (1); the backward gathers them again (its attention
    is checkpointed, so a member holds one layer's gathered K/V at a time) and
    reduce-scatters their gradient, each member receiving the summed gradient of its own rows
    (2); a backward that re-runs the forward first gathers once more (3): a merge pack
    ``recomputed`` by the executor (lockstep FSDP rules), or any with ``recompute="full"``."""
    if kind == "F":
        return 1
    return 3 if recomputed or cost.recompute == "full" else 2

"""Plan a whole epoch: oversize policy, seeded batches, one solve per step, plan shards.

This is what ``slimdata plan`` and ``slimdata build --plan`` call.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from slimdata.cost import CostModel
from slimdata.plan.types import Document, StepPlan
from slimdata.solver.config import PlanConfig
from slimdata.solver.layout import Layout
from slimdata.solver.planshards import TokenSource, write_plan_shards

__all__ = ["plan_epoch", "write_epoch_plan"]


def plan_epoch(
    docs: Sequence[Document],
    layout: Layout,
    *,
    global_batch_tokens: int,
    strategy: str = "slimpack",
    seed: int = 0,
    cost: CostModel | None = None,
    oversize: str = "error",
    **options: Any,
) -> Iterator[StepPlan]:
    """Yield the plan of every step of epoch 0 under :class:`PlanConfig`'s rules (the ones
    the runtime loaders apply): the oversize rule against ``layout.context``, seeded batches
    of <= ``global_batch_tokens``, one ``solve`` per batch."""
    config = PlanConfig(
        layout=layout,
        global_batch_tokens=global_batch_tokens,
        strategy=strategy,
        seed=seed,
        oversize=oversize,
        cost=cost,
    )
    for step, batch in enumerate(config.batches(docs)):
        yield config.solve(batch, step, **options)


def write_epoch_plan(
    docs: Sequence[Document],
    out: str | Path,
    *,
    nodes: int,
    ranks_per_node: int,
    global_batch_tokens: int,
    memory_gib: float,
    strategy: str = "slimpack",
    seed: int = 0,
    cost: CostModel | None = None,
    context: int = 131072,
    mode: str = "free",
    oversize: str = "error",
    tokens_of: TokenSource | None = None,
    workers_per_rank: int = 1,
    **options: Any,
) -> dict[str, Any]:
    """Solve an epoch for ``nodes x ranks_per_node`` DP ranks and write plan shards to ``out``.

    Returns the summary written to ``out/plan.json`` (steps, layout, strategy, mean
    imbalance, per-step loss tokens), plus the total solve milliseconds that it leaves out.
    """
    dp = nodes * ranks_per_node
    layout = Layout(
        dp=dp, ranks_per_node=ranks_per_node, memory_gib=memory_gib, context=context, mode=mode
    )
    plans = list(
        plan_epoch(
            docs,
            layout,
            global_batch_tokens=global_batch_tokens,
            strategy=strategy,
            seed=seed,
            cost=cost,
            oversize=oversize,
            **{"validate": False, **options},  # write_plan_shards validates every plan once
        )
    )
    settings = {
        "seed": seed,
        "global_batch_tokens": global_batch_tokens,
        "memory_gib": memory_gib,
        "context": context,
        "mode": mode,
        "oversize": oversize,
        "cost_model": (cost.label if cost is not None else "llama-8b (analytic)"),
    }
    return write_plan_shards(
        plans,
        out,
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        tokens_of=tokens_of,
        workers_per_rank=workers_per_rank,
        extra={**settings, **_epoch_stats(plans)},
    )


def _epoch_stats(plans: Sequence[StepPlan]) -> dict[str, Any]:
    """Mean imbalance over the steps, total solve milliseconds (not written to plan.json:
    a timing) and merge-group count of an epoch's plans."""
    return {
        "mean_imbalance": float(np.mean([p.meta.get("imbalance", 1.0) for p in plans]))
        if plans
        else 1.0,
        "solve_ms_total": float(sum(p.meta.get("solve_ms", 0.0) for p in plans)),
        "merge_groups": int(sum(len(p.merges) for p in plans)),
    }

"""Plan a whole epoch: oversize policy, seeded batches, one solve per step, plan shards.

This is what ``slimdata plan`` and ``slimdata build --plan`` call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from slimdata.cost import CostModel
from slimdata.errors import ConfigError
from slimdata.plan.types import Document, StepPlan
from slimdata.solver.batches import batch_warnings
from slimdata.solver.config import PlanConfig
from slimdata.solver.layout import Layout
from slimdata.solver.options import DEFAULT_OPTIONS, SolveOptions
from slimdata.solver.planshards import TokenSource, write_plan_shards

__all__ = ["epoch_layout", "plan_epoch", "write_epoch_plan"]


def plan_epoch(
    docs: Sequence[Document],
    layout: Layout,
    *,
    global_batch_tokens: int,
    strategy: str = "slimpack",
    seed: int = 0,
    cost: CostModel | None = None,
    oversize: str = "error",
    options: SolveOptions = DEFAULT_OPTIONS,
    validate: bool = True,
    progress: bool = False,
) -> Iterator[StepPlan]:
    """Yield the plan of every step of epoch 0 under :class:`PlanConfig`'s rules (the ones
    the runtime loaders apply): the oversize rule against ``layout.context``, seeded batches
    of <= ``global_batch_tokens``, one ``solve`` per batch. Under static CP
    (``layout.cp > 1``) every plan records it in ``meta["cp"]`` (:func:`solve`), which the
    runtime reads.
    ``progress``: a bar of the steps solved on standard error, when it is a terminal."""
    config = PlanConfig(
        layout=layout,
        global_batch_tokens=global_batch_tokens,
        strategy=strategy,
        seed=seed,
        oversize=oversize,
        cost=cost,
    )
    batches = config.batches(docs)
    for step, batch in enumerate(_steps_bar(batches, progress, layout.cp)):
        yield config.solve(batch, step, options=options, validate=validate)


def _steps_bar(batches: list[list[Document]], progress: bool, cp: int) -> Iterable[list[Document]]:
    """``batches``, counted by a progress bar on standard error when ``progress`` and it is a
    terminal (tqdm's ``disable=None``)."""
    if not progress:
        return batches
    from tqdm.auto import tqdm

    desc = "plan" if cp == 1 else f"plan (cp {cp})"
    return tqdm(batches, desc=desc, unit="step", disable=None)


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
    cp: int = 1,
    options: SolveOptions = DEFAULT_OPTIONS,
    progress: bool = False,
    opened: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Solve an epoch for ``nodes x ranks_per_node`` ranks and write plan shards to ``out``.

    ``cp > 1``: static context parallelism, the ranks form ``nodes * ranks_per_node / cp``
    DP ranks of ``cp`` consecutive ranks each (:attr:`Layout.cp`); every rank of a group gets
    its DP rank's payload. Returns the summary written to ``out/plan.json`` (steps, layout,
    strategy, mean imbalance, per-step loss tokens), plus what it leaves out: the total solve
    milliseconds and ``warnings`` (:func:`~slimdata.solver.batches.batch_warnings`).
    ``progress``: a bar of the steps solved (:func:`plan_epoch`). ``opened``: called once the
    epoch is solved and the shard writer holds ``out``, before its first shard
    (:func:`~slimdata.solver.planshards.write_plan_shards`).
    """
    layout = epoch_layout(nodes, ranks_per_node, cp, memory_gib, context, mode)
    plans = plan_epoch(
        docs,
        layout,
        global_batch_tokens=global_batch_tokens,
        strategy=strategy,
        seed=seed,
        cost=cost,
        oversize=oversize,
        options=options,
        validate=False,  # write_plan_shards validates every plan once
        progress=progress,
    )
    metas: list[dict[str, Any]] = []  # each plan's meta and merge groups, as it is written
    settings = {
        "seed": seed,
        "global_batch_tokens": global_batch_tokens,
        "memory_gib": memory_gib,
        "context": context,
        "mode": mode,
        "oversize": oversize,
        "cost_model": (cost.label if cost is not None else "llama-8b (analytic)"),
    }
    summary = write_plan_shards(
        _recording(plans, metas),  # solved, checked and encoded one step at a time
        out,
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        tokens_of=tokens_of,
        workers_per_rank=workers_per_rank,
        extra=lambda: {**settings, **_epoch_stats(metas)},
        cp=cp,
        opened=opened,
    )
    steps = [m["tokens"] for m in metas]
    corpus = sum(d.length for d in docs)
    return {**summary, "warnings": batch_warnings(steps, corpus, global_batch_tokens)}


def _recording(plans: Iterator[StepPlan], metas: list[dict[str, Any]]) -> Iterator[StepPlan]:
    """``plans``, each one's meta (and its merge-group count as ``merge_groups``, its token
    count as ``tokens``) appended to ``metas`` as it passes: :func:`_epoch_stats` and the
    batch warnings need no more of them."""
    for p in plans:
        metas.append({**p.meta, "merge_groups": len(p.merges), "tokens": p.tokens})
        yield p


def epoch_layout(
    nodes: int, ranks_per_node: int, cp: int, memory_gib: float, context: int, mode: str
) -> Layout:
    """The layout an epoch is solved for: ``nodes * ranks_per_node / cp`` DP ranks."""
    ranks = nodes * ranks_per_node
    if not isinstance(cp, int) or isinstance(cp, bool) or cp < 1:
        raise ConfigError(f"cp={cp!r}: static context parallelism needs an integer >= 1 (1: none)")
    if ranks % cp:
        raise ConfigError(
            f"cp={cp!r} does not divide the {ranks} ranks ({nodes} nodes x {ranks_per_node} "
            "ranks per node): choose a static CP size that divides them"
        )
    return Layout(
        dp=ranks // cp,
        ranks_per_node=max(1, ranks_per_node // cp),
        memory_gib=memory_gib,
        context=context,
        mode=mode,
        cp=cp,
    )


def _epoch_stats(metas: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean imbalance over the steps, total solve milliseconds (not written to plan.json:
    a timing) and merge-group count of an epoch's plans, from their metas (:func:`_recording`)."""
    return {
        "mean_imbalance": float(np.mean([m.get("imbalance", 1.0) for m in metas]))
        if metas
        else 1.0,
        "solve_ms_total": float(sum(m.get("solve_ms", 0.0) for m in metas)),
        "merge_groups": int(sum(m["merge_groups"] for m in metas)),
    }

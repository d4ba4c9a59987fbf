"""``dcp``: Megatron-LM dynamic context parallelism (``--sequence-packing-scheduler
default_dynamic_cp``; NVIDIA/Megatron-LM PR #2282, ``megatron/core/datasets/data_schedule.py``
``DefaultDynamicCPScheduler`` and ``data_schedule_utils.py`` ``dcp_gpus_needed`` /
``dcp_get_total_workload``).

Every sequence gets its own CP size from its length, and the DP x CP ranks are balanced on
Megatron's workload estimate:

- ``cp(L) = max(min_cp, 2 ** ceil(log2(ceil(L / max_seqlen_per_rank))))``
  (``dcp_gpus_needed``); a sequence of at most ``max_seqlen_per_rank`` tokens runs on one rank;
- workload ``L ** 2 / cp(L)`` per member (``dcp_get_total_workload``);
- sequences in decreasing length, each to the least-loaded place it may go (greedy, as
  ``next_hdp_group``): a sequence with ``cp = 1`` to the least-loaded rank; a longer one to
  the least-loaded CP group of its size, or a new aligned group of ``cp`` free ranks;
- a rank's short sequences are packed, in assignment order, into micro-batches of at most
  ``max_seqlen_per_rank`` tokens (THD packing); a CP group runs its sequences as one pack,
  each cut into ``2 * cp`` chunks with member ``i`` holding chunks ``i`` and ``2 cp - 1 - i``
  (the load-balanced layout of Megatron's THD context parallelism).

CP groups are :class:`~slimdata.plan.types.MergeGroup` s, so the simulator prices them with
the same context-parallel cost model as static CP and DP-Merge.

``max_seqlen_per_rank`` defaults to the tokens whose activations and K/V fit
``layout.memory_gib`` on one device (``memory / (act_bytes_per_token + kv_bytes_per_token)``),
capped at the token cap: the value a Megatron user sets so that no rank runs out of memory.

Deviations, stated: (1) a rank belongs to at most one CP group per step (the plan's merge
groups are per step; Megatron may regroup ranks per micro-batch round), so a long sequence
that finds no free aligned group of its size joins the least-loaded existing group of at
least its size; (2) ``cp`` is capped at ``dp`` (Megatron would fail); (3) the rounds of
``next_hdp_group`` (one micro-batch across all ranks per round, with its slack for empty
ranks) become per-rank packs in lockstep mode, equal counts padded with empty packs;
(4) sequences are not padded to a multiple of ``2 * cp`` in the plan: the simulator's CP cost
model charges the padding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from slimdata.cost import CostModel
from slimdata.plan.types import Document, StepPlan
from slimdata.solver.common import BatchView, assemble_plan, default_cost
from slimdata.solver.layout import Layout
from slimdata.solver.options import DEFAULT_OPTIONS, SolveOptions
from slimdata.solver.strategies.base import now

__all__ = ["dcp", "dcp_cp_size", "default_max_seqlen"]


def dcp_cp_size(length: int, max_seqlen_per_rank: int, min_cp: int = 1) -> int:
    """Megatron's ``dcp_gpus_needed``: ``dcp_cp_size(9000, 4096) == 4`` (3 ranks, rounded up)."""
    need = max(min_cp, math.ceil(length / max_seqlen_per_rank), 1)
    return max(min_cp, 2 ** math.ceil(math.log2(need)))


def default_max_seqlen(layout: Layout, cost: CostModel) -> int:
    """Tokens whose activations and K/V fit one device, at most the token cap (>= 128)."""
    per_token = cost.act_bytes_per_token + cost.kv_bytes_per_token
    fit = int(layout.memory_bytes // per_token) if per_token > 0 else layout.token_cap
    return max(128, min(layout.token_cap, fit))


@dataclasses.dataclass
class _Groups:
    """CP groups being built: ranks, documents, per-member workload."""

    ranks: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
    docs: list[list[int]] = dataclasses.field(default_factory=list)


def _place_long(
    k: int, w: float, dp: int, load: np.ndarray, groups: _Groups, taken: np.ndarray
) -> int:
    """Index of the group a ``cp = k`` sequence of workload ``w`` joins (created if new)."""
    # (resulting max load, tie-break: existing groups, then blocks from rank 0, group or -1 - block)
    options: list[tuple[float, int, int]] = []
    for g, rk in enumerate(groups.ranks):
        if len(rk) == k:
            options.append((float(load[list(rk)].max()) + w, len(options), g))
    for b in range(dp // k):
        block = range(b * k, b * k + k)
        if not taken[block].any():
            options.append((float(load[block].max()) + w, len(options), -1 - b))
    if not options:  # deviation (1): the least-loaded larger group (any group if none)
        fallback = [rk for rk in groups.ranks if len(rk) >= k] or groups.ranks
        options = [
            (float(load[list(rk)].max()) + w, i, groups.ranks.index(rk))
            for i, rk in enumerate(fallback)
        ]
    _, _, g = min(options)
    if g < 0:
        b = -1 - g
        groups.ranks.append(tuple(range(b * k, b * k + k)))
        groups.docs.append([])
        taken[b * k : b * k + k] = True
        g = len(groups.ranks) - 1
    return g


def _assign(
    lengths: np.ndarray, dp: int, mslpr: int, min_cp: int
) -> tuple[list[list[int]], _Groups]:
    """Greedy placement (module docstring): short documents per rank, and CP groups."""
    load = np.zeros(dp)
    taken = np.zeros(dp, dtype=bool)
    groups = _Groups()
    short: list[list[int]] = [[] for _ in range(dp)]
    for d in np.argsort(-lengths, kind="stable").tolist():
        L = int(lengths[d])
        k = min(dcp_cp_size(L, mslpr, min_cp), dp)
        w = L * L / k
        if k == 1:
            r = int(np.argmin(load))
            short[r].append(d)
            load[r] += w
            continue
        g = _place_long(k, w, dp, load, groups, taken)
        groups.docs[g].append(d)
        load[list(groups.ranks[g])] += L * L / len(groups.ranks[g])
    return short, groups


def _pack_short(docs: list[int], lengths: np.ndarray, cap: int) -> list[list[int]]:
    """Consecutive documents into packs of at most ``cap`` tokens (THD micro-batches)."""
    packs: list[list[int]] = []
    fill = cap + 1
    for d in docs:
        if fill + int(lengths[d]) > cap:
            packs.append([])
            fill = 0
        packs[-1].append(d)
        fill += int(lengths[d])
    return packs


def _zigzag(d: Document, k: int) -> Document:
    """``d`` cut into ``2 k`` near-equal chunks (``d.length >= 2 k`` assumed by the caller)."""
    n = 2 * k
    cuts = sorted({round(i * d.length / n) for i in range(n + 1)})
    return dataclasses.replace(d, cuts=tuple(cuts))


def dcp(
    batch: Sequence[Document],
    layout: Layout,
    seed: int = 0,
    cost: CostModel | None = None,
    *,
    step: int = 0,
    validate: bool = True,
    options: SolveOptions = DEFAULT_OPTIONS,
) -> StepPlan:
    """Plan one step the way Megatron's dynamic CP does (module docstring); reads
    ``options.max_seqlen_per_rank`` and ``options.min_cp``."""
    t0 = now()
    cost = cost or default_cost()
    dp = layout.dp
    mslpr = options.max_seqlen_per_rank or default_max_seqlen(layout, cost)
    lengths = np.fromiter((d.length for d in batch), dtype=np.int64, count=len(batch))
    short, groups = _assign(lengths, dp, mslpr, options.min_cp)
    docs = list(batch)
    for rk, ds in zip(groups.ranks, groups.docs, strict=True):
        for d in ds:
            docs[d] = _zigzag(docs[d], len(rk))
    view = BatchView.build(docs, cost)
    forward, backward, merge_at = _packs(view, short, groups, lengths, mslpr, layout)
    return assemble_plan(
        view=view,
        layout=layout,
        cost=cost,
        strategy="dcp",
        step=step,
        forward=forward,
        backward=backward,
        merges=[(rk, tuple(ds)) for rk, ds in zip(groups.ranks, groups.docs, strict=True) if ds],
        merge_rank_pack=merge_at,
        mode=layout.mode,
        meta={"seed": seed, "max_seqlen_per_rank": mslpr, "cp_groups": len(groups.ranks)},
        t0=t0,
        validate=validate,
    )


def _packs(
    view: BatchView,
    short: list[list[int]],
    groups: _Groups,
    lengths: np.ndarray,
    mslpr: int,
    layout: Layout,
) -> tuple[list[list[list[int]]], list[list[list[int]]], dict[int, tuple[int, int]]]:
    """Per-rank forward/backward packs of slice indices; the CP pack (if any) first."""
    dp = layout.dp
    fwd: list[list[list[int]]] = [[] for _ in range(dp)]
    merge_at: dict[int, tuple[int, int]] = {}
    for rk, ds in zip(groups.ranks, groups.docs, strict=True):
        if not ds:
            continue
        n = 2 * len(rk)
        for i, r in enumerate(rk):
            mine = [s for d in ds for c, s in enumerate(view.slices_of(d)) if c in (i, n - 1 - i)]
            fwd[r].append(sorted(mine))
            merge_at[r] = (0, 0)
    for r in range(dp):
        for p in _pack_short(short[r], lengths, mslpr):
            fwd[r].append([s for d in p for s in view.slices_of(d)])
    if layout.mode == "lockstep":
        m = max((len(p) for p in fwd), default=0)
        fwd = [p + [[] for _ in range(m - len(p))] for p in fwd]
    bwd = [[list(reversed(pack)) for pack in packs] for packs in fwd]
    return fwd, bwd, merge_at

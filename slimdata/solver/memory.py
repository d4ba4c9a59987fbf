"""Per-rank memory accounting of a plan (the rule the solver enforces and the simulator reads).

Under a rank's execution ``order``, after each event the rank holds:

- the **activations** of every slice whose forward pack has run and whose backward pack has
  not: ``act_bytes_per_token * tokens``;
- the **retained keys/values** of every document with a slice forwarded and a slice not yet
  backwarded on this rank: ``kv_bytes_per_token * (largest end forwarded so far)``. A
  merge-group member retains the K/V of its own merged slices only: the others' arrive one
  layer at a time and are freed after the layer (:meth:`CostModel.gathered_kv_bytes`).

The peak is taken right after each forward pack (when activations are largest); transient
buffers inside a pass (attention workspace, the gradient of the pack being backwarded) and
model states are outside the budget, as ``Layout.memory_gib`` states.

Example: one rank runs a 6-token document as forward packs ``[0,4)``, ``[4,6)`` and one
backward pack; after F1 it holds ``6 * act + 6 * kv`` bytes, the document's whole footprint.
"""

from __future__ import annotations

import numpy as np

from slimdata.cost import CostModel
from slimdata.plan.types import StepPlan

__all__ = ["plan_peak_memory", "rank_memory_trace", "rank_peak_memory"]


def rank_memory_trace(plan: StepPlan, rank: int, cost: CostModel) -> list[float]:
    """Bytes held after each event of ``plan.ranks[rank].order`` (see the module docstring)."""
    rs = plan.ranks[rank]
    act_per, kv_per = cost.act_bytes_per_token, cost.kv_bytes_per_token
    held_act = 0.0
    kv_end: dict[int, int] = {}
    left: dict[int, int] = {}  # tokens of each document on this rank not yet backwarded
    for p in rs.forward:
        for s in p.slices:
            left[s.doc] = left.get(s.doc, 0) + s.tokens
    kv_total = 0.0
    trace: list[float] = []
    for kind, i in rs.order:
        if kind == "F":
            merged = rs.forward[i].merge is not None
            for s in rs.forward[i].slices:
                held_act += act_per * s.tokens
                old = kv_end.get(s.doc, 0)  # K/V tokens of the document held (merged: own)
                new = old + s.tokens if merged else max(s.end, old)
                kv_total += kv_per * (new - old)
                kv_end[s.doc] = new
        else:
            for s in rs.backward[i].slices:
                held_act -= act_per * s.tokens
                left[s.doc] -= s.tokens
                if left[s.doc] == 0:
                    kv_total -= kv_per * kv_end.pop(s.doc, 0)
        trace.append(max(held_act + kv_total, 0.0))
    return trace


def rank_peak_memory(plan: StepPlan, rank: int, cost: CostModel) -> float:
    """Peak bytes of ``rank`` over the step (0 for an idle rank)."""
    return max(rank_memory_trace(plan, rank, cost), default=0.0)


def plan_peak_memory(plan: StepPlan, cost: CostModel) -> np.ndarray:
    """Peak bytes of every rank, shape ``(dp,)``."""
    return np.array([rank_peak_memory(plan, r, cost) for r in range(plan.dp)])

"""Per-device operation orders for pipeline schedules, at pack granularity.

With ``pp`` pipeline stages a rank's packs are the micro-batches that flow through the
stages; forward and backward packs may differ (asymmetric partitioning). An operation is
``(pass, chunk, pack)``; ``chunk`` is the global model chunk (``0 .. pp * v - 1``, device
``chunk % pp`` holds it).

Schedules form a registry of pure functions ``(rank_order, stage, pp, v) -> ops``:

- ``1f1b``: :func:`slimdata.plan.pipeline.one_f_one_b` (stage ``s`` runs the rank's order
  with every backward pack delayed by ``pp - 1 - s`` forward packs; Megatron's 1F1B);
- ``interleaved``: Megatron's interleaved 1F1B: forward ops in groups of ``pp`` packs, each
  group through the device's ``v`` chunks in turn, backward ops likewise with chunks
  reversed; ``(pp - s - 1) * 2 + (v - 1) * pp`` warm-up forward ops, then one forward and
  one backward op alternately. A backward op never precedes the forward ops it needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from slimdata.plan import StepPlan
from slimdata.plan.pipeline import Op, interleave, one_f_one_b, ready_index

__all__ = ["SCHEDULES", "Op", "common_order", "ready_index", "stage_ops"]


def _groups(n: int, pp: int) -> list[range]:
    return [range(g, min(g + pp, n)) for g in range(0, n, pp)]


def interleaved(order: Sequence[tuple[str, int]], stage: int, pp: int, v: int) -> list[Op]:
    nf = sum(1 for k, _ in order if k == "F")
    ready = ready_index(order)
    nb = len(ready)
    chunks = [stage + pp * c for c in range(v)]
    f_ops = [("F", c, i) for grp in _groups(nf, pp) for c in chunks for i in grp]
    b_ops = [("B", c, j) for grp in _groups(nb, pp) for c in reversed(chunks) for j in grp]
    pos = {(c, i): k for k, (_p, c, i) in enumerate(f_ops)}
    needs = [pos.get((c, ready[j]), -1) if ready[j] >= 0 else -1 for _p, c, j in b_ops]
    warmup = (pp - stage - 1) * 2 + (v - 1) * pp + _lag_ops(needs, pp, v)
    ops: list[Op] = []
    placed = -1  # last forward op emitted
    k_max = len(f_ops) - 1
    for q, (_p, c, j) in enumerate(b_ops):
        # needs the forwards of its documents on this chunk: pack ready[j] on chunk c
        target = max(min(k_max, warmup + q), needs[q], placed)
        while placed < target:
            placed += 1
            ops.append(f_ops[placed])
        ops.append(("B", c, j))
    ops.extend(f_ops[placed + 1 :])
    return ops


def _lag_ops(needs: Sequence[int], pp: int, v: int) -> int:
    """Forward ops the warm-up of every stage adds when backward packs wait for later forward
    packs (a lag): how far the latest forward op a backward op needs runs ahead of Megatron's
    ``(v - 1) * pp``. The same on every stage, so the stages' warm-ups still differ by two ops
    as Megatron's do, and each backward op finds the forward ops of its round trip through the
    later stages already queued. 0 without a lag."""
    return max([0, *(need - q - (v - 1) * pp for q, need in enumerate(needs))])


SCHEDULES: dict[str, Callable[[Sequence[tuple[str, int]], int, int, int], list[Op]]] = {
    "1f1b": one_f_one_b,
    "interleaved": interleaved,
}


def stage_ops(
    schedule: str, order: Sequence[tuple[str, int]], stage: int, pp: int, v: int = 1
) -> list[Op]:
    """Operations of the device at ``stage`` for one rank, in execution order."""
    if pp == 1 or (schedule == "interleaved" and v == 1):
        return one_f_one_b(order, stage, pp)
    return SCHEDULES[schedule](order, stage, pp, v)


def common_order(plan: StepPlan) -> tuple[tuple[str, int], ...]:
    """One order every rank can follow in lockstep: the most packs of any rank, and backward
    pack ``j`` after the latest forward any rank needs before it. Equals the ranks' own order
    when they all share it."""
    orders = {rs.order for rs in plan.ranks}
    if len(orders) == 1:
        return next(iter(orders))
    nf = max(len(rs.forward) for rs in plan.ranks)
    nb = max(len(rs.backward) for rs in plan.ranks)
    ready = [-1] * nb
    for rs in plan.ranks:
        for j, r in enumerate(ready_index(rs.order)):
            ready[j] = max(ready[j], r)
    for j in range(1, nb):
        ready[j] = max(ready[j], ready[j - 1])
    return interleave(nf, ready)

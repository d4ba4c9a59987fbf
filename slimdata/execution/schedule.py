"""Per-device operation orders for pipeline schedules, at pack granularity.

With ``pp`` pipeline stages a rank's packs are the micro-batches that flow through the
stages; forward and backward packs may differ (asymmetric partitioning). An operation is
``(pass, chunk, pack)``; ``chunk`` is the global model chunk (``0 .. pp * v - 1``, device
``chunk % pp`` holds it).

Schedules form a registry of pure functions ``(rank_order, stage, pp, v) -> ops``:

- ``1f1b``: :func:`slimdata.plan.pipeline.one_f_one_b` (stage ``s`` runs the rank's order
  with every backward pack delayed by ``pp - 1 - s`` forward packs; Megatron's 1F1B);
- ``interleaved``: Megatron's interleaved 1F1B: forward ops in groups of ``N`` packs
  (:func:`group_size`, Megatron's ``--microbatch-group-size-per-virtual-pipeline-stage``:
  ``pp``, or more where ``pp`` would leave a last group of fewer than ``pp`` packs), each
  group through the device's ``v`` chunks in turn, backward ops likewise with chunks
  reversed; ``(pp - s - 1) * 2 + (v - 1) * N`` warm-up forward ops, then one forward and
  one backward op alternately. A backward op never precedes the forward ops it needs.

Example (``pp = 8``, ``v = 2``, 10 packs): groups of 8 would leave a last group of 2, whose
forwards on the first device's second chunk wait on the last device, itself waiting on that
chunk's backward (Megatron refuses such a count); :func:`group_size` takes one group of 10.

Under ``interleaved`` a device holds :func:`chunks_per_device` model chunks:
``Layout.virtual_stages``, ``SimConfig.virtual_stages`` and ``ExecutionConfig.virtual_stages``
default to :data:`INTERLEAVED_CHUNKS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from slimdata.plan import StepPlan
from slimdata.plan.pipeline import Op, interleave, one_f_one_b, ready_index

__all__ = [
    "INTERLEAVED_CHUNKS",
    "SCHEDULES",
    "Op",
    "chunks_per_device",
    "common_order",
    "group_size",
    "ready_index",
    "stage_ops",
]

INTERLEAVED_CHUNKS = 2
"""Model chunks per device under the interleaved schedule unless a layout says otherwise
(Megatron's usual virtual pipeline size; one chunk per device is plain 1F1B): the one
default of ``Layout``, ``SimConfig``, ``ExecutionConfig`` and the step bound."""


def chunks_per_device(schedule: str, pp: int, virtual_stages: int) -> int:
    """Model chunks each device holds: ``virtual_stages`` under the interleaved schedule with
    ``pp > 1``, else 1 (then every schedule is 1F1B)."""
    return virtual_stages if pp > 1 and schedule == "interleaved" else 1


def group_size(n: int, pp: int) -> int:
    """Packs per group of the interleaved schedule for ``n`` packs on ``pp`` stages: the
    smallest ``N >= pp`` that Megatron runs (``n % N`` is 0 or at least ``pp``; with ``N =
    pp`` that is ``n`` a multiple of ``pp``), ``pp`` when ``n <= pp`` (one group).

    ``group_size(16, 8) == 8``, ``group_size(10, 8) == 10``, ``group_size(20, 8) == 10``
    (two groups of 10; 8 would leave 4), ``group_size(3, 8) == 8``."""
    return next((g for g in range(pp, n + 1) if n % g == 0 or n % g >= pp), pp)


def _groups(n: int, pp: int) -> list[range]:
    return [range(g, min(g + pp, n)) for g in range(0, n, pp)]


def interleaved(order: Sequence[tuple[str, int]], stage: int, pp: int, v: int) -> list[Op]:
    nf = sum(1 for k, _ in order if k == "F")
    ready = ready_index(order)
    nb = len(ready)
    chunks = [stage + pp * c for c in range(v)]
    size = group_size(nf, pp)
    f_ops = [("F", c, i) for grp in _groups(nf, size) for c in chunks for i in grp]
    b_size = group_size(nb, pp)
    b_ops = [("B", c, j) for grp in _groups(nb, b_size) for c in reversed(chunks) for j in grp]
    pos = {(c, i): k for k, (_p, c, i) in enumerate(f_ops)}
    needs = [pos.get((c, ready[j]), -1) if ready[j] >= 0 else -1 for _p, c, j in b_ops]
    warmup = (pp - stage - 1) * 2 + (v - 1) * size + _lag_ops(needs, size, v)
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


def _lag_ops(needs: Sequence[int], size: int, v: int) -> int:
    """Forward ops the warm-up of every stage adds when backward packs wait for later forward
    packs (a lag): how far the latest forward op a backward op needs runs ahead of Megatron's
    ``(v - 1) * size`` (``size``: packs per group, :func:`group_size`). The same on every
    stage, so the stages' warm-ups still differ by two ops as Megatron's do, and each backward
    op finds the forward ops of its round trip through the later stages already queued. 0
    without a lag."""
    return max([0, *(need - q - (v - 1) * size for q, need in enumerate(needs))])


SCHEDULES: dict[str, Callable[[Sequence[tuple[str, int]], int, int, int], list[Op]]] = {
    "1f1b": one_f_one_b,
    "interleaved": interleaved,
}


def stage_ops(
    schedule: str,
    order: Sequence[tuple[str, int]],
    stage: int,
    pp: int,
    v: int = INTERLEAVED_CHUNKS,
) -> list[Op]:
    """Operations of the device at ``stage`` for one rank, in execution order (``v``: model
    chunks per device under ``interleaved``)."""
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

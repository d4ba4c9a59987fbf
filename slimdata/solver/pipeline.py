"""A fast estimate of a lockstep plan's step time under a 1F1B pipeline, used by SlimPack to
choose the pack count and the backward lag of a lockstep plan.

Assumptions (deliberately simple; the simulator, :mod:`slimdata.sim`, is the judge):

- pack ``i`` takes its slowest rank's time (lockstep: FSDP gathers and pipeline stages
  advance pack by pack), split evenly over ``pp`` stages;
- 1F1B at pack granularity, the simulator's stage order
  (:func:`slimdata.plan.pipeline.one_f_one_b`), forward ``i`` on stage
  ``s`` after forward ``i`` on ``s - 1``, backward ``j`` on ``s`` after backward ``j`` on
  ``s + 1``; no communication time.

Example: ``pipeline_time([1, 1], [2, 2], F0 B0 F1 B1, pp=2)`` is 4.5 (stage 0: F0 F1, then
B0 from stage 1 at 2.0, B1 at 3.5; each op takes half its pack).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from slimdata.plan.pipeline import one_f_one_b
from slimdata.plan.types import RankStep, StepPlan

__all__ = ["pipeline_time", "pipeline_times", "plan_pipeline_time"]


def pipeline_time(
    fwd: Sequence[float], bwd: Sequence[float], order: Sequence[tuple[str, int]], pp: int
) -> float:
    """Makespan of the packs ``fwd[i]`` / ``bwd[j]`` (full-model seconds) on ``pp`` stages."""
    return float(pipeline_times(np.asarray(fwd), np.asarray(bwd), order, pp)[0])


def pipeline_times(
    fwd: np.ndarray, bwd: np.ndarray, order: Sequence[tuple[str, int]], pp: int
) -> np.ndarray:
    """:func:`pipeline_time` of several ranks with the same ``order`` at once: ``fwd`` and
    ``bwd`` are ``(packs,)`` or ``(packs, ranks)``; one makespan per rank."""
    f = np.asarray(fwd, dtype=np.float64).reshape(len(fwd), -1) / max(pp, 1)
    b = np.asarray(bwd, dtype=np.float64).reshape(len(bwd), -1) / max(pp, 1)
    ranks = max(f.shape[1], b.shape[1])
    if pp <= 1:
        return f.sum(axis=0) + b.sum(axis=0) if len(f) and len(b) else np.zeros(ranks)
    f_end = np.zeros((pp, len(f), ranks))
    b_end = np.zeros((pp, len(b), ranks))
    clock = np.zeros((pp, ranks))
    for s, kind, i in _op_sequence(tuple(order), pp):
        if kind == "F":
            dep = f_end[s - 1, i] if s > 0 else 0.0
            clock[s] = f_end[s, i] = np.maximum(clock[s], dep) + f[i]
        else:
            dep = b_end[s + 1, i] if s < pp - 1 else 0.0
            clock[s] = b_end[s, i] = np.maximum(clock[s], dep) + b[i]
    return clock.max(axis=0)


def plan_pipeline_time(plan: StepPlan, pp: int) -> float:
    """The planner's step-time estimate of a lockstep ``plan``: every rank's packs (their
    ``MicroPack.cost``) through its own order on ``pp`` stages under 1F1B
    (:func:`~slimdata.solver.pipeline.pipeline_times`), the slowest rank; no communication.
    Tested equal to the critical path of the plan's programs (:mod:`slimdata.execution`)
    where the packs' ``cost`` is the execution model's price (tests/execution)."""
    # on pp > 1 stages, ranks with the same order (every rank of a lockstep plan) go through
    # one call, a column each (elementwise, so each as alone); on one stage each rank alone
    # (a column sum's rounding depends on the array's layout)
    by_order: dict[object, list[RankStep]] = {}
    for rs in plan.ranks:
        key = (tuple(rs.order), len(rs.forward), len(rs.backward)) if pp > 1 else rs.rank
        by_order.setdefault(key, []).append(rs)
    worst = 0.0
    for ranks in by_order.values():
        if len(ranks) == 1:
            f = np.array([p.cost for p in ranks[0].forward])
            b = np.array([p.cost for p in ranks[0].backward])
        else:
            f = np.array([[p.cost for p in rs.forward] for rs in ranks]).T
            b = np.array([[p.cost for p in rs.backward] for rs in ranks]).T
        worst = max(worst, float(pipeline_times(f, b, ranks[0].order, pp).max()))
    return worst


@lru_cache(maxsize=256)
def _op_sequence(order: tuple[tuple[str, int], ...], pp: int) -> tuple[tuple[int, str, int], ...]:
    """Every stage's 1F1B operations ``(stage, pass, pack)`` in an order that respects the
    dependencies (forward ``i`` on ``s`` after ``s - 1``, backward ``j`` on ``s`` after
    ``s + 1``; each stage's own order): the same for every rank with this ``order``."""
    stages = [[(k, i) for k, _c, i in one_f_one_b(order, s, pp)] for s in range(pp)]
    done: dict[tuple[int, str], set[int]] = {(s, k): set() for s in range(pp) for k in "FB"}
    pos = [0] * pp
    out: list[tuple[int, str, int]] = []
    remaining = sum(len(o) for o in stages)
    while remaining:
        progressed = False
        for s in range(pp):
            while pos[s] < len(stages[s]):
                kind, i = stages[s][pos[s]]
                up = s - 1 if kind == "F" else s + 1
                if 0 <= up < pp and i not in done[(up, kind)]:
                    break
                done[(s, kind)].add(i)
                out.append((s, kind, i))
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - 1F1B orders never deadlock
            raise AssertionError("pipeline order deadlocked")
    return tuple(out)

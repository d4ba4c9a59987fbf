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

from slimdata.plan.pipeline import one_f_one_b, ready_index

__all__ = ["pipeline_time"]


def pipeline_time(
    fwd: Sequence[float], bwd: Sequence[float], order: Sequence[tuple[str, int]], pp: int
) -> float:
    """Makespan of the packs ``fwd[i]`` / ``bwd[j]`` (full-model seconds) on ``pp`` stages."""
    if pp <= 1:
        return float(sum(fwd) + sum(bwd))
    nf = len(fwd)
    ready = ready_index(order)
    stages = [[(k, i) for k, _c, i in one_f_one_b(order, s, pp)] for s in range(pp)]
    f_end = [[-1.0] * nf for _ in range(pp)]
    b_end = [[-1.0] * len(ready) for _ in range(pp)]
    pos = [0] * pp
    clock = [0.0] * pp
    remaining = sum(len(o) for o in stages)
    while remaining:
        progressed = False
        for s in range(pp):
            while pos[s] < len(stages[s]):
                kind, i = stages[s][pos[s]]
                if kind == "F":
                    dep = f_end[s - 1][i] if s > 0 else 0.0
                else:
                    dep = b_end[s + 1][i] if s < pp - 1 else 0.0
                if dep < 0:
                    break
                start = max(clock[s], dep)
                end = start + (fwd[i] if kind == "F" else bwd[i]) / pp
                (f_end if kind == "F" else b_end)[s][i] = end
                clock[s] = end
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - 1F1B orders never deadlock
            raise AssertionError("pipeline order deadlocked")
    return max(clock)

"""A fast estimate of a lockstep plan's step time under a 1F1B pipeline, used by SlimPack to
choose the pack count and the backward lag of a lockstep plan.

Assumptions (deliberately simple; the simulator, :mod:`slimdata.sim`, is the judge):

- pack ``i`` takes its slowest rank's time (lockstep: FSDP gathers and pipeline stages
  advance pack by pack), split evenly over ``pp`` stages;
- 1F1B at pack granularity: stage ``s`` runs the plan ``order`` with every backward delayed by
  ``pp - 1 - s`` forwards (the last stage runs ``order`` unchanged), forward ``i`` on stage
  ``s`` after forward ``i`` on ``s - 1``, backward ``j`` on ``s`` after backward ``j`` on
  ``s + 1``; no communication time.

Example: ``pipeline_time([1, 1], [2, 2], F0 B0 F1 B1, pp=2)`` is 4.5 (stage 0: F0 F1, then
B0 from stage 1 at 2.0, B1 at 3.5; each op takes half its pack).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["pipeline_time"]


def pipeline_time(
    fwd: Sequence[float], bwd: Sequence[float], order: Sequence[tuple[str, int]], pp: int
) -> float:
    """Makespan of the packs ``fwd[i]`` / ``bwd[j]`` (full-model seconds) on ``pp`` stages."""
    if pp <= 1:
        return float(sum(fwd) + sum(bwd))
    nf = len(fwd)
    ready: list[int] = []  # last forward before each backward in ``order``
    last = -1
    for kind, i in order:
        if kind == "F":
            last = i
        else:
            ready.append(last)
    stages: list[list[tuple[str, int]]] = []
    for s in range(pp):
        shift = pp - 1 - s
        after: list[list[int]] = [[] for _ in range(max(nf, 1))]
        for j, r in enumerate(ready):
            after[max(min(nf - 1, r + shift), 0)].append(j)
        ops: list[tuple[str, int]] = []
        for i in range(nf):
            ops.append(("F", i))
            ops.extend(("B", j) for j in after[i])
        if nf == 0:
            ops.extend(("B", j) for j in range(len(ready)))
        stages.append(ops)
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

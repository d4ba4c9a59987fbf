"""The step-time estimate of a plan from its programs: the critical path of their computes.
The planner's fast path (:func:`slimdata.solver.pipeline.plan_pipeline_time`, over the same
stage orders and the packs' ``MicroPack.cost``) is checked against it.

Every rank's programs (one per pipeline stage) run their computes in program order; a
forward on chunk ``c`` starts after the same pack's forward on chunk ``c - 1`` and a backward
on ``c`` after the same pack's backward on ``c + 1``; communication is free and ranks do not
wait for each other. The step takes the slowest rank's makespan. On a network that costs
nothing this is the simulator's step time of a lockstep plan without merge groups (the
simulator adds communication, synchronizing collectives and the CP model).

Example: one rank, ``pp = 2``, forward packs of 1 s and backward packs of 2 s (full model),
order ``F0 B0 F1 B1``: stage 0 runs ``F0 F1 B0 B1``, stage 1 ``F0 B0 F1 B1``, every op half
its pack. Stage 0: F0 ends at 0.5, F1 at 1.0; stage 1: F0 at 1.0, B0 at 2.0, F1 at 2.5, B1
at 3.5; stage 0: B0 at 3.0, B1 at 4.5: the step takes 4.5 s.
"""

from __future__ import annotations

import numpy as np

from slimdata.execution.ops import Compute
from slimdata.execution.program import Programs

__all__ = ["critical_path"]


def critical_path(programs: Programs) -> np.ndarray:
    """Makespan of every rank's programs (module docstring), shape ``(dp,)``."""
    n_chunks = len(programs.fractions)
    return np.array(
        [
            _makespan([programs[(r, s)].computes() for s in range(programs.pp)], n_chunks)
            for r in range(programs.dp)
        ]
    )


def _makespan(stages: list[list[Compute]], n_chunks: int) -> float:
    """Run the stages' computes in order, each after its pipeline predecessor."""
    end: dict[tuple[str, int, int], float] = {}
    clock = [0.0] * len(stages)
    pos = [0] * len(stages)
    remaining = sum(len(ops) for ops in stages)
    while remaining:
        progressed = False
        for s, ops in enumerate(stages):
            while pos[s] < len(ops):
                op = ops[pos[s]]
                up = op.chunk - 1 if op.pass_ == "F" else op.chunk + 1
                dep = (op.pass_, up, op.pack)
                if 0 <= up < n_chunks and dep not in end:
                    break
                clock[s] = max(clock[s], end.get(dep, 0.0)) + op.seconds
                end[(op.pass_, op.chunk, op.pack)] = clock[s]
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - pipeline schedules never deadlock
            raise AssertionError("pipeline order deadlocked")
    return max(clock, default=0.0)

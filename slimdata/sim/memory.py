"""Per-device memory over time: the execution model's allocations and frees
(:mod:`slimdata.execution.memory` states the one rule) placed at the simulated start and end
times of the tasks they belong to. At equal times frees happen before allocations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slimdata.execution import Alloc, Compute, Free
from slimdata.sim.dag import StepDag
from slimdata.sim.engine import Timing

__all__ = ["MemoryProfile", "memory_profile"]


@dataclass(frozen=True)
class MemoryProfile:
    """Allocation events sorted per device; ``level`` is the bytes in use after each event."""

    device: np.ndarray
    time: np.ndarray
    level: np.ndarray
    peak: np.ndarray
    """Peak bytes per device."""

    def series(self, device: int) -> tuple[np.ndarray, np.ndarray]:
        """``(times, bytes)`` step function of one device."""
        m = self.device == device
        return self.time[m], self.level[m]


def memory_profile(dag: StepDag, timing: Timing) -> MemoryProfile:
    """The programs' allocations and frees (:mod:`slimdata.execution.memory`, the one rule)
    at the simulated times: an allocation when the next compute's task starts, a free when
    the previous compute's task ends."""
    devs: list[int] = []
    times: list[float] = []
    deltas: list[float] = []
    start, end = timing.start.tolist(), timing.end.tolist()
    task_of = _TaskOf(dag)

    def event(device: int, t: float, delta: float) -> None:
        devs.append(device)
        times.append(t)
        deltas.append(delta)

    for prog in dag.programs:
        task, alloc, freed = -1, 0.0, 0.0  # bytes allocated before / freed after a compute
        for op in prog.ops:
            if isinstance(op, Alloc):
                alloc += op.bytes
            elif isinstance(op, Free):
                freed += op.bytes
            elif isinstance(op, Compute):
                if freed:
                    event(prog.device, end[task], -freed)
                task, freed = task_of(prog.rank, op), 0.0
                if alloc:
                    event(prog.device, start[task], alloc)
                alloc = 0.0
        if freed:
            event(prog.device, end[task], -freed)
    n_dev = dag.dp * dag.pp
    if not devs:
        z = np.zeros(0)
        return MemoryProfile(z.astype(np.int64), z, z, np.zeros(n_dev))
    dev_a = np.asarray(devs, dtype=np.int64)
    time_a, delta_a = np.asarray(times), np.asarray(deltas)
    o = np.lexsort((delta_a, time_a, dev_a))
    dev_a, time_a, delta_a = dev_a[o], time_a[o], delta_a[o]
    total = np.cumsum(delta_a)
    first = np.flatnonzero(np.r_[True, dev_a[1:] != dev_a[:-1]])
    base = np.repeat(total[first] - delta_a[first], np.diff(np.r_[first, len(dev_a)]))
    level = total - base
    peak = np.zeros(n_dev)
    peak[dev_a[first]] = np.maximum.reduceat(level, first)
    return MemoryProfile(dev_a, time_a, level, np.maximum(peak, 0.0))


class _TaskOf:
    """The graph task of a program's compute; -1 for a lockstep slot the rank lacks (it
    allocates nothing)."""

    def __init__(self, dag: StepDag) -> None:
        self.tid = {"F": dag.ftid, "B": dag.btid}
        self.offset = {"F": dag.pt.f_offset.tolist(), "B": dag.pt.b_offset.tolist()}
        self.count = {
            k: np.diff(np.r_[offs, tid.shape[1]]).tolist()
            for k, offs, tid in (("F", dag.pt.f_offset, dag.ftid), ("B", dag.pt.b_offset, dag.btid))
        }

    def __call__(self, rank: int, op: Compute) -> int:
        if op.pack >= self.count[op.pass_][rank]:
            return -1
        return int(self.tid[op.pass_][op.chunk, self.offset[op.pass_][rank] + op.pack])

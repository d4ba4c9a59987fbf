"""Longest-path evaluation of a task graph with fixed per-device orders.

A task runs on one device or on a group of devices together (a synchronizing collective or a
merged pack). It starts when every predecessor has ended (plus the edge's lag, e.g. a
point-to-point transfer; a *start edge* counts from the predecessor's start instead) and when each of its devices has finished its previous task. Member
``m`` spends ``comm[m]`` seconds exchanging (exposed communication) and ``work[m]`` seconds
computing; all members leave the task together, after
``max(max_m(comm[m] + work[m]), overlap)`` seconds, where ``overlap`` is communication that
runs concurrently with the compute (e.g. prefetched FSDP all-gathers).

Evaluation is one topological pass (Kahn), ``O(tasks + edges)``; a cycle (a plan or schedule
that deadlocks) raises :class:`~slimdata.errors.PlanError`.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from slimdata.errors import PlanError

__all__ = ["TaskGraph", "Timing", "evaluate"]


@dataclass
class TaskGraph:
    """Mutable builder: tasks, their devices, durations, and dependency edges."""

    n_devices: int
    kind: list[str] = field(default_factory=list)
    """``F``, ``B`` (compute) or ``AR`` (a collective with no compute)."""
    label: list[tuple[int, int, int]] = field(default_factory=list)
    """``(rank, chunk, pack)`` of compute tasks; ``(-1, stage, -1)`` for collectives."""
    devices: list[tuple[int, ...]] = field(default_factory=list)
    work: list[tuple[float, ...]] = field(default_factory=list)
    comm: list[tuple[float, ...]] = field(default_factory=list)
    overlap: list[float] = field(default_factory=list)
    preds: list[list[tuple[int, float]]] = field(default_factory=list)
    start_preds: list[list[tuple[int, float]]] = field(default_factory=list)
    """``(src, lag)``: this task starts no earlier than ``start(src) + lag``."""
    hidden: list[float] = field(default_factory=list)
    """Communication seconds fully overlapped by the start edges (reported, not timed)."""
    dev_seq: list[list[int]] = field(init=False)

    def __post_init__(self) -> None:
        self.dev_seq = [[] for _ in range(self.n_devices)]

    def add(
        self,
        kind: str,
        label: tuple[int, int, int],
        devices: tuple[int, ...],
        work: tuple[float, ...],
        comm: tuple[float, ...] | None = None,
        overlap: float = 0.0,
    ) -> int:
        """Add a task (appended to nothing yet: call :meth:`place` to fix device order)."""
        t = len(self.kind)
        self.kind.append(kind)
        self.label.append(label)
        self.devices.append(devices)
        self.work.append(work)
        self.comm.append(comm if comm is not None else (0.0,) * len(devices))
        self.overlap.append(overlap)
        self.preds.append([])
        self.start_preds.append([])
        self.hidden.append(0.0)
        return t

    def edge(self, src: int, dst: int, lag: float = 0.0) -> None:
        if src != dst:
            self.preds[dst].append((src, lag))

    def start_edge(self, src: int, dst: int, lag: float) -> None:
        """``dst`` starts at least ``lag`` after ``src`` *starts* (a transfer issued by ``src``)."""
        self.start_preds[dst].append((src, lag))

    def place(self, device: int, task: int) -> None:
        """Append ``task`` to ``device``'s execution order (once per device)."""
        self.dev_seq[device].append(task)

    def __len__(self) -> int:
        return len(self.kind)


@dataclass(frozen=True)
class Timing:
    start: np.ndarray
    end: np.ndarray

    @property
    def makespan(self) -> float:
        return float(self.end.max()) if len(self.end) else 0.0


def evaluate(g: TaskGraph) -> Timing:
    """Start and end time of every task (earliest start given the fixed device orders)."""
    n = len(g)
    preds = [list(p) for p in g.preds]
    for seq in g.dev_seq:
        for a, b in itertools.pairwise(seq):
            preds[b].append((a, 0.0))
    succs: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    spreds = g.start_preds
    for t, ps in enumerate(preds):
        indeg[t] = len(ps) + len(spreds[t])
        for p, _lag in ps:
            succs[p].append(t)
        for p, _lag in spreds[t]:
            succs[p].append(t)
    start = [0.0] * n
    end = [0.0] * n
    queue = deque(t for t in range(n) if indeg[t] == 0)
    done = 0
    work, comm, overlap = g.work, g.comm, g.overlap
    while queue:
        t = queue.popleft()
        done += 1
        s = 0.0
        for p, lag in preds[t]:
            e = end[p] + lag
            if e > s:
                s = e
        for p, lag in spreds[t]:
            e = start[p] + lag
            if e > s:
                s = e
        busy = max(w + c for w, c in zip(work[t], comm[t], strict=True)) if work[t] else 0.0
        start[t] = s
        end[t] = s + max(busy, overlap[t])
        for u in succs[t]:
            indeg[u] -= 1
            if indeg[u] == 0:
                queue.append(u)
    if done != n:
        stuck = next(t for t in range(n) if indeg[t] > 0)
        raise PlanError(
            f"the schedule deadlocks: task {g.kind[stuck]}{g.label[stuck]} on devices "
            f"{g.devices[stuck]} waits on itself (check the plan's order and merge packs)"
        )
    return Timing(np.asarray(start), np.asarray(end))

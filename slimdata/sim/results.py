"""What one simulated step reports, and the lower bound it is judged against."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from slimdata.sim.dag import StepDag
from slimdata.sim.engine import Timing
from slimdata.sim.memory import MemoryProfile
from slimdata.units import GIB

__all__ = ["GIB", "SimResult", "lower_bound", "summarize"]


@dataclass(frozen=True)
class SimResult:
    """Simulated outcome of one step of one plan. Times in seconds, memory in bytes."""

    step_time: float
    lower_bound: float
    """Total compute / devices plus the pipeline fill and drain every schedule pays."""
    work: float
    """Total compute seconds over all devices."""
    bubble: float
    """Fraction of device time not spent computing: ``1 - work / (devices * step_time)``."""
    busy: np.ndarray
    """Compute seconds per device, shape ``(pp, dp)``."""
    imbalance: float
    """``max(busy) * devices / sum(busy)`` (1.0 is perfect balance)."""
    peak_memory: np.ndarray
    """Peak activation + K/V bytes per device, shape ``(pp, dp)``."""
    comm: np.ndarray
    """Communication seconds per device (collectives, exposed or overlapped, and p2p sends)."""
    memory_limit: float = float("inf")
    """The layout's per-device budget, bytes."""
    timeline: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    """Per task and member device: ``device, start, compute_end, end, kind`` (0 F, 1 B, 2 collective)."""
    memory: MemoryProfile | None = field(default=None, repr=False)
    """Memory events; with ``cp > 1`` indexed by CP group (one representative device each)."""
    cp: int = 1
    """Static context-parallel size: ``busy``, ``peak_memory``, ``comm`` and ``timeline`` list
    every real device (the ``cp`` members of a group are identical)."""

    @property
    def peak_memory_gib(self) -> float:
        return float(self.peak_memory.max()) / GIB if self.peak_memory.size else 0.0

    @property
    def comm_time(self) -> float:
        return float(self.comm.max()) if self.comm.size else 0.0

    @property
    def over_memory(self) -> bool:
        return bool(self.peak_memory.max() > self.memory_limit) if self.peak_memory.size else False

    def summary(self) -> SimResult:
        """This result without its timeline and memory events (what a Gantt chart or a
        memory plot reads; megabytes for a long pipeline): what a search keeps of the many
        configurations it simulates."""
        return dataclasses.replace(self, timeline={}, memory=None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_time": self.step_time,
            "lower_bound": self.lower_bound,
            "imbalance": self.imbalance,
            "bubble": self.bubble,
            "peak_memory_gib": self.peak_memory_gib,
            "comm_time": self.comm_time,
            "over_memory": self.over_memory,
            "cp": self.cp,
            "busy": self.busy.tolist(),
        }


def lower_bound(dag: StepDag, busy_total: float) -> float:
    """``(work + sum over devices of unavoidable idle) / devices``.

    The first compute task of the device holding chunk ``s`` waits for some pack's forward
    through chunks ``0 .. s - 1``; after its last backward, that pack's backward still runs
    through chunks ``s - 1 .. 0``. So device ``s`` idles at least
    ``sum_{c < s} (min forward on c + min backward on c)`` (smallest pack per chunk), for any
    schedule of these packs; ``pp == 1`` gives ``work / devices``. Empty packs (no work) are
    left out of the minima: they hold no tokens, so no work waits on them.
    """
    n = dag.dp * dag.pp
    if dag.pp == 1 or n == 0:
        return busy_total / max(n, 1)

    def smallest(work: np.ndarray) -> np.ndarray:  # per chunk, over packs with work
        if not work.shape[1]:
            return np.zeros(dag.chunks)
        m = np.where(work > 0, work, np.inf).min(axis=1)
        return np.where(np.isfinite(m), m, 0.0)

    min_f, min_b = smallest(dag.fwork), smallest(dag.bwork)
    per_chunk = np.cumsum(np.r_[0.0, (min_f + min_b)[: dag.pp - 1]])  # device s: chunks < s
    return (busy_total + dag.dp * float(per_chunk.sum())) / n


def summarize(dag: StepDag, timing: Timing, mem: MemoryProfile, memory_limit: float) -> SimResult:
    g = dag.graph
    n = g.n_devices
    busy = np.zeros(n)
    comm = dag.p2p.copy()
    dev, st, ce, en, kind = [], [], [], [], []
    codes = {"F": 0, "B": 1}
    for t in range(len(g)):
        s, e = timing.start[t], timing.end[t]
        for d, w, c in zip(g.devices[t], g.work[t], g.comm[t], strict=True):
            busy[d] += w
            comm[d] += c + g.overlap[t] + g.hidden[t]
            dev.append(d)
            st.append(s)
            ce.append(s + c + w)
            en.append(e)
            kind.append(codes.get(g.kind[t], 2))
    total = float(busy.sum())
    step = timing.makespan
    k = dag.cp

    def per_device(x: np.ndarray) -> np.ndarray:  # one column per real device
        return np.repeat(x.reshape(dag.pp, dag.dp), k, axis=1)

    timeline = {
        name: np.asarray(v)
        for name, v in (
            ("device", dev),
            ("start", st),
            ("compute_end", ce),
            ("end", en),
            ("kind", kind),
        )
    }
    if k > 1:
        s, grp = np.divmod(timeline["device"].astype(np.int64), dag.dp)
        base = s * dag.dp * k + grp * k
        timeline = {name: np.repeat(v, k) for name, v in timeline.items()}
        timeline["device"] = np.repeat(base, k) + np.tile(np.arange(k), len(base))
    return SimResult(
        step_time=step,
        lower_bound=lower_bound(dag, total),
        work=total * k,
        bubble=1.0 - total / (n * step) if step > 0 else 0.0,
        busy=per_device(busy),
        imbalance=float(busy.max() * n / total) if total > 0 else 1.0,
        peak_memory=per_device(mem.peak),
        comm=per_device(comm),
        memory_limit=memory_limit,
        timeline=timeline,
        memory=mem,
        cp=k,
    )

"""Per-device memory over time: activations, retained K/V, transient merge buffers.

Assumptions (model states, i.e. parameters, gradients and optimizer, are excluded, as in
:attr:`Layout.memory_gib`):

- a slice's activations (``CostModel.act_bytes_per_token`` per token, already shaped by the
  recompute policy, keys and values excluded) are allocated when its forward pack starts and
  freed when its backward pack ends, on the device of every model chunk, scaled by the
  chunk's share of the layers; a slice whose forward pack runs graph-free
  (``PackTimes.f_graph_free``: its backward pack recomputes it) holds them only while its
  forward pack runs and again while its backward pack (recompute plus backward) runs;
- under every recompute policy the per-step K/V store keeps the slice's keys and values
  (``CostModel.kv_bytes_per_token`` per token, counted once: they are not part of the
  activations) from its forward pack's start to its backward pack's end;
- a merge pack (DP-Merge, ``dcp``) holds one layer's gathered K/V of its group's documents
  while it runs (twice that in the backward: K/V and their gradients), as static CP does: the
  exchange is per layer and freed after the layer (design §9);
- at equal times frees happen before allocations;
- with static context parallelism (``cp = k``) a device holds ``1 / k`` of every slice's
  activations and retained K/V, plus the gathered K/V of one layer while a pack runs (twice
  that in the backward), see :mod:`slimdata.sim.cp`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
    pt = dag.pt
    free = pt.f_graph_free[pt.s_fpack]  # slices whose activations are not kept
    held = (np.where(free, 0.0, pt.s_act) + pt.s_kv) / dag.cp  # forward start -> backward end
    passing = np.where(free, pt.s_act, 0.0) / dag.cp  # during each of the two passes only
    devs, times, deltas = [], [], []
    for c in range(dag.chunks):
        d = (c % dag.pp) * dag.dp + pt.s_rank
        f, b = dag.ftid[c][pt.s_fpack], dag.btid[c][pt.s_bpack]
        for t0, t1, nbytes in (
            (timing.start[f], timing.end[b], held),
            (timing.start[f], timing.end[f], passing),
            (timing.start[b], timing.end[b], passing),
        ):
            devs += [d, d]
            times += [t0, t1]
            deltas += [nbytes * dag.fractions[c], -nbytes * dag.fractions[c]]
    if dag.transient:
        t_id, d, b = (np.asarray(x) for x in zip(*dag.transient, strict=True))
        devs += [d.astype(np.int64), d.astype(np.int64)]
        times += [timing.start[t_id.astype(np.int64)], timing.end[t_id.astype(np.int64)]]
        deltas += [b.astype(np.float64), -b.astype(np.float64)]
    n_dev = dag.dp * dag.pp
    if not devs:
        z = np.zeros(0)
        return MemoryProfile(z.astype(np.int64), z, z, np.zeros(n_dev))
    dev_a, time_a, delta_a = np.concatenate(devs), np.concatenate(times), np.concatenate(deltas)
    o = np.lexsort((delta_a, time_a, dev_a))
    dev_a, time_a, delta_a = dev_a[o], time_a[o], delta_a[o]
    total = np.cumsum(delta_a)
    first = np.flatnonzero(np.r_[True, dev_a[1:] != dev_a[:-1]])
    base = np.repeat(total[first] - delta_a[first], np.diff(np.r_[first, len(dev_a)]))
    level = total - base
    peak = np.zeros(n_dev)
    peak[dev_a[first]] = np.maximum.reduceat(level, first)
    return MemoryProfile(dev_a, time_a, level, np.maximum(peak, 0.0))

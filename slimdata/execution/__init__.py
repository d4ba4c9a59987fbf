"""The execution model: what every device does during one step, in order (design §7).

From a :class:`~slimdata.plan.StepPlan`, a :class:`~slimdata.cost.CostModel` and an
:class:`ExecutionConfig` (pipeline stages, DDP or FSDP, static CP), :func:`build_programs`
lists, per DP rank and pipeline stage, a :class:`Program`: the ordered operations

- ``Compute(pass_, chunk, pack, seconds, tokens, pairs, calls, graph_free, recompute,
  merge)``: a forward (``F``) or backward (``B``) pass of one pack on one model chunk, priced
  by :func:`~slimdata.execution.pricing.pack_times` (the cost model summed over the pack's
  slices, per model call, recompute included) as one device computes it
  (:func:`~slimdata.execution.compute.pack_compute`: a static-CP member's share, merged
  slices' chunk efficiency) times the chunk's share of the layers;
- ``Collective(kind, group, bytes)``: DDP gradient all-reduce, FSDP parameter all-gather /
  gradient reduce-scatter per pack pass, DP-Merge and static-CP K/V all-gather / gradient
  reduce-scatter per layer, pipeline send / recv (:data:`~slimdata.execution.ops.COLLECTIVES`);
- ``Alloc(what, bytes)`` / ``Free(what, bytes)``: activations and retained K/V of a pass's
  slices, gathered K/V of a context-parallel pass (:mod:`slimdata.execution.memory`, the one memory
  rule). An allocation takes effect when the next compute starts, a free when the previous
  one ends.

This is the only place where execution order, memory and the shape of communication are
derived: the solver's memory check and pipeline estimate (the compute-only critical path of
the programs, from per-pack times and the stage order: :mod:`slimdata.execution.critical`),
the simulator's task graph and memory profile, and the runtime executor all read it. A
pack's price is :func:`~slimdata.execution.program.pack_prices` (``pack_times`` then
``pack_compute``); solved plans record it per pack (``MicroPack.cost``), which the runtime's
predicted times read.

Example: one rank, one 6-token document, forward packs ``[0,4)`` and ``[4,6)``, one backward
pack, 1 byte of activations and 1 of K/V per token, no parameters::

    Alloc(activations, 4) Alloc(kv, 4) Compute(F, pack 0)
    Alloc(activations, 2) Alloc(kv, 2) Compute(F, pack 1)
    Compute(B, pack 0) Free(activations, 6) Free(kv, 6)

held while each compute runs: 8, 12, 12 bytes; peak 12.
"""

from slimdata.execution.compute import PackCompute, pack_compute
from slimdata.execution.memory import compute_levels, levels, peak
from slimdata.execution.ops import COLLECTIVES, MEMORY, Alloc, Collective, Compute, Free, Program
from slimdata.execution.pricing import PackTimes, chunk_fractions, pack_times
from slimdata.execution.program import (
    ExecutionConfig,
    Programs,
    build_programs,
    pack_prices,
    padded,
)
from slimdata.execution.schedule import (
    INTERLEAVED_CHUNKS,
    common_order,
    stage_ops,
)

__all__ = [
    "COLLECTIVES",
    "INTERLEAVED_CHUNKS",
    "MEMORY",
    "Alloc",
    "Collective",
    "Compute",
    "ExecutionConfig",
    "Free",
    "PackCompute",
    "PackTimes",
    "Program",
    "Programs",
    "build_programs",
    "chunk_fractions",
    "common_order",
    "compute_levels",
    "levels",
    "pack_compute",
    "pack_prices",
    "pack_times",
    "padded",
    "peak",
    "stage_ops",
]

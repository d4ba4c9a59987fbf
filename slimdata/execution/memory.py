"""Device memory of a step: the one rule, read off a program's allocations and frees.

The rule (:mod:`slimdata.execution.program` lists the operations), model states excluded as
:attr:`Layout.memory_gib` states:

- a slice's activations (``CostModel.act_bytes_per_token`` per token, shaped by the
  recompute policy, keys and values excluded) are held from the start of its forward to the
  end of its backward pack, on the device of every model chunk, scaled by the chunk's share
  of the layers; a slice whose forward runs graph-free holds them only while that forward
  runs and again while its (recomputing) backward runs;
- its keys and values (``CostModel.kv_bytes_per_token`` per token, counted once) are held
  from the start of its forward to the end of its backward pack: the runtime's K/V store
  drops a slice after its backward pack (:mod:`slimdata.hooks.executor`), so a document's
  later slices release theirs before its earlier ones are backwarded;
- a context-parallel pass (a merge pack; every pack under static CP) holds one layer's
  gathered K/V while it runs, twice that in the backward (K/V and their gradients): the
  exchange is per layer and freed after the layer (design §9);
- with static CP (``cp = k``) a device holds ``1 / k`` of every slice's bytes;
- transient buffers inside a pass (attention workspace, the gradient of the pack being
  backwarded) are outside the budget.

Example: one rank runs a 6-token document as forward packs ``[0,4)``, ``[4,6)`` and one
backward pack, 1 byte of activations and 1 of K/V per token: levels after each compute
``8, 12, 0``; peak 12.
"""

from __future__ import annotations

import numpy as np

from slimdata.execution.ops import Alloc, Compute, Free, Program

__all__ = ["compute_levels", "gathered_kv_held", "levels", "peak"]


def gathered_kv_held(per_token: float, tokens, kind: str):
    """Bytes a device holds of a context-parallel pass's gathered K/V while the pass runs (a
    merge pack's; every pack's under static CP): one layer's keys and values of ``tokens``
    tokens (a number or an array), ``per_token`` bytes each
    (:meth:`~slimdata.cost.CostModel.gathered_kv_bytes` of one token), in the forward
    (``kind="F"``); twice that in the backward (``"B"``: the keys/values and their
    gradients). The execution model allocates this (:mod:`slimdata.execution.program`), and
    the solver's packers check a pass's buffer with it."""
    return (1 if kind == "F" else 2) * (per_token * tokens)


def _held(program: Program) -> tuple[np.ndarray, np.ndarray]:
    """Bytes held while each compute runs (its allocations made, the frees after it not
    yet), and after it with the frees that follow it: one walk over the ops."""
    held = 0.0
    during: list[float] = []
    after: list[float] = []
    for op in program.ops:
        if isinstance(op, Alloc):
            held += op.bytes
        elif isinstance(op, Free):  # frees follow the compute they end with
            held -= op.bytes
            after[-1] = held
        elif isinstance(op, Compute):
            during.append(held)
            after.append(held)
    return np.asarray(during, dtype=np.float64), np.asarray(after, dtype=np.float64)


def levels(program: Program) -> np.ndarray:
    """Bytes held while each compute of ``program`` runs (its allocations made, the frees
    after it not yet)."""
    return _held(program)[0]


def compute_levels(program: Program) -> np.ndarray:
    """Bytes held after each compute of ``program`` and the frees that follow it (what
    stays between passes)."""
    return np.maximum(_held(program)[1], 0.0)


def peak(program: Program) -> float:
    """Peak bytes of ``program`` (0 for a device that computes nothing)."""
    lv = levels(program)
    return float(max(lv.max(), 0.0)) if len(lv) else 0.0

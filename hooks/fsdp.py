"""FSDP support for the executor: lockstep schedules, padding calls and SUM gradient reduction.

FSDP (FSDP2 ``torch.distributed.fsdp.fully_shard``; FSDP1 ``FullyShardedDataParallel``) issues
collectives in every model forward (parameter all-gather) and every backward call (all-gather
when resharded, gradient reduce-scatter). Every rank must therefore make the *same sequence of
model calls* per step. :func:`run_step <slimdata.hooks.executor.run_step>` guarantees that for
FSDP-wrapped models:

- the plan must be lockstep (:func:`check_lockstep`): every rank has the same forward and
  backward pack counts and the same F/B order, and each merge group runs its forward and
  backward merge packs at the same indices on all members (a ``Layout(mode="lockstep")``
  solver plan qualifies);
- which forward packs keep their graph and which backward packs are unions of them is decided
  from the whole plan (:func:`lockstep_schedule`), never from one rank's packs, so every rank
  makes the same calls: forward pack ``i`` is one forward (graph kept or not, identically on
  all ranks); a union backward pack is one backward call per forward pack of the union; any
  other backward pack is one recomputed forward plus one backward;
- a pack that is empty on some ranks only (lockstep padding) makes a *dummy* call there: the
  model on one token outside any pack context, loss ``0 * sum(logits)``, whose gradient is
  exactly zero; a pack empty on every rank makes no call anywhere;
- FSDP averages gradients over the mesh by default; the executor's loss is already divided by
  the global loss-token count, so the reduction must be a plain SUM. :func:`prepare` sets
  ``set_gradient_divide_factor(1.0)`` and ``set_force_sum_reduction_for_comms(True)`` on every
  FSDP module: the reduce-scatter is then ``ReduceOp.SUM`` with no pre/post division (exact;
  runs on gloo). FSDP1 gets a SUM communication hook.
- FSDP1: a graph kept across a later forward fails in backward (measured: ``setStorage: ...
  out of bounds for storage of size 0``, its unsharded parameters were freed); under FSDP1 every backward pack is recomputed (``lockstep_schedule(keep=False)``):
  FSDP1 only ever sees a forward followed at once by its backward, or a no-grad forward.

Example (2 ranks, packs ``F0 B0 F1 B1``): rank 0's ``B1`` is a union of its ``F1`` but rank 1's
``B1`` is asymmetric -> ``B1`` is recomputed on *both* ranks, and ``F1`` runs without a graph
on both.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from slimdata.hooks.loss import HiddenStates
from torch import nn

from slimdata.plan.schedule import LockstepSchedule, check_lockstep, lockstep_schedule

__all__ = [
    "LockstepSchedule",
    "check_lockstep",
    "dummy_loss",
    "fsdp_kind",
    "fsdp_modules",
    "is_fsdp",
    "lockstep_schedule",
    "prepare",
    "set_gradient_sync",
]


def _fsdp_module_type():
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return None
    return FSDPModule


def fsdp_kind(model: nn.Module) -> str | None:
    """``"fsdp2"`` (``fully_shard`` applied to ``model``), ``"fsdp1"`` (a
    ``FullyShardedDataParallel`` wrapper) or None."""
    t = _fsdp_module_type()
    if t is not None and isinstance(model, t):
        return "fsdp2"
    from torch.distributed.fsdp import FullyShardedDataParallel

    return "fsdp1" if isinstance(model, FullyShardedDataParallel) else None


def is_fsdp(model: nn.Module) -> bool:
    """True when ``model`` is FSDP-wrapped (FSDP2 module or FSDP1 wrapper)."""
    return fsdp_kind(model) is not None


def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    """Every FSDP2 module inside ``model`` (itself included)."""
    t = _fsdp_module_type()
    return [] if t is None else [m for m in model.modules() if isinstance(m, t)]


def _sum_hook(group, grad: torch.Tensor, output: torch.Tensor | None = None) -> None:
    """FSDP1 communication hook: reduce-scatter (sharded) or all-reduce (NO_SHARD), SUM."""
    import torch.distributed as dist

    if output is None:
        dist.all_reduce(grad, group=group)
    else:
        dist.reduce_scatter_tensor(output, grad, group=group)


def prepare(model: nn.Module) -> None:
    """Make FSDP reduce gradients with a plain SUM (see the module docstring). FSDP1: registers
    a SUM communication hook on the root wrapper once (FSDP1 accepts one hook per model; a
    user hook already registered raises)."""
    if fsdp_kind(model) == "fsdp1":
        if not getattr(model, "_slimdata_sum_hook", False):
            model.register_comm_hook(model.process_group, _sum_hook)  # type: ignore[operator]
            # nn.Module.__setattr__ is annotated Tensor | Module but accepts any value
            cast(Any, model)._slimdata_sum_hook = True
        return
    for m in fsdp_modules(model):
        m.set_gradient_divide_factor(1.0)  # type: ignore[operator]
        m.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]


def set_gradient_sync(model: nn.Module, sync: bool) -> None:
    """Turn FSDP's per-backward gradient reduce-scatter on or off (all FSDP modules)."""
    model.set_requires_gradient_sync(sync, recurse=True)  # type: ignore[operator]


def dummy_loss(module: nn.Module, forward, device) -> torch.Tensor:
    """One-token model call outside any pack context with loss ``0 * sum(logits)``: makes the
    same FSDP collectives as a real pack and contributes an exactly zero gradient."""
    ids = torch.zeros(1, dtype=torch.long, device=device)
    out = forward(module, ids, ids)
    return (out.logits() if isinstance(out, HiddenStates) else out).float().sum() * 0.0

"""Gradient checkpointing inside packs: the runtime runs the recompute policy the plan assumed.

``recompute="full"`` (design §5: a layer holds only its input, ``dtype * hidden`` bytes per
token) checkpoints every decoder layer with non-reentrant :func:`torch.utils.checkpoint`; its
forward runs again when the backward reaches it. Slice continuation survives the re-run
because :func:`pack_checkpoint` re-enters the pack that ran the original forward
(:meth:`PackContext.replaying`): the recomputed attention reads the same prefix keys/values
(the store's leaves, or the group's gathered keys/values, re-gathered), stores nothing and
records nothing, and the gradient reaches the stored keys/values once, through the original
graph (the recomputation only refills its saved tensors).

Which modules are decoder layers, first that applies:

- the modules named by :func:`checkpoint_layers` (``model.blocks``, a ``ModuleList``);
- a Hugging Face model's ``_no_split_modules`` classes (``LlamaDecoderLayer``...); where HF's
  own checkpointing is on (``gradient_checkpointing_enable()``), its checkpoint function is
  swapped for :func:`pack_checkpoint` for the step;
- calls a custom model makes to :func:`recompute_layer` (a layer body that is no module).

``recompute="selective"`` -- the cost model's norms-and-SwiGLU recompute -- checkpoints every
norm module and runs every Llama-style MLP through :func:`~slimdata.hooks.selective.swiglu_down`
for the step (:mod:`slimdata.hooks.selective`); a norm's recomputation re-enters its pack the
same way (it reads no keys/values).
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from slimdata.hooks.continuation import active_context, checkpointed_layer
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.checkpoint import checkpoint

from slimdata.errors import ConfigError
from slimdata.plan import StepPlan

__all__ = [
    "RUNTIME_POLICIES",
    "StepRecompute",
    "active_policy",
    "checkpoint_layers",
    "count_checkpoint",
    "decoder_layers",
    "pack_checkpoint",
    "recompute_layer",
    "resolve_policy",
    "step_recompute",
]

RUNTIME_POLICIES = ("none", "selective", "full")
"""Recompute policies :func:`~slimdata.hooks.run_step` runs."""

_LAYERS_ATTR = "_slimdata_checkpoint_layers"


@dataclass
class StepRecompute:
    """The policy of the step being run and how many layer calls it checkpointed."""

    policy: str
    calls: int = 0


_ACTIVE: contextvars.ContextVar[StepRecompute | None] = contextvars.ContextVar(
    "slimdata_recompute", default=None
)


def resolve_policy(recompute: str | None, plan: StepPlan) -> str:
    """``recompute``, else the policy of the cost model the plan was solved with
    (``plan.meta["recompute"]``), else ``none``; refuse an unknown policy."""
    policy = recompute if recompute is not None else plan.meta.get("recompute", "none")
    where = "run_step(recompute=...)" if recompute is not None else "the plan's cost model"
    if policy not in RUNTIME_POLICIES:
        raise ConfigError(f"recompute={policy!r} ({where}): use one of {RUNTIME_POLICIES}")
    return policy


def active_policy() -> str | None:
    """The recompute policy of the step being run (None outside :func:`~slimdata.hooks.run_step`)."""
    state = _ACTIVE.get()
    return state.policy if state is not None else None


def count_checkpoint() -> None:
    """Record one recomputed call (a layer, a norm, an MLP) of the step being run."""
    state = _ACTIVE.get()
    if state is not None:
        state.calls += 1


class _Hold(torch.autograd.Function):
    """Identity that saves its inputs: a checkpoint keeps its layer's inputs alive for the
    recomputation outside ``saved_tensors_hooks``; this shows those bytes to the hooks
    (:class:`~slimdata.hooks.SavedTensorMeter`) without copying them. Inputs that need no
    gradient (rotary ``cos``/``sin``) come out non-differentiable, as they went in."""

    @staticmethod
    def forward(ctx, *xs):
        ctx.save_for_backward(*xs)
        out = tuple(x.view_as(x) for x in xs)
        ctx.mark_non_differentiable(
            *(o for x, o in zip(xs, out, strict=True) if not x.requires_grad)
        )
        return out

    @staticmethod
    def backward(ctx, *grads):
        return grads


def _hold(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``args, kwargs`` with every tensor in them (nested tuples included, e.g. rotary
    ``(cos, sin)``) passed through :class:`_Hold`, when one of them requires grad (otherwise
    the checkpoint saves nothing)."""
    leaves, spec = tree_flatten((args, kwargs))
    idx = [i for i, a in enumerate(leaves) if isinstance(a, torch.Tensor)]
    if any(leaves[i].requires_grad for i in idx):
        held = _Hold.apply(*(leaves[i] for i in idx))
        for i, h in zip(idx, held, strict=True):
            leaves[i] = h
    return tree_unflatten(leaves, spec)


def _pack_contexts() -> tuple[Any, Any]:
    """Checkpoint contexts: nothing around the forward; the recomputation re-enters the pack
    that was active when the forward ran (None outside the executor)."""
    ctx = active_context()
    return nullcontext(), (ctx.replaying() if ctx is not None else nullcontext())


def pack_checkpoint(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` under non-reentrant :func:`torch.utils.checkpoint.checkpoint`,
    recomputed in the backward inside the pack that ran it; a plain call without grad."""
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    count_checkpoint()
    args, kwargs = _hold(args, kwargs)
    return checkpoint(_marked, fn, *args, use_reentrant=False, context_fn=_pack_contexts, **kwargs)


def _marked(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    with checkpointed_layer():
        return fn(*args, **kwargs)


def recompute_layer(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run one decoder layer ``fn(*args, **kwargs)`` of a custom model: checkpointed
    (:func:`pack_checkpoint`) when the step being run has ``recompute="full"``, a plain call
    otherwise (other policies, outside :func:`~slimdata.hooks.run_step`)::

        for i, block in enumerate(self.blocks):
            x = recompute_layer(self.block_forward, i, x, pos)
    """
    state = _ACTIVE.get()
    if state is not None and state.policy == "full":
        return pack_checkpoint(fn, *args, **kwargs)
    return fn(*args, **kwargs)


def checkpoint_layers(model: nn.Module, layers: Iterable[nn.Module]) -> nn.Module:
    """Name ``model``'s decoder layers: under ``recompute="full"``, :func:`~slimdata.hooks.run_step`
    checkpoints each one's ``forward`` for the step (the model is unchanged outside it).
    Returns ``model``. Needed for custom models whose layers are modules; Hugging Face models
    are found without it."""
    mods = tuple(layers)
    bad = [type(m).__name__ for m in mods if not isinstance(m, nn.Module)]
    if bad or not mods:
        raise ConfigError(
            f"checkpoint_layers: need a non-empty list of modules, got {bad or 'none'}"
        )
    object.__setattr__(model, _LAYERS_ATTR, mods)
    return model


def decoder_layers(module: nn.Module) -> tuple[nn.Module, ...]:
    """The decoder layers of ``module``: :func:`checkpoint_layers`' list, else the modules of
    its Hugging Face ``_no_split_modules`` classes (empty when neither applies)."""
    named = getattr(module, _LAYERS_ATTR, None)
    if named is not None:
        return named
    classes = set(getattr(module, "_no_split_modules", None) or ())
    return tuple(m for m in module.modules() if type(m).__name__ in classes)


def _hf_checkpoint(fn: Callable[..., Any], *args: Any) -> Any:
    """Hugging Face's ``_gradient_checkpointing_func`` signature."""
    return pack_checkpoint(fn, *args)


def _layer_forward(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return pack_checkpoint(forward, *args, **kwargs)


_MISSING = object()


@contextmanager
def step_recompute(module: nn.Module, policy: str) -> Iterator[StepRecompute]:
    """Run a step's packs under ``policy``: for ``full``, every decoder layer of ``module``
    checkpointed until the step ends; for ``selective``, its norms and MLPs
    (:func:`~slimdata.hooks.selective.selective_patches`). Refuses a model with Hugging Face
    checkpointing on under any other policy than ``full`` (its recomputation would run outside
    the pack, and the plan assumed another policy)."""
    if policy != "full" and getattr(module, "is_gradient_checkpointing", False):
        raise ConfigError(
            f"the model has gradient checkpointing on but the step's recompute policy is "
            f"{policy!r}: pass run_step(recompute='full') (and plan with it), or call "
            "model.gradient_checkpointing_disable()"
        )
    state = StepRecompute(policy)
    patched: list[tuple[nn.Module, str, Any]] = []
    if policy == "full":
        for layer in decoder_layers(module):
            if getattr(layer, "gradient_checkpointing", False) and layer.training:
                # HF's own checkpointing: its __call__ checkpoints through this function
                attr, new = "_gradient_checkpointing_func", _hf_checkpoint
            else:
                attr, new = "forward", functools.partial(_layer_forward, layer.forward)
            patched.append((layer, attr, layer.__dict__.get(attr, _MISSING)))
            object.__setattr__(layer, attr, new)
    elif policy == "selective":
        from slimdata.hooks.selective import selective_patches  # it builds on this module

        for mod, forward in selective_patches(module):
            patched.append((mod, "forward", mod.__dict__.get("forward", _MISSING)))
            object.__setattr__(mod, "forward", forward)
    token = _ACTIVE.set(state)
    try:
        yield state
    finally:
        _ACTIVE.reset(token)
        for layer, attr, old in reversed(patched):
            if old is _MISSING:
                object.__delattr__(layer, attr)
            else:
                object.__setattr__(layer, attr, old)

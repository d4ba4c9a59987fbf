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

``recompute="selective"`` -- the cost model's norms-and-SwiGLU recompute -- is model-specific
and not run: :func:`resolve_policy` refuses it and names the policies that run.
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
from torch.utils.checkpoint import checkpoint

from slimdata.errors import ConfigError
from slimdata.plan import StepPlan

__all__ = [
    "RUNTIME_POLICIES",
    "StepRecompute",
    "checkpoint_layers",
    "decoder_layers",
    "pack_checkpoint",
    "recompute_layer",
    "resolve_policy",
    "step_recompute",
]

RUNTIME_POLICIES = ("none", "full")
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
    (``plan.meta["recompute"]``), else ``none``; refuse what the runtime does not run."""
    policy = recompute if recompute is not None else plan.meta.get("recompute", "none")
    where = "run_step(recompute=...)" if recompute is not None else "the plan's cost model"
    if policy == "selective":
        raise ConfigError(
            f"recompute='selective' ({where}): the runtime does not run selective recompute "
            "(the cost model's norms-and-SwiGLU recompute is model-specific); plan with "
            "recompute 'full' or 'none' (LoaderConfig(recompute=...), --recompute), or "
            "override with run_step(recompute='full') (less activation memory than planned, "
            "one more forward per layer) or run_step(recompute='none') (more activation "
            "memory than planned)"
        )
    if policy not in RUNTIME_POLICIES:
        raise ConfigError(f"recompute={policy!r} ({where}): use one of {RUNTIME_POLICIES}")
    return policy


class _Hold(torch.autograd.Function):
    """Identity that saves its inputs: a checkpoint keeps its layer's inputs alive for the
    recomputation outside ``saved_tensors_hooks``; this shows those bytes to the hooks
    (:class:`~slimdata.hooks.SavedTensorMeter`) without copying them."""

    @staticmethod
    def forward(ctx, *xs):
        ctx.save_for_backward(*xs)
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx, *grads):
        return grads


def _hold(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``args, kwargs`` with every tensor that requires grad passed through :class:`_Hold`."""
    flat = list(args) + list(kwargs.values())
    idx = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor) and a.requires_grad]
    if idx:
        held = _Hold.apply(*(flat[i] for i in idx))
        for i, h in zip(idx, held, strict=True):
            flat[i] = h
    return tuple(flat[: len(args)]), dict(zip(kwargs, flat[len(args) :], strict=True))


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
    state = _ACTIVE.get()
    if state is not None:
        state.calls += 1
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
    checkpointed until the step ends. Refuses a model with Hugging Face checkpointing on
    under ``none`` (its recomputation would run outside the pack, and the plan assumed none)."""
    if policy == "none" and getattr(module, "is_gradient_checkpointing", False):
        raise ConfigError(
            "the model has gradient checkpointing on but the step's recompute policy is 'none': "
            "pass run_step(recompute='full') (and plan with it), or call "
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

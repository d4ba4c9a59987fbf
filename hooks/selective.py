"""Selective recompute: the norms and the SwiGLU product recomputed in the backward.

What a decoder layer holds for backward under ``recompute="selective"`` is the cost model's
``dtype * (6 h + 2 ffn) + 4 heads`` bytes per token (:mod:`slimdata.cost.activations`): the
inputs of its two norms, the norms' outputs (the inputs of the q/k/v and gate/up
projections), the queries, the attention output and its fp32 softmax statistics, and the
gate and up projections. Recomputed, at the cost of
elementwise work only (no GEMM runs twice):

- every norm module is checkpointed (:func:`selective_norm`): it holds its input, not its
  fp32 copy, statistics and normalised tensor;
- the MLP's ``down(act(gate) * up)`` runs as one function (:func:`swiglu_down`) that holds
  ``gate`` and ``up`` and rebuilds ``act(gate)`` and the product in the backward, instead of
  holding ``act(gate)`` and the product too.

Hugging Face Llama-style models are found without edits: norm modules by class
(``torch.nn.RMSNorm``, ``LayerNorm``, or a class whose name ends in ``RMSNorm``), MLPs by their
``gate_proj``, ``up_proj``, ``down_proj`` (``nn.Linear``) and ``act_fn`` attributes; their
``forward`` is replaced for the step and restored after it. Custom models call
:func:`selective_norm` and :func:`swiglu_down` in their forward (plain calls under any other
policy), as :func:`~slimdata.hooks.recompute_layer` works for ``full``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from slimdata.hooks.recompute import active_policy, count_checkpoint, pack_checkpoint
from torch import nn

__all__ = ["norm_modules", "selective_active", "selective_norm", "swiglu_down", "swiglu_modules"]


def selective_active() -> bool:
    """True while :func:`~slimdata.hooks.run_step` runs a step under ``selective``."""
    return active_policy() == "selective"


def selective_norm(norm: Callable[..., torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``norm(x)``, checkpointed inside its pack under ``selective`` (holds ``x`` only)."""
    own = getattr(getattr(norm, "__dict__", {}).get("forward"), "func", None)
    if selective_active() and own is not _norm_forward:  # a found norm checkpoints itself
        return pack_checkpoint(norm, x)
    return norm(x)


class _SwiGLUDown(torch.autograd.Function):
    """``F.linear(act(gate) * up, weight, bias)`` holding ``gate`` and ``up`` only."""

    @staticmethod
    def forward(ctx, gate, up, weight, bias, act):
        ctx.act, ctx.has_bias = act, bias is not None
        ctx.save_for_backward(gate, up, weight)
        return F.linear(act(gate) * up, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        gate, up, weight = ctx.saved_tensors
        with torch.enable_grad():
            g = gate.detach().requires_grad_(True)
            u = up.detach().requires_grad_(True)
            prod = ctx.act(g) * u
        grad_prod = grad @ weight
        grad_gate, grad_up = torch.autograd.grad(prod, (g, u), grad_prod)
        flat = grad.reshape(-1, grad.shape[-1])
        grad_w = flat.t() @ prod.detach().reshape(-1, prod.shape[-1])
        grad_b = flat.sum(0) if ctx.has_bias else None
        return grad_gate, grad_up, grad_w, grad_b, None


def swiglu_down(
    gate: torch.Tensor,
    up: torch.Tensor,
    down: nn.Linear,
    act: Callable[[torch.Tensor], torch.Tensor] = F.silu,
) -> torch.Tensor:
    """``down(act(gate) * up)``; under ``selective`` it holds ``gate`` and ``up`` only and
    recomputes ``act(gate) * up`` in the backward (no GEMM is repeated)::

        a, c = self.up(self.norm2(x)).chunk(2, dim=-1)
        x = x + swiglu_down(a, c, self.down)
    """
    if not (selective_active() and torch.is_grad_enabled()):
        return down(act(gate) * up)
    count_checkpoint()
    return _SwiGLUDown.apply(gate, up, down.weight, down.bias, act)


def _is_norm(m: nn.Module) -> bool:
    return isinstance(m, (nn.RMSNorm, nn.LayerNorm)) or type(m).__name__.endswith("RMSNorm")


def _is_swiglu(m: nn.Module) -> bool:
    return all(hasattr(m, a) for a in ("gate_proj", "up_proj", "act_fn")) and isinstance(
        getattr(m, "down_proj", None), nn.Linear
    )


def norm_modules(module: nn.Module) -> tuple[nn.Module, ...]:
    """Norm modules of ``module`` (final norm included) that ``selective`` checkpoints."""
    return tuple(m for m in module.modules() if _is_norm(m))


def swiglu_modules(module: nn.Module) -> tuple[nn.Module, ...]:
    """Llama-style MLPs of ``module`` (``down_proj(act_fn(gate_proj(x)) * up_proj(x))``)."""
    return tuple(m for m in module.modules() if _is_swiglu(m))


def _norm_forward(forward: Callable[..., Any], x: torch.Tensor) -> torch.Tensor:
    return pack_checkpoint(forward, x) if selective_active() else forward(x)


def _swiglu_forward(mlp: Any, x: torch.Tensor) -> torch.Tensor:
    return swiglu_down(mlp.gate_proj(x), mlp.up_proj(x), mlp.down_proj, mlp.act_fn)


def selective_patches(module: nn.Module) -> list[tuple[nn.Module, Callable[..., Any]]]:
    """``(module, forward)`` replacements that run ``module``'s norms and MLPs selectively."""
    out: list[tuple[nn.Module, Callable[..., Any]]] = []
    out += [(m, functools.partial(_norm_forward, m.forward)) for m in norm_modules(module)]
    out += [(m, functools.partial(_swiglu_forward, m)) for m in swiglu_modules(module)]
    return out

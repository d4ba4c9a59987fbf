"""PyTorch's own varlen FlashAttention (``torch.nn.attention.varlen.varlen_attn``, torch >= 2.10).

The kernel is the FlashAttention-2 forward/backward that PyTorch ships for CUDA (fp16/bf16),
so it needs no extra package. ``window_size=(-1, 0)`` is causal aligned to the bottom right
of each sequence's ``(lq, lk)`` block, as flash-attn's ``causal=True``: a slice's queries are
the tail of its document's keys, which is exactly slice continuation. Memory is linear in the
tokens (no score matrix is materialised). Registered only when the function exists.
"""

from __future__ import annotations

import torch
from slimdata.hooks.attention.base import VarlenBatch, register_backend

from slimdata.errors import ConfigError

__all__ = ["AVAILABLE", "torch_varlen"]

try:
    from torch.nn.attention.varlen import varlen_attn

    AVAILABLE = True
except ImportError:  # torch < 2.10
    varlen_attn = None  # type: ignore[assignment]
    AVAILABLE = False


def torch_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: VarlenBatch, scale: float
) -> torch.Tensor:  # pragma: no cover - needs a CUDA device
    if varlen_attn is None:
        raise ConfigError(
            "torch.nn.attention.varlen needs torch >= 2.10: upgrade torch or use backend='sdpa'"
        )
    rep = q.shape[1] // k.shape[1]
    if rep > 1:  # grouped-query attention: query head h reads key head h // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    out = varlen_attn(
        q,
        k,
        v,
        batch.cu_q,
        batch.cu_k,
        batch.max_q,
        batch.max_k,
        scale=scale,
        window_size=(-1, 0),
    )
    assert isinstance(out, torch.Tensor)  # no return_aux: the output alone
    return out


if AVAILABLE:
    register_backend("torch-varlen", torch_varlen)

"""flash-attn 2 varlen backend (GPU, fp16/bf16). Registered only when ``flash_attn`` imports.

``causal=True`` is bottom-right aligned since flash-attn 2.1, which is exactly slice
continuation: a slice's queries are the tail of its document's keys ``[0, end)``.
"""

from __future__ import annotations

import torch
from slimdata.hooks.attention.base import VarlenBatch, register_backend

from slimdata.errors import ConfigError

__all__ = ["AVAILABLE", "flash_varlen"]

try:  # pragma: no cover - not installed on CPU machines
    from flash_attn import flash_attn_varlen_func

    AVAILABLE = True
except ImportError:  # flash-attn is the optional `gpu` extra
    flash_attn_varlen_func = None
    AVAILABLE = False


def flash_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: VarlenBatch, scale: float, mask=None
) -> torch.Tensor:  # pragma: no cover - needs a GPU
    if flash_attn_varlen_func is None:
        raise ConfigError(
            "flash_attn is not installed: pip install 'slimdata[gpu]' on a CUDA machine"
        )
    return flash_attn_varlen_func(
        q, k, v, batch.cu_q, batch.cu_k, batch.max_q, batch.max_k, softmax_scale=scale, causal=True
    )


if AVAILABLE:  # pragma: no cover
    register_backend("flash", flash_varlen)

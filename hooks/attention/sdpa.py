"""Torch SDPA with an explicit boolean mask: runs anywhere (CPU tests, any GPU), exact in fp32.

The mask is block-diagonal over sequences and bottom-right causal inside each, built once per
pack (``O(Tq * Tk)`` booleans) and cached by the caller through :func:`varlen_mask`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from slimdata.hooks.attention.base import VarlenBatch, register_backend

__all__ = ["sdpa_varlen", "varlen_mask"]


def varlen_mask(batch: VarlenBatch) -> torch.Tensor:
    """Boolean ``(Tq, Tk)`` mask, True = attend.

    Sequence with ``lq=2, lk=4``: rows ``[1 1 1 0]`` and ``[1 1 1 1]`` (bottom-right causal).
    """
    cu_q, cu_k = batch.cu_q.long(), batch.cu_k.long()
    lq, lk = cu_q.diff(), cu_k.diff()
    n = len(lq)
    seq_q = torch.repeat_interleave(torch.arange(n, device=cu_q.device), lq)
    seq_k = torch.repeat_interleave(torch.arange(n, device=cu_q.device), lk)
    pos_q = torch.arange(int(cu_q[-1]), device=cu_q.device) - cu_q[seq_q] + (lk - lq)[seq_q]
    pos_k = torch.arange(int(cu_k[-1]), device=cu_q.device) - cu_k[seq_k]
    return (seq_q[:, None] == seq_k[None, :]) & (pos_k[None, :] <= pos_q[:, None])


def sdpa_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    batch: VarlenBatch,
    scale: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Varlen attention through ``scaled_dot_product_attention`` with an explicit mask."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:  # GQA: query head h reads key head h // rep (Hugging Face repeat_kv layout)
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    if mask is None:
        mask = varlen_mask(batch)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask, scale=scale
    )
    return out[0].transpose(0, 1)


register_backend("sdpa", sdpa_varlen)

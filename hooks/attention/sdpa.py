"""Torch SDPA with explicit boolean masks: runs anywhere (CPU tests, any GPU), exact in fp32.

Two layouts, chosen per pack so that work stays close to the causal pairs the cost model
counts: one call over the whole pack with a block-diagonal mask (``O(Tq * Tk)``; best for
one sequence or a few similar ones), or one call per sequence with its own bottom-right
causal mask (``O(sum lq_i * lk_i)``; best for many sequences). Masks are built once per
pack and reused by every layer (``VarlenBatch.cache``).
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


def _attend(q, k, v, mask, scale):
    return F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale
    ).transpose(0, 1)


def sdpa_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    batch: VarlenBatch,
    scale: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Varlen attention through ``scaled_dot_product_attention`` with explicit masks.

    ``mask`` forces the single-call layout with that ``(Tq, Tk)`` mask.
    """
    rep = q.shape[1] // k.shape[1]
    if rep > 1:  # GQA: query head h reads key head h // rep (Hugging Face repeat_kv layout)
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    if mask is not None:
        return _attend(q, k, v, mask, scale)
    c = batch.cache
    if "layout" not in c:
        cu_q, cu_k = batch.cu_q.tolist(), batch.cu_k.tolist()
        spans = list(zip(cu_q, cu_q[1:], cu_k, cu_k[1:], strict=False))
        useful = sum((b - a) * (d - c_) for a, b, c_, d in spans)
        dense = len(spans) <= 1 or 2 * useful >= cu_q[-1] * cu_k[-1]
        c["layout"] = "dense" if dense else "split"
        if dense:
            c["mask"] = varlen_mask(batch)
        else:
            c["spans"] = spans
            c["masks"] = [
                torch.ones(b - a, d - c_, dtype=torch.bool, device=q.device).tril(d - c_ - (b - a))
                for a, b, c_, d in spans
            ]
    if c["layout"] == "dense":
        return _attend(q, k, v, c["mask"], scale)
    outs = [
        _attend(q[a:b], k[c_:d], v[c_:d], m, scale)
        for (a, b, c_, d), m in zip(c["spans"], c["masks"], strict=True)
    ]
    return torch.cat(outs)


register_backend("sdpa", sdpa_varlen)

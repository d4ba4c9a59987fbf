"""Torch SDPA with explicit boolean masks: runs anywhere (CPU tests, any GPU), exact in fp32.

Work follows the causal pairs the cost model counts, as flash-attn's tiles do: each
sequence's queries go in blocks of :data:`BLOCK` rows, and a block attends only to the
keys up to its last query (bottom-right causal mask on the final ``BLOCK`` columns). A
sequence of ``lq`` queries after ``p`` prefix keys costs about ``lq * p + lq**2 / 2 +
BLOCK * lq / 2`` scores (the causal pairs plus a per-token term the linear coefficient
absorbs) in ``ceil(lq / BLOCK)`` calls, instead of the ``lq * (p + lq)`` of one masked
call, or the ``Tq * Tk`` of one block-diagonal call over the whole pack (which made the
time of a pack of a few similar documents twice what its causal pairs predict). The masks
of a pack are views of one ``(BLOCK, max keys)`` template built once per pack and reused by
every layer (``VarlenBatch.cache``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from slimdata.hooks.attention.base import VarlenBatch, register_backend

__all__ = ["BLOCK", "sdpa_pieces", "sdpa_varlen", "varlen_mask"]

BLOCK = 128
"""Query rows per SDPA call (the slicing alignment, and a common flash-attn tile height)."""


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
    if "calls" not in c:
        c["calls"] = _tiles(batch, q.device)
    return torch.cat(
        [_attend(q[a:b], k[c0:c1], v[c0:c1], m, scale) for a, b, c0, c1, m in c["calls"]]
    )


def _tiles(
    batch: VarlenBatch, device: torch.device
) -> list[tuple[int, int, int, int, torch.Tensor]]:
    """``(q_start, q_end, k_start, k_end, mask)`` per call, in query order.

    Sequence with 300 queries after 100 prefix keys, ``BLOCK=128``: queries ``[0,128)``
    read keys ``[0,228)``, ``[128,256)`` read ``[0,356)``, ``[256,300)`` read ``[0,400)``;
    in each, query row ``r`` of an ``m``-row block reads the first ``keys - m + r + 1`` keys.
    """
    cu_q, cu_k = batch.cu_q.tolist(), batch.cu_k.tolist()
    spans = list(zip(cu_q, cu_q[1:], cu_k, cu_k[1:], strict=False))
    widest = max((d - c for _, _, c, d in spans), default=0)
    # row r of the template reads columns <= widest - BLOCK + r: right-aligned causal
    template = torch.ones(BLOCK, widest, dtype=torch.bool, device=device).tril(widest - BLOCK)
    calls = []
    for a, b, c, d in spans:
        prefix = (d - c) - (b - a)
        for i in range(a, b, BLOCK):
            j = min(i + BLOCK, b)
            keys = prefix + (j - a)
            calls.append((i, j, c, c + keys, template[BLOCK - (j - i) :, widest - keys :]))
    return calls


register_backend("sdpa", sdpa_varlen)


class _PieceAttention(torch.autograd.Function):
    """:func:`sdpa_varlen` over keys/values given as pieces, saving ``q`` and the pieces only.

    The concatenated keys/values, their GQA repeat and the masks SDPA converts are never held
    for backward: the backward rebuilds them and recomputes the attention (flash-attn's
    backward recomputes the scores the same way). A prefix piece is a leaf of the per-step
    K/V store, whose storage its producing pack holds anyway, so a document's keys/values
    are held once, however many packs read them."""

    @staticmethod
    def forward(ctx, batch, scale, n, q, *pieces):
        ctx.batch, ctx.scale, ctx.n = batch, scale, n
        ctx.save_for_backward(q, *pieces)
        return sdpa_varlen(q, torch.cat(pieces[:n]), torch.cat(pieces[n:]), batch, scale)

    @staticmethod
    def backward(ctx, grad):
        q, *pieces = (t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors)
        with torch.enable_grad():
            n = ctx.n
            out = sdpa_varlen(q, torch.cat(pieces[:n]), torch.cat(pieces[n:]), ctx.batch, ctx.scale)
            inputs = [t for t in (q, *pieces) if t.requires_grad]
            got = iter(torch.autograd.grad(out, inputs, grad))
        grads = [next(got) if t.requires_grad else None for t in (q, *pieces)]
        return None, None, None, *grads


def sdpa_pieces(
    q: torch.Tensor,
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    batch: VarlenBatch,
    scale: float,
) -> torch.Tensor:
    """:func:`sdpa_varlen` on ``torch.cat(ks), torch.cat(vs)``, holding for backward only
    ``q`` and the pieces (:class:`_PieceAttention`): what flash-attn holds, less its
    per-head softmax statistics."""
    if not torch.is_grad_enabled():
        return sdpa_varlen(q, torch.cat(ks), torch.cat(vs), batch, scale)
    return _PieceAttention.apply(batch, scale, len(ks), q, *ks, *vs)

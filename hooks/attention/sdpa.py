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
    return torch.cat(
        [
            _attend(q[a:b], k[c0:c1], v[c0:c1], m, scale)
            for a, b, c0, c1, m in _calls(batch, q.device)
        ]
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


_FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_CPU_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
"""The CPU kernel ``scaled_dot_product_attention`` dispatches to, and its backward."""


class _PieceAttention(torch.autograd.Function):
    """:func:`sdpa_varlen` on CPU over keys/values given as pieces, holding for backward what
    flash-attn holds: the queries, the key/value pieces, the output and the per-head softmax
    log-sum-exp (fp32).

    Not held: the concatenated keys/values, their GQA repeat and the float masks, which the
    backward rebuilds (copies, no attention recomputed). A prefix piece is a leaf of the
    per-step K/V store, whose storage its producing pack holds anyway, so a document's
    keys/values are held once, however many packs read them. The kernel calls are the ones
    ``scaled_dot_product_attention`` makes, so results are bit-identical to it."""

    @staticmethod
    def forward(ctx, batch, scale, n, q, *pieces):
        k, v = _keys(q, pieces, n)
        outs, lses = [], []
        for a, b, c0, c1, m in _calls(batch, q.device):
            o, lse = _FLASH_CPU(
                *_heads_first(q[a:b], k[c0:c1], v[c0:c1]),
                0.0,
                False,
                attn_mask=_additive(batch, m, q.dtype),
                scale=scale,
            )
            outs.append(o[0].transpose(0, 1))
            lses.append(lse[0])
        out, lse = torch.cat(outs), torch.cat(lses, dim=1)
        ctx.batch, ctx.scale, ctx.n = batch, scale, n
        ctx.save_for_backward(q, out, lse, *pieces)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, out, lse, *pieces = ctx.saved_tensors
        k, v = _keys(q, pieces, ctx.n)
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for a, b, c0, c1, m in _calls(ctx.batch, q.device):
            gq, gk, gv = _FLASH_CPU_BACKWARD(
                *_heads_first(grad[a:b], q[a:b], k[c0:c1], v[c0:c1], out[a:b]),
                lse[None, :, a:b].contiguous(),
                0.0,
                False,
                attn_mask=_additive(ctx.batch, m, q.dtype),
                scale=ctx.scale,
            )
            dq[a:b] = gq[0].transpose(0, 1)
            dk[c0:c1] += gk[0].transpose(0, 1)
            dv[c0:c1] += gv[0].transpose(0, 1)
        dks = _unrepeat(dk, pieces[0].shape[1]).split([p.shape[0] for p in pieces[: ctx.n]])
        dvs = _unrepeat(dv, pieces[0].shape[1]).split([p.shape[0] for p in pieces[ctx.n :]])
        grads = [g if p.requires_grad else None for p, g in zip(pieces, (*dks, *dvs), strict=True)]
        return None, None, None, dq, *grads


def _keys(q: torch.Tensor, pieces, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The concatenated keys and values, repeated to the query heads (GQA)."""
    k, v = torch.cat(pieces[:n]), torch.cat(pieces[n:])
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return k, v


def _unrepeat(g: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Gradient of :func:`_keys`' repeat: the sum over the query heads of each key head."""
    t, heads, d = g.shape
    return g.view(t, kv_heads, heads // kv_heads, d).sum(2) if heads != kv_heads else g


def _heads_first(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(T, H, D)`` -> ``(1, H, T, D)`` views, the kernel's layout."""
    return tuple(x.transpose(0, 1)[None] for x in xs)


def _additive(batch: VarlenBatch, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A call's boolean mask (True = attend, a view of the pack's template) as the additive
    ``dtype`` mask the kernel takes: the same view of one additive template per pack."""
    key = ("additive", dtype)
    if key not in batch.cache:
        base = mask if mask._base is None else mask._base
        batch.cache[key] = torch.zeros(base.shape, dtype=dtype).masked_fill_(~base, float("-inf"))
    return batch.cache[key].as_strided(mask.shape, mask.stride(), mask.storage_offset())[None, None]


def _calls(batch: VarlenBatch, device: torch.device) -> list:
    """:func:`_tiles` of ``batch``, built once per pack (every layer reuses them)."""
    c = batch.cache
    if "calls" not in c:
        c["calls"] = _tiles(batch, device)
    return c["calls"]


def sdpa_pieces(
    q: torch.Tensor,
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    batch: VarlenBatch,
    scale: float,
) -> torch.Tensor:
    """:func:`sdpa_varlen` on ``torch.cat(ks), torch.cat(vs)``; on CPU with grad, holding
    for backward only what flash-attn holds (:class:`_PieceAttention`)."""
    if not torch.is_grad_enabled() or q.device.type != "cpu":
        return sdpa_varlen(q, torch.cat(ks), torch.cat(vs), batch, scale)
    return _PieceAttention.apply(batch, scale, len(ks), q, *ks, *vs)

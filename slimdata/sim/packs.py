"""Pack durations recomputed from the cost model, so every strategy is judged alike.

``MicroPack.cost`` is whatever the producer of a plan predicted; the simulator ignores it
and sums the per-slice costs of :class:`~slimdata.cost.CostModel` over the pack's slices
(``MicroPack.cost`` stays available for a cross-check). Times are seconds of the full model
(all layers); a pipeline chunk holding ``k`` of ``L`` layers takes ``k / L`` of them.

Example: a pack holding slices ``[0, 4)`` of doc 0 and ``[0, 3)`` of doc 1 has forward time
``cost.forward(0, 4) + cost.forward(0, 3)`` (two per-slice constants, 7 tokens, 10 + 6 pairs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slimdata.cost import CostModel
from slimdata.plan import StepPlan

__all__ = ["PackTimes", "chunk_fractions", "pack_times"]


@dataclass(frozen=True)
class PackTimes:
    """Full-model times and sizes of every pack of a plan, plus the slices behind them.

    Packs are numbered flat: forward pack ``i`` of rank ``r`` is ``f_offset[r] + i``,
    backward pack ``j`` is ``b_offset[r] + j``.
    """

    f_offset: np.ndarray
    b_offset: np.ndarray
    fwd: np.ndarray
    """Forward seconds per flat forward pack (full model)."""
    bwd: np.ndarray
    """Backward seconds per flat backward pack (full model)."""
    f_tokens: np.ndarray
    b_tokens: np.ndarray
    f_att: np.ndarray
    """Attention part of :attr:`fwd` (seconds of causal query-key pairs, full model)."""
    b_att: np.ndarray
    """Attention part of :attr:`bwd`."""
    f_const: np.ndarray
    """Per-slice fixed part of :attr:`fwd` (``CostModel.fwd_const`` times the slice count)."""
    b_const: np.ndarray
    """Per-slice fixed part of :attr:`bwd`."""
    # one entry per slice of the plan
    s_rank: np.ndarray
    s_doc: np.ndarray
    s_start: np.ndarray
    s_end: np.ndarray
    s_fpack: np.ndarray
    """Flat forward pack of each slice."""
    s_bpack: np.ndarray
    """Flat backward pack of each slice."""
    s_act: np.ndarray
    """Activation bytes of each slice (full model)."""
    s_kv: np.ndarray
    """Key/value bytes of each slice's own tokens (full model)."""

    def forward_of(self, rank: int, i: int) -> float:
        return float(self.fwd[self.f_offset[rank] + i])

    def backward_of(self, rank: int, j: int) -> float:
        return float(self.bwd[self.b_offset[rank] + j])


def pack_times(plan: StepPlan, cost: CostModel) -> PackTimes:
    """Sum the cost model over the slices of every pack of ``plan`` (vectorized)."""
    nf = np.array([len(rs.forward) for rs in plan.ranks], dtype=np.int64)
    nb = np.array([len(rs.backward) for rs in plan.ranks], dtype=np.int64)
    f_offset = np.concatenate(([0], np.cumsum(nf)[:-1]))
    b_offset = np.concatenate(([0], np.cumsum(nb)[:-1]))
    rows: list[tuple[int, int, int, int, int]] = []  # rank, doc, start, end, flat fpack
    bpack_of: dict[tuple[int, int, int], int] = {}
    for rs in plan.ranks:
        fo, bo = int(f_offset[rs.rank]), int(b_offset[rs.rank])
        for i, p in enumerate(rs.forward):
            rows.extend((rs.rank, s.doc, s.start, s.end, fo + i) for s in p.slices)
        for j, p in enumerate(rs.backward):
            for s in p.slices:
                bpack_of[(s.doc, s.start, rs.rank)] = bo + j
    arr = np.array(rows, dtype=np.int64).reshape(-1, 5)
    s_rank, s_doc, s_start, s_end, s_fpack = (arr[:, k] for k in range(5))
    s_bpack = np.fromiter(
        (
            bpack_of[(d, a, r)]
            for r, d, a in zip(s_rank.tolist(), s_doc.tolist(), s_start.tolist(), strict=True)
        ),
        dtype=np.int64,
        count=len(s_rank),
    )
    sc = cost.slice_costs(s_start, s_end)
    n_f, n_b = int(nf.sum()), int(nb.sum())
    tokens = (s_end - s_start).astype(np.float64)
    return PackTimes(
        f_offset=f_offset,
        b_offset=b_offset,
        fwd=np.bincount(s_fpack, weights=sc.fwd, minlength=n_f),
        bwd=np.bincount(s_bpack, weights=sc.bwd, minlength=n_b),
        f_tokens=np.bincount(s_fpack, weights=tokens, minlength=n_f),
        b_tokens=np.bincount(s_bpack, weights=tokens, minlength=n_b),
        f_att=np.bincount(s_fpack, weights=sc.fwd_att, minlength=n_f),
        b_att=np.bincount(s_bpack, weights=sc.bwd_att, minlength=n_b),
        f_const=cost.fwd_const * np.bincount(s_fpack, minlength=n_f).astype(np.float64),
        b_const=cost.bwd_const * np.bincount(s_bpack, minlength=n_b).astype(np.float64),
        s_rank=s_rank,
        s_doc=s_doc,
        s_start=s_start,
        s_end=s_end,
        s_fpack=s_fpack,
        s_bpack=s_bpack,
        s_act=sc.act_bytes,
        s_kv=cost.kv_bytes_per_token * tokens,
    )


def chunk_fractions(layers: int, chunks: int) -> np.ndarray:
    """Share of the model in each of ``chunks`` consecutive pipeline chunks.

    Layers are split as evenly as possible, earlier chunks taking the remainder
    (``chunk_fractions(10, 4) -> [3, 3, 2, 2] / 10``); with fewer layers than chunks (or an
    unknown layer count) every chunk gets ``1 / chunks``.
    """
    if layers < chunks:
        return np.full(chunks, 1.0 / chunks)
    k = np.full(chunks, layers // chunks, dtype=np.float64)
    k[: layers % chunks] += 1
    return k / layers

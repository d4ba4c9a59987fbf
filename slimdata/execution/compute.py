"""What a pack's compute takes on one device: the execution model's price of every pack
(:func:`~slimdata.execution.pricing.pack_times`) as one device runs it.

- **Static CP** (``cp = k``). A slice of ``s`` tokens is padded to ``s' = ceil(s / 2k) *
  2k`` tokens (:func:`padded`, Megatron's THD requirement) and cut into ``2 k``
  load-balanced chunks (:func:`~slimdata.execution.cp.cp_chunks`), so a member computes
  ``1 / k`` of the padded slice's linear tokens and causal pairs; attention on a chunk of
  ``c = s' / 2k`` tokens of an ``s'``-token sequence runs at ``chunk_factor(s', c)`` times
  the unsplit time per pair (:mod:`slimdata.cost.attention`, a published FlashAttention-3
  curve). The fixed costs (per slice and per model call) are every member's whole.
- **DP-Merge.** A member's slice of a merged document runs its attention at the chunk
  efficiency of the slice within the document (``w`` = document length, ``c`` = slice
  tokens).

The simulator's tasks take these seconds (times their chunk's share of the layers,
:mod:`slimdata.sim.dag`), and the planner's step-time estimate charges them
(:func:`slimdata.execution.critical.plan_critical_path`).

Example (static CP): ``k = 2``, one pack holding a 1000-token sequence whose forward takes
10 s (8 s linear, 2 s attention, no fixed costs) on one device: 1000 is a multiple of 4 (no
padding), its chunks of 250 tokens and the sequence are both below the curve's first point
(factor 1), so each member computes 5 s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slimdata.cost import causal_pairs
from slimdata.cost.attention import attention_curve
from slimdata.execution.pricing import PackTimes
from slimdata.plan import StepPlan

__all__ = ["PackCompute", "merge_attention_scale", "pack_compute", "padded"]


def padded(tokens, k: int) -> np.ndarray:
    """Tokens padded to a multiple of ``2 k`` under static CP (``k > 1``), Megatron's THD
    requirement: ``padded(1000, 3) == 1002``."""
    t = np.asarray(tokens, dtype=np.float64)
    return t if k == 1 else np.ceil(t / (2 * k)) * (2 * k)


@dataclass(frozen=True)
class PackCompute:
    """Compute seconds of one device per flat pack of :class:`PackTimes` (full model, all
    layers), and what they are made of."""

    fwd: np.ndarray
    """Per flat forward pack: one device's compute seconds."""
    bwd: np.ndarray
    f_att: np.ndarray
    """Per flat forward pack: a static-CP member's attention seconds (the part that can hide
    its K/V exchange; merged documents' chunk efficiency apart); ``PackTimes.f_att`` at
    ``cp = 1``."""
    b_att: np.ndarray
    f_merge_att: np.ndarray
    """Per flat forward pack: one device's attention seconds, merged documents' chunk
    efficiency included (``f_att`` plus that correction; ``fwd`` holds it): what hides a
    merge pack's K/V exchange (:mod:`slimdata.sim.cp`)."""
    b_merge_att: np.ndarray


def pack_compute(pt: PackTimes, plan: StepPlan, cp: int = 1) -> PackCompute:
    """The compute seconds of every pack of ``plan`` (priced ``pt``) on one device under
    static CP ``cp`` (module docstring)."""
    doc_len = np.array([d.length for d in plan.docs], dtype=np.float64)
    merged = np.zeros(len(plan.docs), dtype=bool)
    merged[[d for m in plan.merges for d in m.docs]] = True
    f_merge, b_merge = merge_attention_scale(pt, doc_len, merged)
    parts = []
    for tot, att, const, pack, scale in (
        (pt.fwd, pt.f_att, pt.f_const, pt.s_fpack, f_merge),
        (pt.bwd, pt.b_att, pt.b_const, pt.s_bpack, b_merge),
    ):
        if cp == 1:
            member, member_att = tot, att
        else:
            lin_s, att_s = _static_scales(pt, cp, pack, len(tot))
            member_att = att * att_s / cp
            member = (tot - att - const) * lin_s / cp + member_att + const
        merged_extra = att * (scale - 1) / cp  # merged slices' chunk efficiency
        parts.append((member + merged_extra, member_att, member_att + merged_extra))
    (fwd, f_att, f_merge_att), (bwd, b_att, b_merge_att) = parts
    return PackCompute(fwd, bwd, f_att, b_att, f_merge_att, b_merge_att)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.divide(num, den, out=np.ones_like(num), where=den > 0)


def _static_scales(
    pt: PackTimes, cp: int, pack: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per pack: padded over real tokens, padded-and-slowed over real pairs."""
    curve = attention_curve()
    s = (pt.s_end - pt.s_start).astype(np.float64)
    sp = padded(s, cp)
    pairs = causal_pairs(pt.s_start, pt.s_end)
    slow = causal_pairs(pt.s_start, pt.s_start + sp) * curve.chunk_factor(sp, sp / (2 * cp))
    tok_p = np.bincount(pack, weights=sp, minlength=n)
    lin = _ratio(tok_p, np.bincount(pack, weights=s, minlength=n))
    att = _ratio(
        np.bincount(pack, weights=slow, minlength=n), np.bincount(pack, weights=pairs, minlength=n)
    )
    return lin, att


def merge_attention_scale(
    pt: PackTimes, doc_len: np.ndarray, merged: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per flat forward and backward pack: attention time of its slices of merged documents
    with the chunk factor (``w`` = document length, ``c`` = slice tokens), over without it.
    1 for packs without merged slices."""
    curve = attention_curve()
    pairs = causal_pairs(pt.s_start, pt.s_end)
    fac = np.where(
        merged[pt.s_doc],
        curve.chunk_factor(doc_len[pt.s_doc], pt.s_end - pt.s_start),
        1.0,
    )
    out = []
    for pack, n in ((pt.s_fpack, len(pt.fwd)), (pt.s_bpack, len(pt.bwd))):
        num = np.bincount(pack, weights=pairs * fac, minlength=n)
        out.append(_ratio(num, np.bincount(pack, weights=pairs, minlength=n)))
    return out[0], out[1]

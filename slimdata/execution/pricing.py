"""Pack durations recomputed from the cost model, so every strategy is judged alike.

The one pack price: the per-slice costs of :class:`~slimdata.cost.CostModel` summed over the
pack's slices, plus the per-pack constant (``fwd_pack_const``/``bwd_pack_const``) for every
model call. The simulator, the planner's estimate and the solvers' ``MicroPack.cost`` (one
device's share, :func:`slimdata.execution.pack_prices`) take it from here; the simulator
never reads ``MicroPack.cost``, which a plan from elsewhere may set to anything. Times are
seconds of the full model (all layers); a pipeline chunk holding ``k`` of ``L`` layers takes
``k / L`` of them.

Packs run the way the step executor runs them (:func:`slimdata.plan.execution`), and the
pack constant is paid once per model call. With ``split=True`` (``run_step``'s default outside
FSDP; the simulator passes ``SimConfig.split``) a forward pack runs one call per backward pack
its slices go to and a backward pack one backward call per forward pack it draws from
(:func:`slimdata.plan.split_calls`); nothing is recomputed. With ``split=False``
(``run_step(asymmetric="recompute")``, and always under FSDP) a backward pack
that is a union of forward packs runs one backward call per forward pack, any other re-runs
the forward of its own slices first (its time is that forward, with its pack constant, plus
its backward), and a forward pack whose backward packs recompute it runs without an autograd
graph (its time times ``CostModel.graph_free_scale``). Under FSDP (lockstep rules) a pack
that is empty on one rank but not on all is *padding* there: the executor replays it with
one-token dummy calls (same number of calls, same kept/recomputed status as elsewhere), each
priced as a one-token slice plus the pack constant (:func:`padding_call_times`); a pack empty
on every rank makes no call.

Example: a pack holding slices ``[0, 4)`` of doc 0 and ``[0, 3)`` of doc 1 has forward time
``cost.forward(0, 4) + cost.forward(0, 3) + cost.fwd_pack_const`` (two per-slice constants,
7 tokens, 10 + 6 pairs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slimdata.cost import CostModel
from slimdata.errors import PlanError
from slimdata.plan import StepPlan, check_lockstep, execution
from slimdata.plan.pipeline import chunk_fractions

__all__ = ["PackTimes", "chunk_fractions", "pack_times", "padding_call_times", "prices_calls"]


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
    """Fixed part of :attr:`fwd` (``CostModel.fwd_const`` per slice, ``fwd_pack_const`` per
    model call)."""
    b_const: np.ndarray
    """Fixed part of :attr:`bwd` (a recomputed pack's forward constants included)."""
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
    f_graph_free: np.ndarray
    """Per flat forward pack: runs without an autograd graph."""
    b_recomputed: np.ndarray
    """Per flat backward pack: re-runs its forward (its time includes that forward)."""
    f_calls: np.ndarray
    """Per flat forward pack: model calls (0 for an empty pack; a lockstep padding pack's
    dummy call counts, see :func:`padding_call_times`)."""
    b_calls: np.ndarray
    """Per flat backward pack: backward calls (a recomputed pack: 1, after 1 forward)."""

    def forward_of(self, rank: int, i: int) -> float:
        return float(self.fwd[self.f_offset[rank] + i])

    def backward_of(self, rank: int, j: int) -> float:
        return float(self.bwd[self.b_offset[rank] + j])


# 62 lines: 24 of them construct the result, one named field per line
def pack_times(
    plan: StepPlan,
    cost: CostModel,
    lockstep: bool = False,
    split: bool = False,
    keep: bool = True,
) -> PackTimes:
    """Sum the cost model over the slices of every pack of ``plan`` (vectorized).

    ``lockstep``: the executor's FSDP rules decide what is recomputed (plan-global, see
    :func:`slimdata.plan.lockstep_schedule`; ``keep=False``: FSDP1's, every backward pack
    recomputed) when the plan is lockstep; else per rank. ``split``: forward packs split by
    backward pack (ignored with ``lockstep``)."""
    nf = np.array([len(rs.forward) for rs in plan.ranks], dtype=np.int64)
    nb = np.array([len(rs.backward) for rs in plan.ranks], dtype=np.int64)
    f_offset = np.concatenate(([0], np.cumsum(nf)[:-1]))
    b_offset = np.concatenate(([0], np.cumsum(nb)[:-1]))
    s_rank, s_doc, s_start, s_end, s_fpack, s_bpack = _plan_slices(plan, f_offset, b_offset)
    sc = cost.slice_costs(s_start, s_end)
    n_f, n_b = int(nf.sum()), int(nb.sum())
    tokens = (s_end - s_start).astype(np.float64)
    f_slices = np.bincount(s_fpack, minlength=n_f).astype(np.float64)
    b_slices = np.bincount(s_bpack, minlength=n_b).astype(np.float64)
    free, rec, f_calls, b_calls = _how_packs_run(plan, lockstep, split, keep, f_offset, b_offset)
    # lockstep padding packs (model calls, no slices) run one-token dummy calls
    f_dummy, b_dummy = padding_call_times(cost)
    f_pad = np.where(f_slices == 0, f_calls * f_dummy, 0.0)
    b_pad = np.where(b_slices == 0, b_calls * b_dummy, 0.0)
    f_pack = cost.fwd_pack_const * f_calls
    b_pack = cost.bwd_pack_const * b_calls
    fwd = np.bincount(s_fpack, weights=sc.fwd, minlength=n_f) + f_pack + f_pad
    bwd = np.bincount(s_bpack, weights=sc.bwd, minlength=n_b) + b_pack + b_pad
    f_att = np.bincount(s_fpack, weights=sc.fwd_att, minlength=n_f)
    b_att = np.bincount(s_bpack, weights=sc.bwd_att, minlength=n_b)
    f_const = cost.fwd_const * f_slices + f_pack + f_pad
    b_const = cost.bwd_const * b_slices + b_pack + b_pad
    if rec.any():  # the forward of the backward pack's own slices, with its pack constant
        b_fpack = cost.fwd_pack_const * (b_calls > 0)
        b_fpad = np.where(b_slices == 0, f_dummy, 0.0)
        bwd += rec * (np.bincount(s_bpack, weights=sc.fwd, minlength=n_b) + b_fpack + b_fpad)
        b_att += rec * np.bincount(s_bpack, weights=sc.fwd_att, minlength=n_b)
        b_const += rec * (cost.fwd_const * b_slices + b_fpack + b_fpad)
    scale = np.where(free, cost.graph_free_scale, 1.0)
    return PackTimes(
        f_offset=f_offset,
        b_offset=b_offset,
        fwd=fwd * scale,
        bwd=bwd,
        f_tokens=np.bincount(s_fpack, weights=tokens, minlength=n_f),
        b_tokens=np.bincount(s_bpack, weights=tokens, minlength=n_b),
        f_att=f_att * scale,
        b_att=b_att,
        f_const=f_const * scale,
        b_const=b_const,
        s_rank=s_rank,
        s_doc=s_doc,
        s_start=s_start,
        s_end=s_end,
        s_fpack=s_fpack,
        s_bpack=s_bpack,
        s_act=sc.act_bytes,
        s_kv=cost.kv_bytes_per_token * tokens,
        f_graph_free=free,
        b_recomputed=rec,
        f_calls=f_calls,
        b_calls=b_calls,
    )


def _plan_slices(
    plan: StepPlan, f_offset: np.ndarray, b_offset: np.ndarray
) -> tuple[np.ndarray, ...]:
    """Per slice of ``plan``, in forward order: ``(rank, doc, start, end, flat forward pack,
    flat backward pack)``."""
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
    return s_rank, s_doc, s_start, s_end, s_fpack, s_bpack


def _how_packs_run(
    plan: StepPlan,
    lockstep: bool,
    split: bool,
    keep: bool,
    f_offset: np.ndarray,
    b_offset: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """How the executor runs every flat pack (:func:`slimdata.plan.execution`): forward packs
    without an autograd graph, backward packs that recompute their forward, and the model
    calls of each forward and backward pack. A lockstep plan the FSDP executor refuses is
    timed by the per-rank rules."""
    if lockstep:
        try:
            check_lockstep(plan)
        except PlanError:
            lockstep = False
    n_f = sum(len(rs.forward) for rs in plan.ranks)
    n_b = sum(len(rs.backward) for rs in plan.ranks)
    free = np.zeros(n_f, dtype=bool)
    rec = np.zeros(n_b, dtype=bool)
    f_calls = np.zeros(n_f, dtype=np.int64)
    b_calls = np.zeros(n_b, dtype=np.int64)
    for rs, ex in zip(plan.ranks, execution(plan, lockstep, split, keep), strict=True):
        fo, bo = int(f_offset[rs.rank]), int(b_offset[rs.rank])
        free[[fo + i for i in ex.graph_free]] = True
        rec[[bo + j for j in ex.recomputed]] = True
        f_calls[fo : fo + len(ex.f_calls)] = ex.f_calls
        b_calls[bo : bo + len(ex.b_calls)] = ex.b_calls
    return free, rec, f_calls, b_calls


def prices_calls(cost: CostModel) -> bool:
    """Whether ``cost`` prices a pack by how the executor runs it beyond its slices' costs:
    a constant per model call (``fwd_pack_const``, ``bwd_pack_const``) or graph-free forwards
    at another speed (``graph_free_scale != 1``), as a profiled model does. The analytic
    models do neither: there a pack that holds slices and recomputes nothing costs its
    slices' costs summed, however many calls it takes."""
    return bool(cost.fwd_pack_const or cost.bwd_pack_const or cost.graph_free_scale != 1.0)


def padding_call_times(cost: CostModel) -> tuple[float, float]:
    """Forward and backward seconds of one dummy call of a lockstep padding pack, its pack
    constant apart: the FSDP executor runs the model on one token
    (:func:`slimdata.hooks.fsdp.dummy_loss`), priced as a one-token slice."""
    return float(cost.forward(0, 1)), float(cost.backward(0, 1))

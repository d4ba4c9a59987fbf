"""A plan-independent lower bound on the step time of one batch, and the work a plan does.

The bound is computed from the batch's documents, the cost model and the layout only (never
from a plan), so it is the same yardstick for every strategy and does not move when a planner
changes. With ``n = dp * pp`` devices, ``C`` model chunks (``pp``, or ``pp * v`` interleaved,
``v`` by default :data:`~slimdata.execution.schedule.INTERLEAVED_CHUNKS` as the simulator's)
holding the shares ``frac_c`` of the layers, and every document run whole (one slice: the
fewest per-slice constants)::

    W        = sum over documents d of  forward(0, L_d) + backward(0, L_d)      (full model)
    u        = forward(0, 1) + backward(0, 1) + fwd_pack_const + bwd_pack_const
               (the smallest schedulable unit: a one-token slice in a pack of its own)
    stage(s) = W * share_s / dp  +  u * sum_{c < s} frac_c
               share_s: the layers stage s holds; a stage-s device idles at least while the
               first unit's forward crosses chunks 0 .. s-1, and while the last unit's
               backward crosses them back (pipeline fill and drain)
    long     = (forward(0, L) + backward(0, L)) * max_s share_s / dp    (longest document,
               shared by at most the dp devices of a stage: DP-Merge or static CP)
    bound    = max(long, max_s stage(s))

minimised over the schedules ``simulate`` may pick (1F1B and interleaved), whose chunk shares
differ when ``layers`` does not divide evenly. Every strategy that computes the batch's whole
documents (``same_work``) does at least ``W`` seconds of compute (slicing, context
parallelism, padding and recomputation only add to it), so no such strategy's simulated step
is faster than the bound. A strategy that cuts documents (``concat``) computes fewer attention
pairs and may come in under it. Communication is left out (it can only add).

Example: dp=2, pp=1, two documents whose fwd + bwd take 6 s and 2 s: ``W = 8``, the bound is
``8 / 2 = 4 s`` (the 6 s document alone gives ``6 / 2 = 3 s``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slimdata.cost import CostModel, causal_pairs
from slimdata.execution.pricing import chunk_fractions
from slimdata.execution.schedule import INTERLEAVED_CHUNKS
from slimdata.plan import Document, StepPlan

__all__ = ["StepBound", "Work", "batch_work", "plan_work", "step_bound"]


@dataclass(frozen=True)
class StepBound:
    """The bound and its terms, seconds."""

    value: float
    work: float
    """``W``: compute seconds of the batch over all devices (full model)."""
    stage: float
    """``max_s stage(s)``: the busiest stage's work over its devices plus its fill and drain."""
    longest: float
    """The longest document's work over the largest group that may share it."""


@dataclass(frozen=True)
class Work:
    """What a plan (or a batch) computes: tokens and causal query-key pairs."""

    tokens: int
    attention_pairs: float


def batch_work(docs: Sequence[Document]) -> Work:
    """Tokens and causal pairs of ``docs`` run whole: ``sum L``, ``sum L (L + 1) / 2``."""
    lengths = np.fromiter((d.length for d in docs), dtype=np.float64, count=len(docs))
    return Work(int(lengths.sum()), float(causal_pairs(0, lengths).sum()))


def plan_work(plan: StepPlan) -> Work:
    """Tokens and causal pairs the slices of ``plan`` compute (a cut document's pieces do not
    attend to each other, so they count fewer pairs than the whole document)."""
    starts, ends = [], []
    for rs in plan.ranks:
        for s in rs.slices():
            starts.append(s.start)
            ends.append(s.end)
    st, en = np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)
    return Work(int((en - st).sum()), float(causal_pairs(st, en).sum()))


def _terms(
    cost: CostModel, W: float, longest: float, unit: float, dp: int, pp: int, v: int
) -> tuple[float, float]:
    """``(max_s stage(s), long)`` for ``pp`` stages of ``v`` chunks each (module docstring)."""
    frac = chunk_fractions(cost.layers, pp * v)
    share = np.array([frac[s::pp].sum() for s in range(pp)])
    fill = unit * np.concatenate(([0.0], np.cumsum(frac[: pp - 1])))
    return float((W * share / dp + fill).max()), longest * float(share.max()) / dp


def step_bound(
    docs: Sequence[Document],
    cost: CostModel,
    dp: int,
    pp: int = 1,
    virtual_stages: int = INTERLEAVED_CHUNKS,
) -> StepBound:
    """The plan-independent lower bound of one step of ``docs`` (module docstring)."""
    lengths = np.fromiter((d.length for d in docs), dtype=np.int64, count=len(docs))
    per_doc = cost.forward(0, lengths) + cost.backward(0, lengths)
    W = float(per_doc.sum())
    longest = float(per_doc.max()) if len(per_doc) else 0.0
    unit = float(
        cost.forward(0, 1) + cost.backward(0, 1) + cost.fwd_pack_const + cost.bwd_pack_const
    )
    schedules = [1] if pp == 1 else [1, virtual_stages]
    stage, long = min(
        (_terms(cost, W, longest, unit, dp, pp, v) for v in schedules), key=lambda t: max(t)
    )
    return StepBound(value=max(stage, long), work=W, stage=stage, longest=long)

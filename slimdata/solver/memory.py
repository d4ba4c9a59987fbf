"""Per-rank memory of a plan, as the solver checks it: the execution model's one rule
(:mod:`slimdata.execution.memory`) over the rank's program, the whole model on one device.

Example: one rank runs a 6-token document as forward packs ``[0,4)``, ``[4,6)`` and one
backward pack; after F1 it holds ``6 * act + 6 * kv`` bytes, the document's whole footprint.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from slimdata.cost import CostModel
from slimdata.execution import ExecutionConfig, build_programs, compute_levels, peak
from slimdata.plan.types import Document, MicroPack, RankStep, Slice, StepPlan

__all__ = [
    "device_peak_memory",
    "plan_peak_memory",
    "rank_memory_trace",
    "rank_peak_memory",
    "slice_peak_memory",
]


def rank_memory_trace(
    plan: StepPlan, rank: int, cost: CostModel, config: ExecutionConfig | None = None
) -> list[float]:
    """Bytes held after each event of ``plan.ranks[rank].order`` (pipeline stage 0 of
    ``config``, default: one stage, DDP with split calls, the executor's default)."""
    program = build_programs(plan, cost, config, memory_only=True)[(rank, 0)]
    return compute_levels(program).tolist()


def rank_peak_memory(
    plan: StepPlan, rank: int, cost: CostModel, config: ExecutionConfig | None = None
) -> float:
    """Peak bytes of ``rank`` over the step, buffers held while a pass runs included (0 for
    an idle rank)."""
    return peak(build_programs(plan, cost, config, memory_only=True)[(rank, 0)])


def plan_peak_memory(
    plan: StepPlan, cost: CostModel, config: ExecutionConfig | None = None
) -> np.ndarray:
    """Peak bytes of every rank (stage 0 of ``config``), shape ``(dp,)``."""
    programs = build_programs(plan, cost, config, memory_only=True)
    return np.array([peak(programs[(r, 0)]) for r in range(plan.dp)])


def device_peak_memory(
    plan: StepPlan, cost: CostModel, config: ExecutionConfig, over: float | None = None
) -> float:
    """The largest peak of any device of ``plan`` (every rank and pipeline stage), bytes.

    ``over``: a cap the caller only needs to know is exceeded. The ranks holding the most
    tokens in a pack (:data:`FIRST_RANKS` of them) are checked first; when one of their
    devices peaks above ``over`` that peak is returned (at most the largest), and the other
    ranks' programs are never built; else the other ranks' are built and the largest
    returned (each rank's programs read its own packs; under FSDP's plan-global rules every
    rank's are built at once)."""
    if over is None or plan.dp <= FIRST_RANKS or config.parallelism == "fsdp":
        return max(peak(p) for p in build_programs(plan, cost, config, memory_only=True))
    ranked = sorted(range(plan.dp), key=lambda r: -_largest_pack_tokens(plan, r))
    found = 0.0
    for ranks in (ranked[:FIRST_RANKS], ranked[FIRST_RANKS:]):
        programs = build_programs(plan, cost, config, memory_only=True, ranks=ranks)
        found = max(found, max(peak(p) for p in programs))
        if found > over:
            break
    return found


FIRST_RANKS = 2
"""Ranks :func:`device_peak_memory` checks first against a cap."""


@lru_cache(maxsize=256)
def slice_peak_memory(tokens: int, cost: CostModel, config: ExecutionConfig) -> float:
    """What one slice of ``tokens`` tokens needs alone on a device, bytes: the
    :func:`device_peak_memory` of a plan that runs it alone, in one forward and one backward
    pack on one rank (its activations and K/V, and under static CP the K/V its pass
    gathers). No plan holding the slice peaks lower on a device. It depends on the length
    alone: a slice ``[63488, 65536)`` needs what ``[0, 2048)`` does (0.81 GiB for llama-8b
    under full recompute; its prefix is other slices' bytes)."""
    pack = MicroPack((Slice(0, 0, tokens),))
    plan = StepPlan(0, "slice", (Document(0, tokens),), (RankStep(0, (pack,), (pack,)),))
    return device_peak_memory(plan, cost, config)


def _largest_pack_tokens(plan: StepPlan, rank: int) -> int:
    return max((p.tokens for p in plan.ranks[rank].forward), default=0)

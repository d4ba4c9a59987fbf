"""slimpack under FSDP with static CP against wlb-ideal, which packs the ``dp x m`` micro-batches
of the whole batch at once: one 64K document, costly per token, and short documents."""

from __future__ import annotations

import numpy as np
import pytest

from slimdata.cost import CostModel
from slimdata.docsource import documents_from_lengths
from slimdata.sim import SimConfig
from slimdata.sim.compare import compare_strategies
from slimdata.solver import Layout, solve
from slimdata.solver.options import SolveOptions

CONTEXT = 65536


def batch_lengths(seed: int) -> list[int]:
    """A 64K document and short ones of 200-3000 tokens, about 505K tokens in all (under the
    global batch of 8 x 64K, so one step holds them all)."""
    short = np.random.default_rng(seed).integers(200, 3000, size=400)
    return [CONTEXT, *short[np.cumsum(short) <= 505_000 - CONTEXT].tolist()]


@pytest.mark.parametrize("seed", [0, 1])
def test_fsdp_static_cp_4_fills_the_packs_wlb_ideal_fills(seed):
    # 8 devices as 2 groups of static CP 4: the batch needs 4 packs of <= 64K tokens per group.
    # Phase 1 balances each rank's time: the rank with the costly 64K document gets fewer
    # tokens and the other more than 4 packs hold (294,380 of 262,144 at seed 0), which took
    # 5 packs on both and 10.79 s, against wlb-ideal's 4 packs and 9.60 s. Packing the whole
    # batch's documents into 2 x 4 packs at once is now one of slimpack's candidates.
    cost = CostModel.analytic("llama-8b", "h100", "full")
    layout = Layout(dp=8, context=CONTEXT, memory_gib=60, mode="lockstep")
    cmp = compare_strategies(
        documents_from_lengths(batch_lengths(seed)),
        layout,
        cost,
        strategies=["slimpack", "wlb-ideal"],
        global_batch_tokens=8 * CONTEXT,
        steps=1,
        config=SimConfig(parallelism="fsdp"),
        baseline_config="cp=4",
    )
    slim, wlb = cmp.results["slimpack"], cmp.results["wlb-ideal"]
    assert slim.cp == wlb.cp == 4 and not slim.error and not wlb.error
    assert slim.step_time <= wlb.step_time
    assert wlb.micro_batches == 4
    plan = cmp.first["slimpack"][0]
    tokens = [sum(p.tokens for p in rs.forward) for rs in plan.ranks]
    assert sum(tokens) == sum(batch_lengths(seed))  # the whole batch, in this one step
    # the whole batch packed at once fills wlb-ideal's 4 packs per group (the plan above
    # also merges a document too coarse to balance, one pack more: coarse_merge off here)
    alone = solve(
        documents_from_lengths(batch_lengths(seed)),
        Layout(dp=2, cp=4, context=CONTEXT, memory_gib=60, mode="lockstep"),
        "slimpack",
        0,
        cost,
        options=SolveOptions(coarse_merge=False),
    )
    m = len(alone.ranks[0].forward)
    tokens = [sum(p.tokens for p in rs.forward) for rs in alone.ranks]
    assert m == 4 and max(tokens) <= m * CONTEXT
    assert sum(tokens) == sum(batch_lengths(seed))

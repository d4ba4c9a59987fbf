"""``dcp``: Megatron-LM dynamic context parallelism (per-sequence CP size, L^2/cp greedy)."""

from __future__ import annotations

import pytest

from slimdata.cost import CostModel
from slimdata.docsource import documents_from_lengths
from slimdata.solver import Layout, SolveOptions, solve
from slimdata.solver.strategies.dcp import dcp_cp_size, default_max_seqlen


@pytest.mark.parametrize(
    ("length", "per_rank", "min_cp", "cp"),
    [
        (64, 64, 1, 1),  # fits one rank
        (65, 64, 1, 2),
        (128, 64, 1, 2),  # Megatron-Bridge's example: length 128 at 64 per rank needs 2
        (129, 64, 1, 4),  # 3 ranks, rounded up to a power of two
        (9000, 4096, 1, 4),
        (4 * 4096 + 1, 4096, 1, 8),
        (10, 4096, 2, 2),  # never below min_cp
        (6144, 4096, 1, 2),
    ],
)
def test_cp_size_is_megatrons_formula(length, per_rank, min_cp, cp):
    assert dcp_cp_size(length, per_rank, min_cp) == cp


def test_groups_follow_the_formula_and_balance_short_documents():
    cost = CostModel.analytic("llama-1b")
    # per rank 1000 tokens: 3000 -> cp 4, 1500 -> cp 2, the rest cp 1
    docs = documents_from_lengths([3000, 1500, 900, 800, 700, 600, 500, 400])
    lay = Layout(dp=8, context=4096, memory_gib=100)
    plan = solve(docs, lay, "dcp", 0, cost, options=SolveOptions(max_seqlen_per_rank=1000))
    sizes = {plan.docs[d].length: len(m.ranks) for m in plan.merges for d in m.docs}
    assert sizes == {3000: 4, 1500: 2}
    assert sorted(r for m in plan.merges for r in m.ranks) == [0, 1, 2, 3, 4, 5]
    # member i of a cp=4 group holds chunks i and 7 - i of 8 (375 tokens each): 750 tokens
    big = next(m for m in plan.merges if len(m.ranks) == 4)
    for r in big.ranks:
        assert sum(p.tokens for p in plan.ranks[r].forward if p.merge is not None) == 750
    # the six short documents go one per rank to the least loaded ranks: 6, 7 first
    short_rank = {
        plan.docs[s.doc].length: rs.rank
        for rs in plan.ranks
        for p in rs.forward
        if p.merge is None
        for s in p.slices
    }
    assert short_rank[900] == 6 and short_rank[800] == 7
    assert plan.tokens == sum(d.length for d in docs)


def test_default_max_seqlen_fits_memory():
    cost = CostModel.analytic("llama-8b", recompute="selective")
    lay = Layout(dp=8, context=131072, memory_gib=40)
    n = default_max_seqlen(lay, cost)
    assert n * (cost.act_bytes_per_token + cost.kv_bytes_per_token) <= lay.memory_bytes
    assert (n + 1) * (cost.act_bytes_per_token + cost.kv_bytes_per_token) > lay.memory_bytes


def test_lockstep_plan_is_valid():
    cost = CostModel.analytic("llama-1b")
    docs = documents_from_lengths([3000, 1500, 900, 800, 700, 600, 500, 400, 300, 200])
    lay = Layout(dp=4, pp=2, context=4096, memory_gib=100, mode="lockstep")
    plan = solve(
        docs, lay, "dcp", 0, cost, options=SolveOptions(max_seqlen_per_rank=1000)
    ).validate()
    assert len({len(rs.forward) for rs in plan.ranks}) == 1

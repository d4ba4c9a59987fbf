"""slimpack, free mode: where whole documents are too coarse for the ranks to balance, the
costliest on the slowest rank is merged over two ranks, kept only when the plan's estimate
is lower."""

from __future__ import annotations

import pytest

from slimdata.solver import Layout, solve
from slimdata.solver.options import SolveOptions

from .conftest import docs_of, unit_cost

LAYOUT = Layout(dp=2, memory_gib=1000, context=4096)


def rank_tokens(plan) -> list[int]:
    return [sum(s.tokens for p in rs.forward for s in p.slices) for rs in plan.ranks]


def test_three_equal_documents_on_two_ranks_merge_one_over_both():
    # 3 documents of 1,024 tokens, 3 s per token (1 forward, 2 backward): whole, one rank
    # runs two (6,144 s) and the other one (3,072 s), imbalance 6144 / 4608 = 4 / 3. One of
    # the slowest rank's documents merged over both ranks (512 tokens each) gives 1.5
    # documents, 4,608 s, each
    docs = docs_of([1024, 1024, 1024])
    plan = solve(docs, LAYOUT, "slimpack", 0, unit_cost())
    assert len(plan.merges) == 1 and plan.merges[0].ranks == (0, 1)
    assert plan.merges[0].docs == tuple(plan.meta["coarse_merge"])
    assert rank_tokens(plan) == [1536, 1536]
    assert plan.meta["imbalance"] == 1.0

    whole = solve(
        docs, LAYOUT, "slimpack", 0, unit_cost(), options=SolveOptions(coarse_merge=False)
    )
    assert whole.merges == ()
    assert sorted(rank_tokens(whole)) == [1024, 2048]
    assert whole.meta["imbalance"] == round(6144 / 4608, 6)


def test_a_coarse_merge_that_does_not_lower_the_estimate_is_not_kept():
    # 1,500, 1,000 and 1,000 tokens: whole, 1,500 | 2,000 (imbalance 8 / 7). The slowest
    # rank's costliest document merged over both ranks (500 tokens each) leaves 1,500 + 500
    # on one rank and 1,000 + 500 on the other: 2,000 tokens again (a member's share may not
    # outgrow the group's largest), no lower estimate, so no merge
    docs = docs_of([1500, 1000, 1000])
    plan = solve(docs, LAYOUT, "slimpack", 0, unit_cost())
    assert plan.merges == ()
    assert sorted(rank_tokens(plan)) == [1500, 2000]
    assert plan.meta["imbalance"] == round(6000 / 5250, 6)


def test_balanced_ranks_try_no_coarse_merge():
    plan = solve(docs_of([1024, 1024]), LAYOUT, "slimpack", 0, unit_cost())
    assert plan.merges == () and plan.meta["imbalance"] == 1.0


def test_every_equally_slow_rank_merges_its_coarsest_document():
    # 6 documents of 1,024 tokens on 4 ranks: whole, two ranks run two (6,144 s) and two run
    # one (3,072 s), imbalance 6144 / 4608 = 4 / 3. Merging one document of the first slow
    # rank alone leaves the second at 6,144 s (no lower step): both slow ranks' documents
    # merged, each over two ranks, give 1,536 tokens (4,608 s) on every rank
    layout = Layout(dp=4, memory_gib=1000, context=4096)
    plan = solve(docs_of([1024] * 6), layout, "slimpack", 0, unit_cost())
    assert len(plan.meta["coarse_merge"]) == 2
    assert sorted(d for m in plan.merges for d in m.docs) == sorted(plan.meta["coarse_merge"])
    assert all(len(m.ranks) == 2 for m in plan.merges)
    assert {r for m in plan.merges for r in m.ranks} == {0, 1, 2, 3}
    assert rank_tokens(plan) == [1536] * 4
    assert plan.meta["imbalance"] == 1.0

    whole = solve(
        docs_of([1024] * 6),
        layout,
        "slimpack",
        0,
        unit_cost(),
        options=SolveOptions(coarse_merge=False),
    )
    assert sorted(rank_tokens(whole)) == [1024, 1024, 2048, 2048]
    assert whole.meta["imbalance"] == round(4 / 3, 6)


def test_three_slow_ranks_of_eight_each_merge_one_document():
    # 11 documents of 1,024 tokens on 8 ranks: whole, three ranks run two, imbalance
    # 2048 / 1408 = 16 / 11. Each slow rank's second document merged with an idle-ish rank:
    # six ranks hold 1,536 tokens, two hold 1,024, imbalance 1536 / 1408 = 12 / 11
    layout = Layout(dp=8, memory_gib=1000, context=4096)
    plan = solve(docs_of([1024] * 11), layout, "slimpack", 0, unit_cost())
    assert len(plan.merges) == 3 and all(len(m.ranks) == 2 for m in plan.merges)
    assert sorted(rank_tokens(plan)) == [1024, 1024] + [1536] * 6
    assert plan.meta["imbalance"] == round(12 / 11, 6)


def test_a_document_of_one_slice_is_never_a_coarse_merge_candidate():
    # slices of 256 tokens; documents 0-4 of 640, 256, 128, 1,024 and 768 tokens; 4 ranks.
    # Documents 3 and 4 are merged over two ranks each to fit one pack's share; whole, the
    # ranks hold 768 (doc 3's half, doc 1), 640 (doc 3's half, doc 2), 512 (doc 4's half)
    # and 896 tokens (doc 4's half, doc 0): mean 704, imbalance 896 / 704. Rank 3 and rank 0
    # are above 1.02 x the mean; rank 3's costliest whole document, 0 (three slices), can be
    # shared, rank 0's, 1 (one slice), cannot: doc 0 alone is the candidate, merged with doc
    # 4 over ranks 2 and 3: 768, 640, 768, 640 tokens, imbalance 768 / 704
    layout = Layout(dp=4, memory_gib=1000, context=8192)
    plan = solve(docs_of([640, 256, 128, 1024, 768], 256), layout, "slimpack", 0, unit_cost())
    assert plan.meta["coarse_merge"] == [0]
    assert [(m.ranks, m.docs) for m in plan.merges] == [((0, 1), (3,)), ((2, 3), (4, 0))]
    assert rank_tokens(plan) == [768, 640, 768, 640]
    assert plan.meta["imbalance"] == round(768 / 704, 6)


def _launch_bound_cost():
    """A CPU profile of a 2-layer model (rounded): fixed costs per slice and per pack weigh as
    much as a few hundred tokens."""
    from slimdata.cost import CostModel

    return CostModel(
        fwd_lin=7.8e-6,
        fwd_att=1.8e-8,
        fwd_const=3.75e-4,
        bwd_lin=1.58e-5,
        bwd_att=3.7e-8,
        bwd_const=5.65e-4,
        act_bytes_per_token=10564.0,
        kv_bytes_per_token=512.0,
        fwd_pack_const=1.76e-3,
        bwd_pack_const=1.54e-3,
    )


def test_a_merge_whose_members_wait_on_each_other_is_estimated_as_simulated(monkeypatch):
    # six documents (a batch of a PostgreSQL-docs build) on 2 ranks: whole, the ranks' loads
    # are 7% apart (0.569 s simulated). The coarse merge shares the costliest document the
    # slower rank holds whole, 2,039 tokens, between the ranks: [0, 896) on rank 1 (which also
    # holds the 3,796-token document) and [896, 2039) on rank 0, whose attention reads the
    # 896-token prefix: the shares' forward passes take 17 and 44 ms. The rank totals even
    # out, but the members run the merge packs together and rank 1 waits for rank 0 (0.621 s
    # simulated). The estimate prices a merge pack at its slowest member's, as the simulator
    # runs it: on a network that costs nothing the two agree with the merge (forced here) and
    # without it, so slimpack keeps the documents whole
    from slimdata.cost import Interconnect
    from slimdata.execution.critical import plan_critical_path
    from slimdata.sim import SimConfig, simulate_step
    from slimdata.solver.strategies import slimpack

    cost = _launch_bound_cost()
    free = SimConfig(
        interconnect=Interconnect(intra_node_gbps=1e12, inter_node_gbps=1e12, latency_s=0.0)
    )
    layout = Layout(dp=2, memory_gib=72, context=8192)
    docs = docs_of([1426, 1436, 1486, 1720, 2039, 3796], 2048)
    whole = solve(docs, layout, "slimpack", 0, cost)
    assert whole.merges == () and "coarse_merge" not in whole.meta
    step = simulate_step(whole, cost, layout, free).step_time
    assert plan_critical_path(whole, cost) == pytest.approx(step, rel=1e-9)
    assert round(step, 3) == 0.569

    # keep the coarse merge, whatever it costs
    monkeypatch.setattr(slimpack, "COARSE_GAIN", -1.0)
    monkeypatch.setattr(slimpack, "_merges_that_pay", lambda assembly, solve: solve(assembly))
    merged = solve(docs, layout, "slimpack", 0, cost)
    assert [(m.ranks, m.docs) for m in merged.merges] == [((0, 1), (4,))]
    step = simulate_step(merged, cost, layout, free).step_time
    assert plan_critical_path(merged, cost) == pytest.approx(step, rel=1e-9)
    assert round(step, 3) == 0.621

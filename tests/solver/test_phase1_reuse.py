"""A lockstep solve computes phase 1's placement once for the candidate pack counts whose merge
plans agree (``_Placements``): the reused placement must be the one each count would compute
on its own, and a count whose merge plan differs must get its own."""

import pytest

import slimdata.solver.strategies.slimpack as sp
from slimdata.solver import Layout, solve
from slimdata.solver.budget import MemoryBudget
from slimdata.solver.common import BatchView
from slimdata.solver.options import DEFAULT_OPTIONS

from .conftest import GIB, docs_of, unit_cost

# unit cost: 100 tokens of activations per GiB, so the 1536-token document (12 slices) needs
# 15.4 GiB and cannot stay on one 4 GiB rank. The merge planner sizes its group to one pack:
# 6 members at the fewest pack counts, all 8 ranks at the larger ones (whose budgets differ:
# each count reserves room for its own packs in flight).
LENGTHS = [1536] + [128] * 40 + [256] * 10
LAYOUT = Layout(dp=8, pp=2, mode="lockstep", context=2048, memory_gib=4.0)


def _plan_dict(plan) -> dict:
    d = plan.to_dict()
    d["meta"].pop("solve_ms", None)
    return d


def test_memory_budget_answers_alike():
    budget = MemoryBudget(10.0)
    assert budget.fits(7.0) and budget.fits(6.0, reserve=3.0) and not budget.fits(9.0, 2.0)
    assert budget.asked == [(7.0, 0.0, True), (6.0, 3.0, True), (9.0, 2.0, False)]
    assert budget.answers_alike(10.5) and budget.answers_alike(9.0)
    assert not budget.answers_alike(8.5)  # 6 > 8.5 - 3
    assert not budget.answers_alike(11.0)  # 9 <= 11 - 2
    assert MemoryBudget(1.0).answers_alike(-5.0)  # asked nothing: any budget


def test_each_count_gets_the_placement_it_would_compute_alone(monkeypatch):
    cost = unit_cost()
    calls = []  # (packs, budget, gather, layer_share, phase 1 as the solve got it)
    phase1 = sp._phase1

    def recording(
        view,
        layout,
        options,
        *,
        packs,
        mem,
        gather=sp.MERGE_GATHER,
        layer_share,
        placements,
        coarse=(),
    ):
        p1 = phase1(
            view,
            layout,
            options,
            packs=packs,
            mem=mem,
            gather=gather,
            layer_share=layer_share,
            placements=placements,
            coarse=coarse,
        )
        assert coarse == ()  # no coarse merge in this batch
        calls.append((view, packs, mem, gather, layer_share, p1))
        return p1

    monkeypatch.setattr(sp, "_phase1", recording)
    solve(docs_of(LENGTHS), LAYOUT, "slimpack", 0, cost)
    monkeypatch.undo()

    groups = [[len(r) for r, _d in p1.merges.groups] for *_a, p1 in calls]
    assert groups[0] == [6] and [8] in groups  # the merge plans differ between counts
    reused = [k for k in range(1, len(calls)) if any(calls[k][5] is c[5] for c in calls[:k])]
    assert reused  # and some counts reuse an earlier count's placement
    assert all(calls[k][2] != calls[k - 1][2] for k in reused)  # under another budget
    for view, packs, mem, gather, layer_share, p1 in calls:
        fresh = sp._phase1(
            view,
            LAYOUT,
            DEFAULT_OPTIONS,
            packs=packs,
            mem=mem,
            gather=gather,
            layer_share=layer_share,
        )
        assert p1.merges.groups == fresh.merges.groups
        assert p1.member_slices == fresh.member_slices
        assert p1.docs == fresh.docs and p1.moves == fresh.moves


def test_solve_with_reuse_equals_solve_with_every_count_fresh(monkeypatch):
    cost = unit_cost()
    docs = docs_of(LENGTHS)
    reusing = solve(docs, LAYOUT, "slimpack", 0, cost)
    place = sp._Placements.place

    def fresh(self, merges, mem, scale):
        self.found.clear()
        return place(self, merges, mem, scale)

    monkeypatch.setattr(sp._Placements, "place", fresh)
    alone = solve(docs, LAYOUT, "slimpack", 0, cost)
    assert reusing.merges and _plan_dict(reusing) == _plan_dict(alone)


@pytest.mark.parametrize("mem_gib", [2.0, 7.0, 100.0])
def test_a_placement_is_reused_only_where_the_budget_answers_alike(mem_gib):
    # the same merge plan (8 members of 2 slices, 2.56 GiB each) placed under 6 GiB, then
    # under a budget that answers its memory questions alike (7 GiB) or not: under 2 GiB a
    # member's share no longer fits, under 100 GiB the whole document does (15.36 GiB)
    cost = unit_cost()
    view = BatchView.build(docs_of(LENGTHS), cost)
    placements = sp._Placements(view, LAYOUT, DEFAULT_OPTIONS)
    merges = sp.plan_merges(view, LAYOUT.dp, 6 * GIB, packs=8, gather=sp.MERGE_GATHER)
    assert merges.groups
    first = placements.place(merges, 6 * GIB, sp.MERGE_GATHER)
    ((budget, _p1),) = next(iter(placements.found.values()))
    assert budget.asked  # the placement asked its budget something
    again = placements.place(merges, mem_gib * GIB, sp.MERGE_GATHER)
    assert (again is first) == budget.answers_alike(mem_gib * GIB)
    assert (again is first) == (mem_gib == 7.0)

"""plan_table runs validate_plan's per-rank checks on all ranks at once: on every valid plan
it gives exactly the rank-by-rank table, and it passes no plan the rank-by-rank checks
refuse (those then name the failing slice)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slimdata.errors import PlanError
from slimdata.plan import Document, MergeGroup, MicroPack, RankStep, Slice, StepPlan
from slimdata.plan.ranktable import plan_table
from slimdata.plan.validate import _check_merges, _rank_by_rank
from slimdata.solver import STRATEGIES, Layout, solve

from .conftest import docs_of, unit_cost

# dp 3: rank 0 holds document 0 (6 tokens, cut at 4); rank 1 holds document 1 (3 tokens) and
# shares document 2 (8 tokens) with rank 2 in merge group 0: rank 1 [0,5), rank 2 [5,8).
DOCS = (
    Document(doc_id="a", length=6, cuts=(0, 4, 6)),
    Document(doc_id="b", length=3),
    Document(doc_id="c", length=8, cuts=(0, 5, 8)),
)
A0, A1, B, C0, C1 = Slice(0, 0, 4), Slice(0, 4, 6), Slice(1, 0, 3), Slice(2, 0, 5), Slice(2, 5, 8)


def P(*slices, merge=None):
    return MicroPack(tuple(slices), merge=merge)


R0 = RankStep(0, (P(A0), P(A1)), (P(A1), P(A0)))
R1 = RankStep(1, (P(B), P(C0, merge=0)), (P(C0, merge=0), P(B)))
R2 = RankStep(2, (P(C1, merge=0),), (P(C1, merge=0),))
PLAN = StepPlan(
    step=0, strategy="hand", docs=DOCS, ranks=(R0, R1, R2), merges=(MergeGroup((1, 2), (2,)),)
)


def _both(plan):
    merged = _check_merges(plan)
    return plan_table(plan, merged), merged


def test_the_hand_plan_table():
    table, _ = _both(PLAN)
    # doc, start, end, forward pack, backward pack, rank; by rank, then document and start
    assert table.tolist() == [
        [0, 0, 4, 0, 1, 0],
        [0, 4, 6, 1, 0, 0],
        [1, 0, 3, 0, 1, 1],
        [2, 0, 5, 1, 0, 1],
        [2, 5, 8, 0, 0, 2],
    ]


MUTATIONS = {
    "in two forward packs": (0, RankStep(0, (P(A0), P(A0, A1)), (P(A1), P(A0)))),
    "not in a backward pack": (0, RankStep(0, (P(A0), P(A1)), (P(A1),))),
    "slice bounds changed in backward": (
        0,
        RankStep(0, (P(A0), P(A1)), (P(A1), P(Slice(0, 0, 3)))),
    ),
    "tag of another group": (1, RankStep(1, (P(B), P(C0, merge=1)), (P(C0, merge=0), P(B)))),
    "negative tag": (1, RankStep(1, (P(B), P(C0, merge=-1)), (P(C0, merge=0), P(B)))),
    "tag outside any group": (0, RankStep(0, (P(A0, merge=0), P(A1)), (P(A1), P(A0)))),
    "unknown document": (
        0,
        RankStep(0, (P(A0), P(A1), P(Slice(5, 0, 3))), (P(A1), P(A0), P(Slice(5, 0, 3)))),
    ),
    "merged slice outside the merge pack": (
        1,
        RankStep(1, (P(B, C0), P(merge=0)), (P(C0, merge=0), P(B))),
    ),
    "unmerged slice in the merge pack": (
        1,
        RankStep(1, (P(), P(B, C0, merge=0)), (P(C0, merge=0), P(B))),
    ),
    "two merge packs": (2, RankStep(2, (P(C1, merge=0), P(merge=0)), (P(C1, merge=0), P()))),
    "order misses a pack": (
        0,
        RankStep(0, R0.forward, R0.backward, (("F", 0), ("B", 0), ("B", 1))),
    ),
    "order out of sequence": (
        0,
        RankStep(0, R0.forward, R0.backward, (("F", 1), ("F", 0), ("B", 0), ("B", 1))),
    ),
    "backward before forward (rule 3)": (
        0,
        RankStep(0, R0.forward, R0.backward, (("F", 0), ("B", 0), ("F", 1), ("B", 1))),
    ),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_a_rank_failing_a_check_gets_the_rank_by_rank_error(name):
    r, rs = MUTATIONS[name]
    ranks = list(PLAN.ranks)
    ranks[r] = rs
    plan = replace(PLAN, ranks=tuple(ranks))
    table, merged = _both(plan)
    assert table is None
    with pytest.raises(PlanError) as by_rank:
        _rank_by_rank(plan, merged)
    with pytest.raises(PlanError) as whole:
        plan.validate()
    assert str(whole.value) == str(by_rank.value)


def test_non_integer_tags_and_bounds_fall_back():
    for rs in (
        RankStep(0, (P(A0, merge="0"), P(A1)), (P(A1), P(A0))),
        RankStep(0, (P(A0), P(Slice(0, 4, 2**70))), (P(Slice(0, 4, 2**70)), P(A0))),
    ):
        plan = replace(PLAN, ranks=(rs, R1, R2))
        assert _both(plan)[0] is None
        with pytest.raises(PlanError):
            plan.validate()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=40),
    dp=st.integers(1, 6),
    mode=st.sampled_from(["free", "lockstep"]),
    mem=st.sampled_from([0.5, 2.0, 8.0]),
    strategy=st.sampled_from(list(STRATEGIES)),
)
def test_on_valid_plans_the_table_is_the_rank_by_rank_table(lengths, dp, mode, mem, strategy):
    layout = Layout(dp=dp, mode=mode, memory_gib=mem, context=2048)
    try:
        plan = solve(docs_of(lengths, 256), layout, strategy, 0, unit_cost(), validate=False)
    except PlanError:
        return
    table, merged = _both(plan)
    assert table is not None
    np.testing.assert_array_equal(table, _rank_by_rank(plan, merged))
    assert len(table) == sum(len(p.slices) for rs in plan.ranks for p in rs.forward)


@pytest.mark.parametrize("mode", ["free", "lockstep"])
def test_a_solver_plan_with_merge_groups(mode):
    lengths = [*np.random.default_rng(1).integers(20, 400, size=40).tolist(), 2000]
    layout = Layout(dp=4, mode=mode, memory_gib=8)
    plan = solve(docs_of(lengths, 128), layout, "slimpack", 0, unit_cost(), validate=False)
    assert plan.merges  # the merge-group checks are exercised
    table, merged = _both(plan)
    assert table is not None
    np.testing.assert_array_equal(table, _rank_by_rank(plan, merged))

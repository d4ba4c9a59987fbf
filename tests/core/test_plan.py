"""Plan types: JSON round trip, eager order, and every validation rule of design §4."""

from __future__ import annotations

import dataclasses

import pytest

from slimdata.errors import PlanError
from slimdata.plan import Document, MergeGroup, MicroPack, RankStep, Slice, StepPlan
from slimdata.plan.types import eager_order

DOCS = (Document(doc_id="a", length=6, cuts=(0, 4, 6)), Document(doc_id="b", length=3))
A0, A1, B0 = Slice(0, 0, 4), Slice(0, 4, 6), Slice(1, 0, 3)


def P(*slices, merge=None):
    return MicroPack(tuple(slices), merge=merge)


def plan(fwd, bwd, order=(), docs=DOCS, **kw):
    return StepPlan(
        step=0,
        strategy="hand",
        docs=docs,
        ranks=(RankStep(0, tuple(fwd), tuple(bwd), tuple(order)),),
        **kw,
    )


def test_valid_asymmetric_plan_and_round_trip():
    p = plan([P(A0), P(A1, B0)], [P(A1), P(B0, A0)]).validate()
    assert p.ranks[0].order == (("F", 0), ("F", 1), ("B", 0), ("B", 1))
    assert p.loss_tokens == 5 + 2 and p.tokens == 9
    q = StepPlan.from_json(p.to_json())
    assert q == p and q.ranks[0].forward[1].slices == (A1, B0)


def test_eager_order_runs_backward_as_soon_as_documents_finish():
    fwd = [P(B0), P(A0), P(A1)]
    bwd = [P(B0), P(A1), P(A0)]
    assert eager_order(fwd, bwd) == (("F", 0), ("B", 0), ("F", 1), ("F", 2), ("B", 1), ("B", 2))
    plan(fwd, bwd).validate()


@pytest.mark.parametrize(
    ("fwd", "bwd", "message"),
    [
        (
            [P(A1), P(A0, B0)],
            [P(A1), P(A0, B0)],
            r"slice \[4, 6\) of document #0 \(doc_id 'a'\) on rank 0 runs forward in pack 0.*rule 1",
        ),
        (
            [P(A0), P(A1, B0)],
            [P(A0), P(A1, B0)],
            r"slice \[0, 4\) .* runs backward in pack 0, before its successor.*rule 2",
        ),
        ([P(A0), P(B0)], [P(A0), P(B0)], r"tokens \[4, 6\) are in no slice"),
        ([P(A0, A1), P(B0, Slice(1, 2, 3))], [P(A1, A0), P(B0, Slice(1, 2, 3))], r"overlaps"),
        (
            [P(A0), P(A1, B0)],
            [P(A1), P(A0)],
            r"slice \[0, 3\) of document #1.*exactly one forward and one backward",
        ),
        ([P(A0, A0), P(A1, B0)], [P(A1), P(B0, A0)], r"in two forward packs"),
    ],
)
def test_each_rule_names_the_slice(fwd, bwd, message):
    with pytest.raises(PlanError, match=message):
        plan(fwd, bwd).validate()


def test_backward_before_forward_of_its_document_is_rejected():
    with pytest.raises(PlanError, match="rule 3"):
        plan(
            [P(A0), P(A1, B0)], [P(A1), P(B0, A0)], order=(("F", 0), ("B", 0), ("F", 1), ("B", 1))
        ).validate()
    with pytest.raises(PlanError, match="order must list"):
        plan(
            [P(A0), P(A1, B0)], [P(A1), P(B0, A0)], order=(("F", 1), ("F", 0), ("B", 0), ("B", 1))
        ).validate()


def test_document_split_over_ranks_needs_a_merge_group():
    r0 = RankStep(0, (P(A0), P(B0)), (P(B0), P(A0)))
    r1 = RankStep(1, (P(A1),), (P(A1),))
    with pytest.raises(PlanError, match=r"split over ranks \[0, 1\] without a merge group"):
        StepPlan(step=0, strategy="hand", docs=DOCS, ranks=(r0, r1)).validate()
    # as a merge group: each member has one merge pack holding its share of document 0
    r0 = RankStep(0, (P(A0, merge=0), P(B0)), (P(B0), P(A0, merge=0)))
    r1 = RankStep(1, (P(A1, merge=0),), (P(A1, merge=0),))
    ok = StepPlan(
        step=0, strategy="hand", docs=DOCS, ranks=(r0, r1), merges=(MergeGroup((0, 1), (0,)),)
    ).validate()
    assert StepPlan.from_json(ok.to_json()) == ok
    # a merged document outside its merge pack is an error
    r0bad = RankStep(0, (P(A0), P(B0)), (P(B0), P(A0)))
    with pytest.raises(PlanError, match="merged documents must be in their group's merge pack"):
        StepPlan(
            step=0,
            strategy="hand",
            docs=DOCS,
            ranks=(r0bad, r1),
            merges=(MergeGroup((0, 1), (0,)),),
        ).validate()
    with pytest.raises(PlanError, match="two groups"):
        StepPlan(
            step=0,
            strategy="hand",
            docs=DOCS,
            ranks=(r0, r1),
            merges=(MergeGroup((0, 1), (0,)), MergeGroup((1, 0), (1,))),
        ).validate()


def test_lockstep_needs_equal_shapes():
    r0 = RankStep(0, (P(A0), P(A1)), (P(A1), P(A0)))
    r1 = RankStep(1, (P(B0),), (P(B0),))
    p = StepPlan(step=0, strategy="hand", docs=DOCS, ranks=(r0, r1), mode="lockstep")
    with pytest.raises(PlanError, match="lockstep plan"):
        p.validate()
    dataclasses.replace(p, mode="free").validate()


def test_empty_packs_and_bad_modes():
    with pytest.raises(PlanError, match="at least one rank"):
        StepPlan(step=0, strategy="x", docs=(), ranks=()).validate()
    with pytest.raises(PlanError, match="mode="):
        plan([P(A0, A1, B0)], [P(A0, A1, B0)], mode="sync").validate()
    # a rank with no work is valid when another rank holds all documents
    r0 = RankStep(0, (P(A0, A1, B0),), (P(B0, A1, A0),))
    StepPlan(step=0, strategy="x", docs=DOCS, ranks=(r0, RankStep(1, (), ()))).validate()

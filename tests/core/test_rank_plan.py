"""RankPlan: one rank's view of a StepPlan (the plan-shard payload): exactly what the rank
needs, a JSON round trip, and validation of the view on its own."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from slimdata.errors import PlanError, PlanFormatError
from slimdata.plan import (
    Document,
    MergeGroup,
    MicroPack,
    RankPlan,
    RankStep,
    Slice,
    StepPlan,
    lockstep_schedule,
    rank_views,
)
from slimdata.plan.load import parse_rank_plan

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


def merge_plan() -> StepPlan:
    r0 = RankStep(0, (P(A0), P(A1)), (P(A1), P(A0)))
    r1 = RankStep(1, (P(B), P(C0, merge=0)), (P(C0, merge=0), P(B)))
    r2 = RankStep(2, (P(C1, merge=0),), (P(C1, merge=0),))
    plan = StepPlan(
        step=4,
        strategy="hand",
        docs=DOCS,
        ranks=(r0, r1, r2),
        merges=(MergeGroup((1, 2), (2,)),),
        meta={"seed": 0},
    )
    return plan.validate()


def test_each_rank_gets_its_packs_its_documents_and_its_group():
    plan = merge_plan()
    v0, v1, v2 = rank_views(plan)
    assert [v.rank for v in (v0, v1, v2)] == [0, 1, 2]
    assert {v.dp for v in (v0, v1, v2)} == {3}
    assert {v.loss_tokens for v in (v0, v1, v2)} == {5 + 2 + 7}  # global, not the rank's
    assert v0.docs == {0: DOCS[0]} and v0.ranks == {0: plan.ranks[0]}
    assert v1.docs == {1: DOCS[1], 2: DOCS[2]}
    # rank 1 runs its own RankStep and lays out rank 2's share of the merged document
    assert v1.ranks == {1: plan.ranks[1], 2: plan.ranks[2]}
    member = RankStep(1, (P(C0, merge=0),), (P(C0, merge=0),))
    assert v2.docs == {2: DOCS[2]} and v2.ranks == {1: member, 2: plan.ranks[2]}
    assert v1.ranks[2].order == (("F", 0), ("B", 0))
    assert [v.merges for v in (v0, v1, v2)] == [plan.merges] * 3
    assert (v0.tokens, v1.tokens, v2.tokens) == (6, 8, 3)
    assert v1.merge_of_rank(2) == 0 and v0.merge_of_rank(0) is None
    assert plan.rank_view(1) == v1
    with pytest.raises(PlanError, match="rank 3 is not one of the plan's 3 ranks"):
        plan.rank_view(3)


def test_views_round_trip_through_json_and_validate():
    for view in rank_views(merge_plan()):
        assert view.validate() is view
        text = view.to_json()
        assert json.loads(text)["format"] == 2
        back = parse_rank_plan(text, dp=3)
        assert back == view and back.meta == {"seed": 0}


def test_to_json_is_the_compact_sorted_json_of_to_dict():
    """The fast encoder (tuples, orjson) writes to_dict() as compact JSON with every object's
    keys sorted: string and integer doc ids, cut documents, merge packs, lockstep."""
    a, b = Slice(0, 0, 4), Slice(1, 0, 3)
    lock = StepPlan(
        step=1,
        strategy="hand",
        docs=(Document(doc_id=7, length=4), Document(doc_id='q"\\u', length=3, sample=2)),
        ranks=(RankStep(0, (P(a), P()), (P(a), P())), RankStep(1, (P(b), P()), (P(b), P()))),
        mode="lockstep",
        meta={"imbalance": 1.25, "layout": {"dp": 2}},
    ).validate()
    views = [*rank_views(merge_plan()), *rank_views(lock)]
    assert any(v.lockstep is not None for v in views) and any(v.merges for v in views)
    for v in views:
        text = v.to_json()
        assert json.loads(text) == json.loads(json.dumps(v.to_dict()))
        assert text == v.to_json() and ", " not in text and '": ' not in text
        json.loads(text, object_pairs_hook=_keys_sorted)


def _keys_sorted(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [k for k, _v in pairs]
    assert keys == sorted(keys)
    return dict(pairs)


def test_the_step_digest_covers_every_step_wide_field_and_nothing_else():
    v0, v1, v2 = rank_views(merge_plan())
    digest = v0.step_digest()
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert {v1.step_digest(), v2.step_digest()} == {digest}  # same step, other ranks
    assert parse_rank_plan(v1.to_json(), dp=3).step_digest() == digest  # as a payload decodes
    changes = [
        {"step": 5},
        {"strategy": "other"},
        {"mode": "lockstep"},
        {"dp": 4},
        {"loss_tokens": 15},
        {"merges": ()},
        {"meta": {"seed": 1}},
    ]
    assert len({replace(v0, **c).step_digest() for c in changes} | {digest}) == len(changes) + 1
    assert replace(v0, rank=1, docs={}, ranks={}).step_digest() == digest  # rank-own fields


def test_a_view_is_a_fraction_of_the_plan():
    """64 ranks of one document each: every view holds 1 of the 64 documents."""
    docs = tuple(Document(doc_id=i, length=10 + i) for i in range(64))
    ranks = tuple(
        RankStep(r, (P(Slice(r, 0, 10 + r)),), (P(Slice(r, 0, 10 + r)),)) for r in range(64)
    )
    plan = StepPlan(step=0, strategy="hand", docs=docs, ranks=ranks).validate()
    sizes = [len(v.to_json()) for v in rank_views(plan)]
    assert max(sizes) * 20 < len(plan.to_json())
    assert [len(v.docs) for v in rank_views(plan)] == [1] * 64


def test_lockstep_views_carry_the_plan_wide_schedule():
    a, b = Slice(0, 0, 4), Slice(1, 0, 3)
    r0 = RankStep(0, (P(a), P()), (P(a), P()))
    r1 = RankStep(1, (P(b), P()), (P(b), P()))
    docs = (Document(doc_id=0, length=4), Document(doc_id=1, length=3))
    plan = StepPlan(step=0, strategy="hand", docs=docs, ranks=(r0, r1), mode="lockstep").validate()
    whole = lockstep_schedule(plan)
    for view in rank_views(plan):
        assert view.lockstep == whole == lockstep_schedule(view)
        assert parse_rank_plan(view.to_json(), dp=2).lockstep == whole
        assert lockstep_schedule(view, keep=False) == lockstep_schedule(plan, keep=False)
    assert whole.idle_forward == {1}  # the padding pack is idle on every rank
    assert rank_views(merge_plan())[0].lockstep is None  # a free plan has none


def _data(view: RankPlan) -> dict:
    return json.loads(view.to_json())


def _mutations():
    """(name, rank, mutate(dict), expected message part): views damaged alone."""
    return [
        ("old format", 0, lambda d: d.pop("format"), "plan payload of format 1"),
        ("future format", 0, lambda d: d.__setitem__("format", 3), "plan payload of format 3"),
        (
            "slice dropped",
            0,
            lambda d: d["ranks"][0].update(
                forward=[d["ranks"][0]["forward"][0]], order=["F0", "B0", "B1"]
            ),
            "is not in exactly one forward and one backward pack",
        ),
        (
            "document dropped",
            0,
            lambda d: d.__setitem__("docs", []),
            "the plan of rank 0 has no such document",
        ),
        (
            "extra document",
            0,
            lambda d: d["docs"].append([1, *DOCS[1].to_row()]),
            "tokens [0, 3) are in no slice",
        ),
        (
            "member's share lost",
            1,
            lambda d: d["ranks"].pop(1),
            "holds ranks [1]; it needs [1, 2]",
        ),
        (
            "member's share cut short",
            1,
            lambda d: d["ranks"][1]["forward"][0]["slices"][0].__setitem__(2, 7),
            "is not in exactly one forward and one backward pack",
        ),
        (
            "member with other packs",
            2,
            lambda d: d["ranks"][0].update(
                forward=[*d["ranks"][0]["forward"], {"slices": []}], order=["F0", "F1", "B0"]
            ),
            "must hold exactly the merge packs of member 1",
        ),
        (
            "merged document missing",
            2,
            lambda d: d.__setitem__("docs", []),
            "lacks merged documents [2]",
        ),
        (
            "document row cut short",
            0,
            lambda d: d["docs"][0].pop(),
            "a document row must be [doc_id, length, loss_tokens, cuts, sample, offset]",
        ),
        (
            "rank out of range",
            0,
            lambda d: d.__setitem__("rank", 3),
            "plan of rank 3 for a step of 3 ranks",
        ),
        (
            "loss tokens",
            0,
            lambda d: d.__setitem__("loss_tokens", 4),
            "more loss tokens in its documents than the step's 4",
        ),
        (
            "merge group of one",
            0,
            lambda d: d["merges"][0].__setitem__("ranks", [1]),
            "merge group 0 needs >= 2 distinct ranks",
        ),
        (
            "lockstep schedule on a free plan",
            0,
            lambda d: d.__setitem__(
                "lockstep", {"kept": [], "unions": [], "idle_forward": [], "idle_backward": []}
            ),
            "has a lockstep schedule that does not fit",
        ),
    ]


def test_each_damaged_view_is_a_named_plan_error():
    views = rank_views(merge_plan())
    for name, rank, mutate, message in _mutations():
        data = _data(views[rank])
        mutate(data)
        with pytest.raises(PlanError) as info:
            parse_rank_plan(json.dumps(data), dp=3)
        assert message in str(info.value), (name, str(info.value))


def test_old_format_payload_is_a_format_error():
    """Format 1 payloads held the whole StepPlan: refused by name, not parsed as a view."""
    with pytest.raises(PlanFormatError, match="re-run `slimdata plan`"):
        parse_rank_plan(merge_plan().to_json(), dp=3)

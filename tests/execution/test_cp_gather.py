"""Static CP's K/V gather rule (:mod:`slimdata.execution.cp`) on hand-computed cases: what one
model call gathers per layer, and the calls of every pack pass."""

from __future__ import annotations

from slimdata.execution.cp import cp_gather, cp_pass_gathers, doc_slices
from slimdata.plan import Document, MicroPack, RankStep, Slice, StepPlan


def test_docstring_example_gathers_the_prefix_padded_to_the_longest_member():
    # doc 0 of 12 tokens cut [0,8) [8,12), the call holds [8,12) and doc 1 [0,3); cp=2:
    # [0,8) chunks of 2: member 0 [0,2) [6,8) = 4 rows, member 1 [2,6) = 4
    # [8,12) chunks of 1: member 0 [8,9) [11,12) = 2, member 1 [9,11) = 2
    # d1 [0,3) chunks of 1 (the 4th empty): member 0 [0,1) = 1, member 1 [1,3) = 2
    a, b, d1 = Slice(0, 0, 8), Slice(0, 8, 12), Slice(1, 0, 3)
    g = cp_gather([b, d1], {0: [a, b], 1: [d1]}, 2)
    assert g.items == (a, b, d1)  # the prefix first, in the order the call reads them
    assert g.rows == (7, 8)
    assert (g.padded_rows, g.tokens) == (8, 16)
    assert g.member_rows(0) == [(a, 0, 2), (a, 6, 8), (b, 8, 9), (b, 11, 12), (d1, 0, 1)]
    assert g.member_rows(1) == [  # chunk by chunk: 1 and 2 of each slice
        (a, 2, 4), (a, 4, 6), (b, 9, 10), (b, 10, 11), (d1, 1, 2), (d1, 2, 3)
    ]  # fmt: skip


def test_cp3_rows_and_a_prefix_read_twice_is_gathered_once():
    # [0,5) at cp=3: 6 chunks of 1, member 0 holds chunks 0 and 5 ([0,1), empty): 1 row,
    # member 1 chunks 1 and 4 ([1,2) [4,5)): 2, member 2 chunks 2 and 3: 2 -> 3 x 2 = 6
    s = Slice(0, 0, 5)
    g = cp_gather([s], {0: [s]}, 3)
    assert (g.rows, g.tokens) == ((1, 2, 2), 6)
    # a call over [4,8) and [8,12) of one doc reads [0,4) once: at cp=2 every 4-token
    # slice gives each member 2 rows -> 3 slices, 6 rows each, 12 tokens
    p, q, r = Slice(0, 0, 4), Slice(0, 4, 8), Slice(0, 8, 12)
    g = cp_gather([q, r], {0: [p, q, r]}, 2)
    assert (g.items, g.rows, g.tokens) == ((p, q, r), (6, 6), 12)


def test_edges_no_slice_one_token_later_slices_unread():
    assert cp_gather([], {}, 2).tokens == 0
    one = Slice(3, 0, 1)  # member 0 holds the token, member 1 none: both send 1 row
    assert (cp_gather([one], {3: [one]}, 2).rows, cp_gather([one], {3: [one]}, 2).tokens) == (
        (1, 0),
        2,
    )
    # a call over the first slice does not gather the document's later ones
    p, q = Slice(0, 0, 4), Slice(0, 4, 8)
    assert cp_gather([p], {0: [p, q]}, 2).items == (p,)


def test_doc_slices_sorted_by_start_skipping_merged_docs():
    p, q, r = Slice(0, 0, 4), Slice(0, 4, 8), Slice(1, 0, 2)
    rs = RankStep(0, (MicroPack((q, r)), MicroPack((p,))), (MicroPack((p, q, r)),))
    assert doc_slices(rs) == {0: [p, q], 1: [r]}
    assert doc_slices(rs, {1}) == {0: [p, q]}


def test_pass_gathers_follow_the_executors_calls():
    # doc 0 [0,4) and doc 1 [0,4) in one forward pack, backward packs [d1] then [d0]
    a, b = Slice(0, 0, 4), Slice(1, 0, 4)
    rs = RankStep(0, (MicroPack((a, b)),), (MicroPack((b,)), MicroPack((a,))))
    plan = StepPlan(0, "test", (Document(0, 4), Document(1, 4)), (rs,)).validate()
    # split: the forward pack runs [a] (backward pack 1) then [b], each 2 x 2 rows = 4
    split = cp_pass_gathers(plan, 2, lockstep=False, split=True)
    assert (split.forward, split.backward, split.recomputed) == (
        ((4, 4),),
        ((4,), (4,)),
        (False, False),
    )
    assert [split.collectives("B", k) for k in (0, 1)] == [2, 2]
    # recompute: one forward call over both (2 x 4 rows = 8); each backward pack re-runs
    # its forward: 3 collectives of 4 tokens per layer
    rec = cp_pass_gathers(plan, 2, lockstep=False, split=False)
    assert (rec.forward, rec.backward, rec.recomputed) == (((8,),), ((4,), (4,)), (True, True))
    assert (rec.collectives("F", 0), rec.tokens("F", 0), rec.largest("F", 0)) == (1, 8, 8)
    assert (rec.collectives("B", 1), rec.tokens("B", 1), rec.largest("B", 1)) == (3, 12, 4)


def test_merge_group_on_static_cp_pads_every_process_to_the_longest():
    # doc 0 (8 tokens) merged over DP ranks 0 ([0,5)) and 1 ([5,8)), cp=2: four processes.
    # [0,5) in chunks of 2: member 0 [0,2) = 2 rows, member 1 [2,4) [4,5) = 3;
    # [5,8) in chunks of 1: member 0 [5,6) = 1, member 1 [6,8) = 2 -> 4 x 3 = 12 tokens
    from slimdata.execution.merge import merge_layer_tokens
    from slimdata.plan import MergeGroup

    p0, p1 = MicroPack((Slice(0, 0, 5),), merge=0), MicroPack((Slice(0, 5, 8),), merge=0)
    ranks = (RankStep(0, (p0,), (p0,)), RankStep(1, (p1,), (p1,)))
    plan = StepPlan(0, "test", (Document(0, 8),), ranks, (MergeGroup((0, 1), (0,)),))
    assert merge_layer_tokens(plan, 0, 2) == 12
    assert merge_layer_tokens(plan, 0) == 10  # without CP: 2 members x the longer share 5

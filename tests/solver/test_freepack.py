"""pack_rank_by_runs: pack_rank's packs and peak, found a pack at a time."""

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slimdata.cost import CostModel
from slimdata.solver.common import BatchView
from slimdata.solver.freepack import documents_alone, longest_backward_last, pack_rank_by_runs
from slimdata.solver.micropack import pack_rank

from .conftest import GIB, docs_of, unit_cost


def same(view, docs, merge=(), **caps):
    fast = pack_rank_by_runs(view, docs, merge, **caps)
    ref = pack_rank(view, [view.slices_of(d) for d in docs], merge, **caps)
    assert fast is not None and ref is not None
    assert (fast.forward, fast.backward, fast.merge_pack) == (
        ref.forward,
        ref.backward,
        ref.merge_pack,
    )
    assert fast.peak == ref.peak
    return fast


def test_cut_inside_a_document_waits_for_its_end():
    # documents of 3, 2 and 2 slices of 128 tokens, cap 4 slices: forward a0 a1 a2 b0 | b1 c0
    # c1; the cut is inside b, so both packs run backward at the end, newest first
    view = BatchView.build(docs_of([384, 256, 256], 128), unit_cost())
    p = same(view, [0, 1, 2], cap=512, mem=math.inf)
    assert p.forward == [[0, 1, 2, 3], [4, 5, 6]]
    assert p.backward == [[6, 5, 4], [3, 2, 1, 0]]
    assert p.merge_pack is None


def test_clean_cut_runs_backward_at_once_and_merge_share_first():
    view = BatchView.build(docs_of([256, 256, 384], 128), unit_cost())
    p = same(view, [0, 1], [4, 5, 6], cap=256, mem=math.inf)
    assert p.forward == [[4, 5, 6], [0, 1], [2, 3]]
    assert p.backward == [[4, 5, 6], [1, 0], [3, 2]]
    assert p.merge_pack == (0, 0)


def test_memory_cap_cuts_before_a_document_that_does_not_fit():
    # 100 tokens a GiB: documents of 256 tokens hold 2.56 GiB each; at 6 GiB the third starts
    # a new pack after the first two ran their backward
    view = BatchView.build(docs_of([256, 256, 256], 128), unit_cost(act_tokens_per_gib=100))
    p = same(view, [0, 1, 2], cap=4096, mem=6 * GIB)
    assert p.forward == [[0, 1, 2, 3], [4, 5]]
    assert p.backward == [[3, 2, 1, 0], [5, 4]]
    assert p.peak == 5.12 * GIB


def test_none_where_pack_rank_is_needed():
    view = BatchView.build(docs_of([256, 256], 128), unit_cost(act_tokens_per_gib=100))
    caps = {"cap": 512, "mem": 6 * GIB}
    assert pack_rank_by_runs(view, [], **caps) is None  # no slice
    assert pack_rank_by_runs(view, [0, 0], **caps) is None  # twice
    assert pack_rank_by_runs(view, [0], cap=64, mem=6 * GIB) is None  # a slice above the cap
    assert pack_rank_by_runs(view, [0], cap=512, mem=GIB) is None  # does not fit
    assert pack_rank(view, [view.slices_of(0)], cap=512, mem=GIB) is None
    assert pack_rank_by_runs(view, [1, 0], **caps) is not None


COSTS = {"unit": unit_cost(act_tokens_per_gib=1000), "llama-1b": CostModel.analytic("llama-1b")}


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 1800), min_size=1, max_size=16),
    slice_tokens=st.sampled_from([128, 256, 384]),
    cap_slices=st.integers(1, 8),
    merge=st.booleans(),
    order=st.randoms(use_true_random=False),
    mem_share=st.sampled_from([0.1, 0.25, 0.5, 0.8, 2.0]),
    cost=st.sampled_from(sorted(COSTS)),
)
def test_same_packs_and_peak_as_pack_rank(
    lengths, slice_tokens, cap_slices, merge, order, mem_share, cost
):
    view = BatchView.build(docs_of(lengths, slice_tokens), COSTS[cost])
    docs = list(range(len(lengths)))
    order.shuffle(docs)
    merge_slices = list(view.slices_of(docs.pop())) if merge and len(docs) > 1 else []
    # memory: a share of everything the rank's documents hold (above 1: never binds)
    cap, mem = cap_slices * slice_tokens, mem_share * float(view.doc_mem[docs].sum())
    fast = pack_rank_by_runs(view, docs, merge_slices, cap=cap, mem=mem)
    ref = pack_rank(view, [view.slices_of(d) for d in docs], merge_slices, cap=cap, mem=mem)
    assert (fast is None) == (ref is None)  # whole documents: it answers whenever pack_rank can
    if mem_share > 1:
        assert ref is not None  # no vacuous pass
    if ref is not None:
        same(view, docs, merge_slices, cap=cap, mem=mem)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 1800), min_size=1, max_size=12),
    slice_tokens=st.sampled_from([128, 256, 384]),
    cap_slices=st.integers(1, 8),
    merge=st.booleans(),
    order=st.randoms(use_true_random=False),
    mem_share=st.sampled_from([0.1, 0.3, 0.6, 0.9, 1.5]),
    cp=st.sampled_from([2, 3, 4]),
)
def test_same_packs_and_peak_as_pack_rank_under_static_cp(
    lengths, slice_tokens, cap_slices, merge, order, mem_share, cp
):
    """Under static CP both count every pack's gathered K/V alike; memory is a share of
    what the rank's documents need alone (above 1: never binds)."""
    view = BatchView.build(docs_of(lengths, slice_tokens), COSTS["llama-1b"])
    docs = list(range(len(lengths)))
    order.shuffle(docs)
    merge_slices = list(view.slices_of(docs.pop())) if merge and len(docs) > 1 else []
    cap, mem = cap_slices * slice_tokens, mem_share * float(documents_alone(view, cp)[docs].sum())
    caps = {"cap": cap, "mem": mem, "cp": cp}
    fast = pack_rank_by_runs(view, docs, merge_slices, **caps)
    ref = pack_rank(view, [view.slices_of(d) for d in docs], merge_slices, **caps)
    assert (fast is None) == (ref is None)
    if mem_share > 1:
        assert ref is not None  # no vacuous pass
    if ref is not None:
        same(view, docs, merge_slices, **caps)
        assert ref.peak <= mem


def test_static_cp_buffer_cuts_before_a_document_that_does_not_fit_with_it():
    """cp=2, activations and K/V of 1 GiB per 200 tokens each, 2 layers: a device gathers
    one layer's K/V, 1 GiB per 400 tokens, twice that in the backward, and a rank of 2
    devices counts it twice. A 256-token document holds 2.56 GiB and its backward gathers
    2 x 2 x 0.64 GiB: 5.12 GiB alone. Two in one pack would gather 512 tokens: 5.12 + 5.12
    GiB. At 7 GiB the second does not fit beside the first with its own buffer (2.56 + 2.56
    + 2.56 GiB): a clean cut. At 8 GiB it does, and the pack closes before its last slice
    (3.84 GiB held + 3.84 of buffer for 384 tokens; then 5.12 + 2.56 for the pack that
    gathers the document's 256 tokens); without static CP one pack holds both."""
    cost = replace(unit_cost(act_tokens_per_gib=200), kv_bytes_per_token=GIB / 200, layers=2)
    view = BatchView.build(docs_of([256, 256], 128), cost)
    assert documents_alone(view, 2).tolist() == [5.12 * GIB, 5.12 * GIB]
    p = same(view, [0, 1], cap=4096, mem=7 * GIB, cp=2)
    assert (p.forward, p.backward) == ([[0, 1], [2, 3]], [[1, 0], [3, 2]])
    assert p.peak == pytest.approx(5.12 * GIB)
    p = same(view, [0, 1], cap=4096, mem=8 * GIB, cp=2)
    assert (p.forward, p.backward) == ([[0, 1, 2], [3]], [[3], [2, 1, 0]])
    assert p.peak == pytest.approx(7.68 * GIB)
    assert same(view, [0, 1], cap=4096, mem=7 * GIB).forward == [[0, 1, 2, 3]]  # cp=1
    assert pack_rank_by_runs(view, [0], cap=4096, mem=5.1 * GIB, cp=2) is None


def test_longest_backward_segment_runs_last():
    # one-slice packs a | b0 | b1 | c (cap 128 tokens); b is cut, so b0 and b1 are one segment
    # of 512 s of backward (a and c: 256 s each): it moves to the end, its packs in order
    view = BatchView.build(docs_of([128, 256, 128], 128), unit_cost())
    p = same(view, [0, 1, 2], cap=128, mem=math.inf)
    assert p.forward == [[0], [1], [2], [3]]
    assert p.backward == [[0], [2], [1], [3]]
    q = longest_backward_last(view, p)
    assert q.forward == [[0], [3], [1], [2]]
    assert q.backward == [[0], [3], [2], [1]]
    assert (q.peak, q.merge_pack) == (p.peak, None)


def test_longest_backward_last_keeps_the_merge_pack_first_and_ties_in_place():
    # merge share [5 6 7] first; then documents of 3 and 2 slices, cap 384 tokens
    view = BatchView.build(docs_of([256, 384, 384], 128), unit_cost())
    p = same(view, [1, 0], [5, 6, 7], cap=384, mem=math.inf)
    assert p.forward == [[5, 6, 7], [2, 3, 4], [0, 1]]
    q = longest_backward_last(view, p)
    assert q.forward == [[5, 6, 7], [0, 1], [2, 3, 4]]
    assert q.backward == [[5, 6, 7], [1, 0], [4, 3, 2]]
    assert q.merge_pack == (0, 0)
    even = BatchView.build(docs_of([256, 256, 384], 128), unit_cost())
    p = same(even, [0, 1], [4, 5, 6], cap=256, mem=math.inf)
    assert longest_backward_last(even, p) is p  # segments of 512 s each: nothing moves


def test_a_single_segment_is_left_alone():
    view = BatchView.build(docs_of([384, 256, 256], 128), unit_cost())
    p = same(view, [0, 1, 2], cap=512, mem=math.inf)
    assert longest_backward_last(view, p) is p

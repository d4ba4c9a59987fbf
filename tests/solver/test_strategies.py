import math

import numpy as np
import pytest

from slimdata.errors import ConfigError, PlanError
from slimdata.plan.types import Slice
from slimdata.solver import ALL_STRATEGIES, STRATEGIES, STREAMS, Layout, plan_peak_memory, solve
from slimdata.solver.common import BatchView
from slimdata.solver.micropack import pack_rank, pack_rank_lockstep
from slimdata.solver.strategies.bfd import best_fit_decreasing
from slimdata.solver.strategies.multipack import ffd
from slimdata.solver.strategies.wlb import wlb_pack

from .conftest import docs_of, unit_cost

LINEAR = unit_cost(act_tokens_per_gib=1 << 30)
"""Linear work only, backward twice forward, one byte of activations per token, no K/V."""


def rank_tokens(plan):
    return [rs.tokens for rs in plan.ranks]


def test_registry_names_and_unknown():
    assert list(STRATEGIES) == [
        "concat",
        "bfd",
        "multipack",
        "wlb-ideal",
        "sorted",
        "dcp",
        "slimpack",
    ]
    assert list(STREAMS) == ["wlb"]
    assert set(ALL_STRATEGIES) == {*STRATEGIES, *STREAMS}
    with pytest.raises(ConfigError, match="strategy='nope'"):
        solve(docs_of([10]), Layout(dp=1), "nope")


def test_concat_rows_cut_documents_into_independent_pieces(ucost):
    docs = docs_of([100, 50, 90])
    plan = solve(docs, Layout(dp=2, context=128), "concat", cost=ucost)
    # rows of 128: [d0 100, d1 0:28] and [d1 28:50, d2 90]; row j -> rank j % 2
    assert [(d.doc_id, d.offset, d.length) for d in plan.docs] == [
        (0, 0, 100),
        (1, 0, 28),
        (1, 28, 22),
        (2, 0, 90),
    ]
    assert rank_tokens(plan) == [128, 112]
    assert [[s for s in p.slices] for p in plan.ranks[0].forward] == [
        [Slice(0, 0, 100), Slice(1, 0, 28)]
    ]
    assert plan.meta["rows"] == 2
    # every pack priced: forward 1 s/token
    assert plan.ranks[1].forward[0].cost == 112.0 and plan.ranks[1].backward[0].cost == 224.0


def test_best_fit_decreasing_by_hand():
    # 100 -> bin0 (28 left); 60 -> bin1 (68); 50 -> bin1, the tightest fit (18); 30 -> bin2
    assert best_fit_decreasing(np.array([30, 100, 50, 60]), 128) == [[1], [3, 2], [0]]


def test_ffd_by_hand():
    assert ffd(np.array([70, 60, 50, 40]), 128, 2) == [[0, 2], [1, 3]]
    assert ffd(np.array([100, 100, 100]), 128, 2) is None


def test_wlb_pack_by_hand():
    # workloads equal to length: 100 -> mb0, 60 -> mb1, 50 -> mb1 (least load 60 < 100), 30 -> mb0
    bins = wlb_pack(np.array([100, 60, 50, 30]), np.array([100.0, 60, 50, 30]), 2, 140)
    assert bins == [[0, 3], [1, 2]]
    assert wlb_pack(np.array([100, 100, 100]), np.ones(3), 2, 128) is None


def test_sorted_groups_similar_lengths(ucost):
    plan = solve(docs_of([10, 120, 20, 110, 30]), Layout(dp=1, context=128), "sorted", cost=ucost)
    packs = sorted(
        tuple(sorted(plan.docs[s.doc].length for s in p.slices)) for p in plan.ranks[0].forward
    )
    assert packs == [(10, 20, 30), (110,), (120,)]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_strategy_small_batch(strategy, ucost):
    docs = docs_of([300, 100, 50, 20, 200, 128, 7])
    for mode in ("free", "lockstep"):
        plan = solve(
            docs, Layout(dp=3, context=256, memory_gib=100, mode=mode), strategy, seed=1, cost=ucost
        )
        assert sum(rank_tokens(plan)) == 805
        assert plan.meta["seed"] == 1 and "solve_ms" in plan.meta
        assert all(p.cost >= 0 for rs in plan.ranks for p in rs.forward)
        if mode == "lockstep":
            assert len({(len(rs.forward), len(rs.backward), rs.order) for rs in plan.ranks}) == 1


def test_slimpack_balances_time_by_hand(ucost):
    # 512 tokens over 2 ranks: the 256-token document alone, the two 128s together
    plan = solve(docs_of([128, 256, 128]), Layout(dp=2, memory_gib=100), "slimpack", cost=ucost)
    assert sorted(rank_tokens(plan)) == [256, 256]
    assert plan.merges == () and plan.meta["imbalance"] == 1.0


def test_slimpack_merges_document_that_does_not_fit_memory():
    cost = unit_cost(act_tokens_per_gib=100)  # 2 GiB = 200 tokens of activations
    docs = docs_of([384, 64, 64, 64])  # 384 = 3 slices of 128: two members would hold 256 > 200
    plan = solve(docs, Layout(dp=4, memory_gib=2.0), "slimpack", cost=cost)
    assert len(plan.merges) == 1
    (g,) = plan.merges
    assert g.docs == (0,) and len(g.ranks) == 3
    assert (plan_peak_memory(plan, cost) <= 2 * (1 << 30)).all()
    for r in g.ranks:
        (mp,) = [p for p in plan.ranks[r].forward if p.merge is not None]
        assert mp.tokens == 128


def test_slimpack_impossible_layouts_name_the_document():
    cost = unit_cost(act_tokens_per_gib=100)
    with pytest.raises(PlanError, match=r"doc_id 0 .*1000 tokens"):
        solve(docs_of([1000]), Layout(dp=2, memory_gib=2.0), "slimpack", cost=cost)
    with pytest.raises(PlanError, match="memory cap"):
        solve(docs_of([512], slice_tokens=512), Layout(dp=4, memory_gib=1.0), "slimpack", cost=cost)
    with pytest.raises(PlanError, match="token cap"):
        solve(
            docs_of([512], slice_tokens=512), Layout(dp=1, pack_tokens=256), "slimpack", cost=cost
        )
    with pytest.raises(ConfigError):
        Layout(dp=0)


def test_pack_rank_lockstep_docstring_example():
    cost = LINEAR
    view = BatchView.build(docs_of([512]), cost)  # 4 slices of 128
    p = pack_rank_lockstep(view, [range(4)], cap=512, mem=1e9, m=2)
    assert p.forward == [[0, 1], [2, 3]]
    assert p.backward == [[], [3, 2, 1, 0]]
    view2 = BatchView.build(docs_of([256, 256]), cost)
    p2 = pack_rank_lockstep(view2, [range(2), range(2, 4)], cap=512, mem=1e9, m=2)
    assert p2.forward == [[0, 1], [2, 3]] and p2.backward == [[1, 0], [3, 2]]


def test_pack_rank_free_mode_backward_packs_are_forward_packs():
    cost = LINEAR
    # slices of 128: doc 0 = [0], doc 1 = [1, 2] (spans the cut), doc 2 = [3]
    view = BatchView.build(docs_of([128, 256, 128]), cost)
    units = [range(0, 1), range(1, 3), range(3, 4)]
    p = pack_rank(view, units, cap=256, mem=1e9)
    # no cut is clean until the end: both forward packs run backward then, newest first
    assert p.forward == [[0, 1], [2, 3]]
    assert p.backward == [[3, 2], [1, 0]]
    # a clean cut (doc 1 ends with the pack) frees the packs behind it at once
    view2 = BatchView.build(docs_of([128, 128, 256]), cost)
    p2 = pack_rank(view2, [range(0, 1), range(1, 2), range(2, 4)], cap=256, mem=1e9)
    assert p2.forward == [[0, 1], [2, 3]] and p2.backward == [[1, 0], [3, 2]]
    # memory: a document that does not fit beside the held one starts after a clean cut,
    # even though the token cap would let it share the pack (doc 0 holds 256 bytes)
    view3 = BatchView.build(docs_of([256, 256]), cost)
    units3 = [range(0, 2), range(2, 4)]
    p3 = pack_rank(view3, units3, cap=1024, mem=400)
    assert p3.forward == [[0, 1], [2, 3]] and p3.backward == [[1, 0], [3, 2]]
    assert p3.peak == 256
    p4 = pack_rank(view3, units3, cap=1024, mem=512)
    assert p4.forward == [[0, 1, 2, 3]] and p4.backward == [[3, 2, 1, 0]]
    assert pack_rank(view3, units3, cap=1024, mem=255) is None  # one document alone is too big


def test_slimpack_respects_memory_with_continuation():
    cost = unit_cost(act_tokens_per_gib=100)
    plan = solve(docs_of([180, 90, 90, 30]), Layout(dp=1, memory_gib=2.0), "slimpack", cost=cost)
    assert plan_peak_memory(plan, cost)[0] <= 2 * (1 << 30)
    assert len(plan.ranks[0].forward) >= 2


def test_split_group_hands_out_fresh_lists_of_one_split(ucost):
    # slices of 5 x 128 and 1 x 72 tokens (unit cost: forward+backward 384 and 216 s) over
    # 2 members by LPT, ties to the first member: {0, 2, 4} | {1, 3, 5}
    from slimdata.solver.merge import split_group

    view = BatchView.build(docs_of([512, 200]), ucost)
    slices = list(range(len(view.doc)))
    assert (view.end - view.start).tolist() == [128, 128, 128, 128, 128, 72]
    members, loads, _peak = split_group(view, slices, 2)
    assert members == [[0, 2, 4], [1, 3, 5]] and loads.tolist() == [1152.0, 984.0]
    members[0].append(99)
    loads[0] = -1.0
    again, loads2, _ = split_group(view, slices, 2)  # the batch's memo is not changed
    assert again == [[0, 2, 4], [1, 3, 5]] and loads2.tolist() == [1152.0, 984.0]


def test_a_split_answers_memory_questions_as_its_exact_peak():
    # 0.1 bytes of activations per token: sums that round. The rough peak (activations summed
    # in one pass over the members) answers clear questions; at the exact peak's own value,
    # where the rough one is off by an ulp, the answer comes from the exact peak
    from slimdata.solver.merge import _Split, member_peaks

    cost = unit_cost(act_tokens_per_gib=10 * 2**30)  # 0.1 bytes of activations per token
    view = BatchView.build(docs_of([2566, 1947, 1582]), cost)
    split = _Split.of(view, list(range(len(view.doc))), 2)
    peak = split.peak
    assert peak == float(member_peaks(view, split.members).max())
    assert split.rough_peak != peak and abs(split.rough_peak - peak) <= 1e-12 * peak  # guard
    none = lambda members, tokens: 0.0  # noqa: E731
    assert split.fits(2 * peak, none, math.inf) and not split.fits(peak / 2, none, math.inf)
    assert split.fits(peak, none, math.inf)
    assert not split.fits(float(np.nextafter(peak, 0.0)), none, math.inf)
    assert not split.fits(2 * peak, none, int(split.tokens.max()) - 1)  # the token cap


def test_a_split_answers_balance_questions_as_its_exact_sums():
    # member sums of llama-8b slice seconds that round: the rough ones (one pass over the
    # members) answer clear questions; at a member's exact sum, or an ulp below it, where a
    # rough sum may be off by an ulp, the answer is the exact sums'; and the largest member's
    # time is the exact one
    from slimdata.cost import CostModel
    from slimdata.solver.merge import _Split

    view = BatchView.build(docs_of([8192, 5000, 3000, 1700], 128), CostModel.analytic("llama-8b"))
    split = _Split.of(view, list(range(len(view.doc))), 5)
    f, b = split.fwd, split.bwd  # exact: numpy's sum of each member's slices
    assert (split.rough_fwd != f).any() and (split.rough_bwd != b).any()  # guard: they round
    assert split.largest_time() == float((f + b).max())
    wide_f, wide_b = 2 * float(f.max()), 2 * float(b.max())
    for t in [*f.tolist(), *np.nextafter(f, 0.0).tolist()]:
        assert split.within(t, wide_b) == bool((f <= t).all())
    for t in [*b.tolist(), *np.nextafter(b, 0.0).tolist()]:
        assert split.within(wide_f, t) == bool((b <= t).all())
    assert split.within(wide_f, wide_b) and not split.within(float(f.min()) / 2, wide_b)


def test_member_sums_are_numpys_sums_to_the_bit():
    # members of 0 to 9 slices over costs spanning six orders of magnitude: every member's
    # sum equals values[ms].sum() exactly (the merge planner compares them with thresholds),
    # and the peaks equal member_peak's one by one
    from slimdata.cost import CostModel
    from slimdata.solver.merge import member_peak, member_peaks, member_sums

    rng = np.random.default_rng(0)
    values = rng.random(200) * 10.0 ** rng.integers(-3, 3, 200)
    members = [
        rng.choice(200, int(rng.integers(0, 10)), replace=False).tolist() for _ in range(300)
    ]
    got = member_sums(values, members)
    assert got.tolist() == [values[np.asarray(ms, dtype=np.int64)].sum() for ms in members]
    assert {len(ms) for ms in members} == set(range(10))  # guard: every size was compared
    view = BatchView.build(docs_of([4096, 3000, 700], 128), CostModel.analytic("llama-8b"))
    shares = [rng.choice(len(view.doc), int(rng.integers(0, 6)), replace=False) for _ in range(50)]
    shares = [sorted(s.tolist()) for s in shares]
    assert member_peaks(view, shares).tolist() == [member_peak(view, s) for s in shares]

"""Lockstep / pipeline plans: pack counts that suit the pipeline, balanced packs across pack
indices (forward and backward), no empty packs, the backward lag, and the 1F1B estimate."""

from collections import Counter

import numpy as np
import pytest

from slimdata.cost import CostModel
from slimdata.execution import ExecutionConfig
from slimdata.execution.critical import critical_path, plan_critical_path
from slimdata.plan import MicroPack
from slimdata.solver import Layout, solve
from slimdata.solver.common import BatchView, interleaved_order
from slimdata.solver.micropack import pack_rank_lockstep

from .conftest import GIB, attention_cost, docs_of, unit_cost


def test_interleaved_order_with_lag():
    assert interleaved_order(3, 3) == (("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2))
    assert interleaved_order(3, 3, 1) == (
        ("F", 0),
        ("F", 1),
        ("B", 0),
        ("F", 2),
        ("B", 1),
        ("B", 2),
    )
    assert interleaved_order(2, 2, 5) == (("F", 0), ("F", 1), ("B", 0), ("B", 1))


def test_interleave_runs_each_backward_after_its_ready_forward_in_order():
    from slimdata.plan.pipeline import interleave, ready_index

    order = interleave(3, [0, 2, 2])
    assert order == (("F", 0), ("B", 0), ("F", 1), ("F", 2), ("B", 1), ("B", 2))
    assert ready_index(order) == [0, 2, 2]
    # a backward pack never overtakes an earlier one: B1 waits for B0 (ready after F2)
    assert interleave(3, [2, 0]) == (("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1))
    assert interleave(1, [5]) == (("F", 0), ("B", 0))


def pipeline_time(fwd, bwd, order, pp: int) -> float:
    return float(critical_path(fwd, bwd, order, pp)[0])


def test_pipeline_time_by_hand():
    # stage 0: F0 [0, .5], F1 [.5, 1]; stage 1: F0 [.5, 1], B0 [1, 2], F1 [2, 2.5], B1 [2.5, 3.5];
    # stage 0: B0 [2, 3], B1 [3.5, 4.5]
    assert pipeline_time([1, 1], [2, 2], interleaved_order(2, 2), 2) == 4.5
    # m equal packs on pp stages: (m + pp - 1) slots of (f + b) / pp
    assert pipeline_time([1] * 4, [3] * 4, interleaved_order(4, 4), 4) == 7.0
    assert pipeline_time([1] * 8, [3] * 8, interleaved_order(8, 8), 4) == 11.0
    assert pipeline_time([1, 2], [3, 4], interleaved_order(2, 2), 1) == 10.0


def test_pack_rank_lockstep_lag_feeds_every_backward_pack():
    # a 512-token document (4 slices of 128) and four 128-token documents; forward 1 s/token,
    # backward 2 s/token; 4 packs of 256 forward tokens: F0 = L[0:256], F1 = L[256:512]
    ucost = unit_cost()
    view = BatchView.build(docs_of([512, 128, 128, 128, 128]), ucost)
    units = [view.slices_of(d) for d in range(5)]
    # lag 0: nothing is complete after F0, so B0 is empty; the 2048 s of backward left are
    # spread over the 3 packs left (water-filling, 683 s each at most by half a slice):
    # 768, 768 and 512 s, not one pack taking the whole document (1024 s)
    p0 = pack_rank_lockstep(view, units, cap=1024, mem=1e30, m=4, lag=0)
    assert p0.forward == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert p0.backward == [[], [3, 2, 1], [0, 4, 5], [6, 7]]
    # lag 1: B0 runs after F1 and takes the document's end; every pack costs the same
    p1 = pack_rank_lockstep(view, units, cap=1024, mem=1e30, m=4, lag=1)
    assert p1.forward == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert p1.backward == [[3, 2], [1, 0], [4, 5], [6, 7]]


def test_one_rank_prepared_once_packs_every_lag_as_fresh():
    # the planner prepares a rank once per pack count and packs it at every lag it probes:
    # each packing must equal a fresh pack_rank_lockstep (nothing carried between lags, the
    # hand-checked lag 0 and lag 1 packs of the test above among them)
    from slimdata.solver.micropack import LockstepWork

    ucost = unit_cost()
    view = BatchView.build(docs_of([512, 128, 128, 128, 128]), ucost)
    units = [view.slices_of(d) for d in range(5)]
    work = LockstepWork.of(view, units, (), 4)
    for lag in (0, 1, 3, 2, 0, 1):
        again = work.pack(cap=1024, mem=1e30, lag=lag)
        fresh = pack_rank_lockstep(view, units, cap=1024, mem=1e30, m=4, lag=lag)
        assert (again.forward, again.backward) == (fresh.forward, fresh.backward)
    assert work.pack(cap=1024, mem=1e30, lag=1).backward == [[3, 2], [1, 0], [4, 5], [6, 7]]
    assert work.pack(cap=1024, mem=1e30, lag=0).backward == [[], [3, 2, 1], [0, 4, 5], [6, 7]]


@pytest.mark.parametrize(("analytic", "slice_tokens"), [(False, 128), (True, 128), (True, 1024)])
@pytest.mark.parametrize("seed", range(6))
def test_packs_without_the_memory_walk_are_the_walks_packs(seed, analytic, slice_tokens):
    # where a rank's bytes all fit, pack(peak=False) packs the forward once and the backward
    # per lag: the same packs (and the same refusals) as the memory walk, merge share or not;
    # with the analytic model's attention costs the float sums are not exact, and slices of
    # 1024 tokens can alone pass a pack's target or the 256-token cap
    from slimdata.solver.micropack import LockstepWork

    rng = np.random.default_rng(seed)
    lengths = rng.integers(64, 2048, size=int(rng.integers(2, 12))).tolist()
    cost = CostModel.analytic("llama-8b", "h100", "full") if analytic else unit_cost()
    view = BatchView.build(docs_of([512, *lengths], slice_tokens), cost)
    units = [view.slices_of(d) for d in range(1, len(view.docs))]
    merge = view.slices_of(0)[: int(rng.integers(0, 3))]
    fast_path = refused = 0
    unbound = Counter()  # lag >= 1 on the fast path: the packs no lag binds handed out or not
    for m in (1, 2, 3, 5, 8):
        work = LockstepWork.of(view, units, merge, m)
        for lag in (*range(m), m + 1):
            for cap in (256, 1024, 4096):
                kw = dict(cap=cap, lag=lag, pp=int(rng.integers(1, 5)), merge_kv=1e3)
                walk = work.pack(mem=1e30, **kw)
                fast = work.pack(mem=1e30, peak=False, **kw)
                assert (walk is None) == (fast is None)
                refused += walk is None
                if walk is None:
                    continue
                assert (fast.forward, fast.backward) == (walk.forward, walk.backward)
                assert fast.merge_pack == walk.merge_pack
                fwd, bwd = view.lists[1], view.lists[2]
                f = [sum(map(fwd.__getitem__, p)) for p in walk.forward]
                b = [sum(map(bwd.__getitem__, p)) for p in walk.backward]
                if analytic:  # Python >= 3.12 sums floats with compensation: last-ulp sums
                    assert np.allclose(fast.forward_cost, f, rtol=1e-12, atol=0.0)
                    assert np.allclose(fast.backward_cost, b, rtol=1e-12, atol=0.0)
                else:  # integer seconds: exact in any order
                    assert (fast.forward_cost, fast.backward_cost) == (f, b)
                fast_path += work._forward.get(cap) is not None
                if lag >= 1 and cap in work._unbound:
                    unbound[fast is work._unbound[cap][0]] += 1
    assert fast_path and refused and unbound[True]  # guard: these outcomes were compared


def test_packs_no_lag_binds_are_handed_out_only_where_the_lag_does_not_bind():
    # a 768-token document (slices 0-5) and two of 128 (6, 7); 4 packs of 256 forward tokens:
    # F0 [0, 1] F1 [2, 3] F2 [4, 5] F3 [6, 7]; the long document completes with F2. Unbound
    # (every document complete), backward packs take 512 s each: [5, 4] [3, 2] [1, 0] [6, 7].
    # At lag 1, B0 runs after F1, before the long document completes: the lag binds (B0 is
    # empty); at lag 2, B0 runs after F2 and B1 after F3: the unbound packs
    from slimdata.solver.micropack import LockstepWork

    view = BatchView.build(docs_of([768, 128, 128]), unit_cost())
    work = LockstepWork.of(view, [view.slices_of(d) for d in range(3)], (), 4)
    for lag, backward in [
        (1, [[], [5, 4, 3], [2, 1, 0], [6, 7]]),
        (2, [[5, 4], [3, 2], [1, 0], [6, 7]]),
        (3, [[5, 4], [3, 2], [1, 0], [6, 7]]),
    ]:
        fast = work.pack(cap=1024, mem=1e30, lag=lag, peak=False)
        walk = work.pack(cap=1024, mem=1e30, lag=lag)
        assert fast.backward == walk.backward == backward
        assert (fast is work._unbound[1024][0]) == (lag >= 2)


def test_a_backward_pack_takes_its_first_slice_even_past_its_target():
    # documents of 20 and 135 tokens: slice 0 (20 tokens), slices 1, 2 (128 + 7 tokens);
    # backward 2 s/token: 40, 256, 14 s. At lag 1 backward pack 0 takes slice 2 (14 s); pack
    # 1's target is 14 + 296 / 3 = 112.7 s and slice 1's midpoint, 14 + 128 s, passes it, but
    # a pack always takes its first slice (with the memory walk and without)
    from slimdata.solver.micropack import LockstepWork

    view = BatchView.build(docs_of([20, 135]), unit_cost())
    work = LockstepWork.of(view, [view.slices_of(0), view.slices_of(1)], (), 4)
    for peak in (True, False):
        assert work.pack(cap=4096, mem=1e30, lag=1, peak=peak).backward == [[2], [1], [0], []]


def test_pack_rank_lockstep_merge_pack_first_and_caps():
    ucost = unit_cost()
    view = BatchView.build(docs_of([256, 256, 256]), ucost)
    p = pack_rank_lockstep(
        view, [view.slices_of(1), view.slices_of(2)], [0, 1], cap=1024, mem=1e30, m=3
    )
    assert p.merge_pack == (0, 0) and p.forward[0] == [0, 1] and p.backward[0] == [0, 1]
    assert p.forward[1:] == [[2, 3], [4, 5]] and p.backward[1:] == [[3, 2], [5, 4]]
    # 3 packs of <= 128 tokens cannot hold 4 slices
    assert (
        pack_rank_lockstep(view, [view.slices_of(1), view.slices_of(2)], cap=128, mem=1e30, m=3)
        is None
    )


def pack_costs(plan):
    f = np.array([[p.cost for p in rs.forward] for rs in plan.ranks])
    b = np.array([[p.cost for p in rs.backward] for rs in plan.ranks])
    return f, b


def test_pipeline_plan_has_balanced_nonempty_packs():
    # per rank: one 8192-token document and 32 short ones; 4 pipeline stages
    rng = np.random.default_rng(0)
    lengths = [8192, 8192, *rng.integers(300, 1000, size=64).tolist()]
    ucost = unit_cost()
    layout = Layout(dp=2, pp=4, mode="lockstep", context=16384, memory_gib=1000)
    plan = solve(docs_of(lengths), layout, "slimpack", 0, ucost)
    f, b = pack_costs(plan)
    assert f.shape[1] >= 4  # at least pp micro-batches
    assert (f > 0).all() and (b > 0).all()  # no empty pack
    # pack i balanced across ranks and packs of similar cost across i (forward and backward)
    assert f.max() / f.mean() < 1.1 and b.max() / b.mean() < 1.1
    assert plan.meta["lag"] >= 1 and plan.meta["pipeline_estimate"] > 0
    assert plan.ranks[0].order == interleaved_order(f.shape[1], f.shape[1], plan.meta["lag"])


def test_lockstep_uses_layout_microbatches():
    ucost = unit_cost()
    layout = Layout(dp=2, pp=2, mode="lockstep", context=2048, memory_gib=1000, microbatches=6)
    plan = solve(docs_of([300, 200, 100, 400, 250, 150, 90, 310]), layout, "slimpack", 0, ucost)
    assert {len(rs.forward) for rs in plan.ranks} == {6} and {
        len(rs.backward) for rs in plan.ranks
    } == {6}


def test_lockstep_merge_share_sized_to_one_pack():
    # a 3072-token document among 104 short ones on 8 ranks, 4 packs per rank: 16384 tokens,
    # 2048 per rank, 512 per pack -> a group of 3072 / 512 = 6 members, one pack each
    ucost = unit_cost()
    lengths = [3072] + [128] * 104
    layout = Layout(dp=8, pp=4, mode="lockstep", context=4096, memory_gib=1000, microbatches=4)
    plan = solve(docs_of(lengths), layout, "slimpack", 0, ucost)
    (g,) = plan.merges
    assert len(g.ranks) == 6
    f, b = pack_costs(plan)
    assert (f == 512).all() and (b == 1024).all()


def test_validate_false_gives_the_same_plan():
    ucost = unit_cost()
    docs = docs_of([300, 200, 100, 400, 250, 150, 90, 310])
    for layout in (
        Layout(dp=3, memory_gib=100),
        Layout(dp=2, pp=2, mode="lockstep", memory_gib=100),
    ):
        a = solve(docs, layout, "slimpack", 0, ucost)
        b = solve(docs, layout, "slimpack", 0, ucost, validate=False)
        assert a.ranks == b.ranks and a.merges == b.merges


def test_pack_rank_lockstep_memory_is_per_pipeline_stage():
    # unit cost: 100 tokens of activations per GiB, no K/V. A 512-token document (4 slices)
    # and four 128-token ones, 4 packs, lag 1 (the lag the long document needs).
    ucost = unit_cost()
    view = BatchView.build(docs_of([512, 128, 128, 128, 128]), ucost)
    units = [view.slices_of(d) for d in range(5)]
    # one device holding the whole model: F0 + F1 = 512 tokens = 5.12 GiB > 3 GiB
    assert pack_rank_lockstep(view, units, cap=1024, mem=3 * GIB, m=4, lag=1) is None
    # 4 stages of a quarter of the layers each: under 1F1B the first stage runs B0 after F4,
    # i.e. holds all 1024 tokens before its first backward: 10.24 GiB / 4 = 2.56 GiB
    p = pack_rank_lockstep(view, units, cap=1024, mem=3 * GIB, m=4, lag=1, pp=4, layer_share=0.25)
    assert p.forward == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert p.backward == [[3, 2], [1, 0], [4, 5], [6, 7]]
    assert abs(p.peak - 2.56 * GIB) < 1e3
    assert (
        pack_rank_lockstep(view, units, cap=1024, mem=2.5 * GIB, m=4, lag=1, pp=4, layer_share=0.25)
        is None
    )


def test_pack_rank_lockstep_counts_merge_buffers_on_the_first_stage():
    # merge share: doc 0 (256 tokens = 2.56 GiB); docs 1 and 2 of 256 tokens; 3 packs, lag 0,
    # 2 stages of half the layers; the group's gathered K/V is 1 GiB (full model).
    # First stage order F0 F1 B0 F2 B1 B2: while the merge backward B0 runs it holds the merge
    # share (2.56) + F1 (2.56) + 2 x 1 GiB of K/V and gradients = 7.12 GiB, 3.56 GiB per stage
    ucost = unit_cost()
    view = BatchView.build(docs_of([256, 256, 256]), ucost)
    units = [view.slices_of(1), view.slices_of(2)]
    kw = dict(cap=1024, m=3, lag=0, pp=2, layer_share=0.5, merge_kv=1 * GIB)
    p = pack_rank_lockstep(view, units, [0, 1], mem=3.6 * GIB, **kw)
    assert p.forward == [[0, 1], [2, 3], [4, 5]] and p.backward == [[0, 1], [3, 2], [5, 4]]
    assert abs(p.peak - 3.56 * GIB) < 1e3
    assert pack_rank_lockstep(view, units, [0, 1], mem=3.5 * GIB, **kw) is None


@pytest.mark.parametrize(
    ("dp", "context", "memory_gib", "long"),
    [(4, 32768, 4.0, [32768, 24000]), (8, 65536, 8.0, [65536, 30000])],
)
def test_pipeline_plan_fits_the_cap_in_the_simulator(dp, context, memory_gib, long):
    # llama-8b, 4 stages: a full-model memory check refuses these batches outright (a 32K
    # document needs 12 GiB, a 64K one 24 GiB on one device); per stage they fit, merged or
    # with the lag a long document left whole needs, and the simulator's accounting (per
    # stage, 1F1B packs in flight, one layer's merge K/V buffers) stays within the cap
    from slimdata.sim import SimConfig, simulate_step

    cost = CostModel.analytic("llama-8b", "h100", "full")
    rng = np.random.default_rng(0)
    lengths = long + rng.integers(500, 4000, size=40).tolist()
    layout = Layout(dp=dp, pp=4, mode="lockstep", context=context, memory_gib=memory_gib)
    plan = solve(docs_of(lengths, 2048), layout, "slimpack", 0, cost)
    merged = {d for g in plan.merges for d in g.docs}
    if not {0, 1} <= merged:  # a long document left whole spans packs: its backward lags
        assert plan.meta["lag"] >= 1
    if dp == 8:  # the 64K document needs 6 GiB per stage: it is merged
        assert any(0 in g.docs for g in plan.merges)
    result = simulate_step(plan, cost, layout, SimConfig())
    assert 0 < result.peak_memory.max() <= layout.memory_bytes


def test_free_plan_merge_buffers_fit_the_cap_in_the_simulator():
    # free mode (DDP), llama-8b with selective recompute, 40 GiB: a 40K-token document needs a
    # merge group; the simulator charges every member the group's gathered K/V while the merge
    # forward runs and twice that in the backward (7.6 GiB here), which the members' shares
    # must leave room for (the previous solver's 4 members peaked at 43.5 GiB)
    from slimdata.sim import SimConfig, simulate_step

    cost = CostModel.analytic("llama-8b", "h100", "selective")
    rng = np.random.default_rng(0)
    lengths = [40000, *rng.integers(500, 4000, size=60).tolist()]
    layout = Layout(dp=8, context=131072, memory_gib=40)
    plan = solve(docs_of(lengths, 2048), layout, "slimpack", 0, cost)
    (group,) = plan.merges
    assert group.docs == (0,)
    result = simulate_step(plan, cost, layout, SimConfig())
    assert result.peak_memory.max() <= layout.memory_bytes


def test_pack_rank_lockstep_can_free_kv_per_slice_like_the_simulator():
    # act and K/V 1 GiB per 100 tokens each; the lag test's packs: B0 = doc 0's second half.
    # Per-document rule: doc 0's K/V stays until B1, so F2 (two 128-token documents) peaks at
    # 2.56 (doc 0's first half) + 5.12 (its K/V) + 5.12 = 12.8 GiB; per slice (the simulator's
    # rule) B0 also frees its slices' K/V: 10.24 GiB
    cost = CostModel(
        fwd_lin=1.0,
        fwd_att=0.0,
        fwd_const=0.0,
        bwd_lin=2.0,
        bwd_att=0.0,
        bwd_const=0.0,
        act_bytes_per_token=GIB / 100,
        kv_bytes_per_token=GIB / 100,
    )
    view = BatchView.build(docs_of([512, 128, 128, 128, 128]), cost)
    units = [view.slices_of(d) for d in range(5)]
    doc = pack_rank_lockstep(view, units, cap=1024, mem=100 * GIB, m=4, lag=1)
    assert abs(doc.peak - 12.8 * GIB) < 1e3
    # under 11 GiB the per-document rule must cut F2 early (unbalanced packs), per slice not
    tight = pack_rank_lockstep(view, units, cap=1024, mem=11 * GIB, m=4, lag=1)
    assert tight.forward == [[0, 1], [2, 3], [4], [5, 6, 7]]
    per_slice = pack_rank_lockstep(
        view, units, cap=1024, mem=11 * GIB, m=4, lag=1, kv_per_slice=True
    )
    assert per_slice.forward == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert per_slice.backward == [[3, 2], [1, 0], [4, 5], [6, 7]]
    assert abs(per_slice.peak - 10.24 * GIB) < 1e3


def test_memory_refusal_names_full_recompute_when_the_model_keeps_more():
    from slimdata.errors import PlanError

    layout = Layout(dp=2, context=65536, memory_gib=4.0)
    for policy, advised in (("selective", True), ("full", False)):
        cost = CostModel.analytic("llama-8b", "h100", policy)
        with pytest.raises(PlanError, match="--memory-gib") as info:
            solve(docs_of([60000, 500], 2048), layout, "slimpack", 0, cost)
        assert ("--recompute full" in str(info.value)) is advised


@pytest.mark.parametrize("pp", [2, 4])
def test_planner_estimate_is_the_simulated_step_without_communication(pp):
    # one execution order and one pack pricing: on a network that costs nothing, the step time
    # the planner chose its pack count and lag by is the simulator's step time, per plan
    from slimdata.cost import Interconnect
    from slimdata.sim import SimConfig, simulate_step

    cost = CostModel.analytic("llama-8b", "h100", "full")
    free_net = Interconnect(intra_node_gbps=1e12, inter_node_gbps=1e12, latency_s=0.0)
    rng = np.random.default_rng(pp)
    for seed in range(3):
        lengths = rng.integers(200, 20000, size=60).tolist()
        layout = Layout(dp=4, pp=pp, mode="lockstep", context=32768, memory_gib=20)
        plan = solve(docs_of(lengths, 2048), layout, "slimpack", seed, cost)
        assert not plan.merges  # a merge group's members wait on each other: not estimated
        sim = simulate_step(plan, cost, layout, SimConfig(interconnect=free_net))
        assert plan.meta["pipeline_estimate"] == pytest.approx(sim.step_time, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("mode", ["lockstep", "ragged"])
def test_plan_estimate_is_the_slowest_ranks_own_pipeline(mode):
    # every rank's packs through its own order on 4 stages, one by one: the plan's estimate is
    # the largest, whether ranks share an order (lockstep) or not (other lags, other counts)
    from dataclasses import replace

    rng = np.random.default_rng(3)
    lengths = [8192, 4096, *rng.integers(300, 3000, size=40).tolist()]
    layout = Layout(dp=3, pp=4, mode="lockstep", context=16384, memory_gib=1000)
    plan = solve(docs_of(lengths), layout, "slimpack", 0, unit_cost())
    if mode == "ragged":
        r0, r1, r2 = plan.ranks
        m = len(r1.forward)
        r1 = replace(r1, order=interleaved_order(m, m, 2))
        # rank 2 runs its first two forward packs as one: another count, lag 1
        f0, f1, *rest = r2.forward
        joined = MicroPack(f0.slices + f1.slices, f0.cost + f1.cost)
        r2 = replace(r2, forward=(joined, *rest), order=interleaved_order(m - 1, m, 1))
        plan = replace(plan, ranks=(r0, r1, r2))
    each = [
        pipeline_time([p.cost for p in rs.forward], [p.cost for p in rs.backward], rs.order, 4)
        for rs in plan.ranks
    ]
    orders = {rs.order for rs in plan.ranks}
    assert len(orders) == (1 if mode == "lockstep" else 3)  # not vacuous
    assert min(each) > 0
    assert plan_critical_path(plan, unit_cost(), ExecutionConfig(pp=4)) == max(each)


def test_one_stage_lockstep_plans_a_document_longer_than_the_pack_cap():
    # rank 0's 1024-token document needs four packs of <= 256 tokens; its backward work can
    # start only after its last forward pack, so the backward lag is 3 (at lag 0 the last
    # backward pack would hold all 1024 tokens): every forward pack, then every backward pack
    layout = Layout(dp=2, mode="lockstep", context=4096, pack_tokens=256, memory_gib=1000)
    plan = solve(docs_of([1024, 128, 128, 128]), layout, "slimpack", 0, unit_cost())
    (long,) = [r for r in plan.ranks if any(s.doc == 0 for p in r.forward for s in p.slices)]
    assert [[(s.start, s.end) for s in p.slices] for p in long.forward] == [
        [(0, 256)],
        [(256, 512)],
        [(512, 768)],
        [(768, 1024)],
    ]
    assert [[(s.start, s.end) for s in p.slices] for p in long.backward] == [
        [(768, 1024)],
        [(512, 768)],
        [(256, 512)],
        [(0, 256)],
    ]
    assert plan.meta["lag"] == 3
    assert {r.order for r in plan.ranks} == {interleaved_order(4, 4, 3)}


def test_fsdp_lockstep_spreads_a_document_over_every_backward_pack_by_the_lag():
    # FSDP on one stage: the ranks meet before every pass, so each backward pack costs its
    # slowest rank's. Rank 0 holds a 384-token document (three 128-token slices), rank 1
    # three 128-token ones; three packs of <= 256 tokens (two do not hold 384 tokens as
    # whole slices with backward work in each). At lag 1 (F0 F1 B0 F2 B1 B2), the first lag
    # that fits, rank 0's backward pack 0 is empty and pack 1 holds 256 tokens; at lag 2
    # every backward pack holds one slice, as on rank 1: the slower pack is gone.
    layout = Layout(dp=2, mode="lockstep", context=4096, pack_tokens=256, memory_gib=1000)
    plan = solve(docs_of([384, 128, 128, 128]), layout, "slimpack", 0, unit_cost())
    (long,) = [r for r in plan.ranks if any(s.doc == 0 for p in r.forward for s in p.slices)]
    assert plan.meta["lag"] == 2 and plan.meta["microbatches"] == 3
    assert [[(s.start, s.end) for s in p.slices] for p in long.backward] == [
        [(256, 384)],
        [(128, 256)],
        [(0, 128)],
    ]
    tokens = [[p.tokens for p in r.backward] for r in plan.ranks]
    assert tokens == [[128, 128, 128], [128, 128, 128]]


def test_pipeline_lockstep_plans_a_document_longer_than_the_pack_cap():
    layout = Layout(dp=2, pp=2, mode="lockstep", context=4096, pack_tokens=256, memory_gib=1000)
    plan = solve(docs_of([1024, 128, 128, 128]), layout, "slimpack", 0, unit_cost())
    packs = [p for r in plan.ranks for p in (*r.forward, *r.backward)]
    assert max(sum(s.end - s.start for s in p.slices) for p in packs) <= 256
    # the document's backward work starts after its last forward pack closes
    (long,) = [r for r in plan.ranks if any(s.doc == 0 for p in r.forward for s in p.slices)]
    last_f = max(i for i, p in enumerate(long.forward) if any(s.doc == 0 for s in p.slices))
    first_b = min(i for i, p in enumerate(long.backward) if any(s.doc == 0 for s in p.slices))
    order = long.order
    assert order.index(("F", last_f)) < order.index(("B", first_b))
    assert plan.meta["lag"] >= 3


def test_whole_documents_fill_the_packs_the_cost_quantiles_run_out_of():
    # documents of 4, 2, 2, 3 tokens (one slice each) cost 10, 3, 3, 6 s; 2 packs of <= 6
    # tokens. Quantile cuts: F0 = [d0] (d1's midpoint passes 11 s), then d1, d2, d3 = 7
    # tokens for the last pack: no fit. Whole documents, most tokens first: d0 -> p0 (10 s);
    # d3 -> p1 (6 s); d1 -> p1, the least seconds (5 tokens, 9 s); d2: p1 would hold 7
    # tokens, so the fewest tokens, p0 (6 tokens, 13 s). Packs by decreasing seconds.
    from slimdata.solver.micropack import LockstepWork

    view = BatchView.build(docs_of([4, 2, 2, 3]), attention_cost())
    work = LockstepWork.of(view, [view.slices_of(d) for d in range(4)], (), 2)
    assert work.pack(cap=6, mem=1e30) is None
    whole = work.pack_whole(2, cap=6, mem=1e30)
    assert whole.forward == whole.backward == [[0, 2], [3, 1]]
    assert (whole.forward_cost, whole.backward_cost) == ([13.0, 9.0], [0.0, 0.0])
    assert whole.merge_pack is None and whole.peak == 6.0  # the largest pack's bytes (pp 1)
    # 3 packs: d0, d3, then d1 and d2 together in the emptiest; 5 packs: one stays empty
    assert work.pack_whole(3, cap=6, mem=1e30).forward == [[0], [3], [1, 2]]
    assert work.pack_whole(5, cap=6, mem=1e30) is None
    # memory: the first of pp stages holds pp packs at once (6 + 5 bytes at pp 2)
    assert work.pack_whole(2, cap=6, mem=11, pp=2).peak == 11.0
    assert work.pack_whole(2, cap=6, mem=10.9, pp=2) is None
    # a document longer than the cap fits no pack
    assert work.pack_whole(2, cap=3, mem=1e30) is None


def test_whole_documents_keep_backward_from_each_documents_end_and_the_merge_share_first():
    # a 256-token document of two 128-token slices (0, 1), one of 128 (2); merge share 3
    from slimdata.solver.micropack import LockstepWork

    view = BatchView.build(docs_of([256, 128, 128]), unit_cost())
    work = LockstepWork.of(view, [view.slices_of(0), view.slices_of(1)], [3], 3)
    whole = work.pack_whole(3, cap=256, mem=1e30)
    assert whole.merge_pack == (0, 0)
    assert whole.forward == [[3], [0, 1], [2]]
    assert whole.backward == [[3], [1, 0], [2]]


def test_fsdp_estimate_is_the_simulated_step_without_communication():
    # FSDP on one stage: every pass first gathers the parameters from every rank, so pack i
    # costs its slowest rank's; on a network that costs nothing the planner's estimate is
    # the simulator's step (with its per-rank sums it was below it)
    from slimdata.cost import Interconnect
    from slimdata.sim import SimConfig, simulate_step

    cost = CostModel.analytic("llama-8b", "h100", "full")
    free_net = Interconnect(intra_node_gbps=1e12, inter_node_gbps=1e12, latency_s=0.0)
    rng = np.random.default_rng(5)
    for seed in range(3):
        lengths = rng.integers(200, 30000, size=40).tolist()
        layout = Layout(dp=4, mode="lockstep", context=65536, memory_gib=60)
        plan = solve(docs_of(lengths, 2048), layout, "slimpack", seed, cost)
        assert not plan.merges and len(plan.ranks[0].forward) >= 2
        sim = simulate_step(
            plan, cost, layout, SimConfig(parallelism="fsdp", interconnect=free_net)
        )
        assert plan.meta["pipeline_estimate"] == pytest.approx(sim.step_time, rel=1e-6, abs=1e-6)


def test_critical_path_in_lockstep_charges_each_op_its_slowest_rank():
    # two ranks, F0 B0 F1 B1 on one stage: rank 0 (1, 4, 1, 1), rank 1 (2, 1, 2, 3); alone
    # 7 and 8 s; meeting before every op: 2 + 4 + 2 + 3 = 11 s for both
    order = interleaved_order(2, 2)
    f, b = np.array([[1.0, 2.0], [1.0, 2.0]]), np.array([[4.0, 1.0], [1.0, 3.0]])
    assert critical_path(f, b, order, 1).tolist() == [7.0, 8.0]
    assert critical_path(f, b, order, 1, lockstep=True).tolist() == [11.0, 11.0]


def test_a_profiled_model_gets_the_pack_count_its_plans_estimate_lowest():
    # 80 documents of 300-16,000 tokens on 2 ranks, 2 stages, and a profiled-style model:
    # 0.25 s / 0.5 s per model call. The probes price a pack as its slices' costs summed, so
    # more and smaller packs look faster (a smaller bubble: 76 packs, probed 7.65 s); each
    # pack's calls cost more than that (76 packs: 61.52 s by the plan's estimate, 38 packs:
    # 39.85 s). The count chosen is the one whose plan the execution model estimates lowest
    from dataclasses import replace

    cost = replace(
        CostModel.analytic("llama-8b", "h100", "selective"), fwd_pack_const=0.25, bwd_pack_const=0.5
    )
    rng = np.random.default_rng(2)
    lengths = np.exp(rng.uniform(np.log(300), np.log(16000), 80)).astype(int).tolist()
    docs = docs_of(lengths, 1024)
    layout = Layout(dp=2, pp=2, mode="lockstep", memory_gib=30, context=8192)
    config = ExecutionConfig(pp=2)
    plan = solve(docs, layout, "slimpack", cost=cost)
    estimate = plan_critical_path(plan, cost, config)
    assert plan.meta["pipeline_estimate"] == round(estimate, 6)
    forced = {
        m: plan_critical_path(
            solve(docs, replace(layout, microbatches=m), "slimpack", cost=cost), cost, config
        )
        for m in (38, 57, 76, 114)  # the counts the solve tries (19 packs do not fit)
    }
    assert plan.meta["microbatches"] == 38 and estimate == forced[38]
    assert estimate < min(forced[57], forced[76], forced[114])


def test_merge_members_wait_for_the_slowest_in_the_estimate():
    # two ranks, one stage, DDP rules (each rank's passes summed): rank 0 packs F 1, 2 and
    # B 2, 4 (9 s), rank 1 F 3, 1 and B 6, 2 (12 s). As merge members their first packs run
    # together, 3 s and 6 s on both: rank 0 takes 3 + 2 + 6 + 4 = 15 s
    from slimdata.solver.strategies.slimpack import _Stages

    stages = _Stages(pp=1, layers=2)
    f = np.array([[1.0, 3.0], [2.0, 1.0]])  # a row per pack, a column per rank
    b = np.array([[2.0, 6.0], [4.0, 2.0]])
    order = interleaved_order(2, 2, 0)
    assert stages.estimate(f, b, order) == 12.0
    assert stages.estimate(f, b, order, members=[[0, 1]]) == 15.0


@pytest.mark.parametrize("seed", range(4))
def test_a_pipeline_candidates_estimate_is_its_plans(seed, monkeypatch):
    # a 2900-token document merged over the 8 ranks of a 4-stage pipeline, the members'
    # shares uneven: the solver ranks candidates by the estimate of their packs, which under
    # the unit cost model (no fused-slice pricing) is exactly the assembled plan's, members
    # waiting for the slowest one's merge pack included
    from slimdata.solver.strategies import slimpack as sp

    pairs = []
    assemble = sp._Assembly.plan

    def plan(self, candidate):
        p = assemble(self, candidate)
        pairs.append((candidate[0], self.estimate(p), len(p.merges)))
        return p

    monkeypatch.setattr(sp._Assembly, "plan", plan)
    rng = np.random.default_rng(seed)
    lengths = [2900, *rng.integers(64, 700, size=40).tolist()]
    layout = Layout(dp=8, pp=4, mode="lockstep", context=4096, memory_gib=1000)
    solve(docs_of(lengths), layout, "slimpack", 0, unit_cost())
    assert any(merges for _p, _e, merges in pairs)  # not vacuous: a plan with a merge
    assert all(probe == estimate for probe, estimate, _m in pairs)

"""The lockstep planner estimates the step under the schedule the plan will run
(``Layout.schedule``, ``Layout.virtual_stages``): 1F1B or interleaved."""

import math

import numpy as np
import pytest

from slimdata.cost import CostModel
from slimdata.errors import ConfigError
from slimdata.execution import ExecutionConfig
from slimdata.execution.critical import plan_critical_path
from slimdata.execution.schedule import SCHEDULES as EXECUTION_SCHEDULES
from slimdata.solver import Layout, solve
from slimdata.solver.layout import SCHEDULES

from .conftest import docs_of, unit_cost


def test_layout_schedule_defaults_and_validation():
    lay = Layout(dp=1)
    assert (lay.schedule, lay.virtual_stages, lay.chunks_per_device) == ("1f1b", 2, 1)
    assert tuple(EXECUTION_SCHEDULES) == SCHEDULES  # one registry of schedules
    # interleaved without a count: 2 chunks per device, as the simulator and execution model
    assert Layout(dp=1, pp=2, schedule="interleaved").chunks_per_device == 2
    assert ExecutionConfig(pp=2, schedule="interleaved").chunks_per_device == 2
    assert ExecutionConfig(pp=2, virtual_stages=3).chunks_per_device == 1  # 1F1B: one chunk
    assert Layout(dp=1, pp=2, schedule="interleaved", virtual_stages=2).chunks_per_device == 2
    # chunks only matter with a pipeline, and only under the interleaved schedule
    assert Layout(dp=1, pp=1, schedule="interleaved", virtual_stages=2).chunks_per_device == 1
    assert Layout(dp=1, pp=2, virtual_stages=2).chunks_per_device == 1
    with pytest.raises(ConfigError, match=r"schedule='gpipe': use one of 1f1b, interleaved"):
        Layout(dp=1, schedule="gpipe")
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ConfigError, match=f"virtual_stages={bad!r}"):
            Layout(dp=1, pp=2, schedule="interleaved", virtual_stages=bad)  # type: ignore[arg-type]


def test_estimate_is_the_interleaved_critical_path_by_hand():
    """pp 2, two documents of 128 tokens (one slice each), 1 s/token forward, 2 s/token
    backward: two packs of F 128 s, B 256 s whatever the schedule, lag 0.

    1F1B (halves of a pack per stage): stage 0 F0 [0, 64] F1 [64, 128]; stage 1 F0 [64, 128]
    B0 [128, 256] F1 [256, 320] B1 [320, 448]; stage 0 B0 [256, 384] B1 [448, 576]: 576 s.
    Interleaved, v = 2 (chunk c on device c % 2, a quarter of a pack each; F 32 s, B 64 s):
    device 0 F(0,0) [0, 32] F(0,1) [32, 64] F(2,0) [64, 96] F(2,1) [96, 128]; device 1 F(1,0)
    [32, 64] F(1,1) [64, 96] F(3,0) [96, 128] B(3,0) [128, 192] F(3,1) [192, 224] B(3,1)
    [224, 288]; device 0 B(2,0) [192, 256] B(2,1) [288, 352] B(0,0) [352, 416] B(0,1)
    [416, 480]; device 1 B(1,0) [288, 352] B(1,1) [352, 416]: 480 s, the smaller bubble."""
    cost, docs = unit_cost(), docs_of([128, 128], 128)
    base = Layout(dp=1, pp=2, mode="lockstep", context=256, memory_gib=1000)
    one = solve(docs, base, "slimpack", 0, cost)
    lay = Layout(
        dp=1, pp=2, mode="lockstep", context=256, memory_gib=1000, schedule="interleaved",
        virtual_stages=2,
    )  # fmt: skip
    inter = solve(docs, lay, "slimpack", 0, cost)
    for plan in (one, inter):  # the same packs: the guard that the estimates differ by schedule
        rs = plan.ranks[0]
        assert [p.cost for p in rs.forward] == [128.0, 128.0]
        assert [p.cost for p in rs.backward] == [256.0, 256.0] and plan.meta["lag"] == 0
    assert (
        one.meta["pipeline_estimate"]
        == 576.0
        == plan_critical_path(one, cost, ExecutionConfig(pp=2))
    )
    est = plan_critical_path(
        inter, cost, ExecutionConfig(pp=2, schedule="interleaved", virtual_stages=2)
    )
    assert inter.meta["pipeline_estimate"] == 480.0 == est
    assert inter.meta["layout"]["schedule"] == "interleaved"
    assert inter.meta["layout"]["virtual_stages"] == 2
    assert "schedule" not in one.meta["layout"]  # 1F1B plans record what they always did


@pytest.mark.parametrize("gib", [6, 8, 12])
def test_static_cp_estimate_is_the_simulated_step_without_communication(gib):
    """Under static CP 2 (two DP groups of two devices, 2 stages) the planner's estimate is
    per device, as the simulator times it: each member computes its share of the padded
    slices, every slice's fixed cost whole, a merged document's slices at their chunk
    efficiency. On a network that costs nothing the two are equal, with DP-Merge (6 and
    8 GiB: the 60,000-token document merged over both groups) and without (12 GiB)."""
    import dataclasses

    from slimdata.cost import Interconnect
    from slimdata.sim import SimConfig, simulate_step

    cost = CostModel.analytic("llama-8b", "h100", "full")
    free_net = Interconnect(intra_node_gbps=1e12, inter_node_gbps=1e12, latency_s=0.0)
    rng = np.random.default_rng(0)
    lengths = [60000, *rng.integers(200, 8000, size=40).tolist()]
    devices = Layout(dp=4, pp=2, mode="lockstep", context=32768, memory_gib=gib)
    layout = dataclasses.replace(devices, dp=2, cp=2, ranks_per_node=4)
    plan = solve(docs_of(lengths, 2048), layout, "slimpack", 0, cost)
    assert [m.ranks for m in plan.merges] == ([] if gib == 12 else [(0, 1)])
    sim = simulate_step(plan, cost, devices, SimConfig(interconnect=free_net, cp=2))
    assert plan.meta["pipeline_estimate"] == pytest.approx(sim.step_time, rel=1e-6)
    # the same packs priced whole, as one device would run them, take far longer
    whole = plan_critical_path(plan, cost, ExecutionConfig(pp=2))
    assert whole > 1.5 * sim.step_time


@pytest.mark.parametrize("pp", [2, 4])
def test_interleaved_estimate_is_the_simulated_step_without_communication(pp):
    """As for 1F1B (test_lockstep): on a network that costs nothing, the step the planner
    chose its pack count and lag by is the simulator's interleaved step, per plan."""
    from slimdata.cost import Interconnect
    from slimdata.sim import SimConfig, simulate_step

    cost = CostModel.analytic("llama-8b", "h100", "full")
    free_net = Interconnect(intra_node_gbps=1e12, inter_node_gbps=1e12, latency_s=0.0)
    config = SimConfig(interconnect=free_net, schedule="interleaved", virtual_stages=2)
    rng = np.random.default_rng(pp)
    for seed in range(2):
        lengths = rng.integers(200, 20000, size=60).tolist()
        layout = Layout(
            dp=4, pp=pp, mode="lockstep", context=32768, memory_gib=20, schedule="interleaved",
            virtual_stages=2,
        )  # fmt: skip
        plan = solve(docs_of(lengths, 2048), layout, "slimpack", seed, cost)
        assert not plan.merges  # a merge group's members wait on each other: not estimated
        sim = simulate_step(plan, cost, layout, config)
        assert plan.meta["pipeline_estimate"] == pytest.approx(sim.step_time, rel=1e-6, abs=1e-6)
        one = plan_critical_path(plan, cost, ExecutionConfig(pp=pp))
        assert plan.meta["pipeline_estimate"] < one  # interleaving shrinks the bubble


def test_an_order_the_interleaved_schedule_cannot_run_is_a_plan_error():
    """pp 8, v 2, one backward pack that waits for forward pack 15 of 36: the last device
    runs that pack's backward on chunk 7 before its forwards of the third group, which the
    first device's backward on chunk 8 waits for: the devices wait on each other. The
    planner prices such a candidate ``inf`` so another count or lag wins."""
    import math

    from slimdata.errors import PlanError
    from slimdata.execution.critical import critical_path
    from slimdata.plan.pipeline import interleave
    from slimdata.solver.common import interleaved_order
    from slimdata.solver.strategies.slimpack import _Stages

    order = interleave(36, [15])
    with pytest.raises(PlanError, match="interleaved schedule cannot run"):
        critical_path([1.0] * 36, [2.0], order, 8, schedule="interleaved", v=2)
    stages = _Stages(8, 32, "interleaved", 2)
    assert stages.estimate(np.ones((36, 1)), np.full((1, 1), 2.0), order) == math.inf
    ok = interleaved_order(16, 16, 0)  # a symmetric order runs: the guard is not vacuous
    assert math.isfinite(stages.estimate(np.ones((16, 1)), np.full((16, 1), 2.0), ok))


def test_interleaved_runs_pack_counts_that_are_no_multiple_of_pp():
    """Megatron's interleaved schedule groups the packs by ``N`` (its micro-batch group size):
    ``pp``, or more where groups of ``pp`` would leave a last group of fewer than ``pp`` packs
    (Megatron refuses those; here the devices waited on each other: pp 8, v 2, 10 packs, and
    the 76 packs of a pp 16 baseline). One group of 5 packs on pp 4, v 3, lag 0: the last
    device runs its 10 warm-up forwards (chunks 3 and 7), then 1F1B on chunk 11; the first
    device every forward (its warm-up, 6 + 10 ops, outnumbers them), then every backward.
    With 1 s forward and 2 s backward packs on 12 layers, each device computes 5 * 3 * 0.25 =
    3.75 s and waits out the fill and drain of ``pp - 1`` chunk ops (0.25 s each): 4.5 s.
    pp 8, v 2, 10 packs on 16 layers (one group of 10): 10 * 2 * 3/16 + 7 * 3/16 = 5.0625 s."""
    from slimdata.execution.critical import critical_path
    from slimdata.execution.schedule import group_size, stage_ops
    from slimdata.solver.common import interleaved_order

    assert [group_size(n, 8) for n in (3, 8, 10, 16, 20, 76)] == [8, 8, 10, 8, 10, 11]
    assert group_size(76, 16) == 19 and group_size(96, 16) == 16
    order = interleaved_order(5, 5, 0)
    last = " ".join(f"{p}{c}.{i}" for p, c, i in stage_ops("interleaved", order, 3, 4, 3))
    assert last == (
        "F3.0 F3.1 F3.2 F3.3 F3.4 F7.0 F7.1 F7.2 F7.3 F7.4 F11.0 B11.0 F11.1 B11.1 F11.2 "
        "B11.2 F11.3 B11.3 F11.4 B11.4 B7.0 B7.1 B7.2 B7.3 B7.4 B3.0 B3.1 B3.2 B3.3 B3.4"
    )
    first = [f"{p}{c}.{i}" for p, c, i in stage_ops("interleaved", order, 0, 4, 3)]
    assert first == [
        f"{p}{c}.{i}"
        for p, cs in (("F", (0, 4, 8)), ("B", (8, 4, 0)))
        for c in cs
        for i in range(5)
    ]
    got = critical_path([1.0] * 5, [2.0] * 5, order, 4, schedule="interleaved", v=3, layers=12)
    assert got.tolist() == pytest.approx([4.5], rel=1e-12)
    ten = interleaved_order(10, 10, 0)
    got = critical_path([1.0] * 10, [2.0] * 10, ten, 8, schedule="interleaved", v=2, layers=16)
    assert got.tolist() == pytest.approx([5.0625], rel=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_interleaved_plans_fit_the_budget_on_every_device(seed, monkeypatch):
    """The packer checks memory with 1F1B's packs in flight; the interleaved warm-up keeps
    more on the first devices. Every plan solved for the interleaved schedule stays within
    16 GiB on every device in the simulator, and the check is not vacuous: with it switched
    off (the packer's check alone) the same batches overflow."""
    from slimdata.sim import SimConfig, simulate_step
    from slimdata.solver.strategies import slimpack as sp

    cost = CostModel.analytic("llama-8b", "h100", "full")
    docs = docs_of(np.random.default_rng(seed).integers(200, 60000, size=40).tolist(), 2048)
    layout = Layout(
        dp=2, pp=4, mode="lockstep", context=65536, memory_gib=16, schedule="interleaved",
        virtual_stages=2,
    )  # fmt: skip
    config = SimConfig(schedule="interleaved", virtual_stages=2)
    sim = simulate_step(solve(docs, layout, "slimpack", 0, cost), cost, layout, config)
    assert not sim.over_memory and sim.peak_memory_gib <= 16
    monkeypatch.setattr(sp._Stages, "peak", lambda self, plan, cost, layout, over=None: 0.0)
    unchecked = simulate_step(solve(docs, layout, "slimpack", 0, cost), cost, layout, config)
    assert unchecked.over_memory and unchecked.peak_memory_gib > 16


def test_no_interleaved_plan_that_fits_is_a_clear_error(monkeypatch):
    """When no candidate fits the interleaved schedule's peak (nor a calibrated packer's),
    the solver says so with the best peak reached, instead of returning a plan that
    overflows."""
    from slimdata.errors import PlanError
    from slimdata.solver.strategies import slimpack as sp

    docs = docs_of(np.random.default_rng(0).integers(200, 60000, size=40).tolist(), 2048)
    layout = Layout(
        dp=2, pp=4, mode="lockstep", context=65536, memory_gib=16, schedule="interleaved",
        virtual_stages=2,
    )  # fmt: skip
    monkeypatch.setattr(sp._Stages, "peak", lambda self, plan, cost, layout, over=None: 17 * 2**30)
    with pytest.raises(
        PlanError,
        match=r"no plan fits 16.0 GiB per device under the interleaved schedule \(the execution model.s peak of every candidate is above it, at best 17.0 GiB\)",
    ):
        solve(docs, layout, "slimpack", 0, CostModel.analytic("llama-8b", "h100", "full"))


@pytest.mark.parametrize("seed", [0, 3])
def test_static_cp_pipeline_plans_fit_the_budget_on_every_device(seed, monkeypatch):
    """Under static CP every pass holds one layer's gathered K/V, which the packer does not
    count: the plan is read off the execution model's memory rule, and the packer's budget
    calibrated until a candidate fits. 1F1B, two DP groups of two devices, 16 GiB each; the
    packer's check alone overflows on these batches."""
    from slimdata.sim import SimConfig, simulate_step
    from slimdata.solver.strategies import slimpack as sp

    cost = CostModel.analytic("llama-8b", "h100", "full")
    docs = docs_of(np.random.default_rng(seed).integers(200, 120000, size=40).tolist(), 2048)
    layout = Layout(dp=2, pp=2, cp=2, mode="lockstep", context=131072, memory_gib=16)
    devices = Layout(dp=4, pp=2, mode="lockstep", context=131072, memory_gib=16)
    sim = simulate_step(solve(docs, layout, "slimpack", 0, cost), cost, devices, SimConfig(cp=2))
    assert not sim.over_memory and sim.peak_memory_gib <= 16
    monkeypatch.setattr(sp._Stages, "peak", lambda self, plan, cost, layout, over=None: 0.0)
    unchecked = solve(docs, layout, "slimpack", 0, cost)
    over = simulate_step(unchecked, cost, devices, SimConfig(cp=2))
    assert over.over_memory and over.peak_memory_gib > 16


def test_a_memory_bound_solve_also_tries_twice_and_four_times_the_packs(monkeypatch):
    """When memory binds (no usual pack count fits), the counts grow until one fits, ``m``;
    then ``2 m`` and ``4 m`` are tried too (smaller packs: more in flight, a smaller bubble)
    and the best estimate wins."""
    from slimdata.solver.strategies import slimpack as sp

    tried: list[tuple[int, float | None]] = []
    real = sp._lockstep

    def recording(view, p1, layout, counts, stages, seen=None, **late):
        found = real(view, p1, layout, counts, stages, seen, **late)
        tried.append((counts[0], None if found is None else found[0]))
        return found

    monkeypatch.setattr(sp, "_lockstep", recording)
    cost = CostModel.analytic("llama-8b", "h100", "full")
    docs = docs_of(np.random.default_rng(0).integers(200, 120000, size=40).tolist(), 2048)
    layout = Layout(dp=2, pp=2, mode="lockstep", context=131072, memory_gib=32)
    plan = solve(docs, layout, "slimpack", 0, cost)
    fits = [(m, est) for m, est in tried if est is not None]
    first = fits[-3][0]  # the first count that fits, then its two multiples
    assert [m for m, _ in fits[-3:]] == [first, 2 * first, 4 * first]
    assert all(est is None for m, est in tried if m < first)  # memory bound below it
    best = min(fits[-3:], key=lambda f: f[1])
    assert plan.meta["microbatches"] == best[0] != first


def test_a_winner_over_memory_competes_with_twice_and_four_times_its_packs(monkeypatch):
    """When the best candidate by estimate does not fit a device, memory binds: the first
    candidate that fits competes with the first that fits at twice and four times the
    winner's pack count, and the smallest estimate wins. Here the winner's count is made to
    overflow (every plan of that many packs reads as over the budget)."""
    from slimdata.solver.strategies import slimpack as sp

    cost = CostModel.analytic("llama-8b", "h100", "full")
    docs = docs_of(np.random.default_rng(0).integers(200, 60000, size=40).tolist(), 2048)
    layout = Layout(dp=2, pp=2, cp=2, mode="lockstep", context=131072, memory_gib=40)
    m = solve(docs, layout, "slimpack", 0, cost).meta["microbatches"]
    assembled: list[tuple[int, float, bool]] = []

    def peak(self, plan, cost, layout, over=None):
        fits = plan.meta["microbatches"] != m
        if plan.meta.get("whole_documents"):  # the plan with documents whole competes last
            whole.append((plan.meta["microbatches"], plan.meta["pipeline_estimate"]))
        else:
            assembled.append((plan.meta["microbatches"], plan.meta["pipeline_estimate"], fits))
        return 0.0 if fits else math.inf

    whole: list[tuple[int, float]] = []
    monkeypatch.setattr(sp._Stages, "peak", peak)
    plan = solve(docs, layout, "slimpack", 0, cost)
    pool = [(mb, est) for mb, est, fits in assembled if fits]  # the first fit of each round
    assert [mb for mb, _ in pool][1:] == [2 * m, 4 * m] and pool[0][0] != m
    assert assembled[0][0] == m and not assembled[0][2]  # the winner was tried first
    assert len(whole) == 1  # the first that keeps documents whole fits
    best = min(pool + whole, key=lambda p: p[1])
    assert (plan.meta["microbatches"], plan.meta["pipeline_estimate"]) == best


def test_a_device_over_the_cap_is_found_without_building_every_rank():
    """``device_peak_memory(..., over=cap)``: the largest peak when no device exceeds the
    cap; else some device's peak above the cap, never above the largest (the ranks with the
    largest packs are built first, the others only when none of theirs is over)."""
    from slimdata.execution import ExecutionConfig
    from slimdata.solver.memory import device_peak_memory

    cost = CostModel.analytic("llama-8b", "h100", "full")
    docs = docs_of(np.random.default_rng(3).integers(200, 60000, size=60).tolist(), 2048)
    layout = Layout(dp=4, pp=4, mode="lockstep", context=65536, memory_gib=40)
    plan = solve(docs, layout, "slimpack", 0, cost)
    config = ExecutionConfig(pp=4, parallelism="ddp", schedule="interleaved", virtual_stages=2)
    largest = device_peak_memory(plan, cost, config)
    assert device_peak_memory(plan, cost, config, over=largest) == largest
    assert device_peak_memory(plan, cost, config, over=2 * largest) == largest
    found = device_peak_memory(plan, cost, config, over=0.0)
    assert 0.0 < found <= largest


def test_the_lowest_overshoot_is_exact_though_each_is_known_by_a_bound():
    """The calibration scales by the smallest largest-device peak of the candidates that did
    not fit; each is recorded with a device above the budget (a bound), and the exact
    peaks are computed from the smallest bound up only until the smallest is exact."""
    from types import SimpleNamespace

    from slimdata.solver.strategies.slimpack import _Fitting

    exact = {"a": 30.0, "b": 25.0, "c": 40.0}
    computed = []

    def peak(plan, cost, layout, over=None):
        computed.append(plan)
        return exact[plan]

    fitting = _Fitting(SimpleNamespace(cost=None, layout=None), SimpleNamespace(peak=peak))
    assert fitting.lowest == math.inf
    fitting.failed += [(21.0, "a"), (24.0, "b"), (39.0, "c")]
    assert fitting.lowest == 25.0 and computed == ["a", "b"]  # c's bound is above 25
    assert fitting.lowest == 25.0 and computed == ["a", "b"]  # now known

"""A plan is simulated under the execution it was solved for: one default of model chunks per
device under the interleaved schedule, the schedule, chunks and static CP a plan records, a
clear error when the simulator is asked for others, and interleaved pack counts Megatron
runs."""

from __future__ import annotations

import inspect

import pytest
from sim_helpers import linear_cost, whole_doc_plan

from slimdata.cost import Interconnect
from slimdata.docsource import documents_from_lengths
from slimdata.errors import PlanError
from slimdata.execution import INTERLEAVED_CHUNKS, ExecutionConfig
from slimdata.sim import SimConfig, simulate_step, step_bound
from slimdata.solver import Layout, solve

FREE = Interconnect(intra_node_gbps=1e12, inter_node_gbps=1e12, latency_s=0.0)
"""A network that costs nothing: the simulated step is the compute critical path."""


def _two_docs_plan(schedule: str = "1f1b"):
    """pp 2, two 128-token documents (one slice each), 1 s/token forward, 2 s/token backward,
    4 layers: two packs of F 128 s, B 256 s whatever the schedule. 1F1B takes 576 s;
    interleaved over 2 chunks per device (a quarter of a pack per chunk) 480 s (the hand
    derivation: tests/solver/test_schedule_estimate.py)."""
    lay = Layout(
        dp=1, pp=2, mode="lockstep", context=256, memory_gib=1000, schedule=schedule
    )  # virtual_stages left at its default
    docs = documents_from_lengths([128, 128], 128)
    return solve(docs, lay, "slimpack", 0, linear_cost(layers=4)), lay


def test_one_default_of_chunks_per_device():
    """Solver, simulator, execution model and bound share the interleaved default: 2."""
    bound_default = inspect.signature(step_bound).parameters["virtual_stages"].default
    assert INTERLEAVED_CHUNKS == 2
    assert Layout(dp=1).virtual_stages == SimConfig().pipeline.virtual_stages == 2
    assert ExecutionConfig().virtual_stages == bound_default == 2
    assert Layout(dp=1, pp=4, schedule="interleaved").execution == SimConfig(
        schedule="interleaved"
    ).execution(4)


def test_an_interleaved_plan_under_defaults_is_simulated_as_estimated():
    plan, lay = _two_docs_plan("interleaved")
    assert [p.cost for p in plan.ranks[0].forward] == [128.0, 128.0]  # the same packs
    assert plan.meta["layout"]["virtual_stages"] == 2
    assert plan.meta["pipeline_estimate"] == 480.0
    cost = linear_cost(layers=4)
    for config in (
        SimConfig(interconnect=FREE),
        SimConfig(interconnect=FREE, schedule="interleaved"),
    ):
        assert simulate_step(plan, cost, lay, config).step_time == pytest.approx(480.0, rel=1e-9)


def test_a_plan_without_a_recorded_schedule_runs_under_the_one_asked():
    """A 1F1B plan records no schedule: the search also runs it interleaved."""
    plan, lay = _two_docs_plan("1f1b")
    assert "schedule" not in plan.meta["layout"] and plan.meta["pipeline_estimate"] == 576.0
    cost = linear_cost(layers=4)
    one = simulate_step(plan, cost, lay, SimConfig(interconnect=FREE))
    inter = simulate_step(plan, cost, lay, SimConfig(interconnect=FREE, schedule="interleaved"))
    assert one.step_time == pytest.approx(576.0, rel=1e-9)
    assert inter.step_time == pytest.approx(480.0, rel=1e-9)


@pytest.mark.parametrize(
    ("asked", "message"),
    [
        (
            {"schedule": "1f1b"},
            r"the plan was solved for schedule='interleaved' but the simulator was asked for "
            r"schedule='1f1b': leave them unset to simulate the plan as solved",
        ),
        (
            {"virtual_stages": 3},
            r"solved for virtual_stages=2 but the simulator was asked for virtual_stages=3",
        ),
    ],
)
def test_asking_for_another_execution_than_the_plan_records_is_refused(asked, message):
    plan, lay = _two_docs_plan("interleaved")
    with pytest.raises(PlanError, match=message):
        simulate_step(plan, linear_cost(layers=4), lay, SimConfig(**asked))
    # asking for what it records is fine: the guard is not vacuous
    same = SimConfig(schedule="interleaved", virtual_stages=2, cp=1, interconnect=FREE)
    assert simulate_step(plan, linear_cost(layers=4), lay, same).step_time == pytest.approx(480.0)


def test_a_static_cp_plan_records_its_cp_and_is_simulated_with_it():
    """Solved for one DP group of two CP devices, the plan says so (``meta["cp"]``, which the
    runtime reads too); the simulator runs it on the two devices without being told."""
    group = Layout(dp=1, cp=2, pp=2, mode="lockstep", context=256, memory_gib=1000)
    devices = Layout(dp=2, pp=2, mode="lockstep", context=256, memory_gib=1000)
    docs = documents_from_lengths([128, 128], 128)
    plan = solve(docs, group, "slimpack", 0, linear_cost(layers=4))
    assert plan.meta["cp"] == 2
    cost = linear_cost(layers=4)
    told = simulate_step(plan, cost, devices, SimConfig(cp=2)).step_time
    assert simulate_step(plan, cost, devices).step_time == told
    with pytest.raises(PlanError, match=r"solved for cp=2 but the simulator was asked for cp=1"):
        simulate_step(plan, cost, devices, SimConfig(cp=1))


@pytest.mark.parametrize(
    ("pp", "packs", "layers", "step"), [(8, 10, 16, 648.0), (16, 76, 32, 2004.0)]
)
def test_interleaved_pack_counts_no_multiple_of_pp_run(pp, packs, layers, step):
    """``packs`` one-document packs of 128 tokens (F 128 s, B 256 s) on ``pp`` stages, 2
    chunks per device: in groups of ``pp`` the devices waited on each other (the pp 16
    baseline of 76 packs failed as a deadlock); in Megatron's groups (10; 19) every device
    computes ``packs * 2 * 384 / (2 pp)`` s and waits out the fill and drain of ``pp - 1``
    chunk ops of ``384 / (2 pp)`` s: pp 8, 10 packs: 480 + 168 = 648 s; pp 16, 76 packs:
    1824 + 180 = 2004 s."""
    plan = whole_doc_plan([[[128]] * packs], mode="lockstep")
    lay = Layout(dp=1, pp=pp, mode="lockstep", context=256, memory_gib=1000, schedule="interleaved")
    config = SimConfig(interconnect=FREE, schedule="interleaved")
    r = simulate_step(plan, linear_cost(layers=layers), lay, config)
    assert r.step_time == pytest.approx(step, rel=1e-9)


def test_fsdp1_pays_every_forward_again():
    """Under FSDP1's rules every backward pack re-runs its forward: the simulated step of a
    one-rank lockstep plan of two 128-token documents (1 s/token forward) is 256 s longer
    than under FSDP2's, however the solver packed them."""
    lay = Layout(dp=1, mode="lockstep", context=256, memory_gib=1000)
    plan = solve(documents_from_lengths([128, 128], 128), lay, "slimpack", 0, linear_cost())
    cost = linear_cost()
    fsdp2 = SimConfig(parallelism="fsdp", interconnect=FREE)
    fsdp1 = SimConfig(parallelism="fsdp", interconnect=FREE, fsdp_keeps_graphs=False)
    t2 = simulate_step(plan, cost, lay, fsdp2).step_time
    t1 = simulate_step(plan, cost, lay, fsdp1).step_time
    assert t2 == pytest.approx(128 * 2 + 2 * 128 * 2)
    assert t1 - t2 == pytest.approx(256.0)

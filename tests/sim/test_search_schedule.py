"""The configuration search solves slimpack for the schedule it simulates (once per schedule)
and a baseline once for every schedule."""

from __future__ import annotations

from sim_helpers import linear_cost, whole_doc_plan

from slimdata.docsource import documents_from_lengths
from slimdata.sim import SimConfig
from slimdata.sim.search import BaselineConfig, Evaluator, Setup, search
from slimdata.solver import Layout


def recording_solver(calls: list[tuple], made: dict[int, str] | None = None):
    """A stand-in solver that splits 16 documents of 128 tokens into the asked number of
    packs (2 by its own choice) and records what each solve was asked for (``made``: the
    schedule of each plan, by ``id``)."""

    def solve(batch, layout, name, seed, cost, *, step, validate):
        m = layout.microbatches or 2
        calls.append((name, layout.pack_tokens, m, layout.schedule, layout.virtual_stages))
        plan = whole_doc_plan([[[128] * (16 // m)] * m], mode="lockstep")
        if made is not None:
            made[id(plan)] = layout.schedule
        return plan

    return solve


def evaluator(calls: list[tuple], pp: int = 2, made: dict[int, str] | None = None) -> Evaluator:
    docs = documents_from_lengths([128] * 16)
    lay = Layout(dp=1, pp=pp, context=4096, memory_gib=100, mode="lockstep")
    config = SimConfig(virtual_stages=3)  # not the layout's default (2): told apart below
    return Evaluator([docs], lay, linear_cost(layers=4), config, 0, recording_solver(calls, made))


def test_search_solves_slimpack_once_per_schedule_it_simulates():
    calls: list[tuple] = []
    made: dict[int, str] = {}
    ev = evaluator(calls, made=made)
    run = search(ev, "slimpack", BaselineConfig("best"))
    assert not isinstance(run, str)
    assert len(calls) == len(set(calls)) == ev.log.solves  # never the same solve twice
    # every screened configuration (pack count x schedule planned for) is solved once; the
    # 1F1B plans are also screened under the interleaved schedule, without solving again
    tried = {(t["microbatches"] or 2, t.get("plan_schedule", t["schedule"])) for t in ev.log.tried}
    assert {(m, sch) for _n, _row, m, sch, _v in calls} == tried
    cross = [t for t in ev.log.tried if "plan_schedule" in t]
    assert cross and all(
        (t["plan_schedule"], t["schedule"]) == ("1f1b", "interleaved") for t in cross
    )
    assert {(2, "1f1b"), (2, "interleaved")} <= tried  # its own choice under each schedule
    assert all(v == 3 for *_rest, v in calls)  # the simulator's virtual stages
    # the run's plan is the one solved for the schedule it runs under
    assert made[id(run.plans[0])] == run.schedule


def test_search_solves_a_baseline_once_for_both_schedules():
    calls: list[tuple] = []
    ev = evaluator(calls)
    search(ev, "bfd", BaselineConfig("best"), rows=True)
    screened = [(t["row"], t["schedule"]) for t in ev.log.tried]
    rows = {row for row, _sch in screened}
    assert {sch for _row, sch in screened} == {"1f1b", "interleaved"}
    assert len(calls) == len(rows) == ev.log.solves < len(screened)  # once per row
    assert {(sch, v) for *_rest, sch, v in calls} == {("1f1b", 2)}  # the layout as given


def test_without_a_pipeline_slimpack_is_solved_once():
    calls: list[tuple] = []
    ev = evaluator(calls, pp=1)
    ev.plan("slimpack", Setup(1), 0, "1f1b")
    ev.plan("slimpack", Setup(1), 0, "interleaved")
    assert len(calls) == 1 and calls[0][3] == "1f1b"  # the layout as given


def test_static_cp_plans_are_solved_for_cp_groups_with_their_devices_memory():
    """Under static CP k the search solves for ``dp / k`` DP groups of ``Layout.cp = k``
    devices: a group's budget is k devices' (``memory_bytes``) while ``memory_gib`` stays
    the device's, which the planner's own per-device memory checks read."""
    docs = documents_from_lengths([128] * 16)
    lay = Layout(dp=8, ranks_per_node=8, context=4096, memory_gib=10, mode="lockstep")
    ev = Evaluator([docs], lay, linear_cost(layers=4), SimConfig(), 0, recording_solver([]))
    group = ev.layout_for(Setup(cp=4))
    assert (group.dp, group.cp, group.ranks_per_node, group.memory_gib) == (2, 4, 2, 10)
    assert group.memory_bytes == 40 * 2**30 == 4 * lay.memory_bytes
    assert ev.layout_for(Setup(cp=1)) == lay

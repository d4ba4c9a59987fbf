"""Under static CP the solver's memory checks are the execution model's: a plan it returns
fits the budget on every device (:func:`device_peak_memory`), and a budget below what the
batch needs is a :class:`PlanError`, not an over-budget plan."""

from __future__ import annotations

import pytest

from slimdata.cost import CostModel
from slimdata.errors import PlanError
from slimdata.execution import ExecutionConfig
from slimdata.plan import Document, MicroPack, RankStep, Slice, StepPlan
from slimdata.solver import Layout, solve
from slimdata.solver.memory import device_peak_memory

from .conftest import GIB, docs_of

SELECTIVE = CostModel.analytic("llama-8b", "h100", "selective")


def alone(length: int, cost: CostModel, cp: int) -> float:
    """The execution model's device peak of one document of ``length`` tokens run alone, in
    one pack on one DP rank of ``cp`` devices (bytes)."""
    pack = MicroPack((Slice(0, 0, length),))
    rank = RankStep(0, (pack,), (pack,))
    plan = StepPlan(0, "by-hand", (Document(0, length),), (rank,))
    return device_peak_memory(plan, cost, ExecutionConfig(cp=cp))


def free_cp2(memory_gib: float, dp: int = 1) -> Layout:
    return Layout(dp=dp, cp=2, mode="free", memory_gib=memory_gib, context=16384)


def test_free_packs_count_a_devices_gathered_kv():
    """Two 8,192-token documents at static CP 2 (the review's case): a device holds half of
    a document's activations and K/V and, while its last pass runs backward, twice one
    layer's K/V gathered over the whole document. At 1.0005x the half alone (13.5869 GiB)
    the solver accepted a plan whose devices peak at 13.6426 GiB; it needs what one
    document alone needs on a device, and plans each in its own pack at that."""
    need = alone(8192, SELECTIVE, 2)
    assert round(need / GIB, 4) == 13.6426
    docs = docs_of([8192, 8192], 1024)
    with pytest.raises(PlanError, match=r"needs 27\.3 GiB but the memory cap is 13\.6 GiB"):
        solve(docs, free_cp2(13.5869), "slimpack", cost=SELECTIVE)
    with pytest.raises(PlanError, match=r"per device, 27\.3 GiB per DP rank of 2 CP devices"):
        solve(docs, free_cp2(need * (1 - 1e-6) / GIB), "slimpack", cost=SELECTIVE)
    budget = need * (1 + 1e-6)
    plan = solve(docs, free_cp2(budget / GIB), "slimpack", cost=SELECTIVE)
    assert [p.tokens for p in plan.ranks[0].forward] == [8192, 8192]
    assert device_peak_memory(plan, SELECTIVE, ExecutionConfig(cp=2)) == pytest.approx(need)
    assert device_peak_memory(plan, SELECTIVE, ExecutionConfig(cp=2)) <= budget


def test_free_plan_a_document_too_large_with_its_buffer_merges():
    """With a second DP rank the document that does not fit a rank with its gathered K/V
    merges instead of failing, and the plan fits every device."""
    need = alone(8192, SELECTIVE, 2)
    budget = need * (1 - 1e-3)
    plan = solve(
        docs_of([8192, 1024], 1024), free_cp2(budget / GIB, dp=2), "slimpack", cost=SELECTIVE
    )
    assert [g.docs for g in plan.merges] == [(0,)]
    assert device_peak_memory(plan, SELECTIVE, ExecutionConfig(cp=2)) <= budget


def test_every_free_plan_under_static_cp_is_read_off_the_execution_model(monkeypatch):
    """The assembled free plan is checked on every device (:meth:`_Stages.peak`): a plan
    over the budget is planned again with the budget scaled down by the overshoot, and when
    every plan is over, the error gives the best peak."""
    from slimdata.solver.strategies import slimpack as sp

    docs = docs_of([8192, 8192, 4096], 1024)
    layout = free_cp2(60.0)
    budgets: list[float] = []
    real = sp._free_at

    def recording(assembly, packer):
        budgets.append(packer.memory_gib)
        return real(assembly, packer)

    monkeypatch.setattr(sp, "_free_at", recording)
    monkeypatch.setattr(sp._Stages, "peak", lambda self, plan, cost, layout, over=None: 61 * GIB)
    with pytest.raises(
        PlanError,
        match=r"^free: no plan fits 60\.0 GiB per device with static CP 2 \(the execution "
        r"model's peak of every plan is above it, at best 61\.0 GiB\): raise --memory-gib",
    ):
        solve(docs, layout, "slimpack", cost=SELECTIVE)
    assert len(budgets) == 1 + sp.CALIBRATIONS
    assert budgets[1] == pytest.approx(60.0 * 60 / 61 * (1 - 1e-3))
    over: list[StepPlan] = []  # the first plan checked reads as over the budget

    def first_over(self, plan, cost, layout, over_=None):
        over[:] = over or [plan]
        return 61 * GIB if plan is over[0] else 0.0

    monkeypatch.setattr(sp._Stages, "peak", first_over)
    budgets.clear()
    solve(docs, layout, "slimpack", cost=SELECTIVE)
    assert budgets == [60.0, pytest.approx(60.0 * 60 / 61 * (1 - 1e-3))]

"""slimdata.hooks.verify on CPU in fp32: a DP plan run rank after rank equals the reference."""

from __future__ import annotations

import pytest
from hooks_helpers import TinyLM, make_plan, solver_case, tiny_forward
from slimdata.hooks.verify import equivalence_report, run_plan, whole_document_plan

from slimdata.errors import PlanError
from slimdata.plan import MergeGroup


def test_fp32_report_of_a_two_rank_solver_plan_is_exact():
    plan, toks = solver_case([300, 200, 90, 64, 7, 1], "slimpack", dp=2, seed=1, context=128)
    assert any(s.start > 0 for r in plan.ranks for p in r.forward for s in p.slices)
    rep = equivalence_report(TinyLM(), plan, toks, forward=tiny_forward)
    assert rep["packed"]["grad"] < 1e-5 and rep["packed"]["loss"] < 1e-6
    assert rep["noise"]["grad"] < 1e-5


def test_whole_document_plans_hold_every_token_once():
    plan, _ = solver_case([300, 200, 90], "slimpack", dp=1, seed=0, context=128)
    for per_pack, reverse in ((1, False), (2, True)):
        p = whole_document_plan(plan.docs, per_pack, reverse)
        assert sorted((s.doc, s.start, s.end) for f in p.ranks[0].forward for s in f.slices) == [
            (i, 0, d.length) for i, d in enumerate(plan.docs)
        ]
        assert len(p.ranks[0].forward) == -(-len(plan.docs) // per_pack)


def test_merge_plans_are_refused():
    plan = make_plan(
        [8, 4],
        [([[(0, 0, 4)], [(1, 0, 4)]], [[(0, 0, 4)], [(1, 0, 4)]]), ([[(0, 4, 8)]], [[(0, 4, 8)]])],
        merges=[MergeGroup((0, 1), (0,))],
        merge_packs={0: (0, 0), 1: (0, 0)},
    )
    with pytest.raises(PlanError, match="one process per rank"):
        run_plan(TinyLM(), plan, [[1] * 8, [2] * 4], forward=tiny_forward)

"""Idle ranks, shares without a loss token and a merge member with no document of its own run
on 2 and 4 gloo ranks with the gradients of the unpacked batch, and every rank issues the same
collectives in the same order."""

from __future__ import annotations

import pytest
import robust_workers as W
from slimdata.hooks.distributed import run_distributed

pytestmark = pytest.mark.timeout(300)
TOL = 1e-5


def _check(results, cases: int) -> None:
    assert all(len(r) == cases for r in results)
    for case in zip(*results, strict=True):  # one tuple per rank
        shares, refs, errs, calls = zip(*case, strict=True)
        assert sum(shares) == pytest.approx(refs[0], rel=1e-6)
        assert max(errs) <= TOL, errs
        assert calls[0], "no collective recorded: the comparison below would be vacuous"
        assert all(c == calls[0] for c in calls), calls


def test_idle_rank_no_loss_token_and_member_only_two_ranks():
    names = ["idle2", "no_loss2", "member_only2"]
    _check(run_distributed(W.robust, 2, names), 2 * len(names))


@pytest.mark.slow
def test_idle_ranks_four_ranks():
    _check(run_distributed(W.robust, 4, ["idle4"]), 2)


def test_a_plan_for_other_processes_is_one_clear_error_on_every_rank():
    # 2 DDP processes: a plan for 4, then each process handed the other's payload
    results = run_distributed(W.wrong_processes, 2)
    assert [r[0] for r in results] == ["ran", "ran"]  # the same plans run on their ranks
    assert [r[1] for r in results] == [
        "step 0: the plan is for 4 processes (4 DP ranks x cp=1) but the gradients are summed "
        "over 2: launch 4 processes, or plan for 2 (`slimdata plan --nodes/--ranks-per-node`, "
        "Layout(dp=...))"
    ] * 2
    assert [r[2] for r in results] == [
        f"step 0: process {me} runs DP rank {me} of the plan but got the payload of DP rank "
        f"{1 - me}: hand process r the payload of DP rank r // 1 (PlanShardLoader(rank=r), "
        "DocumentLoader(rank=r // 1))"
        for me in (0, 1)
    ]

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

"""The MILP refinement of SlimPack's phase 1 (HiGHS): it finds what LPT misses."""

import pytest

from slimdata.solver import Layout, SolveOptions, solve

from .conftest import docs_of


def test_milp_repairs_the_classic_lpt_miss(ucost):
    # costs 3 3 2 2 2 on two ranks: LPT gives {3, 2, 2} | {3, 2} (max 7 of a 6 share, degree
    # 7/6); the optimum is {3, 3} | {2, 2, 2} (whole documents: no coarse merge)
    docs = docs_of([300, 300, 200, 200, 200])
    layout = Layout(dp=2, memory_gib=100)
    lpt = solve(
        docs,
        layout,
        "slimpack",
        cost=ucost,
        options=SolveOptions(improve_rounds=0, coarse_merge=False),
    )
    assert lpt.meta["imbalance"] == pytest.approx(7 / 6, abs=1e-6)
    assert "milp" not in lpt.meta
    exact = solve(
        docs,
        layout,
        "slimpack",
        cost=ucost,
        options=SolveOptions(improve_rounds=0, milp_seconds=10.0, coarse_merge=False),
    )
    report = exact.meta["milp"]
    assert report["before"] == pytest.approx(7 / 6, abs=1e-6)
    assert report["after"] == pytest.approx(1.0)
    assert report["docs"] == 5
    assert exact.meta["imbalance"] == pytest.approx(1.0)
    lengths = sorted(
        sorted({exact.docs[s.doc].length for p in rs.forward for s in p.slices})
        for rs in exact.ranks
    )
    assert lengths == [[200], [300]]
    assert sorted(rs.tokens for rs in exact.ranks) == [600, 600]

"""Exact refinement of SlimPack's phase 1 with a MILP (HiGHS through ``highspy``).

Model, over the ``max_docs`` costliest whole documents (the rest, and merge shares, stay where
the heuristic put them and enter as fixed loads ``F0``, ``B0``)::

    min z   s.t.  sum_r x[d, r] = 1                          for every free document d
                  F0[r] + sum_d f[d] x[d, r] <= z * F_share   for every rank r
                  B0[r] + sum_d b[d] x[d, r] <= z * B_share   for every rank r
                  x binary

i.e. the two-dimensional imbalance degree the heuristic minimises. The solver is warm-started
from the heuristic assignment, runs under a wall-time budget (``seconds``), and the heuristic
answer is kept unless HiGHS returns a strictly better one. The returned info reports the
objective before and after, HiGHS's status and its relative MIP gap.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from slimdata.solver.common import BatchView

__all__ = ["refine_assignment"]


def refine_assignment(
    view: BatchView,
    rest: np.ndarray,
    assign: list[list[int]],
    dp: int,
    member_slices: Mapping[int, Sequence[int]],
    *,
    seconds: float = 1.0,
    max_docs: int = 48,
) -> tuple[list[list[int]], dict[str, Any]]:
    """Return an assignment no worse than ``assign`` and a report (see the module docstring)."""
    import highspy

    t0 = time.perf_counter()
    fs = max(float(view.doc_fwd.sum()) / dp, 1e-30)
    bs = max(float(view.doc_bwd.sum()) / dp, 1e-30)
    rank_of = {d: r for r, ds in enumerate(assign) for d in ds}
    cost = view.doc_fwd[rest] + view.doc_bwd[rest]
    free = rest[np.argsort(-cost, kind="stable")][:max_docs].tolist()
    free_set = set(free)
    F0, B0 = _fixed_loads(view, rank_of, free_set, member_slices, dp)

    def objective(where: dict[int, int]) -> float:
        F, B = F0.copy(), B0.copy()
        for d, r in where.items():
            F[r] += view.doc_fwd[d]
            B[r] += view.doc_bwd[d]
        return float(max((F / fs).max(), (B / bs).max()))

    before = objective({d: rank_of[d] for d in free})
    h = highspy.Highs()
    h.silent()
    h.setOptionValue("time_limit", float(seconds))
    h.setOptionValue("threads", 1)
    x, z = _add_model(h, view, free, dp, (fs, bs), (F0, B0))
    _warm_start(h, x, z, rank_of, before)
    h.changeObjectiveSense(highspy.ObjSense.kMinimize)
    h.changeColCost(z.index, 1.0)
    h.run()
    info = h.getInfo()
    report: dict[str, Any] = {
        "status": h.modelStatusToString(h.getModelStatus()),
        "before": round(before, 6),
        "after": round(before, 6),
        "gap": None,
        "docs": len(free),
        "seconds": seconds,
    }
    where = _solution(h, x, free, dp) if info.primal_solution_status == 2 else None
    if where is not None:  # a feasible point was found
        after = objective(where)
        report["gap"] = float(info.mip_gap) if np.isfinite(info.mip_gap) else None
        if after < before - 1e-9:
            new = [[d for d in ds if d not in free_set] for ds in assign]
            for d, r in where.items():
                new[r].append(d)
            assign = new
            report["after"] = round(after, 6)
    report["milp_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    return assign, report


def _fixed_loads(
    view: BatchView,
    rank_of: Mapping[int, int],
    free: set[int],
    member_slices: Mapping[int, Sequence[int]],
    dp: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank forward and backward seconds that stay where they are: merge shares and the
    documents outside the model."""
    F0 = np.zeros(dp)
    B0 = np.zeros(dp)
    for r, ms in member_slices.items():
        F0[r] += view.fwd[list(ms)].sum()
        B0[r] += view.bwd[list(ms)].sum()
    for d, r in rank_of.items():
        if d not in free:
            F0[r] += view.doc_fwd[d]
            B0[r] += view.doc_bwd[d]
    return F0, B0


def _add_model(h, view: BatchView, free: list[int], dp: int, shares, fixed):
    """The constraints of the module docstring over documents ``free``: binaries ``x[d, r]``
    and ``z``; ``shares = (F_share, B_share)``, ``fixed = (F0, B0)``."""
    (fs, bs), (F0, B0) = shares, fixed
    x = {(d, r): h.addBinary() for d in free for r in range(dp)}
    z = h.addVariable(lb=0.0)
    for d in free:
        h.addConstr(sum(x[d, r] for r in range(dp)) == 1)
    backward = bool(view.doc_bwd[free].any() or B0.any())  # none: one load (BatchView.summed)
    for r in range(dp):
        h.addConstr(sum(float(view.doc_fwd[d]) * x[d, r] for d in free) - fs * z <= -float(F0[r]))
        if backward:
            h.addConstr(
                sum(float(view.doc_bwd[d]) * x[d, r] for d in free) - bs * z <= -float(B0[r])
            )
    return x, z


def _warm_start(h, x, z, rank_of: Mapping[int, int], before: float) -> None:
    """Start HiGHS from the heuristic assignment (objective ``before``)."""
    import highspy

    start = np.zeros(h.getNumCol())
    for (d, r), var in x.items():
        start[var.index] = 1.0 if rank_of[d] == r else 0.0
    start[z.index] = before
    sol = highspy.HighsSolution()
    sol.col_value = start.tolist()
    sol.value_valid = True
    h.setSolution(sol)


def _solution(h, x, free: list[int], dp: int) -> dict[int, int] | None:
    """The rank of every free document in HiGHS's solution (its largest ``x[d, r]``)."""
    values = h.getSolution().col_value
    if len(values) != h.getNumCol():
        return None
    return {
        d: max(range(dp), key=cast("Callable[[int], float]", lambda r, d=d: values[x[d, r].index]))
        for d in free
    }

"""The strategy registry and the per-step solve API (design §6).

``STRATEGIES`` maps a name to a pure function ``(batch, layout, seed, cost, *, step, **options)
-> StepPlan``; every strategy sees the same documents and returns a validated plan whose packs
carry their predicted seconds and whose ``meta`` carries the seed, options and solve time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from slimdata.cost import CostModel
from slimdata.errors import ConfigError
from slimdata.plan.types import Document, StepPlan
from slimdata.solver.common import default_cost
from slimdata.solver.layout import Layout
from slimdata.solver.strategies.bfd import bfd
from slimdata.solver.strategies.concat import concat
from slimdata.solver.strategies.dcp import dcp
from slimdata.solver.strategies.multipack import multipack
from slimdata.solver.strategies.slimpack import slimpack
from slimdata.solver.strategies.sorted import sorted_batches
from slimdata.solver.strategies.wlb import wlb

__all__ = ["STRATEGIES", "solve"]

STRATEGIES: dict[str, Callable[..., StepPlan]] = {
    "concat": concat,
    "bfd": bfd,
    "multipack": multipack,
    "wlb": wlb,
    "sorted": sorted_batches,
    "dcp": dcp,
    "slimpack": slimpack,
}


def solve(
    batch: Sequence[Document],
    layout: Layout,
    strategy: str = "slimpack",
    seed: int = 0,
    cost: CostModel | None = None,
    *,
    step: int = 0,
    validate: bool = True,
    **options,
) -> StepPlan:
    """Plan one step of ``batch`` on ``layout`` with ``strategy``; deterministic for a seed.

    ``cost=None`` means ``CostModel.analytic("llama-8b")``. ``validate=False`` skips
    :meth:`StepPlan.validate` (about a quarter of a slimpack solve): for per-step callers that
    trust the solver (the simulator, benchmarks); the test suite validates every strategy's
    plans and :func:`~slimdata.solver.planshards.write_plan_shards` validates every plan it
    writes. Raises :class:`ConfigError` for an unknown strategy and
    :class:`~slimdata.errors.PlanError` for an impossible layout. ``plan.meta["recompute"]``
    is the cost model's recompute policy, the one the runtime runs.
    """
    fn = STRATEGIES.get(strategy)
    if fn is None:
        raise ConfigError(f"strategy={strategy!r}: use one of {', '.join(STRATEGIES)}")
    plan = fn(batch, layout, seed, cost, step=step, validate=validate, **options)
    # the recompute policy the plan's memory assumes: the runtime runs it (design §9)
    plan.meta["recompute"] = (cost if cost is not None else default_cost()).recompute
    return plan

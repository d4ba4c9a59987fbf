"""The strategy registry and the per-step solve API (design §6).

``STRATEGIES`` maps a name to a pure function ``(batch, layout, seed, cost, *, step, validate)
-> StepPlan``; the strategies with knobs (:data:`~slimdata.solver.options.OPTIONS_OF`) also
take ``options``, a :class:`~slimdata.solver.options.SolveOptions`. Every strategy sees the
same documents and returns a validated plan whose packs carry their predicted seconds and
whose ``meta`` carries the seed, the knobs it used and the solve time.

``STREAMS`` maps a name to a strategy that packs the run's *stream* of steps, because it moves
documents between steps (``wlb``'s outlier delay): a class built as ``(layout, seed, cost, *,
validate)`` with ``step(batch, step) -> StepPlan`` per step in order and ``flush(step) ->
list[StepPlan]`` after the last one (extra iterations that train what still waits), and
``mean_token_delay()``. ``slimdata simulate`` runs both kinds (``ALL_STRATEGIES``); ``solve``
and ``slimdata plan`` run ``STRATEGIES`` only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from slimdata.cost import CostModel
from slimdata.errors import ConfigError
from slimdata.plan.types import Document, StepPlan
from slimdata.solver.common import default_cost
from slimdata.solver.layout import Layout
from slimdata.solver.options import DEFAULT_OPTIONS, OPTIONS_OF, SolveOptions, check_options
from slimdata.solver.strategies.bfd import bfd
from slimdata.solver.strategies.concat import concat
from slimdata.solver.strategies.dcp import dcp
from slimdata.solver.strategies.multipack import multipack
from slimdata.solver.strategies.slimpack import slimpack
from slimdata.solver.strategies.sorted import sorted_batches
from slimdata.solver.strategies.wlb import wlb_ideal
from slimdata.solver.strategies.wlb_queue import WlbStream

__all__ = ["ALL_STRATEGIES", "STRATEGIES", "STREAMS", "solve"]

STRATEGIES: dict[str, Callable[..., StepPlan]] = {
    "concat": concat,
    "bfd": bfd,
    "multipack": multipack,
    "wlb-ideal": wlb_ideal,
    "sorted": sorted_batches,
    "dcp": dcp,
    "slimpack": slimpack,
}
STREAMS: dict[str, Callable[..., WlbStream]] = {"wlb": WlbStream}
ALL_STRATEGIES: tuple[str, ...] = (
    "concat",
    "bfd",
    "multipack",
    "wlb",
    "wlb-ideal",
    "sorted",
    "dcp",
    "slimpack",
)
"""Every strategy ``slimdata simulate`` compares, per-step and stream, in table order."""


def solve(
    batch: Sequence[Document],
    layout: Layout,
    strategy: str = "slimpack",
    seed: int = 0,
    cost: CostModel | None = None,
    *,
    step: int = 0,
    validate: bool = True,
    options: SolveOptions = DEFAULT_OPTIONS,
) -> StepPlan:
    """Plan one step of ``batch`` on ``layout`` with ``strategy``; deterministic for a seed.

    ``cost=None`` means ``CostModel.analytic("llama-8b")``. ``validate=False`` skips
    :meth:`StepPlan.validate` (about a quarter of a slimpack solve): for per-step callers that
    trust the solver (the simulator, benchmarks); the test suite validates every strategy's
    plans and :func:`~slimdata.solver.planshards.write_plan_shards` validates every plan it
    writes. ``options``: the strategy's knobs (:class:`~slimdata.solver.options.SolveOptions`,
    e.g. ``SolveOptions(skew_merge=False)`` for slimpack). Raises :class:`ConfigError` for an
    unknown strategy or a knob it does not read, and
    :class:`~slimdata.errors.PlanError` for an impossible layout. ``plan.meta["recompute"]``
    is the cost model's recompute policy, the one the runtime runs; under static CP
    (``layout.cp > 1``) ``plan.meta["cp"]`` is its size, which the runtime and the simulator
    read.
    """
    fn = STRATEGIES.get(strategy)
    if strategy in STREAMS:
        raise ConfigError(
            f"strategy={strategy!r} delays documents to later steps, so it plans a run, not one "
            f"step: simulate it (slimdata simulate), or plan its per-step variant {strategy}-ideal"
        )
    if fn is None:
        raise ConfigError(f"strategy={strategy!r}: use one of {', '.join(STRATEGIES)}")
    check_options(strategy, options)
    if strategy in OPTIONS_OF:
        plan = fn(batch, layout, seed, cost, step=step, validate=validate, options=options)
    else:
        plan = fn(batch, layout, seed, cost, step=step, validate=validate)
    # the recompute policy the plan's memory assumes: the runtime runs it (design §9)
    plan.meta["recompute"] = (cost if cost is not None else default_cost()).recompute
    if layout.cp > 1:  # the CP groups the plan's ranks stand for (hooks, SimConfig.for_plan)
        plan.meta["cp"] = layout.cp
    return plan

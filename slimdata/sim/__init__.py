"""Step-time simulator (design §7): a DAG of forward/backward pack tasks per pipeline chunk
and DP rank, evaluated by longest path with fixed per-device orders.

What a user calls::

    from slimdata.sim import SimConfig, compare_strategies, simulate_step, step_bound

    r = simulate_step(plan, cost, layout, SimConfig(parallelism="fsdp"))  # one plan, one step
    b = step_bound(batch, cost, dp=16, pp=4)  # the plan-independent bound of a batch
    cmp = compare_strategies(docs, layout, cost, strategies=["bfd", "slimpack"])  # `simulate`

The core has no CLI and no plotting; see :mod:`slimdata.sim.gantt` for the chart,
:mod:`slimdata.sim.fidelity` for checking predictions against measured pack times and
``slimdata simulate`` for the command. Modelling assumptions are stated in
:mod:`slimdata.sim.step`. The building blocks (the task graph, its evaluation, the memory
profile, the context-parallel model) are imported from their modules.
"""

from __future__ import annotations

from slimdata.sim.bound import StepBound, step_bound
from slimdata.sim.compare import Comparison, StrategyStats, compare_strategies, format_table
from slimdata.sim.config import SimConfig
from slimdata.sim.results import SimResult
from slimdata.sim.step import simulate_step

__all__ = [
    "Comparison",
    "SimConfig",
    "SimResult",
    "StepBound",
    "StrategyStats",
    "compare_strategies",
    "format_table",
    "simulate_step",
    "step_bound",
]

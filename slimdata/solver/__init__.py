"""Packing solver (design §6): per-step plans for a global batch on a training layout.

Public API::

    from slimdata.solver import Layout, SolveOptions, solve, STRATEGIES, make_batches
    plan = solve(batch, Layout(dp=64, memory_gib=60), "slimpack", seed=0)
    plan = solve(batch, layout, "slimpack", options=SolveOptions(skew_merge=False))
"""

from __future__ import annotations

from slimdata.solver.batches import OVERSIZE_POLICIES, apply_oversize, make_batches
from slimdata.solver.config import PlanConfig
from slimdata.solver.layout import Layout
from slimdata.solver.memory import plan_peak_memory
from slimdata.solver.options import SolveOptions
from slimdata.solver.registry import ALL_STRATEGIES, STRATEGIES, STREAMS, solve

__all__ = [
    "ALL_STRATEGIES",
    "OVERSIZE_POLICIES",
    "STRATEGIES",
    "STREAMS",
    "Layout",
    "PlanConfig",
    "SolveOptions",
    "apply_oversize",
    "make_batches",
    "plan_peak_memory",
    "solve",
]

"""Step-time simulator (design §7): a DAG of forward/backward pack tasks per pipeline chunk
and DP rank, evaluated by longest path with fixed per-device orders.

The core (this package) has no CLI and no plotting; see :mod:`slimdata.sim.gantt` for the
chart and ``slimdata simulate`` for the command. Modelling assumptions are stated in
:mod:`slimdata.sim.step`.
"""

from __future__ import annotations

from slimdata.execution.pricing import PackTimes, chunk_fractions, pack_times
from slimdata.execution.schedule import SCHEDULES, common_order, stage_ops
from slimdata.sim.bound import StepBound, batch_work, plan_work, step_bound
from slimdata.sim.config import PARALLELISMS, SCHEDULE_NAMES, SimConfig
from slimdata.sim.cp import CpPacks, cp_packs, cp_peak_memory
from slimdata.sim.dag import StepDag, build_dag
from slimdata.sim.engine import TaskGraph, Timing, evaluate
from slimdata.sim.memory import MemoryProfile, memory_profile
from slimdata.sim.results import GIB, SimResult, lower_bound
from slimdata.sim.step import simulate_step

__all__ = [
    "GIB",
    "PARALLELISMS",
    "SCHEDULES",
    "SCHEDULE_NAMES",
    "CpPacks",
    "MemoryProfile",
    "PackTimes",
    "SimConfig",
    "SimResult",
    "StepBound",
    "StepDag",
    "TaskGraph",
    "Timing",
    "batch_work",
    "build_dag",
    "chunk_fractions",
    "common_order",
    "cp_packs",
    "cp_peak_memory",
    "evaluate",
    "lower_bound",
    "memory_profile",
    "pack_times",
    "plan_work",
    "simulate_step",
    "stage_ops",
    "step_bound",
]

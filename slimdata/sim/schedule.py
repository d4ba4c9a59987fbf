"""Pipeline stage orders live in :mod:`slimdata.execution.schedule`; this name stays importable."""

from slimdata.execution.schedule import SCHEDULES, Op, common_order, ready_index, stage_ops

__all__ = ["SCHEDULES", "Op", "common_order", "ready_index", "stage_ops"]

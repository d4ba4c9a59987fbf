"""Plan types and their validation (design §3-4)."""

from __future__ import annotations

from slimdata.plan.rankplan import RankPlan, rank_views
from slimdata.plan.schedule import (
    LockstepSchedule,
    RankExecution,
    check_lockstep,
    execution,
    lockstep_schedule,
    split_calls,
)
from slimdata.plan.types import (
    Document,
    MergeGroup,
    MicroPack,
    RankStep,
    Slice,
    StepPlan,
    loss_token_count,
)
from slimdata.plan.validate import validate_plan

__all__ = [
    "Document",
    "LockstepSchedule",
    "MergeGroup",
    "MicroPack",
    "RankExecution",
    "RankPlan",
    "RankStep",
    "Slice",
    "StepPlan",
    "check_lockstep",
    "execution",
    "lockstep_schedule",
    "loss_token_count",
    "rank_views",
    "split_calls",
    "validate_plan",
]

"""Plan types and their validation (design §3-4)."""

from __future__ import annotations

from slimdata.plan.types import (
    Document,
    MergeGroup,
    MicroPack,
    RankStep,
    Slice,
    StepPlan,
    eager_order,
)
from slimdata.plan.validate import validate_plan

__all__ = [
    "Document",
    "MergeGroup",
    "MicroPack",
    "RankStep",
    "Slice",
    "StepPlan",
    "eager_order",
    "validate_plan",
]

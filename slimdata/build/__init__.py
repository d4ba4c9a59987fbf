"""`slimdata build`: corpus -> tokenized, sliced, cost-annotated MDS document shards.

Stages (:mod:`slimdata.build.stages`): read -> tokenize (batched) -> append EOS -> slice ->
annotate cost -> write. :mod:`~slimdata.build.task` runs them for one task into its own
sub-directory; :mod:`~slimdata.build.run` plans tasks, runs them on ``workers`` processes,
resumes interrupted builds and merges; :mod:`~slimdata.build.output` owns the directory.
"""

from __future__ import annotations

from slimdata.build.config import DEFAULT_SIZE_LIMIT, BuildConfig, parse_size
from slimdata.build.output import PLAN_NAME, SIDECAR_NAME
from slimdata.build.run import BuildSummary, build, plan_build
from slimdata.build.stages import COLUMNS, COST_COLUMNS
from slimdata.build.task import QUARANTINE_NAME

__all__ = [
    "COLUMNS",
    "COST_COLUMNS",
    "DEFAULT_SIZE_LIMIT",
    "PLAN_NAME",
    "QUARANTINE_NAME",
    "SIDECAR_NAME",
    "BuildConfig",
    "BuildSummary",
    "build",
    "parse_size",
    "plan_build",
]

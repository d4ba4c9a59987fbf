"""The corpus build behind `slimdata build` (package `slimdata.ingest`): corpus -> tokenized,
sliced, cost-annotated MDS document shards.

Stages (:mod:`slimdata.ingest.stages`): read -> tokenize (batched) -> append EOS -> slice ->
annotate cost -> write. :mod:`~slimdata.ingest.task` runs them for one task into its own
sub-directory; :mod:`~slimdata.ingest.run` plans tasks, runs them on ``workers`` processes,
resumes interrupted builds and merges; :mod:`~slimdata.ingest.output` owns the directory.
"""

from __future__ import annotations

from slimdata.columns import COLUMNS, COST_COLUMNS
from slimdata.ingest.config import DEFAULT_SIZE_LIMIT, BuildConfig, parse_size
from slimdata.ingest.output import PLAN_NAME, SIDECAR_NAME
from slimdata.ingest.run import BuildSummary, build, plan_build
from slimdata.ingest.task import QUARANTINE_NAME

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

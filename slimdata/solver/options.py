"""The tuning knobs of the strategies that have any, as one typed value.

``solve(..., options=SolveOptions(skew_merge=False))`` replaces loose keyword arguments: a
misspelt name fails where the value is built, and :func:`check_options` refuses a knob the
chosen strategy does not read (``SolveOptions(min_cp=2)`` with ``slimpack``). The defaults are
the tuned ones; a strategy without knobs takes the defaults.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from slimdata.errors import ConfigError
from slimdata.solver.refine import REFINE_SHARE

__all__ = ["DEFAULT_OPTIONS", "OPTIONS_OF", "SolveOptions", "check_options"]


@dataclass(frozen=True, kw_only=True)
class SolveOptions:
    """Strategy knobs of one solve (:data:`OPTIONS_OF` says which strategy reads which)."""

    merge_share: float = 1.0
    """slimpack: documents costlier than this fraction of the balanced per-rank time are
    merged (1.0: only those that cannot be balanced otherwise; large: none for cost)."""
    improve_rounds: int = 400
    """slimpack: moves of the local search after LPT (0 turns it off)."""
    milp_seconds: float = 0.0
    """slimpack: wall-time budget of the MILP refinement of phase 1 in seconds (0: off)."""
    refine_share: float = REFINE_SHARE
    """slimpack, free mode: slices costlier than this fraction of the balanced per-rank time
    are cut finer first (0 turns it off)."""
    skew_merge: bool = True
    """slimpack, free mode: also merge documents whose backward/forward skew would leave
    their rank unbalanced."""
    coarse_merge: bool = True
    """slimpack: where whole documents are too coarse for the ranks to balance, also try the
    costliest one on the slowest rank merged over two ranks (kept when the plan's estimate is
    lower)."""
    max_seqlen_per_rank: int | None = None
    """dcp: the most tokens of one sequence on one rank (None: what one device's memory
    holds, at most the pack token cap)."""
    min_cp: int = 1
    """dcp: the smallest context-parallel size of any sequence."""

    def __post_init__(self) -> None:
        for name in ("merge_share", "milp_seconds", "refine_share"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 0")
        if self.merge_share == 0:
            raise ConfigError("merge_share=0 would merge every document: give a share > 0")
        if self.improve_rounds < 0:
            raise ConfigError(f"improve_rounds={self.improve_rounds!r} must be >= 0 (0: off)")
        if self.max_seqlen_per_rank is not None and self.max_seqlen_per_rank < 1:
            raise ConfigError(
                f"max_seqlen_per_rank={self.max_seqlen_per_rank!r} must be >= 1 (or None)"
            )
        if self.min_cp < 1:
            raise ConfigError(f"min_cp={self.min_cp!r} must be >= 1")

    def forced_merges_only(self) -> SolveOptions:
        """These options with every merge that memory does not force turned off: no merge for
        cost (``merge_share`` infinite), skew or coarseness. What slimpack's plan is compared
        with to see whether those merges pay, and what a caller gives that runs every rank
        in one process (DP-Merge needs a process per rank)."""
        return dataclasses.replace(self, merge_share=math.inf, skew_merge=False, coarse_merge=False)

    def changed(self) -> tuple[str, ...]:
        """Names of the knobs set away from their defaults, in field order."""
        return tuple(f.name for f in dataclasses.fields(self) if getattr(self, f.name) != f.default)


DEFAULT_OPTIONS = SolveOptions()

OPTIONS_OF: dict[str, frozenset[str]] = {
    "slimpack": frozenset(
        {
            "merge_share",
            "improve_rounds",
            "milp_seconds",
            "refine_share",
            "skew_merge",
            "coarse_merge",
        }
    ),
    "dcp": frozenset({"max_seqlen_per_rank", "min_cp"}),
}
"""The knobs each strategy reads; a strategy not listed reads none."""


def check_options(strategy: str, options: SolveOptions) -> None:
    """Refuse knobs set away from their defaults that ``strategy`` does not read."""
    ignored = [n for n in options.changed() if n not in OPTIONS_OF.get(strategy, ())]
    if ignored:
        takes = ", ".join(sorted(OPTIONS_OF.get(strategy, ()))) or "none"
        raise ConfigError(
            f"strategy={strategy!r} does not read the option(s) {', '.join(ignored)} "
            f"(it reads: {takes}): leave them at their defaults or pick the strategy they tune"
        )

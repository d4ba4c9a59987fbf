"""The planning rules one training job uses, in one value that ``slimdata plan`` and the
runtime loaders share: layout (context, pack token cap, memory budget), global batch, oversize
policy, strategy, seed and cost model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slimdata.cost import CostModel
from slimdata.errors import ConfigError
from slimdata.plan.types import Document, StepPlan
from slimdata.solver.batches import OVERSIZE_POLICIES, apply_oversize, make_batches
from slimdata.solver.layout import Layout
from slimdata.solver.options import DEFAULT_OPTIONS, SolveOptions
from slimdata.solver.registry import STRATEGIES, solve

__all__ = ["PlanConfig"]


@dataclass(frozen=True, kw_only=True)
class PlanConfig:
    """How an epoch is cut into global batches and every batch is planned."""

    layout: Layout
    """The training layout: ``dp`` ranks, ``context``, ``pack_tokens`` cap, ``memory_gib``."""
    global_batch_tokens: int
    """Token budget of one global batch (one optimizer step)."""
    strategy: str = "slimpack"
    """Solver strategy (``slimdata.solver.STRATEGIES``)."""
    seed: int = 0
    """Shuffle and solver seed; epoch ``e`` shuffles with ``seed + e``."""
    oversize: str = "split"
    """Documents longer than ``layout.context``: ``split`` into independent pieces (the
    default of ``slimdata plan`` and ``simulate`` too), ``truncate`` to the context, or
    ``error``."""
    cost: CostModel | None = None
    """Cost model for the solver (None: the solver's default)."""

    def __post_init__(self) -> None:
        if self.global_batch_tokens < 1:
            raise ConfigError(f"global_batch_tokens={self.global_batch_tokens!r} must be >= 1")
        if self.oversize not in OVERSIZE_POLICIES:
            raise ConfigError(
                f"oversize={self.oversize!r}: use one of {', '.join(OVERSIZE_POLICIES)}"
            )
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy={self.strategy!r}: use one of {', '.join(STRATEGIES)}")

    def batches(self, docs: Sequence[Document], epoch: int = 0) -> list[list[Document]]:
        """The global batches of ``epoch``: the oversize rule against ``layout.context``,
        then a shuffle seeded by ``seed + epoch`` and batches of <= ``global_batch_tokens``."""
        docs = apply_oversize(docs, self.layout.context, self.oversize)
        return make_batches(docs, self.global_batch_tokens, self.seed + epoch)

    def solve(
        self,
        batch: Sequence[Document],
        step: int = 0,
        *,
        options: SolveOptions = DEFAULT_OPTIONS,
        validate: bool = True,
    ) -> StepPlan:
        """The plan of one global batch (deterministic for ``seed``); ``options`` and
        ``validate`` as in :func:`~slimdata.solver.solve`."""
        return solve(
            batch,
            self.layout,
            self.strategy,
            self.seed,
            self.cost,
            step=step,
            validate=validate,
            options=options,
        )

"""Lifecycle callbacks of the step executor (design §9): per-pack times, throughput, balance.

A callback is a dataclass with one no-op method per lifecycle point; override the ones you
need. The executor calls them in list order on the rank that runs :func:`run_step`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import torch.distributed as dist

from slimdata.plan import RankPlan

__all__ = ["BalanceMeter", "Callback", "PackEvent", "PackTimeRecorder", "StepSummary"]


@dataclass(frozen=True)
class PackEvent:
    """One executed pack pass. ``seconds`` is wall time (device-synchronized on GPU)."""

    step: int
    rank: int
    pass_: str
    """``F`` or ``B``; a recomputed backward pack counts its recomputed forward in ``B``."""
    pack: int
    seconds: float
    tokens: int
    predicted: float = 0.0
    """The plan's predicted seconds for this pack (``MicroPack.cost``: in a solved plan the
    execution model's price of the pass on one device, :func:`slimdata.execution.pack_prices`)."""
    recomputed: bool = False
    """``B``: the pack re-ran its forward (it is not a union of forward packs). ``F``: the
    pack ran without an autograd graph because its backward recomputes it."""
    calls: int = 1
    """Model calls the pass made: ``F`` split into one call per backward pack its slices go to
    (``run_step(asymmetric="split")``), ``B`` one backward per kept graph it runs through."""

    def record(self) -> dict:
        """The JSON-lines record the simulator's fidelity report reads."""
        return {
            "step": self.step,
            "rank": self.rank,
            "pass": self.pass_,
            "pack": self.pack,
            "seconds": self.seconds,
            "tokens": self.tokens,
        }


@dataclass(frozen=True)
class StepSummary:
    """One rank's step."""

    step: int
    rank: int
    loss: float
    """This rank's share of the step loss (sum over ranks = the batch loss)."""
    tokens: int
    seconds: float
    """Wall time of run_step on this rank (packs, merges, gradient reduction)."""
    busy_seconds: float
    """Sum of pack times (forward + backward)."""
    events: tuple[PackEvent, ...] = ()


@dataclass
class Callback:
    """Base: every method is a no-op."""

    def on_step_start(self, plan: RankPlan, rank: int) -> None:
        """Fires in ``run_step`` before the first pack, after tokens and merge groups are ready;
        ``plan`` is this rank's view of the step's plan (:meth:`StepPlan.rank_view`)."""

    def on_pack_end(self, event: PackEvent) -> None:
        """Fires after each forward pack and each backward pack (recomputation included)."""

    def on_step_end(self, summary: StepSummary) -> None:
        """Fires after the last pack and the gradient reduction, before ``run_step`` returns."""


@dataclass
class PackTimeRecorder(Callback):
    """Appends one JSON line per pack pass: ``{step, rank, pass, pack, seconds, tokens}``."""

    path: str | Path
    skip_steps: int = 0
    """Steps to leave out at the start (warm-up)."""
    _fh: IO[str] | None = field(default=None, repr=False)

    def on_pack_end(self, event: PackEvent) -> None:
        if event.step < self.skip_steps:
            return
        if self._fh is None:
            self._fh = open(self.path, "a")  # noqa: SIM115 - closed in close()
        self._fh.write(json.dumps(event.record()) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


@dataclass
class BalanceMeter(Callback):
    """Tokens/s and balance per step. With torch.distributed initialized, ``on_step_end`` is a
    collective (``all_gather_object`` of busy times), so install it on every rank.

    ``imbalance = max(busy) * n / sum(busy)`` (1.0 = perfectly balanced).
    """

    history: list[dict] = field(default_factory=list)

    def on_step_end(self, summary: StepSummary) -> None:
        mine = (summary.busy_seconds, summary.tokens, summary.seconds)
        if dist.is_available() and dist.is_initialized():
            all_: list = [None] * dist.get_world_size()
            dist.all_gather_object(all_, mine)
        else:
            all_ = [mine]
        busy = [a[0] for a in all_]
        wall = max(a[2] for a in all_)
        tokens = sum(a[1] for a in all_)
        self.history.append(
            {
                "step": summary.step,
                "tokens": tokens,
                "seconds": wall,
                "tokens_per_s": tokens / wall if wall > 0 else 0.0,
                "busy": busy,
                "imbalance": max(busy) * len(busy) / sum(busy) if sum(busy) > 0 else 1.0,
            }
        )

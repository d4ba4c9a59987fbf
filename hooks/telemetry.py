"""Per-step telemetry a training run reports: the global loss, throughput, predicted against
measured step time per rank, imbalance, waiting share and peak memory; a progress line and an
optional JSON-lines log (``slimdata.plots.write_training_plots`` turns it into PNGs).

Definitions (every rank's numbers are gathered, so all ranks agree):

- ``loss``: the step loss of the unpacked batch (sum of the ranks' shares);
- ``predicted``/``measured``: per rank, the plan's predicted seconds (sum of its packs'
  ``MicroPack.cost``, forward and backward: in a solved plan the execution model's price of
  each pass on one device, :func:`slimdata.execution.pack_prices`) and the measured busy
  seconds (sum of pack times);
- ``imbalance``: ``max(measured) * n / sum(measured)`` (1.0 = balanced);
- ``wait_share``: ``1 - sum(measured) / (n * max(measured))``, the share of rank-time spent
  waiting for the slowest rank (the time a padded batch would spend on padding);
- ``peak_mem_bytes``: per rank, the device's peak allocated bytes in the step on CUDA
  (``torch.cuda.max_memory_allocated``, reset every step), else the process's peak resident
  set so far (``ru_maxrss``).
"""

from __future__ import annotations

import json
import resource
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import torch
import torch.distributed as dist
from slimdata.hooks.callbacks import Callback, StepSummary

from slimdata.plan import RankPlan

__all__ = ["StepTelemetry"]


def _peak_bytes() -> int:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.max_memory_allocated())
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(kib) * 1024


@dataclass
class StepTelemetry(Callback):
    """Gathers every rank's step (a collective: install it on every rank) and reports it."""

    log: str | Path | None = None
    """Rank 0 appends one JSON line per step here (None: no log)."""
    progress: IO[str] | None = field(default_factory=lambda: sys.stderr)
    """Rank 0 writes a one-line summary per step here (None: quiet)."""
    history: list[dict] = field(default_factory=list)
    _predicted: float = 0.0

    def on_step_start(self, plan: RankPlan, rank: int) -> None:
        rs = plan.ranks[rank]
        self._predicted = sum(p.cost for p in (*rs.forward, *rs.backward))
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()

    def on_step_end(self, summary: StepSummary) -> None:
        mine = (
            summary.loss,
            summary.tokens,
            summary.seconds,
            summary.busy_seconds,
            self._predicted,
            _peak_bytes(),
        )
        if dist.is_available() and dist.is_initialized():
            every: list = [None] * dist.get_world_size()
            dist.all_gather_object(every, mine)
            first = dist.get_rank() == 0
        else:
            every, first = [mine], True
        record = _record(summary.step, every)
        self.history.append(record)
        if first:
            self._report(record)

    def _report(self, r: dict) -> None:
        if self.log is not None:
            with open(self.log, "a") as fh:
                fh.write(json.dumps(r) + "\n")
        if self.progress is not None:
            self.progress.write(
                f"step {r['step']:>5}  loss {r['loss']:.4f}  {r['tokens_per_s']:,.0f} tok/s  "
                f"step {r['seconds']:.2f}s  imbalance {r['imbalance']:.3f}  "
                f"wait {100 * r['wait_share']:.1f}%  "
                f"peak {max(r['peak_mem_bytes']) / 2**30:.2f} GiB\n"
            )
            self.progress.flush()


def _record(step: int, every: list) -> dict:
    """One step's JSON record from the ranks' ``(loss, tokens, seconds, busy, predicted,
    peak)`` tuples."""
    loss, tokens, seconds, busy, predicted, peak = (list(c) for c in zip(*every, strict=True))
    wall, n, top = max(seconds), len(busy), max(busy)
    return {
        "step": step,
        "loss": sum(loss),
        "tokens": sum(tokens),
        "seconds": wall,
        "tokens_per_s": sum(tokens) / wall if wall > 0 else 0.0,
        "predicted": predicted,
        "measured": busy,
        "imbalance": top * n / sum(busy) if sum(busy) > 0 else 1.0,
        "wait_share": 1 - sum(busy) / (n * top) if top > 0 else 0.0,
        "peak_mem_bytes": peak,
    }

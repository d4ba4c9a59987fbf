"""Fidelity hook: compare the simulator with per-pack times measured by the runtime.

Measured-times format (written by the runtime's executor; JSON Lines, one object per line, or
one JSON list of the same objects)::

    {"step": 0, "rank": 3, "pass": "F", "pack": 1, "seconds": 0.412}
    {"step": 0, "rank": 3, "pass": "B", "pack": 0, "seconds": 0.957, "stage": 0}
    {"step": 0, "rank": 0, "pass": "step", "seconds": 7.31}

- ``pass``: ``F`` or ``B`` for one pack (``pack`` indexes ``RankStep.forward`` /
  ``RankStep.backward``), or ``step`` for the measured wall time of the whole step (``rank``
  and ``pack`` ignored; the largest ``step`` record of a step counts).
- ``stage``: the model chunk the time covers (default 0; with pipeline parallelism the
  chunk a device ran); ``seconds``: wall time of that pack's compute on that device.

The report gives the mean absolute percentage error (MAPE) of the predicted pack times (the
execution model's :attr:`~slimdata.execution.Compute.seconds`, what the simulator's tasks
take) and, per step, the simulated step time (predicted pack times) against the measured
step time when present, and against a replay of the plan with the measured pack times
substituted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from slimdata.cost import CostModel
from slimdata.errors import InputError
from slimdata.execution import ExecutionConfig, build_programs
from slimdata.plan import StepPlan
from slimdata.sim.config import SimConfig
from slimdata.sim.dag import Durations
from slimdata.sim.step import simulate_step
from slimdata.solver.layout import Layout

__all__ = ["FidelityReport", "MeasuredTime", "fidelity_report", "load_measured_times"]


@dataclass(frozen=True)
class MeasuredTime:
    step: int
    rank: int
    kind: str
    """``F``, ``B`` or ``step``."""
    pack: int
    seconds: float
    stage: int = 0


def load_measured_times(path: str | Path) -> list[MeasuredTime]:
    """Read measured times (JSON Lines or a JSON list); raise :class:`InputError` naming the bad record."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"cannot read measured times {path}: {exc}") from exc
    try:
        rows = (
            json.loads(text)
            if text.lstrip().startswith("[")
            else [json.loads(line) for line in text.splitlines() if line.strip()]
        )
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: invalid JSON: {exc}") from exc
    out = []
    for k, row in enumerate(rows, 1):
        try:
            kind = str(row["pass"])
            if kind not in ("F", "B", "step"):
                raise ValueError(f"pass={kind!r} must be F, B or step")
            sec = float(row["seconds"])
            if not np.isfinite(sec) or sec < 0:
                raise ValueError(f"seconds={sec} must be finite and >= 0")
            out.append(
                MeasuredTime(
                    int(row["step"]),
                    int(row.get("rank", -1)),
                    kind,
                    int(row.get("pack", -1)),
                    sec,
                    int(row.get("stage", 0)),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{path}: record {k} ({row!r}) is invalid: {exc}") from exc
    return out


@dataclass(frozen=True)
class FidelityReport:
    packs: int
    """Pack times compared."""
    pack_mape: float
    """Mean absolute percentage error of predicted vs measured pack times."""
    steps: list[dict[str, float]] = field(default_factory=list)
    """Per step: ``simulated``, ``replayed`` (measured pack times) and ``measured`` (if recorded)."""

    @property
    def step_error(self) -> float:
        """Mean relative error of the simulated step time vs the measured one (or the replay)."""
        errs = [
            abs(s["simulated"] - s.get("measured", s["replayed"]))
            / s.get("measured", s["replayed"])
            for s in self.steps
            if s.get("measured", s["replayed"]) > 0
        ]
        return float(np.mean(errs)) if errs else float("nan")

    def to_dict(self) -> dict:
        return {
            "packs": self.packs,
            "pack_mape": self.pack_mape,
            "step_error": self.step_error,
            "steps": self.steps,
        }


def fidelity_report(
    plans: Mapping[int, StepPlan] | Sequence[StepPlan],
    cost: CostModel,
    layout: Layout,
    measured: Sequence[MeasuredTime],
    config: SimConfig | None = None,
) -> FidelityReport:
    """Compare the simulator's predictions for ``plans`` (by step) with ``measured`` times."""
    by_step = plans if isinstance(plans, Mapping) else {p.step: p for p in plans}
    config = config or SimConfig()
    errors: list[float] = []
    steps = []
    for step, plan in sorted(by_step.items()):
        predicted = _predicted(plan, cost, config.for_plan(plan).execution(layout.pp))
        durations: Durations = {}
        wall = None
        for m in measured:
            if m.step != step:
                continue
            if m.kind == "step":
                wall = max(wall or 0.0, m.seconds)
                continue
            key = (m.stage, m.rank, m.kind, m.pack)
            if key not in predicted or m.pack >= _n_packs(plan, m.rank, m.kind):
                raise InputError(
                    f"measured time {m} names a pack or stage the plan of step {step} does not have"
                )
            durations[key] = m.seconds
            if m.seconds > 0:
                errors.append(abs(predicted[key] - m.seconds) / m.seconds)
        row = {
            "step": float(step),
            "simulated": simulate_step(plan, cost, layout, config).step_time,
            "replayed": simulate_step(plan, cost, layout, config, durations=durations).step_time,
        }
        if wall is not None:
            row["measured"] = wall
        steps.append(row)
    return FidelityReport(
        packs=len(errors), pack_mape=float(np.mean(errors)) if errors else float("nan"), steps=steps
    )


def _n_packs(plan: StepPlan, rank: int, kind: str) -> int:
    rs = plan.ranks[rank]
    return len(rs.forward if kind == "F" else rs.backward)


def _predicted(plan: StepPlan, cost: CostModel, config: ExecutionConfig) -> Durations:
    """``(chunk, rank, pass, pack) -> seconds`` the execution model prices every compute of
    ``plan`` at (:attr:`~slimdata.execution.Compute.seconds`: a static-CP member's share,
    merged slices' chunk efficiency, the chunk's share of the layers), what the simulator's
    tasks take."""
    programs = build_programs(plan, cost, config, compute_only=True)
    return {
        (op.chunk, prog.rank, op.pass_, op.pack): op.seconds
        for prog in programs
        for op in prog.computes()
    }

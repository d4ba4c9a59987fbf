"""Compare packing strategies on the same batches: what ``slimdata simulate`` runs.

Fairness: every strategy sees the same documents in the same steps (one
:func:`~slimdata.solver.make_batches` call, one seed, one oversize policy applied before
batching) and is judged by the same cost model and simulator; every strategy, ``concat``
included, masks attention at document boundaries (pack times count only within-document
pairs). The solver is imported lazily, so the simulator core does not depend on it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from slimdata.cost import CostModel
from slimdata.errors import ConfigError, PlanError
from slimdata.plan import Document, StepPlan
from slimdata.sim.config import SimConfig
from slimdata.sim.results import SimResult
from slimdata.sim.step import simulate_step
from slimdata.solver.layout import Layout

__all__ = ["Comparison", "StrategyStats", "compare_strategies", "format_table", "parse_strategies"]

REFERENCE = "concat"


@dataclass(frozen=True)
class StrategyStats:
    """Means over the simulated steps of one strategy."""

    step_time: float
    lower_bound: float
    imbalance: float
    bubble: float
    peak_memory_gib: float
    solve_ms: float
    comm_time: float
    over_memory_steps: int
    steps: int
    error: str = ""
    """Why the strategy could not plan (then the numbers are NaN)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in (
            "step_time",
            "lower_bound",
            "imbalance",
            "bubble",
            "peak_memory_gib",
            "solve_ms",
            "comm_time",
            "over_memory_steps",
            "steps",
        ):
            x = getattr(self, k)
            out[k] = None if isinstance(x, float) and not np.isfinite(x) else x  # JSON has no NaN
        if self.error:
            out["error"] = self.error
        return out


@dataclass(frozen=True)
class Comparison:
    config: dict[str, Any]
    results: dict[str, StrategyStats]
    first: dict[str, tuple[StepPlan, SimResult]] = field(default_factory=dict, repr=False)
    """The first step of every strategy, for the Gantt chart."""

    def speedups(self) -> dict[str, tuple[float, float]]:
        """``strategy -> (speedup vs concat, speedup vs the best other strategy)``.

        ``concat-nomask`` (if present) is never a reference."""
        t = {k: v.step_time for k, v in self.results.items() if np.isfinite(v.step_time)}
        out = {}
        for k, v in t.items():
            ref = t.get(REFERENCE, float("nan"))
            others = [x for name, x in t.items() if name not in (k, "concat-nomask")]
            best = min(others) if others else float("nan")
            out[k] = (ref / v, best / v)
        return out

    def to_dict(self) -> dict[str, Any]:
        sp = self.speedups()
        res = {}
        for k, v in self.results.items():
            d = v.to_dict()
            if k in sp:
                d["speedup_vs_concat"], d["speedup_vs_best_other"] = sp[k]
            res[k] = d
        return {"config": self.config, "results": res}


def parse_strategies(spec: str, known: Sequence[str]) -> list[str]:
    """``"all"`` or a comma list of registry names, in the given order."""
    if spec.strip() == "all":
        return list(known)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [s for s in names if s not in known]
    if bad or not names:
        raise ConfigError(
            f"--strategies {spec!r}: unknown {bad}; use 'all' or a comma list of {', '.join(known)}"
        )
    return names


def compare_strategies(
    docs: Sequence[Document],
    layout: Layout,
    cost: CostModel,
    *,
    strategies: Sequence[str],
    steps: int = 1,
    seed: int = 0,
    global_batch_tokens: int | None = None,
    config: SimConfig | None = None,
    oversize: str = "split",
) -> Comparison:
    """Solve and simulate ``steps`` batches with every strategy; means per strategy.

    ``global_batch_tokens`` defaults to ``dp * context`` (one context-long row per rank).
    """
    from slimdata.solver import apply_oversize, make_batches, solve

    if steps < 1:
        raise ConfigError(f"steps={steps!r} must be >= 1")
    config = config or SimConfig()
    gbt = global_batch_tokens or layout.dp * layout.context
    batches = make_batches(apply_oversize(docs, layout.context, oversize), gbt, seed)
    if not batches:
        raise ConfigError("no documents to simulate")
    batches = [batches[s % len(batches)] for s in range(steps)]
    results: dict[str, StrategyStats] = {}
    first: dict[str, tuple[StepPlan, SimResult]] = {}
    for name in strategies:
        rows, err = [], ""
        for step, batch in enumerate(batches):
            t0 = time.perf_counter()
            try:
                plan = solve(batch, layout, name, seed, cost, step=step)
            except PlanError as exc:
                err = str(exc)
                break
            solve_ms = (time.perf_counter() - t0) * 1e3
            r = simulate_step(plan, cost, layout, config)
            if step == 0:
                first[name] = (plan, r)
            rows.append(
                (
                    r.step_time,
                    r.lower_bound,
                    r.imbalance,
                    r.bubble,
                    r.peak_memory_gib,
                    solve_ms,
                    r.comm_time,
                    r.over_memory,
                )
            )
        if err:
            nan = float("nan")
            results[name] = StrategyStats(nan, nan, nan, nan, nan, nan, nan, 0, 0, error=err)
            first.pop(name, None)
            continue
        a = np.array(rows, dtype=np.float64)
        m = a.mean(axis=0)
        results[name] = StrategyStats(
            *(float(x) for x in m[:7]), over_memory_steps=int(a[:, 7].sum()), steps=len(rows)
        )
    cfg = {
        "dp": layout.dp,
        "pp": layout.pp,
        "context": layout.context,
        "memory_gib": layout.memory_gib,
        "ranks_per_node": layout.ranks_per_node,
        "mode": layout.mode,
        "global_batch_tokens": gbt,
        "steps": steps,
        "seed": seed,
        "oversize": oversize,
        "documents": len(docs),
        "cost_model": cost.label or cost.source,
        "parallelism": config.parallelism,
        "schedule": config.schedule,
        "strategies": list(strategies),
    }
    return Comparison(config=cfg, results=results, first=first)


def format_table(cmp: Comparison) -> str:
    """A fixed-width comparison table, one row per strategy."""
    sp = cmp.speedups()
    head = f"{'strategy':<14}{'step s':>10}{'bound s':>10}{'eff':>7}{'imbal':>8}{'bubble':>8}{'mem GiB':>9}{'solve ms':>10}{'vs concat':>11}{'vs best':>9}"
    lines = [head, "-" * len(head)]
    for name, r in cmp.results.items():
        if r.error:
            lines.append(f"{name:<14}  failed: {r.error}")
            continue
        vc, vb = sp.get(name, (float("nan"), float("nan")))
        mem = f"{r.peak_memory_gib:.1f}" + ("!" if r.over_memory_steps else "")
        lines.append(
            f"{name:<14}{r.step_time:>10.3f}{r.lower_bound:>10.3f}{r.lower_bound / r.step_time:>7.2f}{r.imbalance:>8.3f}{r.bubble:>8.3f}{mem:>9}{r.solve_ms:>10.1f}{vc:>10.2f}x{vb:>8.2f}x"
        )
    if any(r.over_memory_steps for r in cmp.results.values()):
        lines.append(f"! peak memory above --memory-gib {cmp.config['memory_gib']} in some steps")
    return "\n".join(lines)

"""Compare packing strategies on the same batches: what ``slimdata simulate`` runs.

Fairness:

- every strategy sees the same documents in the same steps (one
  :func:`~slimdata.solver.make_batches` call, one seed, one oversize policy applied before
  batching) and is judged by the same cost model and simulator;
- every strategy, ``concat`` included, masks attention at document boundaries (pack times
  count only within-document pairs);
- **every strategy respects the memory cap** (``Layout.memory_gib``). The baselines do not
  enforce memory themselves, so a baseline whose plan does not fit (its simulated per-device
  peak memory, :attr:`SimResult.peak_memory`, in any step) is run the way a
  Megatron-style job runs rows that do not fit: with **static context parallelism** of the
  smallest power of two ``k`` that fits, for the whole job: it is re-planned for ``dp / k``
  DP groups and simulated with ``SimConfig.cp = k`` (:mod:`slimdata.sim.cp`). If even
  ``k = dp`` does not fit, it is reported as failed with the reason. ``slimpack`` always
  runs with ``cp = 1`` (its DP-Merge handles the documents that do not fit one rank) and
  must fit by itself: the solver plans within the cap; a simulated peak above it is
  reported (``over_memory_steps``, ``!`` in the table), a plan it cannot make as failed.

The solver is imported lazily, so the simulator core does not depend on it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from slimdata.cost import CostModel
from slimdata.errors import ConfigError, PlanError
from slimdata.plan import Document, StepPlan
from slimdata.sim.config import SimConfig
from slimdata.sim.cp import cp_peak_memory
from slimdata.sim.results import SimResult
from slimdata.sim.step import simulate_step
from slimdata.solver.layout import Layout

__all__ = [
    "CP_FREE",
    "Comparison",
    "StrategyStats",
    "compare_strategies",
    "cp_sizes",
    "format_table",
    "parse_strategies",
]

REFERENCE = "concat"
CP_FREE: tuple[str, ...] = ("slimpack",)
"""Strategies that handle memory themselves (DP-Merge) and always run with ``cp = 1``."""
GIB = float(1 << 30)


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
    cp: int = 1
    """Static context-parallel size it ran with (0 when it failed)."""
    plan_memory_gib: float = float("nan")
    """Per-device peak by the solver's rule under ``cp`` (:func:`~slimdata.sim.cp.cp_peak_memory`,
    max over steps), for comparison with the simulated ``peak_memory_gib`` the fit test uses."""

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
            "cp",
            "plan_memory_gib",
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
    from slimdata.solver import PlanConfig, solve

    if steps < 1:
        raise ConfigError(f"steps={steps!r} must be >= 1")
    config = config or SimConfig()
    gbt = layout.dp * layout.context if global_batch_tokens is None else global_batch_tokens
    if gbt < 1:
        raise ConfigError(f"global_batch_tokens={gbt!r} must be >= 1")
    rules = PlanConfig(layout=layout, global_batch_tokens=gbt, seed=seed, oversize=oversize)
    batches = rules.batches(docs)  # the rules `slimdata plan` and the loaders apply
    if not batches:
        raise ConfigError("no documents to simulate")
    batches = [batches[s % len(batches)] for s in range(steps)]
    results: dict[str, StrategyStats] = {}
    first: dict[str, tuple[StepPlan, SimResult]] = {}
    nan = float("nan")
    for name in strategies:
        sizes = [1] if name in CP_FREE else cp_sizes(layout.dp)
        fit = _fit(name, batches, layout, cost, seed, sizes, solve, config)
        plans, sims, solve_ms, k, err = fit
        if err:
            results[name] = StrategyStats(nan, nan, nan, nan, nan, nan, nan, 0, 0, error=err, cp=0)
            continue
        rows = []
        for step, (plan, r, ms) in enumerate(zip(plans, sims, solve_ms, strict=True)):
            if step == 0:
                first[name] = (plan, r)
            rows.append(
                (
                    r.step_time,
                    r.lower_bound,
                    r.imbalance,
                    r.bubble,
                    r.peak_memory_gib,
                    ms,
                    r.comm_time,
                    r.over_memory,
                )
            )
        a = np.array(rows, dtype=np.float64)
        m = a.mean(axis=0)
        step_t, bound, imbal, bubble, mem, ms, comm = (float(x) for x in m[:7])
        results[name] = StrategyStats(
            step_time=step_t,
            lower_bound=bound,
            imbalance=imbal,
            bubble=bubble,
            peak_memory_gib=mem,
            solve_ms=ms,
            comm_time=comm,
            over_memory_steps=int(a[:, 7].sum()),
            steps=len(rows),
            cp=k,
            plan_memory_gib=max(float(cp_peak_memory(p, cost, k).max()) for p in plans) / GIB,
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
        "cp_overlap": config.cp_overlap,
        "memory_rule": "baselines over --memory-gib run static CP (smallest power of two that "
        "fits, re-planned for dp/cp DP groups); slimpack runs cp=1 and must fit",
    }
    return Comparison(config=cfg, results=results, first=first)


def cp_sizes(dp: int) -> list[int]:
    """Static CP sizes a ``dp``-device stage can run: powers of two dividing ``dp``."""
    out, k = [], 1
    while k <= dp and dp % k == 0:
        out.append(k)
        k *= 2
    return out


def _fit(
    name: str,
    batches: Sequence[Sequence[Document]],
    layout: Layout,
    cost: CostModel,
    seed: int,
    sizes: Sequence[int],
    solve: Any,
    config: SimConfig,
) -> tuple[list[StepPlan], list[SimResult], list[float], int, str]:
    """Plans and simulations of every step at the smallest CP size in ``sizes`` whose
    simulated per-device peak memory fits the cap in every step.

    Returns ``(plans, results, solve_ms, cp, error)``; ``error`` is empty on success. A
    strategy of :data:`CP_FREE` (one size, ``1``) is returned even over the cap: its
    ``SimResult.over_memory`` reports it.
    """
    cap = layout.memory_bytes
    err, peak = "", 0.0
    for k in sizes:
        lay_k = dataclasses.replace(
            layout, dp=layout.dp // k, ranks_per_node=max(1, layout.ranks_per_node // k)
        )
        cfg_k = dataclasses.replace(config, cp=k)
        plans, sims, times, peak = [], [], [], 0.0
        try:
            for step, batch in enumerate(batches):
                t0 = time.perf_counter()
                plan = solve(batch, lay_k, name, seed, cost, step=step)
                times.append((time.perf_counter() - t0) * 1e3)
                r = simulate_step(plan, cost, layout, cfg_k)
                peak = max(peak, float(r.peak_memory.max()))
                plans.append(plan)
                sims.append(r)
                if peak > cap and name not in CP_FREE:
                    break
        except PlanError as exc:
            err = str(exc)
            continue
        if peak <= cap or name in CP_FREE:
            return plans, sims, times, k, ""
        err = ""
    if err:
        return [], [], [], 0, err
    why = (
        f"does not fit --memory-gib {layout.memory_gib:g} even with static CP {sizes[-1]} "
        f"(needs {peak / GIB:.1f} GiB per device)"
    )
    return [], [], [], 0, why


def format_table(cmp: Comparison) -> str:
    """A fixed-width comparison table, one row per strategy."""
    sp = cmp.speedups()
    head = f"{'strategy':<14}{'cp':>3}{'step s':>10}{'bound s':>10}{'eff':>7}{'imbal':>8}{'bubble':>8}{'mem GiB':>9}{'solve ms':>10}{'vs concat':>11}{'vs best':>9}"
    lines = [head, "-" * len(head)]
    for name, r in cmp.results.items():
        if r.error:
            lines.append(f"{name:<14}  failed: {r.error}")
            continue
        vc, vb = sp.get(name, (float("nan"), float("nan")))
        mem = f"{r.peak_memory_gib:.1f}" + ("!" if r.over_memory_steps else "")
        lines.append(
            f"{name:<14}{r.cp:>3}{r.step_time:>10.3f}{r.lower_bound:>10.3f}{r.lower_bound / r.step_time:>7.2f}{r.imbalance:>8.3f}{r.bubble:>8.3f}{mem:>9}{r.solve_ms:>10.1f}{vc:>10.2f}x{vb:>8.2f}x"
        )
    if any(r.over_memory_steps for r in cmp.results.values()):
        lines.append(f"! peak memory above --memory-gib {cmp.config['memory_gib']} in some steps")
    if any(r.cp > 1 for r in cmp.results.values()):
        lines.append(
            "cp: static context parallelism a baseline needs to fit --memory-gib "
            "(re-planned for dp/cp DP groups); slimpack always runs cp=1 (DP-Merge)"
        )
    return "\n".join(lines)

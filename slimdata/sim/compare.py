"""Compare packing strategies on the same batches: what ``slimdata simulate`` runs.

Fairness (design §7):

- every strategy sees the same documents in the same steps (one
  :func:`~slimdata.solver.make_batches` call, one seed, one oversize policy applied before
  batching) and is judged by the same cost model and simulator; every strategy, ``concat``
  included, masks attention at document boundaries. A *stream* strategy (``wlb``, whose
  outlier queues delay documents to later steps) trains the same documents over the run and
  then flushes what still waits in extra iterations, simulated and counted: every strategy's
  ``step_time`` is its run's total time over the number of steps, so speedups compare
  throughput over the same work;
- **every baseline runs at its best configuration** (:mod:`slimdata.sim.search`): static CP
  size (CP ranks taken out of DP, re-planned for ``dp / cp`` DP groups), hence micro-batches
  per pipeline, and the pipeline schedule, within the memory cap (``Layout.memory_gib``) in
  every step. ``--baseline-config smallest`` gives the smallest CP that fits instead,
  ``cp=N`` a fixed size. ``slimpack`` goes through the same search (slimpack on top of static
  CP: its DP-Merge groups then span CP groups); strategies of :data:`CP_FREE` (``dcp``:
  per-sequence CP) run ``cp = 1`` and place long documents themselves, with ``best`` at the
  fastest of their longest sequence per rank (:func:`cp_free_rows`); a simulated peak above
  the cap is reported (``over_memory_steps``, ``!`` in the table);
- **same work**: every result states the tokens and causal attention pairs its plans compute
  (:func:`~slimdata.sim.bound.plan_work`); a strategy that cuts documents (``concat``)
  computes fewer pairs and is marked ``same_work = False``. Speedups "vs best" are against
  the fastest *other same-work* strategy; the speedup vs ``concat`` is shown beside it;
- **one yardstick**: the plan-independent bound (:mod:`slimdata.sim.bound`) of every batch,
  reported with ``step_time / bound`` for every strategy;
- the **Megatron default** reference (concat, smallest static CP that fits, 1F1B, as the
  SlimPack paper compares) is run too, and every result carries its speedup over it.

The solver is imported lazily, so the simulator core does not depend on it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from slimdata.cost import CostModel
from slimdata.cost.states import GIVEN, budget_text
from slimdata.errors import ConfigError
from slimdata.plan import Document, StepPlan
from slimdata.sim.bound import batch_work, plan_work, step_bound
from slimdata.sim.config import SimConfig
from slimdata.sim.results import SimResult
from slimdata.sim.search import (
    MIN_ROW,
    BaselineConfig,
    Evaluator,
    Run,
    Setup,
    cp_sizes,
    first_screens,
    parse_baseline_config,
    search,
)
from slimdata.solver.batches import batch_warnings
from slimdata.solver.layout import Layout

__all__ = [
    "CP_FREE",
    "Comparison",
    "StrategyStats",
    "compare_strategies",
    "cp_free_rows",
    "cp_sizes",
    "format_table",
    "parse_strategies",
]

REFERENCE = "concat"
CP_FREE: tuple[str, ...] = ("dcp",)
"""Strategies that choose context parallelism per sequence themselves: ``cp = 1``."""
CP_FREE_LONGER = (2, 4)
"""With ``best``, a CP-free strategy also runs with rows of these multiples of the token cap
(:func:`cp_free_rows`), as the token-packing baselines do."""


def cp_free_rows(cap: int) -> list[int]:
    """The rows a CP-free strategy runs with under ``best`` (0: the token cap ``cap``): the cap,
    its half, quarter, ... down to :data:`~slimdata.sim.search.MIN_ROW` tokens, then
    :data:`CP_FREE_LONGER` times it. ``dcp``'s ``max_seqlen_per_rank`` is at most the row: the
    knob a Megatron user tunes, so that long sequences spread over CP groups instead of one
    rank carrying them, or short ones pack into longer micro-batches.
    ``cp_free_rows(32768) == [0, 16384, 8192, 4096, 65536, 131072]``."""
    rows = [0]
    row = cap // 2
    while row >= MIN_ROW:
        rows.append(row)
        row //= 2
    return rows + [k * cap for k in CP_FREE_LONGER]


ROW_SEARCH: tuple[str, ...] = ("bfd", "multipack", "wlb", "wlb-ideal", "sorted", "slimpack")
"""Strategies whose packs are bounded by a row length: the token-packing baselines, whose
micro-batch count follows from it, and slimpack, whose pack token cap bounds its own choice
of micro-batches (fewer, larger packs pay where every pack costs a parameter gather, as under
FSDP). With ``best`` the search also tries other row lengths
(:meth:`~slimdata.sim.search.Evaluator.rows`). ``concat``'s row is the training context itself
(a data choice, not a packing knob); ``dcp`` chooses its micro-batches itself."""
NAN = float("nan")


@dataclass(frozen=True)
class StrategyStats:
    """One strategy over the simulated run (see :func:`_stats` for what is a mean)."""

    step_time: float
    """Run time per step: the sum of its iterations' times (a stream strategy's flush
    iterations included) over ``steps``; the mean step time of a per-step strategy. Every
    strategy trains the same documents over the run, so ratios of it are throughput ratios."""
    lower_bound: float
    """The plan's own bound (:func:`~slimdata.sim.results.lower_bound`): moves with the plan."""
    imbalance: float
    bubble: float
    peak_memory_gib: float
    solve_ms: float
    comm_time: float
    over_memory_steps: int
    steps: int
    error: str = ""
    """Why the strategy could not plan or fit (then the numbers are NaN)."""
    cp: int = 1
    """Static context-parallel size it ran with (0 when it failed)."""
    plan_memory_gib: float = NAN
    """The largest per-device peak of any iteration: the execution model's memory
    (:mod:`slimdata.execution.memory`) of the configuration it ran (static CP, pipeline
    stages and schedule, parallelism), as the simulation holds it; ``peak_memory_gib`` is
    its mean over the iterations."""
    bound: float = NAN
    """The plan-independent bound of the same batches (:mod:`slimdata.sim.bound`), mean."""
    tokens: float = NAN
    """Tokens computed per step (run total / steps)."""
    attention_pairs: float = NAN
    """Causal query-key pairs computed per step (run total / steps)."""
    same_work: bool = True
    """Computes every causal pair of the batch's documents (False: cuts documents)."""
    schedule: str = ""
    """Pipeline schedule it ran with."""
    micro_batches: int = 0
    """Most forward packs of any DP group in a step (micro-batches per pipeline)."""
    merge_groups: float = 0.0
    """Merge groups (DP-Merge or per-sequence CP groups) per step (mean)."""
    iterations: int = 0
    """Iterations simulated: ``steps``, plus the flush iterations of a stream strategy."""
    token_delay: float = 0.0
    """Mean token delay in iterations (tokens x iterations waited / tokens; ``wlb``)."""
    row_tokens: int = 0
    """Packed row length (most tokens of one micro-batch of a DP group) it was solved with."""

    def to_dict(self) -> dict[str, Any]:
        if self.error:
            return {"failed": True, "reason": self.error, "error": self.error}
        out: dict[str, Any] = {}
        for k in (
            "step_time",
            "bound",
            "imbalance",
            "peak_memory_gib",
            "attention_pairs",
            "tokens",
            "same_work",
            "lower_bound",
            "bubble",
            "solve_ms",
            "comm_time",
            "over_memory_steps",
            "steps",
            "iterations",
            "token_delay",
            "cp",
            "plan_memory_gib",
        ):
            x = getattr(self, k)
            out[k] = None if isinstance(x, float) and not np.isfinite(x) else x  # JSON has no NaN
        out["step_over_bound"] = self.step_time / self.bound if self.bound > 0 else None
        out["config"] = {
            "cp": self.cp,
            "micro_batches": self.micro_batches,
            "schedule": self.schedule,
            "merge_groups": self.merge_groups,
            "row_tokens": self.row_tokens,
        }
        return out


def _failed(error: str) -> StrategyStats:
    return StrategyStats(NAN, NAN, NAN, NAN, NAN, NAN, NAN, 0, 0, error=error, cp=0)


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare_strategies` found: the settings, one :class:`StrategyStats` per
    strategy, and the first simulated step of each (for :func:`~slimdata.sim.gantt.draw_gantt`)."""

    config: dict[str, Any]
    results: dict[str, StrategyStats]
    first: dict[str, tuple[StepPlan, SimResult]] = field(default_factory=dict, repr=False)
    """The first step of every strategy: its plan and simulated step (with the timeline a
    Gantt chart draws when ``compare_strategies(timelines=True)``, else its summary)."""
    steps: list[list[int]] = field(default_factory=list, repr=False)
    """Document lengths of every simulated step."""
    megatron_default: StrategyStats | None = None
    """concat at the smallest static CP that fits, 1F1B (the paper's reference)."""
    search: dict[str, Any] = field(default_factory=dict)
    """What the baseline-configuration search cost."""
    warnings: list[str] = field(default_factory=list)

    def speedups(self) -> dict[str, tuple[float, float]]:
        """``strategy -> (speedup vs concat, speedup vs the best other same-work strategy)``;
        a strategy over the memory cap in some step is never the reference."""
        t = {k: v.step_time for k, v in self.results.items() if np.isfinite(v.step_time)}
        # a reference must compute the same work and fit memory in every step
        same = {k for k, v in self.results.items() if v.same_work and not v.over_memory_steps}
        out = {}
        for k, v in t.items():
            others = [x for name, x in t.items() if name != k and name in same]
            out[k] = (t.get(REFERENCE, NAN) / v, (min(others) if others else NAN) / v)
        return out

    def vs_megatron_default(self) -> dict[str, float]:
        ref = self.megatron_default.step_time if self.megatron_default else NAN
        return {k: ref / v.step_time for k, v in self.results.items() if not v.error}

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` contract (docs/simulate.md)."""
        sp, md = self.speedups(), self.vs_megatron_default()
        res = {}
        for k, v in self.results.items():
            d = v.to_dict()
            if k in sp:
                d["speedup_vs_concat"], d["speedup_vs_best_baseline"] = (_num(x) for x in sp[k])
                d["speedup_vs_megatron_default"] = _num(md[k])
            res[k] = d
        ref = self.megatron_default
        return {
            "config": self.config,
            "steps": [{"lengths": s} for s in self.steps],
            "results": res,
            "megatron_default": ref.to_dict() if ref else None,
            "search": self.search,
            "warnings": self.warnings,
        }


def _num(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def parse_strategies(spec: str, known: Sequence[str]) -> list[str]:
    """``"all"`` or a comma list of registry names, in the given order."""
    if spec.strip() == "all":
        return list(known)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [s for s in names if s not in known]
    if bad or not names:
        what = f"unknown {bad}" if bad else "names no strategy"
        raise ConfigError(
            f"--strategies {spec!r}: {what}; use 'all' or a comma list of {', '.join(known)}"
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
    baseline_config: str | BaselineConfig = "best",
    memory_budget: str = GIVEN,
    progress: Callable[[str], None] | None = None,
    jobs: int = 1,
    timelines: bool = False,
) -> Comparison:
    """Solve and simulate ``steps`` batches with every strategy; means per strategy.

    ``global_batch_tokens`` defaults to ``dp * context``; ``baseline_config``: ``best``,
    ``smallest`` or ``cp=N`` (:mod:`slimdata.sim.search`); ``memory_budget``: how
    ``layout.memory_gib`` was set, :data:`~slimdata.cost.states.GIVEN` or the account of a
    derived budget (messages name it by :func:`~slimdata.cost.states.budget_text`);
    ``progress``: called with a strategy's name after each step it simulates (a progress bar);
    ``jobs``: worker processes that solve and simulate the configurations the search will ask
    for ahead of it (:mod:`slimdata.sim.prefetch`; the same results for any number). The
    workers are spawned, so a script that asks for them calls this under ``if __name__ ==
    "__main__":`` (Python's rule for spawned processes). ``timelines``: the first step of
    every strategy in :attr:`Comparison.first` with its timeline and memory events (a Gantt
    chart's; simulated again, since the search keeps only summaries, :meth:`SimResult.summary`).
    """
    from slimdata.solver import STREAMS, solve

    if steps < 1:
        raise ConfigError(f"steps={steps!r} must be >= 1")
    if cost.layers and layout.pp > cost.layers:
        raise ConfigError(
            f"pp={layout.pp}: more pipeline stages than the model's {cost.layers} layers "
            "(each stage holds at least one)"
        )
    choice = (
        parse_baseline_config(baseline_config)
        if isinstance(baseline_config, str)
        else baseline_config
    )
    config = (config or SimConfig()).resolved()  # the user's schedule, else the defaults
    notes = []
    if layout.pp == 1 and config.schedule != "1f1b":  # one stage: nothing to interleave
        notes.append(f"--schedule {config.schedule} needs --pp > 1; simulated 1f1b")
        config = dataclasses.replace(config, schedule="1f1b")
    gbt = layout.dp * layout.context if global_batch_tokens is None else global_batch_tokens
    if gbt < 1:
        raise ConfigError(f"global_batch_tokens={gbt!r} must be >= 1")
    batches, epoch = _batches(docs, layout, gbt, seed, oversize, steps)
    if epoch < steps:
        notes.append(
            f"the documents fill {epoch} step(s) of {gbt} tokens: steps {epoch + 1} to {steps} "
            "repeat them from the first"
        )
    evaluator = Evaluator(
        batches,
        layout,
        cost,
        config,
        seed,
        solve,
        STREAMS,
        memory_budget=memory_budget,
        progress=progress,
        jobs=jobs,
    )
    with closing(evaluator) as ev:
        bounds = [
            step_bound(b, cost, layout.dp, layout.pp, config.pipeline.virtual_stages).value
            for b in batches
        ]
        ref_work = [batch_work(b) for b in batches]
        results, first = _strategy_results(
            ev, strategies, choice, layout, cost, bounds, ref_work, timelines
        )
        cfg = _config_dict(
            layout, cost, config, choice, gbt, steps, seed, oversize, strategies, docs
        )
        cfg["memory_budget"] = memory_budget
        return Comparison(
            config=cfg,
            results=results,
            first=first,
            steps=[[d.length for d in b] for b in batches],
            megatron_default=_megatron_default(ev, layout, cost, bounds, ref_work),
            search=_search_dict(ev),
            warnings=notes
            + _step_warnings(batches, gbt, docs)
            + _warnings(results, layout)
            + _pool_warnings(ev),
        )


def _batches(
    docs: Sequence[Document], layout: Layout, gbt: int, seed: int, oversize: str, steps: int
) -> tuple[list[list[Document]], int]:
    """The global batches of ``steps`` steps, by the rules `slimdata plan` and the loaders
    apply (over again from the first when the documents fill fewer batches), and how many
    the epoch holds."""
    from slimdata.solver import PlanConfig

    rules = PlanConfig(layout=layout, global_batch_tokens=gbt, seed=seed, oversize=oversize)
    batches = rules.batches(docs)
    if not batches:
        raise ConfigError("no documents to simulate")
    return [batches[s % len(batches)] for s in range(steps)], len(batches)


def _strategy_results(
    ev: Evaluator,
    strategies: Sequence[str],
    choice: BaselineConfig,
    layout: Layout,
    cost: CostModel,
    bounds: list[float],
    ref_work: list,
    timelines: bool = False,
) -> tuple[dict[str, StrategyStats], dict[str, tuple[StepPlan, SimResult]]]:
    """Every strategy's means over the run (a strategy that cannot plan reports why), and
    its first step, plan and simulation. With workers, every searched strategy's first
    screens are computed at once, ahead of the searches (:func:`first_screens`)."""
    results: dict[str, StrategyStats] = {}
    first: dict[str, tuple[StepPlan, SimResult]] = {}
    searched = [n for n in strategies if n not in CP_FREE]
    t0 = time.perf_counter()
    ev.prefetch([w for n in searched for w in first_screens(ev, n, choice)], screen=True)
    ev.log.seconds += time.perf_counter() - t0  # the searches' time, spent ahead of them
    for name in strategies:
        run = _run(ev, name, choice)
        if isinstance(run, str):
            results[name] = _failed(run)
            continue
        # the search keeps summaries: a timeline (the Gantt chart's) is simulated again
        sim = ev.simulate(run.plans[0], run.cp, run.schedule) if timelines else run.sims[0]
        first[name] = (run.plans[0], sim)
        row = layout.context if name == REFERENCE else layout.token_cap  # concat: rows of context
        results[name] = _stats(run, bounds, ref_work, row)
    return results, first


def _megatron_default(
    ev: Evaluator, layout: Layout, cost: CostModel, bounds: list[float], ref_work: list
) -> StrategyStats | None:
    """concat at the smallest static CP that fits, 1F1B (the paper's reference); None when
    it does not fit at any CP size."""
    default = _run(ev, REFERENCE, BaselineConfig("smallest"), schedule="1f1b")
    if isinstance(default, str):
        return None
    return _stats(default, bounds, ref_work, layout.context)


def _run(
    ev: Evaluator, name: str, choice: BaselineConfig, schedule: str | None = None
) -> Run | str:
    """One strategy: CP-free strategies at ``cp = 1`` (over the cap reported, not refused);
    the others through the configuration search. With ``best`` ``dcp`` runs the fastest of
    its rows (:func:`cp_free_rows`) and, with ``pp > 1``, of 1F1B and interleaved."""
    if schedule is not None and schedule != ev.config.schedule:
        ev = ev.with_schedule(schedule)
    if name not in CP_FREE:
        return search(ev, name, choice, rows=name in ROW_SEARCH)
    schedules = [ev.config.pipeline.schedule]
    rows = [0]
    if choice.mode == "best":
        if ev.layout.pp > 1:
            schedules = ["1f1b", "interleaved"]
        rows = cp_free_rows(ev.layout.token_cap)
    setups = [Setup(1, row) for row in rows]
    ev.prefetch(
        [(name, at, sch, s) for at in setups for sch in schedules for s in range(len(ev.batches))]
    )
    runs = [_cp_free(ev, name, at, sch) for at in setups for sch in schedules]
    ok = [r for r in runs if isinstance(r, Run)]
    if not ok:
        return runs[0]
    # ties to 9 digits (the same plan's floats summed otherwise) go to the first: the longer
    # row, then 1F1B
    return min(ok, key=lambda r: (sum(x.over_memory for x in r.sims), float(f"{_mean(r):.9g}")))


def _mean(run: Run) -> float:
    return float(np.mean([r.step_time for r in run.sims]))


def _cp_free(ev: Evaluator, name: str, at: Setup, schedule: str) -> Run | str:
    """Every step of a CP-free strategy at ``cp = 1`` (``at``), with ``schedule``."""
    from slimdata.errors import PlanError

    try:
        n = ev.iterations(name, at)
        plans = [ev.plan(name, at, s) for s in range(n)]
        sims = [ev.sim(name, at, schedule, s) for s in range(n)]
    except PlanError as exc:
        return str(exc)
    return Run(
        1,
        schedule,
        [p for p, _ in plans],
        sims,
        [t for _, t in plans],
        len(ev.batches),
        ev.token_delay(name, at),
        at.row,
    )


def _stats(run: Run, bounds: list[float], ref: list, cap: int) -> StrategyStats:
    """One run over its iterations. Times and work are per step over the run (total / steps):
    a per-step strategy's mean, and for a stream strategy its total time over the same
    documents, flush iterations included; the rest are means over iterations."""
    rows = np.array(
        [
            (r.lower_bound, r.imbalance, r.bubble, r.peak_memory_gib, ms, r.comm_time)
            for r, ms in zip(run.sims, run.solve_ms, strict=True)
        ]
    )
    m = [float(x) for x in rows.mean(axis=0)]
    steps = run.steps or len(run.sims)
    works = [plan_work(p) for p in run.plans]
    tokens = sum(w.tokens for w in works)
    pairs = sum(w.attention_pairs for w in works)
    ref_pairs = sum(b.attention_pairs for b in ref)
    same = tokens == sum(b.tokens for b in ref) and pairs >= ref_pairs * (1 - 1e-12)
    return StrategyStats(
        step_time=run.step_time,
        lower_bound=m[0],
        imbalance=m[1],
        bubble=m[2],
        peak_memory_gib=m[3],
        solve_ms=m[4],
        comm_time=m[5],
        over_memory_steps=sum(r.over_memory for r in run.sims),
        steps=steps,
        cp=run.cp,
        plan_memory_gib=max(r.peak_memory_gib for r in run.sims),
        bound=float(np.mean(bounds)),
        tokens=tokens / steps,
        attention_pairs=pairs / steps,
        same_work=same,
        schedule=run.schedule,
        micro_batches=max(len(rs.forward) for p in run.plans for rs in p.ranks),
        merge_groups=float(np.mean([len(p.merges) for p in run.plans])),
        iterations=len(run.sims),
        token_delay=run.token_delay,
        row_tokens=run.row or cap,
    )


def _config_dict(
    layout: Layout,
    cost: CostModel,
    config: SimConfig,
    choice: BaselineConfig,
    gbt: int,
    steps: int,
    seed: int,
    oversize: str,
    strategies: Sequence[str],
    docs: Sequence[Document],
) -> dict[str, Any]:
    """Every setting, resolved defaults and cost coefficients included (the JSON ``config``)."""
    return {
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
        "cost": cost.to_dict(),
        "parallelism": config.parallelism,
        "asymmetric": config.asymmetric,
        "schedule": config.schedule,
        "virtual_stages": config.virtual_stages,
        "cp_overlap": config.cp_overlap,
        "interconnect": dataclasses.asdict(config.interconnect),
        "baseline_config": choice.label(),
        "strategies": list(strategies),
        "memory_rule": "every strategy must fit memory_gib in every step; baselines search "
        "static CP (taken out of DP) and the schedule, slimpack included; dcp runs cp=1 and, "
        "with best, the fastest max_seqlen_per_rank of the row, its half, quarter, ... down to "
        "4096 tokens",
    }


def _pool_warnings(ev: Evaluator) -> list[str]:
    """A worker of the search that died (the search went on without them)."""
    if ev.pool is None or not ev.pool.broken:
        return []
    return [
        "a worker process of the configuration search died (killed, or out of memory?); "
        "the search went on without workers, with the same results (--jobs 1 runs none)"
    ]


def _search_dict(ev: Evaluator) -> dict[str, Any]:
    log = ev.log
    return {
        "configurations": log.screened,
        "pruned_by_memory": log.pruned,
        "solves": log.solves,
        "simulations": log.simulations,
        "seconds": log.seconds,
        "workers": log.workers,
        "tried": [
            {
                **t,
                "first_step": t["first_step"] if isinstance(t["first_step"], float) else None,
                **({"reason": t["first_step"]} if isinstance(t["first_step"], str) else {}),
            }
            for t in log.tried
        ],
    }


def _step_warnings(
    batches: Sequence[Sequence[Document]], gbt: int, docs: Sequence[Document]
) -> list[str]:
    """:func:`~slimdata.solver.batches.batch_warnings` of the simulated steps."""
    steps = [sum(d.length for d in b) for b in batches]
    return batch_warnings(steps, sum(d.length for d in docs), gbt)


def _warnings(results: dict[str, StrategyStats], layout: Layout) -> list[str]:
    """A pipeline with fewer than ``2 * pp`` micro-batches mostly waits (bubble)."""
    if layout.pp == 1:
        return []
    few = {
        k: r.micro_batches
        for k, r in results.items()
        if not r.error and r.micro_batches < 2 * layout.pp
    }
    if not few:
        return []
    names = ", ".join(f"{k} ({m})" for k, m in few.items())
    return [
        f"fewer than 2*pp = {2 * layout.pp} micro-batches per pipeline: {names}; the pipeline "
        "bubble dominates their step time (raise --global-batch-tokens)"
    ]


def format_table(cmp: Comparison) -> str:
    """A fixed-width comparison table, one row per strategy."""
    sp, md = cmp.speedups(), cmp.vs_megatron_default()
    head = (
        f"{'strategy':<12}{'cp':>3}{'sched':>12}{'mb':>4}{'step s':>10}{'bound s':>10}"
        f"{'step/bnd':>9}{'imbal':>7}{'bubble':>7}{'mem GiB':>9}{'solve ms':>9}"
        f"{'vs best':>9}{'vs concat':>10}{'vs mega':>9}"
    )
    lines = [head, "-" * len(head)]
    for name, r in cmp.results.items():
        if r.error:
            lines.append(f"{name:<12}  failed: {r.error}")
            continue
        vc, vb = sp.get(name, (NAN, NAN))
        mem = f"{r.peak_memory_gib:.1f}" + ("!" if r.over_memory_steps else "")
        tag = "" if r.same_work else "*"
        lines.append(
            f"{name + tag:<12}{r.cp:>3}{r.schedule:>12}{r.micro_batches:>4}{r.step_time:>10.3f}"
            f"{r.bound:>10.3f}{r.step_time / r.bound:>9.2f}{r.imbalance:>7.2f}{r.bubble:>7.2f}"
            f"{mem:>9}{r.solve_ms:>9.1f}{_ratio(vb, 9)}{_ratio(vc, 10)}{_ratio(md.get(name, NAN), 9)}"
        )
    lines.extend(_notes(cmp))
    return "\n".join(lines)


def _ratio(x: float, width: int) -> str:
    """A speedup column: ``1.07x``, or ``-`` where there is no reference (e.g. ``concat`` not
    among --strategies)."""
    return f"{x:>{width - 1}.2f}x" if np.isfinite(x) else f"{'-':>{width}}"


def _notes(cmp: Comparison) -> list[str]:
    out = []
    if any(r.over_memory_steps for r in cmp.results.values()):
        budget = budget_text(cmp.config["memory_gib"], cmp.config["memory_budget"])
        out.append(f"! peak memory above {budget} in some steps")
    if any(not r.same_work for r in cmp.results.values() if not r.error):
        out.append(
            "* cuts documents: computes fewer attention pairs than the batch holds (not the same "
            "work); 'vs best' compares against same-work strategies only"
        )
    for name, r in cmp.results.items():
        if not r.error and r.iterations > r.steps:
            out.append(
                f"{name}: delays documents; {r.iterations} iterations for {r.steps} step(s) "
                f"({r.iterations - r.steps} flushing what still waited), mean token delay "
                f"{r.token_delay:.2f} iterations; step s = total run time / steps (same documents)"
            )
    mega = cmp.megatron_default
    ref = f"{mega.step_time:.3f} s at cp={mega.cp}" if mega else "failed"
    out.append(
        f"baselines: {cmp.config['baseline_config']} configuration (cp = static context "
        f"parallelism taken out of DP, mb = micro-batches per pipeline); vs mega: vs concat at "
        f"the smallest CP that fits, 1F1B ({ref}); bound: plan-independent (docs/simulate.md); "
        f"search: {cmp.search.get('simulations', 0)} simulations, "
        f"{cmp.search.get('seconds', 0.0):.1f} s"
    )
    return out + [f"warning: {w}" for w in cmp.warnings]

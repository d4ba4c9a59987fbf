"""Run every baseline at the configuration a Megatron user would tune (global batch fixed).

For a baseline the search covers:

- **static CP size** ``k``: powers of two dividing ``dp``; the ``k`` CP ranks come out of DP, so
  the plan is solved for ``dp / k`` DP groups (:mod:`slimdata.sim.cp`);
- **micro-batches per pipeline**, through the **packed row length** ``R`` (token-packing
  baselines, and slimpack's pack token cap; :data:`~slimdata.sim.compare.ROW_SEARCH`): Megatron's packed (THD) path runs
  micro-batch size 1, so with the global batch ``G`` fixed a pipeline runs about ``G / (R dp
  / k)`` micro-batches. ``R`` is tried at ``cap / 2``, ``cap / 4``, ... (more, smaller
  micro-batches; only rows that every document of the run fits, so no document is cut, and
  below ``cap / 2`` none under :data:`MIN_ROW`), ``cap`` (``layout.token_cap``, the default)
  and ``2 cap``, ``4 cap`` (fewer, larger ones: ``R / k`` tokens per device) while a DP
  group's share of the batch needs more than one row of ``R / 2``; the shorter rows also at
  every static CP size and schedule over the memory cap at ``cap`` (they hold less);
- **micro-batches of slimpack** (``pp > 1``), which chooses its own count by estimating the
  step under the schedule it is solved for (``Layout.schedule``): also 2x and 4x its choice
  (:data:`MICROBATCH_SEARCH`; its estimate has no communication and checks memory with
  1F1B's packs in flight, so more, smaller micro-batches may still be faster or fit);
- **pipeline schedule** (``pp > 1``): 1F1B or interleaved (``SimConfig.virtual_stages``
  virtual stages).

``best`` (the default) reports the fastest configuration that fits the memory cap in every
step; ``smallest`` the smallest ``k`` that fits, with the schedule the user gave (what the
Megatron default of the paper does); ``cp=N`` exactly that size. Costs and shortcuts:

- a baseline's plan does not depend on the schedule: each ``(strategy, k, R, step)`` is solved
  once and simulated once per schedule; a strategy that plans for the schedule
  (:data:`PLANS_BY_SCHEDULE`, slimpack) is solved once per schedule too, with the schedule
  and ``SimConfig.virtual_stages`` in its layout (:class:`Evaluator` memoizes both); with
  ``best`` its 1F1B plan is also simulated under the interleaved schedule
  (:data:`CROSS_SCHEDULE`, ``Setup.plan_schedule``), no solve added, and the micro-batch
  search starts from the fastest of those too;
- a ``(k, R)`` whose largest pack cannot fit even alone (``act_bytes_per_token * tokens *
  smallest stage share / k`` above the cap: a necessary condition for the simulated peak) is
  pruned without simulating it;
- candidates are screened on the first step; the :data:`FINALISTS` fastest that fit every
  step are run on every step, and the lowest time per step over the run wins (the first
  step alone may rank them otherwise: a stream strategy's first step is not its run, even
  with one step, so its finalists always run); with one step the screen is the run of a
  per-step strategy and the fastest that fits wins;
- row lengths are screened only at the ``(k, schedule)`` of the three fastest configurations
  of the default row (:data:`ROW_CANDIDATES`; fewer when two of them share a ``k`` and
  schedule, e.g. a plan and the 1F1B plan both run interleaved) and, the shorter rows alone,
  at those over the memory cap there; longer rows in increasing order until one does not fit
  or is slower than the one before;
- a *stream* strategy (``wlb``, which delays documents to later steps) is advanced step by
  step as the search asks for its plans (screening solves only its first step) and flushed
  when a configuration runs every step: its run has the flush iterations after the steps.

``SearchLog`` says what the search cost: configurations screened, pruned, simulations run
and wall seconds, reported in ``simulate``'s JSON.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slimdata.cost import CostModel
from slimdata.cost.states import GIVEN, budget_text
from slimdata.errors import ConfigError, PlanError
from slimdata.plan import Document, StepPlan
from slimdata.sim.config import SimConfig
from slimdata.sim.prefetch import POOL_TOKENS, Done, Task, WorkerPool, cannot_fit, solve_timed
from slimdata.sim.results import SimResult
from slimdata.sim.step import simulate_step
from slimdata.solver.layout import Layout
from slimdata.units import gib

__all__ = [
    "MIN_ROW",
    "BaselineConfig",
    "Evaluator",
    "Run",
    "SearchLog",
    "Setup",
    "cp_sizes",
    "parse_baseline_config",
    "search",
]


@dataclass(frozen=True)
class BaselineConfig:
    """``best``, ``smallest`` or a fixed ``cp``."""

    mode: str
    cp: int = 0

    def label(self) -> str:
        return f"cp={self.cp}" if self.mode == "fixed" else self.mode


def parse_baseline_config(spec: str) -> BaselineConfig:
    """``"best"``, ``"smallest"`` or ``"cp=N"`` (``N`` a power of two)."""
    s = spec.strip().lower()
    if s in ("best", "smallest"):
        return BaselineConfig(s)
    if s.startswith("cp="):
        try:
            k = int(s[3:])
        except ValueError:
            k = 0
        if k >= 1 and k & (k - 1) == 0:
            return BaselineConfig("fixed", k)
    raise ConfigError(
        f"--baseline-config {spec!r}: use 'best', 'smallest' or 'cp=N' with N a power of two"
    )


def cp_sizes(dp: int) -> list[int]:
    """Static CP sizes a ``dp``-device stage can run: powers of two dividing ``dp``."""
    out, k = [], 1
    while k <= dp and dp % k == 0:
        out.append(k)
        k *= 2
    return out


@dataclass
class SearchLog:
    """What a search cost."""

    screened: int = 0
    """Configurations considered (``k`` x schedule)."""
    pruned: int = 0
    """Configurations skipped by the memory test, without simulating."""
    simulations: int = 0
    solves: int = 0
    """Plans solved, those that do not solve included (each configuration once)."""
    seconds: float = 0.0
    workers: int = 0
    """Worker processes that solved and simulated ahead of the search (0: none,
    :meth:`Evaluator.prefetch`)."""
    tried: list[dict] = field(default_factory=list)
    """Per screened configuration: ``cp``, ``schedule``, first-step ``step_time`` or why not."""


@dataclass(frozen=True, order=True)
class Setup:
    """What a plan is solved for: static CP size, packed row length (0: the layout's
    ``token_cap``) and, for a strategy that chooses its own micro-batches, how many it is asked
    for (0: its own choice)."""

    cp: int
    row: int = 0
    microbatches: int = 0
    plan_schedule: str = ""
    """For :data:`PLANS_BY_SCHEDULE`: the schedule the plan is solved for when it is not the
    one simulated ("": the simulated one); the search also runs slimpack's 1F1B plan under the
    interleaved schedule (:data:`CROSS_SCHEDULE`)."""


@dataclass(frozen=True)
class Run:
    """A strategy run on every step in one configuration.

    ``plans``/``sims`` are its iterations: one per step, plus the flush iterations of a stream
    strategy (which trains, over the run, the same documents as the steps)."""

    cp: int
    schedule: str
    plans: list[StepPlan]
    sims: list[SimResult]
    solve_ms: list[float]
    steps: int = 0
    """Steps of the run (the batches); ``len(plans) - steps`` flush iterations."""
    token_delay: float = 0.0
    """Mean token delay in iterations (0 for a per-step strategy)."""
    row: int = 0
    """Packed row length it was solved with (0: the layout's ``token_cap``)."""

    @property
    def step_time(self) -> float:
        """Seconds per step over the run: a per-step strategy's mean, a stream strategy's
        total time over the same documents (flush iterations included) per step."""
        return sum(r.step_time for r in self.sims) / (self.steps or len(self.sims))


class _Stream:
    """A stream strategy's progress in one ``(strategy, cp)``: the packer and its next step."""

    def __init__(self, packer: Any) -> None:
        self.packer = packer
        self.next = 0
        self.flush_iterations: int | None = None
        """Set once flushed."""


class Evaluator:
    """Solve and simulate ``(strategy, Setup, step)`` at most once each (per schedule; solve
    per schedule only for :data:`PLANS_BY_SCHEDULE`); a stream strategy (``streams``: name ->
    packer class) is advanced step by step."""

    def __init__(
        self,
        batches: Sequence[Sequence[Document]],
        layout: Layout,
        cost: CostModel,
        config: SimConfig,
        seed: int,
        solve: Callable[..., StepPlan],
        streams: Mapping[str, Callable[..., Any]] | None = None,
        *,
        memory_budget: str = GIVEN,
        progress: Callable[[str], None] | None = None,
        jobs: int = 1,
    ) -> None:
        self.batches, self.layout, self.cost = batches, layout, cost
        # the user's settings, an unset schedule, virtual stages and CP at their defaults
        self.config, self.seed, self._solve = config.resolved(), seed, solve
        self.memory_budget = memory_budget
        """How ``layout.memory_gib`` was set, for messages (:func:`budget_text`)."""
        self.progress = progress
        """Called with the strategy's name after each new simulation (a progress bar)."""
        self._stream_kinds = dict(streams or {})
        self._plans: dict[tuple[str, Setup, str | None, int], tuple[StepPlan, float]] = {}
        self._sims: dict[tuple[str, Setup, str, int], SimResult] = {}
        self._streams: dict[tuple[str, Setup], _Stream] = {}
        self._failed: dict[tuple, PlanError] = {}
        """Plans and simulations a worker found failing (:meth:`prefetch`), by cache key."""
        most = max((sum(d.length for d in b) for b in batches), default=0)
        self.pool = WorkerPool(jobs) if jobs > 1 and most >= POOL_TOKENS else None
        """Workers for :meth:`prefetch` (None: everything is computed here, on demand)."""
        self.log = SearchLog()

    def with_schedule(self, schedule: str) -> Evaluator:
        """The same evaluator, caches and log shared, with another user schedule."""
        other = Evaluator(
            self.batches,
            self.layout,
            self.cost,
            dataclasses.replace(self.config, schedule=schedule),
            self.seed,
            self._solve,
            self._stream_kinds,
            memory_budget=self.memory_budget,
            progress=self.progress,
        )
        other._plans, other._sims, other._streams = self._plans, self._sims, self._streams
        other._failed, other.pool, other.log = self._failed, self.pool, self.log
        return other

    def layout_for(self, at: Setup, schedule: str | None = None) -> Layout:
        """The layout a plan is solved for under static CP ``k = at.cp``: ``dp / k`` DP
        groups of ``Layout.cp = k`` devices; a group holds a pack split k ways, so it is
        planned with k devices' memory (``Layout.memory_bytes``; the simulator then checks
        every device's peak, gathered K/V included); packs of at most ``at.row`` tokens when
        given; ``schedule`` (:meth:`plan_schedule`) with the simulator's virtual stages when
        given, else the layout's own."""
        k = at.cp
        lay = dataclasses.replace(
            self.layout,
            dp=self.layout.dp // k,
            ranks_per_node=max(1, self.layout.ranks_per_node // k),
            cp=k,
            pack_tokens=at.row or self.layout.pack_tokens,
            microbatches=at.microbatches or self.layout.microbatches,
        )
        if schedule is None:
            return lay
        return dataclasses.replace(
            lay, schedule=schedule, virtual_stages=self.config.pipeline.virtual_stages
        )

    def plan_schedule(self, name: str, schedule: str | None) -> str | None:
        """The schedule ``name``'s plan is solved for when it runs under ``schedule`` (default:
        the user's): that schedule for a strategy that plans for it
        (:data:`PLANS_BY_SCHEDULE`) with a pipeline, else ``None`` (one plan for every
        schedule, solved with the layout as given; so is a stream strategy's, advanced
        once)."""
        if name not in PLANS_BY_SCHEDULE or name in self._stream_kinds or self.layout.pp == 1:
            return None
        return schedule or self.config.pipeline.schedule

    def plan(
        self, name: str, at: Setup, step: int, schedule: str | None = None
    ) -> tuple[StepPlan, float]:
        """The plan of iteration ``step`` (a step, or a stream's flush iteration) to run under
        ``schedule`` (default: the user's) and its solve milliseconds."""
        key = self._plan_key(name, at, schedule, step)
        sch = key[2]
        if key in self._failed:
            raise self._failed[key]
        if key not in self._plans and name in self._stream_kinds:
            self._advance(name, at, step)
        elif key not in self._plans:
            self.log.solves += 1
            try:
                self._plans[key] = solve_timed(
                    self._solve,
                    self.batches[step],
                    self.layout_for(at, sch),
                    name,
                    self.seed,
                    self.cost,
                    step,
                )
            except PlanError as exc:  # solved once: a solve is deterministic
                self._failed[key] = exc
                raise
        return self._plans[key]

    def _plan_key(
        self, name: str, at: Setup, schedule: str | None, step: int
    ) -> tuple[str, Setup, str | None, int]:
        """Which plan ``(name, at)`` runs under ``schedule`` in iteration ``step``."""
        sch = self.plan_schedule(name, at.plan_schedule or schedule)
        return (name, dataclasses.replace(at, plan_schedule=""), sch, step)

    def prefetch(self, wanted: Sequence[Wanted], *, screen: bool = False) -> None:
        """Compute on the workers the plans and simulations of ``wanted`` (``(strategy,
        setup, schedule, step)``) not known yet, for :meth:`plan` and :meth:`sim` to read
        (:mod:`slimdata.sim.prefetch`); ``screen``: a plan the search prunes
        (:meth:`cannot_fit`) is not simulated. Nothing without workers or for fewer than two
        plans; never a stream strategy's (its plans come one step after the other)."""
        if self.pool is None:
            return
        todo: dict[tuple, list[tuple[tuple, SimConfig]]] = {}
        for name, at, schedule, step in wanted:
            if name in self._stream_kinds:
                continue
            key = self._plan_key(name, at, schedule, step)
            sim_key = (name, at, schedule, step)
            if key in self._failed or sim_key in self._sims or sim_key in self._failed:
                continue
            sims = todo.setdefault(key, [])
            if all(sim_key != known for known, _config in sims):  # asked for twice: once
                sims.append((sim_key, self.sim_config(at.cp, schedule)))
        if len(todo) < 2:
            return
        tasks = [self._task(key, sims, screen) for key, sims in todo.items()]
        results = self.pool.run(tasks)
        if results is None:  # a worker died: what is asked for is computed here
            return
        self.log.workers = self.pool.jobs
        for (key, sims), done in zip(todo.items(), results, strict=True):
            self._keep(key, sims, done)

    def _task(self, key: tuple, sims: list[tuple[tuple, SimConfig]], screen: bool) -> Task:
        name, at, sch, step = key
        return Task(
            solve=self._solve,
            batch=self.batches[step],
            plan_layout=self.layout_for(at, sch),
            name=name,
            seed=self.seed,
            cost=self.cost,
            step=step,
            layout=self.layout,
            configs=tuple(cfg for _k, cfg in sims),
            prune=at.cp if screen else 0,
            plan=self._plans[key][0] if key in self._plans else None,
        )

    def _keep(self, key: tuple, sims: list[tuple[tuple, SimConfig]], done: Done) -> None:
        """A worker's results into the caches and the log, as :meth:`plan` and :meth:`sim`
        would have put them. An unexpected error is not kept: the search may never ask for
        what raised it (the workers compute ahead), and where it does, it raises it itself,
        as without workers."""
        if done.error is not None:
            if isinstance(done.error, PlanError):
                self._failed[key] = done.error
                self.log.solves += 1
            return
        assert done.plan is not None
        if done.solved:
            self._plans[key] = (done.plan, done.solve_ms)
            self.log.solves += 1
        for (sim_key, _cfg), r in zip(sims, done.sims, strict=True):
            if r is None:  # pruned: the search does not simulate it
                continue
            if isinstance(r, Exception):
                if isinstance(r, PlanError):
                    self._failed[sim_key] = r
                continue
            self._sims[sim_key] = r
            self.log.simulations += 1
            if self.progress is not None:
                self.progress(key[0])

    def close(self) -> None:
        """Stop the workers, if any."""
        if self.pool is not None:
            self.pool.close()

    def streams(self, name: str) -> bool:
        """Whether ``name`` is a stream strategy (its run is the steps and flush iterations)."""
        return name in self._stream_kinds

    def iterations(self, name: str, at: Setup) -> int:
        """Iterations of the run: the steps, plus a stream's flush iterations."""
        n = len(self.batches)
        if name not in self._stream_kinds:
            return n
        self._advance(name, at, n)
        return n + (self._streams[(name, at)].flush_iterations or 0)

    def token_delay(self, name: str, at: Setup) -> float:
        st = self._streams.get((name, at))
        return float(st.packer.mean_token_delay()) if st else 0.0

    def _advance(self, name: str, at: Setup, step: int) -> None:
        """Run the stream packer of ``(name, at)`` up to ``step`` (the flush once past the
        last step)."""
        st = self._streams.get((name, at))
        if st is None:
            packer = self._stream_kinds[name](
                self.layout_for(at), self.seed, self.cost, validate=False
            )
            st = self._streams[(name, at)] = _Stream(packer)
        n = len(self.batches)
        while st.next <= min(step, n - 1):
            t0 = time.perf_counter()
            plan = st.packer.step(self.batches[st.next], st.next)
            self._plans[(name, at, None, st.next)] = (plan, (time.perf_counter() - t0) * 1e3)
            self.log.solves += 1
            st.next += 1
        if step >= n and st.flush_iterations is None:
            t0 = time.perf_counter()
            plans = st.packer.flush(n)
            ms = (time.perf_counter() - t0) * 1e3 / max(len(plans), 1)
            for i, plan in enumerate(plans):
                self._plans[(name, at, None, n + i)] = (plan, ms)
            self.log.solves += len(plans)
            st.flush_iterations = len(plans)

    def sim(self, name: str, at: Setup, schedule: str, step: int) -> SimResult:
        """The :meth:`~SimResult.summary` of ``(name, at)``'s step ``step`` under
        ``schedule``, simulated once."""
        key = (name, at, schedule, step)
        if key in self._failed:
            raise self._failed[key]
        if key not in self._sims:
            plan = self.plan(name, at, step, schedule)[0]
            self._sims[key] = self.simulate(plan, at.cp, schedule).summary()
            self.log.simulations += 1
            if self.progress is not None:
                self.progress(name)
        return self._sims[key]

    def simulate(self, plan: StepPlan, cp: int, schedule: str) -> SimResult:
        """``plan``'s step under static CP ``cp`` and ``schedule``, timeline and memory events
        included (:meth:`sim` keeps only their :meth:`~SimResult.summary`)."""
        return simulate_step(plan, self.cost, self.layout, self.sim_config(cp, schedule))

    def sim_config(self, cp: int, schedule: str) -> SimConfig:
        """The simulator's settings of a configuration."""
        return dataclasses.replace(self.config, cp=cp, schedule=schedule)

    def cannot_fit(self, plan: StepPlan, k: int) -> bool:
        """The largest pack alone, at the smallest stage share, is over the cap (see module)."""
        return cannot_fit(plan, k, self.cost, self.layout)

    def run(self, name: str, at: Setup, schedule: str) -> Run | str:
        """Every step in one configuration, or why it does not fit."""
        plans, sims, ms = [], [], []
        for step in range(self.iterations(name, at)):
            plan, t = self.plan(name, at, step, schedule)
            r = self.sim(name, at, schedule, step)
            if r.over_memory:
                return f"needs {gib(r.peak_memory_gib)} per device in step {step}"
            plans.append(plan)
            sims.append(r)
            ms.append(t)
        n, delay = len(self.batches), self.token_delay(name, at)
        return Run(at.cp, schedule, plans, sims, ms, n, delay, at.row)

    def rows(self, k: int) -> list[int]:
        """Packed row lengths to search under static CP ``k`` (module docstring): ``cap / 2``
        when every document fits it and, halving again, every shorter row that every document
        fits down to :data:`MIN_ROW` tokens; ``cap`` (0); and ``2 cap``, ``4 cap`` while a DP
        group's share of the largest batch needs more than one row."""
        cap = self.layout.token_cap
        longest = max((d.length for b in self.batches for d in b), default=0)
        group = -(-max(sum(d.length for d in b) for b in self.batches) // (self.layout.dp // k))
        out: list[int] = []
        row = cap // 2
        while row >= max(longest, 128) and (not out or row >= MIN_ROW):
            out.append(row)
            row //= 2
        out.append(0)
        r = 2 * cap
        while r <= 4 * cap and r // 2 < group:
            out.append(r)
            r *= 2
        return out


def _screen(ev: Evaluator, name: str, at: Setup, schedule: str) -> float | str:
    """First-step time of a configuration, or why it does not fit."""
    ev.log.screened += 1
    try:
        plan, _ = ev.plan(name, at, 0, schedule)
    except PlanError as exc:
        return str(exc)
    if ev.cannot_fit(plan, at.cp):
        ev.log.pruned += 1
        return f"{OVER_MEMORY}more than the memory cap for its largest pack (pruned)"
    try:
        r = ev.sim(name, at, schedule, 0)
    except PlanError as exc:  # e.g. a schedule that cannot run these micro-batches
        return str(exc)
    if r.over_memory:
        cap = ev.layout.memory_gib
        return f"{OVER_MEMORY}{gib(r.peak_memory_gib, 2)} per device, over the {gib(cap, 2)} cap"
    return r.step_time


def search(ev: Evaluator, name: str, choice: BaselineConfig, rows: bool = False) -> Run | str:
    """The configuration ``choice`` asks for (module docstring), or why none fits; ``rows``:
    with ``best``, also search the packed row length (token-packing baselines)."""
    t0 = time.perf_counter()
    lay = ev.layout
    if choice.mode == "fixed" and lay.dp % choice.cp:
        return f"cp={choice.cp} does not divide dp={lay.dp}"
    sizes, schedules = _sizes_and_schedules(ev, choice)
    if choice.mode == "smallest":
        out = _smallest(ev, name, sizes)
    else:
        screened: list[Screened] = []
        over: list[tuple[Setup, str]] = []  # over the memory cap: more micro-batches may fit
        why = ""
        ev.prefetch(first_screens(ev, name, choice), screen=True)
        for k in sizes:
            for at, sch in _first_pass(ev, name, k, schedules, choice):
                fails = _try(ev, name, at, sch, screened)
                why = why or fails
                if fails.startswith(OVER_MEMORY):
                    over.append((at, sch))
        if rows and choice.mode == "best":
            # a CP size and schedule once, though its own plan and the 1F1B plan run under
            # the interleaved schedule may both be among the fastest; one over the memory cap
            # at the default row may fit a shorter one
            fastest = [(at.cp, sch) for _t, at, sch in sorted(screened)[:ROW_CANDIDATES]]
            bases = list(dict.fromkeys([*fastest, *((at.cp, sch) for at, sch in over)]))
            rows_wanted = [
                (name, Setup(k, r), sch, 0)
                for k, sch in bases
                for r in ev.rows(k)
                if r and (r < lay.token_cap or (k, sch) in fastest)
            ]
            ev.prefetch(rows_wanted, screen=True)  # some, the search may not reach
            for k, sch in bases:
                _try_rows(ev, name, k, sch, screened)
        if name in MICROBATCH_SEARCH and choice.mode == "best" and lay.pp > 1:
            bases_mb = _microbatch_bases(screened) + over
            more = [(name, *w) for a, s in bases_mb for w in _more_microbatches(ev, name, a, s)]
            ev.prefetch(more, screen=True)
            for at, sch in bases_mb:
                _try_microbatches(ev, name, at, sch, screened)
        out = _first_that_fits(ev, name, sorted(screened), why, sizes[-1])
    ev.log.seconds += time.perf_counter() - t0
    return out


def first_screens(ev: Evaluator, name: str, choice: BaselineConfig) -> list[Wanted]:
    """The configurations :func:`search` screens first for ``name`` (each static CP size and
    schedule, :func:`_first_pass`), as :meth:`Evaluator.prefetch` takes them; none with
    ``smallest`` (its sizes are tried one after the other until one fits)."""
    if choice.mode == "smallest" or (choice.mode == "fixed" and ev.layout.dp % choice.cp):
        return []
    sizes, schedules = _sizes_and_schedules(ev, choice)
    return [
        (name, at, sch, 0) for k in sizes for at, sch in _first_pass(ev, name, k, schedules, choice)
    ]


def _sizes_and_schedules(ev: Evaluator, choice: BaselineConfig) -> tuple[list[int], list[str]]:
    """The static CP sizes and the schedules ``choice`` searches."""
    sizes = cp_sizes(ev.layout.dp) if choice.mode != "fixed" else [choice.cp]
    best_pp = choice.mode == "best" and ev.layout.pp > 1
    return sizes, ["1f1b", "interleaved"] if best_pp else [ev.config.pipeline.schedule]


def _first_pass(
    ev: Evaluator, name: str, k: int, schedules: list[str], choice: BaselineConfig
) -> list[tuple[Setup, str]]:
    """The configurations screened first at CP size ``k``: each schedule, and with ``best``
    for :data:`CROSS_SCHEDULE` the 1F1B plan under the interleaved schedule too."""
    out = [(Setup(k), sch) for sch in schedules]
    if name in CROSS_SCHEDULE and choice.mode == "best" and ev.layout.pp > 1:
        out += [(Setup(k, plan_schedule="1f1b"), s) for s in schedules if s != "1f1b"]
    return out


def _microbatch_bases(screened: list[Screened]) -> list[tuple[Setup, str]]:
    """Where the micro-batch search starts: the :data:`ROW_CANDIDATES` fastest configurations
    whose plan is solved for the schedule simulated, and the fastest of those whose plan is
    1F1B's under another schedule or runs 1F1B (the search before plans depended on the
    schedule), so the search never does worse than that one."""
    own = [(at, sch) for _t, at, sch in sorted(screened) if not at.plan_schedule]
    cross = [(at, sch) for _t, at, sch in sorted(screened) if at.plan_schedule or sch == "1f1b"]
    out = own[:ROW_CANDIDATES]
    return out + [c for c in cross[:ROW_CANDIDATES] if c not in out]


ROW_CANDIDATES = 3
"""Row lengths are searched at the best ``(k, schedule)`` configurations of the first pass (and
the shorter rows at every one over the memory cap at the default row)."""

MIN_ROW = 4096
"""The shortest row a search halves down to below ``cap / 2`` (:meth:`Evaluator.rows`,
:func:`slimdata.sim.compare.cp_free_rows`): Megatron's packed (THD) path runs any row that
holds the longest document; shorter micro-batches than this run a GPU's matrix products at
low efficiency, which the analytic cost model does not price."""

MICROBATCH_SEARCH: tuple[str, ...] = ("slimpack",)
"""Strategies that choose their own micro-batches per pipeline (estimated for the schedule
they are solved for, without communication): with ``best`` and ``pp > 1`` the search also
asks them for 2x and 4x their choice at the best configurations of the first pass (an
interleaved schedule keeps more micro-batches in flight than the planner's 1F1B memory check
counts, so it may fit only with more, smaller ones, and more may shrink the bubble); also
where its own choice is over the memory cap."""

CROSS_SCHEDULE: tuple[str, ...] = ("slimpack",)
"""Strategies of :data:`PLANS_BY_SCHEDULE` whose 1F1B plan is also run under the interleaved
schedule (with ``best``): its estimate has no communication and 1F1B's memory, so the plan for
1F1B is at times the faster one interleaved (measured on the fair study's 512K wikipedia
cells: 150.3 s vs 156.2 s at DP 8 x PP 8)."""

PLANS_BY_SCHEDULE: tuple[str, ...] = ("slimpack",)
"""Strategies whose plan depends on the pipeline schedule (``Layout.schedule``: slimpack
chooses its pack count and lag by the schedule's critical path): with ``pp > 1`` they are
solved once per schedule they are simulated under; every other strategy once for all."""

MICROBATCH_FACTORS = (2, 4)

OVER_MEMORY = "needs "
"""How a screening result over the memory cap starts."""

Wanted = tuple[str, Setup, str, int]
"""A plan and simulation the search will (or may) ask for: strategy, setup, schedule, step."""

Screened = tuple[float, Setup, str]
"""A screened configuration: first-step time, setup, schedule."""


def _try(ev: Evaluator, name: str, at: Setup, sch: str, screened: list[Screened]) -> str:
    """Screen one configuration into ``screened``; why it does not fit, or ``""``."""
    t = _screen(ev, name, at, sch)
    tried = {
        "strategy": name,
        "cp": at.cp,
        "row": at.row,
        "microbatches": at.microbatches,
        "schedule": sch,
        "first_step": t,
    }
    if at.plan_schedule:  # a plan solved for another schedule than the one simulated
        tried["plan_schedule"] = at.plan_schedule
    ev.log.tried.append(tried)
    if isinstance(t, str):
        return t
    screened.append((t, at, sch))
    return ""


def _try_rows(ev: Evaluator, name: str, k: int, sch: str, screened: list[Screened]) -> None:
    """The other row lengths at ``(k, sch)``: shorter first; longer ones in increasing order
    until one does not fit or is slower than the one before (activation memory and the
    per-device pack grow with the row), none where the default row is over the memory cap."""
    cap = ev.layout.token_cap
    prev = next((t for t, at, ss in screened if (at, ss) == (Setup(k), sch)), None)
    for row in ev.rows(k):
        if row == 0:
            continue
        if prev is None and row > cap:
            break
        n = len(screened)
        fails = _try(ev, name, Setup(k, row), sch, screened)
        if row < cap:
            continue
        if prev is None or fails or screened[n][0] > prev:
            break
        prev = screened[n][0]


def _try_microbatches(
    ev: Evaluator, name: str, at: Setup, sch: str, screened: list[Screened]
) -> None:
    """:data:`MICROBATCH_FACTORS` times the micro-batches ``name`` chose at ``(at, sch)``, in
    increasing order until one does not fit or is slower than the one before (where its own
    choice did not fit, until one fits and then as before)."""
    prev = next((t for t, a, ss in screened if (a, ss) == (at, sch)), float("inf"))
    for more, _sch, _step in _more_microbatches(ev, name, at, sch):
        n = len(screened)
        if any(a == more and ss == sch for _t, a, ss in screened):
            continue
        fails = _try(ev, name, more, sch, screened)
        if fails.startswith(OVER_MEMORY) and prev == float("inf"):
            continue
        if fails or screened[n][0] > prev:
            break
        prev = screened[n][0]


def _more_microbatches(
    ev: Evaluator, name: str, at: Setup, sch: str
) -> list[tuple[Setup, str, int]]:
    """The first steps :func:`_try_microbatches` may screen at ``(at, sch)``: its
    :data:`MICROBATCH_FACTORS` times the micro-batches ``name`` chose there (its plan of
    ``at.plan_schedule``), in order."""
    chosen = len(ev.plan(name, at, 0, sch)[0].ranks[0].forward)
    return [
        (Setup(at.cp, at.row, factor * chosen, at.plan_schedule), sch, 0)
        for factor in MICROBATCH_FACTORS
    ]


def _smallest(ev: Evaluator, name: str, sizes: list[int]) -> Run | str:
    """The smallest ``k`` that fits every step, with the user's schedule."""
    why = ""
    for k in sizes:
        ev.log.screened += 1
        try:
            run = ev.run(name, Setup(k), ev.config.pipeline.schedule)
        except PlanError as exc:
            why = str(exc)
            continue
        if isinstance(run, Run):
            return run
        why = run
    return _no_fit(ev, sizes[-1], why)


def _first_that_fits(
    ev: Evaluator, name: str, ranked: list[Screened], why: str, largest: int
) -> Run | str:
    """Of the screened configurations, fastest first, the first that fits every step (with
    several steps, or a stream strategy, whose run adds flush iterations to the steps, the
    first :data:`FINALISTS` that do), each run on every step: the lowest time per step over
    the run (ties: the faster screen)."""
    finalists: list[Run] = []
    wanted = FINALISTS if len(ev.batches) > 1 or ev.streams(name) else 1
    steps = range(1, len(ev.batches))  # the screen ran the first
    ev.prefetch([(name, at, sch, s) for _t, at, sch in ranked[:wanted] for s in steps])
    for _t, at, sch in ranked:
        try:
            run = ev.run(name, at, sch)
        except PlanError as exc:
            run = str(exc)
        if isinstance(run, Run):
            finalists.append(run)
            if len(finalists) == wanted:
                break
        else:
            why = run
    if finalists:
        return min(finalists, key=lambda r: r.step_time)
    return _no_fit(ev, largest, why)


FINALISTS = 6
"""Screened configurations run on every step at most when there are several steps: the first
step alone may rank them otherwise than the run does."""


def _no_fit(ev: Evaluator, largest: int, why: str) -> str:
    """One line: what did not fit, and what to change."""
    budget = budget_text(ev.layout.memory_gib, ev.memory_budget)
    recompute = "" if ev.cost.recompute == "full" else "use --recompute full, "
    return (
        f"does not fit {budget} even with static CP {largest} ({why}); "
        f"raise --memory-gib, {recompute}a larger --pp or a smaller --context"
    )

"""The configuration search's solves and simulations, computed ahead on worker processes.

The search (:mod:`slimdata.sim.search`) walks configurations one after the other, each step
deciding the next; what it will certainly ask for next (every configuration of the first
pass, the finalists' other steps) and what it will likely ask for (the row lengths and
micro-batch counts it tries in turn) is handed to a pool of worker processes first
(:meth:`~slimdata.sim.search.Evaluator.prefetch`). Each worker solves a plan and simulates it
under the schedules asked for, exactly as the search would; the search then reads the results
from its caches. The choices are the same for any number of workers (the same deterministic
solve and simulation of the same inputs, only elsewhere); what the log counts may grow by the
speculative ones.

Workers are started with ``spawn`` (no state copied from the parent), ignore Ctrl-C (the
parent handles it and stops them) and die with their parent, ``kill -9`` included
(:func:`slimdata.orphans.die_with_parent`). While they run, SIGTERM ends the parent as
Ctrl-C does (exit status 143), so it stops them and leaves nothing behind. A worker that
dies (killed, out of memory) does not stop the search: the pool is given up and the search
computes what it asks for itself.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from slimdata.cost import CostModel
from slimdata.orphans import exit_on_sigterm
from slimdata.plan import Document, StepPlan
from slimdata.plan.pipeline import chunk_fractions
from slimdata.sim.config import SimConfig
from slimdata.sim.results import SimResult
from slimdata.sim.step import simulate_step
from slimdata.solver.layout import Layout

__all__ = ["POOL_TOKENS", "WorkerPool", "cannot_fit", "default_jobs", "solve_timed"]

POOL_TOKENS = 1 << 20
"""Workers are used only for batches of at least this many tokens: below it a configuration
solves and simulates in milliseconds, less than a worker takes to start."""

MAX_DEFAULT_JOBS = 8
"""``simulate``'s default ``--jobs``: the usable cores, at most this many."""


def default_jobs() -> int:
    """The cores this process may run on, at most :data:`MAX_DEFAULT_JOBS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_DEFAULT_JOBS, cores))


def cannot_fit(plan: StepPlan, k: int, cost: CostModel, layout: Layout) -> bool:
    """The plan's largest pack alone, at the smallest pipeline stage's share of the layers and
    split over ``k`` static-CP devices, is over the memory cap: a necessary condition for the
    simulated peak, so the search prunes such a configuration without simulating it."""
    most = max((p.tokens for rs in plan.ranks for p in (*rs.forward, *rs.backward)), default=0)
    share = float(min(chunk_fractions(cost.layers, layout.pp)))
    return cost.act_bytes_per_token * most * share / k > layout.memory_bytes


def solve_timed(
    solve: Callable[..., StepPlan],
    batch: Sequence[Document],
    layout: Layout,
    name: str,
    seed: int,
    cost: CostModel,
    step: int,
) -> tuple[StepPlan, float]:
    """``name``'s plan of ``batch`` as the search solves it (unvalidated: the simulator reads
    it) and the milliseconds it took."""
    t0 = time.perf_counter()
    plan = solve(batch, layout, name, seed, cost, step=step, validate=False)
    return plan, (time.perf_counter() - t0) * 1e3


@dataclass(frozen=True)
class Task:
    """One plan to solve (or the one already solved) and the schedules to simulate it under."""

    solve: Callable[..., StepPlan]
    batch: Sequence[Document]
    plan_layout: Layout
    """The layout the plan is solved for (:meth:`~slimdata.sim.search.Evaluator.layout_for`)."""
    name: str
    seed: int
    cost: CostModel
    step: int
    layout: Layout
    """The simulated devices' layout (the search's own)."""
    configs: tuple[SimConfig, ...]
    prune: int
    """Static CP size to apply :func:`cannot_fit` with (0: simulate whatever the plan)."""
    plan: StepPlan | None = None


@dataclass(frozen=True)
class Done:
    """A task's results: the plan and its solve milliseconds, or why it does not solve; per
    config, its simulation, why it failed, or None where :func:`cannot_fit` pruned it."""

    plan: StepPlan | None
    solve_ms: float
    error: Exception | None
    """Why the plan does not solve: a :class:`~slimdata.errors.PlanError`, or an unexpected
    error, which the search does not keep (it meets it again only if it asks for that plan
    itself)."""
    sims: tuple[SimResult | Exception | None, ...]
    solved: bool
    """Whether the worker solved the plan (not handed one)."""


def run_task(task: Task) -> Done:
    """Solve and simulate one :class:`Task` as the search would."""
    plan, ms, solved = task.plan, 0.0, task.plan is None
    if plan is None:
        try:
            plan, ms = solve_timed(
                task.solve,
                task.batch,
                task.plan_layout,
                task.name,
                task.seed,
                task.cost,
                task.step,
            )
        except Exception as exc:  # the parent decides what it means (Done.error)
            return Done(None, 0.0, exc, (), True)
    if task.prune and cannot_fit(plan, task.prune, task.cost, task.layout):
        return Done(plan, ms, None, (None,) * len(task.configs), solved)
    sims: list[SimResult | Exception | None] = []
    for cfg in task.configs:
        try:
            sims.append(simulate_step(plan, task.cost, task.layout, cfg).summary())
        except Exception as exc:
            sims.append(exc)
    return Done(plan, ms, None, tuple(sims), solved)


MANAGER_JOIN_SECONDS = 10.0
"""The longest :meth:`WorkerPool.close` waits for the executor's manager thread to end once
its workers are killed (it ends at once; the bound only keeps a stuck one from holding the
command)."""


def _start_worker(parent: int) -> None:
    """A worker ignores Ctrl-C (its parent stops it) and ends with its parent. It starts with
    Ctrl-C held back (:func:`_spawning`); once ignored, a Ctrl-C held since is dropped."""
    from slimdata.orphans import die_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    die_with_parent(parent)


@contextlib.contextmanager
def _spawning() -> Iterator[None]:
    """Ctrl-C held back while this thread may spawn workers. A terminal's Ctrl-C reaches the
    whole process group, and a worker still importing, before :func:`_start_worker` ignores
    it, would die of it with a traceback: the spawning thread blocks SIGINT, and a spawned
    process inherits that (:func:`_start_worker` then drops it). Another thread of this
    process (a BLAS pool's) may still take the signal, and Python would raise
    KeyboardInterrupt in the middle of a spawn, leaving the worker without its start data:
    in the main thread a Ctrl-C of that moment is only noted, and raised again after."""
    noted: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    handler = (
        signal.signal(signal.SIGINT, lambda signum, _f: noted.append(signum)) if main else None
    )
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        if main:
            signal.signal(signal.SIGINT, handler)
            if noted:
                signal.raise_signal(signal.SIGINT)  # as the handler before would have it


class WorkerPool:
    """``jobs`` spawned worker processes, started on first use; :meth:`close` stops them."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.broken = False
        """A worker died: the pool is closed and used no more."""
        self._executor: ProcessPoolExecutor | None = None
        self._on_term: Any = None
        """SIGTERM's handler before the workers started (restored by :meth:`close`)."""

    def run(self, tasks: Sequence[Task]) -> list[Done] | None:
        """Every task's :class:`Done`, in order; None when a worker died (the pool is then
        :attr:`broken`)."""
        if self.broken:
            return None
        if self._executor is None:
            if threading.current_thread() is threading.main_thread():
                self._on_term = signal.signal(signal.SIGTERM, exit_on_sigterm)
            self._executor = ProcessPoolExecutor(
                self.jobs,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(os.getpid(),),
            )
        try:
            with _spawning():  # map submits every task at once: the workers start here
                done = self._executor.map(run_task, tasks)
            return list(done)
        except BrokenProcessPool:
            self.broken = True
            self.close()
            return None

    def close(self) -> None:
        """Stop the workers at once (whatever they still run is no longer wanted)."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        if self._on_term is not None:
            signal.signal(signal.SIGTERM, self._on_term)
            self._on_term = None
        # the executor has no public way to stop a running worker: its processes, by hand
        workers = list((executor._processes or {}).values())
        tasks = getattr(executor, "_call_queue", None)  # shutdown lets go of it
        manager = getattr(executor, "_executor_manager_thread", None)
        if tasks is not None:
            # tasks still on their way to the killed workers are dropped: the queue's feeder
            # thread, blocked on a full pipe nobody reads, would hold the exit (and the
            # executor's manager thread, which joins it) forever
            tasks.cancel_join_thread()
        executor.shutdown(wait=False, cancel_futures=True)
        for p in workers:
            p.kill()
        for p in workers:
            p.join()
        if manager is not None:
            # the manager thread closes its wake-up pipe as it ends; at interpreter exit
            # concurrent.futures wakes every manager thread still known to it, and one that
            # closes the pipe in that moment makes the exit print an OSError traceback
            # (Python 3.11): ended here, it is closed before the exit looks at it
            manager.join(timeout=MANAGER_JOIN_SECONDS)

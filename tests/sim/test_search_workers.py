"""The configuration search with worker processes (``simulate --jobs``): the same choices,
times and search record as without them."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading

import numpy as np

from slimdata.cost import CostModel
from slimdata.docsource import documents_from_lengths
from slimdata.sim import SimConfig
from slimdata.sim.compare import compare_strategies
from slimdata.sim.prefetch import POOL_TOKENS
from slimdata.sim.search import BaselineConfig, Evaluator, Run, search
from slimdata.solver import Layout


def _docs(seed: int, n: int):
    """``n`` documents of lognormal lengths (median about 1.9K tokens), at most 32K."""
    rng = np.random.default_rng(seed)
    return documents_from_lengths(
        np.minimum(rng.lognormal(7.5, 1.3, n).astype(int) + 64, 32768).tolist()
    )


def test_workers_give_the_same_comparison():
    docs = _docs(3, 1400)
    tokens = POOL_TOKENS + 65536  # steps of about 1M tokens: the workers are used
    kw = dict(
        strategies=["slimpack", "bfd", "dcp", "wlb"],
        steps=2,
        global_batch_tokens=tokens,
        config=SimConfig(),
    )
    layout = Layout(dp=8, pp=2, memory_gib=30, context=32768)
    cost = CostModel.analytic("llama-8b", "h100", "full")
    alone = compare_strategies(docs, layout, cost, jobs=1, **kw)
    workers = compare_strategies(docs, layout, cost, jobs=2, **kw)
    for name, r in alone.results.items():
        w = workers.results[name]
        assert dataclasses.replace(w, solve_ms=r.solve_ms) == r, name
    assert (alone.search["workers"], workers.search["workers"]) == (0, 2)
    assert workers.search["tried"] == alone.search["tried"]
    assert workers.search["configurations"] == alone.search["configurations"]
    # the workers solve and simulate ahead, some of it the search never asks for
    assert workers.search["simulations"] >= alone.search["simulations"]
    assert workers.search["solves"] >= alone.search["solves"]


def _dying_solve(*args, **kwargs):
    """The registry's solve, except that a worker process kills itself (as the kernel's
    out-of-memory killer would)."""
    from slimdata.solver.registry import solve

    if os.getpid() != int(os.environ["SLIMDATA_TEST_PARENT"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return solve(*args, **kwargs)


def _bfd_search(how, jobs: int) -> tuple[Run | str, Evaluator]:
    """bfd's configuration search over one batch of about 1M tokens, solving with ``how``."""
    from slimdata.solver import STREAMS

    batches = [_docs(5, 900)]
    assert sum(d.length for d in batches[0]) >= POOL_TOKENS  # the workers are used
    layout = Layout(dp=8, memory_gib=30, context=32768)
    cost = CostModel.analytic("llama-8b", "h100", "full")
    ev = Evaluator(batches, layout, cost, SimConfig(), 0, how, STREAMS, jobs=jobs)
    try:
        return search(ev, "bfd", BaselineConfig("best"), rows=True), ev
    finally:
        ev.close()


def test_a_worker_that_dies_leaves_the_search_to_the_parent(monkeypatch):
    from slimdata.solver import solve

    monkeypatch.setenv("SLIMDATA_TEST_PARENT", str(os.getpid()))
    alone, _ev = _bfd_search(solve, 1)
    after, ev = _bfd_search(_dying_solve, 2)
    assert ev.log.workers == 0  # the pool broke before it delivered anything
    assert ev.pool is not None and ev.pool.broken
    assert isinstance(alone, Run) and isinstance(after, Run)
    assert (after.cp, after.row, after.step_time) == (alone.cp, alone.row, alone.step_time)


def test_a_closed_pool_leaves_no_thread_of_its_executor_running():
    # a manager thread still ending when the interpreter exits can make the exit print an
    # OSError traceback (Python 3.11's concurrent.futures; seen after Ctrl-C in `simulate
    # --jobs 2`): closing the pool ends it
    from concurrent.futures.process import _ExecutorManagerThread

    from slimdata.solver import solve

    _run, ev = _bfd_search(solve, 2)
    assert ev.log.workers == 2
    assert not [t for t in threading.enumerate() if isinstance(t, _ExecutorManagerThread)]


def test_a_comparison_whose_worker_died_says_so(monkeypatch):
    monkeypatch.setenv("SLIMDATA_TEST_PARENT", str(os.getpid()))
    monkeypatch.setattr("slimdata.solver.solve", _dying_solve)
    docs = _docs(5, 900)
    layout = Layout(dp=8, memory_gib=30, context=32768)
    cost = CostModel.analytic("llama-8b", "h100", "full")
    kw = dict(strategies=["bfd"], global_batch_tokens=POOL_TOKENS + 65536)
    died = compare_strategies(docs, layout, cost, jobs=2, **kw)
    alone = compare_strategies(docs, layout, cost, jobs=1, **kw)
    assert [w for w in died.warnings if "worker" in w] == [
        "a worker process of the configuration search died (killed, or out of memory?); "
        "the search went on without workers, with the same results (--jobs 1 runs none)"
    ]
    assert not [w for w in alone.warnings if "worker" in w]
    assert died.results["bfd"].step_time == alone.results["bfd"].step_time


def test_a_configuration_is_screened_and_simulated_once(monkeypatch):
    # slimpack's fastest first-pass configurations here are its interleaved plan and its 1F1B
    # plan, both run interleaved at cp 1: one CP size and schedule, whose rows are screened
    # once, each simulation handed to one worker once
    from slimdata.sim import prefetch
    from slimdata.solver import STREAMS, solve

    handed: list[tuple] = []
    run = prefetch.WorkerPool.run

    def recording(self, tasks):
        for t in tasks:
            lay = t.plan_layout
            for config in t.configs:
                key = (t.name, lay.cp, lay.pack_tokens, lay.microbatches, lay.schedule)
                handed.append((*key, t.step, config.schedule))
        return run(self, tasks)

    monkeypatch.setattr(prefetch.WorkerPool, "run", recording)
    batch = _docs(3, 700)
    assert sum(d.length for d in batch) >= POOL_TOKENS
    layout = Layout(dp=8, pp=2, memory_gib=30, context=32768, mode="lockstep")
    cost = CostModel.analytic("llama-8b", "h100", "full")
    for jobs in (1, 2):
        handed.clear()
        ev = Evaluator([batch], layout, cost, SimConfig(), 0, solve, STREAMS, jobs=jobs)
        try:
            search(ev, "slimpack", BaselineConfig("best"), rows=True)
        finally:
            ev.close()
        tried = [tuple(sorted(t.items())) for t in ev.log.tried]
        assert len(tried) == len(set(tried)), jobs
        assert any(t.get("row") for t in ev.log.tried)  # guard: rows were screened
        assert len(handed) == len(set(handed)), jobs
        assert ev.log.simulations == len(ev._sims), jobs
    assert handed  # guard: the workers ran


def _failing_solve(*args, **kwargs):
    """The registry's solve, except that in a worker process it fails unexpectedly."""
    from slimdata.solver.registry import solve

    if os.getpid() != int(os.environ["SLIMDATA_TEST_PARENT"]):
        raise ValueError("unexpected")
    return solve(*args, **kwargs)


def test_an_unexpected_error_on_a_worker_is_met_only_where_the_search_asks(monkeypatch):
    # the workers compute ahead, some of it the search never asks for: an error there must
    # not stop a search that runs without workers; what it does ask for it computes itself
    from slimdata.solver import solve

    monkeypatch.setenv("SLIMDATA_TEST_PARENT", str(os.getpid()))
    alone, _ev = _bfd_search(solve, 1)
    after, _ev = _bfd_search(_failing_solve, 2)
    assert isinstance(alone, Run) and isinstance(after, Run)
    assert (after.cp, after.row, after.step_time) == (alone.cp, alone.row, alone.step_time)

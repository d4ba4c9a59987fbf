"""`slimdata build` as one library call: plan tasks, run them (in parallel, or on Ray), merge.

Determinism: tasks are planned from the inputs and options alone; each task is processed
independently into its own sub-directory; the merge concatenates tasks in plan order. So the
same inputs and options give byte-identical output for any ``workers``, on either engine
(:mod:`~slimdata.ingest.ray_engine`) and after any number of crash-and-resume cycles (with one
exception: streaming's ``gz`` shard compression stamps the current time into every shard;
use ``zstd`` or ``br`` for reproducible bytes).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from slimdata import __version__
from slimdata.columns import COLUMNS
from slimdata.corpus import DEFAULT_CORPUS_SOURCE, corpus_info, default_corpus_config
from slimdata.cost import CostModel, resolve_cost_model
from slimdata.cost.costmodel import Recompute
from slimdata.errors import ConfigError, InputError, SlimdataError
from slimdata.ingest.config import COMPRESSIONS, HASHES, BuildConfig
from slimdata.ingest.output import (
    BUILD_PLAN_FORMAT,
    SIDECAR_NAME,
    discard_failed,
    finalize,
    output_lock,
    prepare_output,
)
from slimdata.ingest.task import (
    QUARANTINE_NAME,
    TaskJob,
    TaskResult,
    cached_tokenizer,
    collect_task,
    load_result,
    run_task,
    task_dir,
    write_task,
)
from slimdata.orphans import die_with_parent
from slimdata.readers import ReadTask, _matches, input_stamps, plan_inputs
from slimdata.tokenize import TextTokenizer
from slimdata.units import plural

__all__ = ["IN_FLIGHT_BYTES", "BuildSummary", "build", "plan_build", "require_ray"]

IN_FLIGHT_BYTES = 512 << 20
"""Cap on the input bytes of the tasks a parallel build has handed to workers but not yet
written (their tokens wait in memory, about one byte per input byte for code and prose)."""


@dataclass(frozen=True, kw_only=True)
class BuildSummary:
    """What a build did (counts come from the sidecar; timings are informational)."""

    output: Path
    sidecar: dict[str, Any]
    tasks_run: int
    tasks_resumed: int
    seconds: float

    @property
    def counts(self) -> dict[str, int]:
        return self.sidecar["counts"]


def _check_writer_options(config: BuildConfig) -> None:
    if config.compression is not None and config.compression not in COMPRESSIONS:
        raise ConfigError(
            f"compression={config.compression!r} is unknown; use one of zstd, zstd:<1-22>, br, bz2, snappy, gz"
        )
    bad = sorted(set(config.hashes) - HASHES)
    if bad:
        raise ConfigError(f"hashes {bad} are unknown; use any of {', '.join(sorted(HASHES))}")


def require_ray() -> None:
    """Fail with a clear message (not a traceback) when the ``ray`` extra is missing."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"--engine ray needs Ray Data, which is not installed ({exc}); "
            "install the extra with `pip install 'slimdata[ray]'`, or use --engine local"
        ) from None


def plan_build(
    config: BuildConfig,
) -> tuple[BuildConfig, TextTokenizer, CostModel, list[ReadTask], dict[str, Any]]:
    """Resolve the corpus, tokenizer and cost model and plan the tasks (reads no text)."""
    if not config.inputs:
        config = config.replace(**default_corpus_config())
    tokenizer = cached_tokenizer(config.tokenizer, config.eos_token)
    cost_model = resolve_cost_model(
        config.model, config.device, cast(Recompute, config.recompute), config.cost_profile
    )
    tasks = plan_inputs(
        config.inputs,
        opts=config.read_options,
        fmt=config.format,
        include=config.include,
        exclude=config.exclude,
        task_bytes=config.task_bytes,
        source=config.source,
    )
    plan = {
        "slimdata_build_plan": BUILD_PLAN_FORMAT,
        "config": config.output_dict(),
        "tokenizer": tokenizer.to_dict(),
        "cost_model": cost_model.to_dict(),
        "tasks": [t.to_dict() for t in tasks],
        "inputs": input_stamps(tasks),
    }
    return config, tokenizer, cost_model, tasks, plan


def _sidecar(
    config: BuildConfig,
    default_corpus: bool,
    tokenizer: TextTokenizer,
    cost_model: CostModel,
    tasks: list[ReadTask],
) -> dict[str, Any]:
    return {
        "slimdata_version": __version__,
        "format": "slimdata.documents",
        "format_version": 1,
        "columns": COLUMNS,
        "tokenizer": {"spec": config.tokenizer, **tokenizer.to_dict()},
        "model": config.cost_profile or config.model,
        "device": config.device,
        "recompute": config.recompute,
        "cost_model": cost_model.to_dict(),
        "slice_tokens": config.slice_tokens,
        "truncate": config.truncate,
        "compression": config.compression,
        "hashes": list(config.hashes),
        "size_limit": config.size_limit,
        "sources": sorted({t.source for t in tasks}),
        "corpus": corpus_info() if default_corpus else None,
        "quarantine": QUARANTINE_NAME,
    }


def _warm_imports() -> None:
    """Import the writer stack (streaming imports torch; pyarrow imports pandas on its first
    array conversion). A parallel build does this while its workers already tokenize."""
    import numpy as np
    import pyarrow as pa

    from slimdata.ingest.mds import writer_class

    writer_class()
    pa.array(np.zeros(1, dtype=np.int64))


def _run_parallel(jobs: list[TaskJob], workers: int, on_done: Callable[[TaskResult], None]) -> None:
    """Prepare tasks on ``workers`` processes, write them here as they finish.

    Workers are forked before the writer stack is imported, so they start tokenizing at
    once while this process imports it (they need neither streaming nor torch). Tasks go
    out largest first, so the shortest are left for the end when cores run out of work.
    Finished, unwritten tasks wait in memory; the input bytes of the tasks in flight are
    capped at :data:`IN_FLIGHT_BYTES` (at least ``3 * workers`` tasks). Output bytes do not
    depend on this order: each task has its own directory. Workers die with this process
    (:func:`~slimdata.orphans.die_with_parent`), ``kill -9`` included.
    """
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    order = sorted(jobs, key=lambda j: (-j.task.size, j.index))
    pending: dict[Future, TaskJob] = {}
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context(method),
        initializer=die_with_parent,
        initargs=(os.getpid(),),
    )

    def fill() -> None:
        while order and (
            len(pending) < 3 * workers
            or sum(j.task.size for j in pending.values()) + order[0].task.size <= IN_FLIGHT_BYTES
        ):
            job = order.pop(0)
            pending[pool.submit(collect_task, job)] = job

    try:
        fill()  # forks all the workers at the first submit
        _warm_imports()
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            finished = sorted(((pending.pop(f), f) for f in done), key=lambda p: p[0].index)
            fill()
            for job, future in finished:
                on_done(write_task(job, future.result()))
    except BrokenProcessPool as exc:
        raise SlimdataError(
            "a build worker died (killed or out of memory); finished tasks are kept: rerun the same command with --resume"
        ) from exc
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _check_output_outside_inputs(config: BuildConfig, output: Path) -> None:
    """The output directory must not lie inside an input directory unless ``--exclude``
    prunes it: a rerun (``--overwrite``, ``--resume``) would read the build's own files."""
    out = output.resolve()
    for spec in config.inputs:
        root = Path(spec)
        if not root.is_dir():
            continue
        root = root.resolve()
        if out != root and root not in out.parents:
            continue
        rel = out.relative_to(root).as_posix()
        if rel != "." and _pruned(rel, config.exclude):
            continue
        hint = f", or add --exclude {rel!r}" if rel != "." else ""
        raise ConfigError(
            f"--output {output} is inside the input directory {spec}: the build would read its "
            f"own files on a rerun; choose an output outside the inputs{hint}"
        )


def _pruned(rel: str, exclude: Sequence[str]) -> bool:
    """Whether the input walk prunes the directory at ``rel``: an ``exclude`` pattern matches
    it or a directory above it (by name or relative path, as the walk matches them)."""
    parts = rel.split("/")
    above = ("/".join(parts[: i + 1]) for i in range(len(parts)))
    return any(_matches(d, exclude) for d in above)


def build(
    config: BuildConfig,
    output: str | Path,
    *,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = False,
) -> BuildSummary:
    """Tokenize, slice and cost-annotate ``config.inputs`` into document shards at ``output``.

    ``resume`` keeps the finished tasks of an interrupted build with the same plan and redoes
    the rest; ``overwrite`` discards a previous build. Raises :class:`InputError` when no
    document survives (``output`` then holds only the quarantine file, which says why),
    :class:`OutputExistsError` while another build holds ``output`` (see
    :func:`~slimdata.ingest.output.output_lock`). A ``ray`` build connects to its cluster
    before it touches ``output`` (:class:`ConfigError` when out of reach).
    """
    start = time.perf_counter()
    default_corpus = not config.inputs or config.source == DEFAULT_CORPUS_SOURCE
    _check_writer_options(config)
    _check_output_outside_inputs(config, Path(output))
    if config.engine == "ray":
        require_ray()
    config, tokenizer, cost_model, tasks, plan = plan_build(config)
    output = Path(output)
    with _engine_session(config, progress), output_lock(output):
        prepare_output(output, plan, overwrite=overwrite, resume=resume)
        return _build_locked(
            config,
            output,
            tasks,
            _sidecar(config, default_corpus, tokenizer, cost_model, tasks),
            cost_model=cost_model,
            progress=progress,
            start=start,
        )


def _engine_session(config: BuildConfig, progress: bool) -> contextlib.AbstractContextManager:
    """The Ray session of a ``ray`` build, connected before the output directory is touched
    so that a cluster out of reach fails with nothing written; nothing for the local engine."""
    if config.engine != "ray":
        return contextlib.nullcontext()
    from slimdata.ingest.ray_engine import ray_session

    return ray_session(config.ray_address, quiet=not progress)


def _finished_tasks(output: Path, count: int) -> dict[int, TaskResult]:
    """Results of the tasks an earlier run finished; half-written ``.partial`` ones go."""
    for stale in list(output.glob("task-*.partial")):
        shutil.rmtree(stale)
    results: dict[int, TaskResult] = {}
    for i in range(count):
        done = load_result(task_dir(output, i))
        if done is not None:
            results[i] = done
    return results


def _build_locked(
    config: BuildConfig,
    output: Path,
    tasks: list[ReadTask],
    sidecar: dict[str, Any],
    *,
    cost_model: CostModel,
    progress: bool,
    start: float,
) -> BuildSummary:
    """The tasks of a planned build into a prepared, locked ``output``; then the merge."""
    results = _finished_tasks(output, len(tasks))
    resumed = len(results)
    todo = [i for i in range(len(tasks)) if i not in results]
    on_ray = config.engine == "ray" and bool(todo)
    parallel = on_ray or (config.workers > 1 and len(todo) > 1)
    jobs = [
        TaskJob(
            index=i,
            task=tasks[i],
            output=str(output),
            config=config,
            cost_model=cost_model,
            single_thread=parallel,  # a serial build gives the tokenizer every core
        )
        for i in todo
    ]
    _run_jobs(jobs, tasks, results, config, progress=progress, on_ray=on_ray, parallel=parallel)
    sidecar = _merge(output, [results[i] for i in range(len(tasks))], sidecar)
    return BuildSummary(
        output=output,
        sidecar=sidecar,
        tasks_run=len(jobs),
        tasks_resumed=resumed,
        seconds=time.perf_counter() - start,
    )


def _run_jobs(
    jobs: list[TaskJob],
    tasks: list[ReadTask],
    results: dict[int, TaskResult],
    config: BuildConfig,
    *,
    progress: bool,
    on_ray: bool,
    parallel: bool,
) -> None:
    """Run ``jobs`` on Ray, on ``config.workers`` processes or here, one after the other;
    each result goes into ``results`` (task index -> result) as it arrives, and a progress
    bar counts the input bytes of the finished tasks (resumed ones included): on a terminal a
    tqdm bar; when standard error is a file or a pipe (a job's log), one plain line at most
    every :data:`LOG_PROGRESS_SECONDS` (tqdm's redrawn line would fill the log with carriage
    returns)."""
    from tqdm.auto import tqdm

    terminal = sys.stderr.isatty()
    bar = tqdm(
        total=sum(t.size for t in tasks),
        initial=sum(tasks[i].size for i in results),
        unit="B",
        unit_scale=True,
        desc="build",
        disable=not progress or on_ray or not terminal,  # Ray Data shows its own progress
    )
    log = _LogProgress(bar.total, bar.n) if progress and not on_ray and not terminal else None

    def on_done(result: TaskResult) -> None:
        results[result.index] = result
        bar.update(tasks[result.index].size)
        docs = sum(r.documents for r in results.values())
        tokens = sum(r.tokens for r in results.values())
        bar.set_postfix(docs=docs, tokens=tokens)
        if log is not None:
            log.update(tasks[result.index].size, docs, tokens)

    with bar:
        if on_ray:
            from slimdata.ingest.ray_engine import run_tasks

            for result in run_tasks(jobs, address=config.ray_address, progress=progress):
                on_done(result)
        elif parallel:
            _run_parallel(jobs, min(config.workers, len(jobs)), on_done)
        else:
            for job in jobs:
                on_done(run_task(job))


LOG_PROGRESS_SECONDS = 30.0
"""Seconds between two progress lines of a build whose standard error is no terminal."""


class _LogProgress:
    """A build's progress as plain lines on standard error, at most one every
    :data:`LOG_PROGRESS_SECONDS`, and one when the last task finishes:
    ``build: 45% of 66.8MB read, 609 documents, 10,581,652 tokens, 20 s``."""

    def __init__(self, total: float, done: float):
        self.total, self.done = total, done
        self.start = self.last = time.monotonic()

    def update(self, size: float, docs: int, tokens: int) -> None:
        from tqdm import tqdm

        self.done += size
        now = time.monotonic()
        if now - self.last < LOG_PROGRESS_SECONDS and self.done < self.total:
            return
        self.last = now
        share = self.done / self.total if self.total else 1.0
        print(
            f"build: {share:.0%} of {tqdm.format_sizeof(self.total, 'B')} read, "
            f"{plural(docs, 'document')}, "
            f"{plural(tokens, 'token')}, {now - self.start:.0f} s",
            file=sys.stderr,
            flush=True,
        )


def _merge(output: Path, ordered: list[TaskResult], sidecar: dict[str, Any]) -> dict[str, Any]:
    """Merge the finished tasks, in task order, into the build's shards and sidecar; a build
    that wrote no document is an error and leaves only its quarantine file."""
    sidecar = finalize(output, ordered, sidecar)
    rejected = sidecar["counts"]["quarantined"]
    if sidecar["counts"]["documents"] == 0:
        discard_failed(output)
        if not rejected:
            raise InputError("no document was written: the inputs hold no record")
        which = "the only record was" if rejected == 1 else f"all {rejected:,} records were"
        raise InputError(
            f"no document was written: {which} rejected; "
            f"see {output / QUARANTINE_NAME} for the reasons"
        )
    assert (output / SIDECAR_NAME).is_file()
    return sidecar

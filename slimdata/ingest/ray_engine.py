"""The ``ray`` build engine: the planned tasks of a build as Ray Data write tasks.

Nothing about the output changes with the engine. The driver plans the tasks
(:func:`~slimdata.ingest.run.plan_build`), prepares or resumes the output directory and
merges the finished tasks (:func:`~slimdata.ingest.output.finalize`) exactly as the local
build does; only the middle runs on Ray. There each write task of :class:`TaskSink` runs
:func:`~slimdata.ingest.task.run_task` on its jobs: read, tokenize, EOS, slice, cost, and
``streaming.MDSWriter`` into ``task-NNNNN.partial/``, renamed to ``task-NNNNN/`` once its
``done.json`` marker is written. Sub-directories are named by the planned task index (never
by a Ray task or attempt id) and merged in index order, so the bytes do not depend on the
number of workers, on scheduling or on retries.

Faults: Ray retries a task whose worker died (:data:`MAX_RETRIES`); the retry clears the
task's ``.partial`` directory first. If the driver dies, finished task directories stay and
``--resume`` redoes only the rest.

Memory: the dataset holds one row per task (its pickled :class:`TaskJob`, a few KiB); a
worker streams its task batch by batch into the writer, so its memory is bounded by one
tokenizer batch (``batch_chars``) plus the tokenizer and the writer stack (~0.8 GB).

Cluster: with an address (``auto``, ``ray://host:10001``, a GCS ``host:port``) Ray connects
to it, every node needs slimdata installed and the output directory on a shared
filesystem. Without one it connects to ``RAY_ADDRESS`` if set (as under ``ray job
submit``), else starts a local cluster with this machine's cores on loopback and stops it at
the end. If Ray is already initialised in this process, that session is used as is.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import socket
from collections.abc import Iterable, Iterator
from typing import Any

import ray
import ray.data
from ray.data import Datasink
from ray.data.block import Block, BlockAccessor

from slimdata.errors import ConfigError
from slimdata.ingest.task import FAULT_VARIABLES, TaskJob, TaskResult, run_task

__all__ = [
    "CONNECT_SECONDS",
    "LOCAL_OBJECT_STORE_BYTES",
    "MAX_RETRIES",
    "TaskSink",
    "ray_session",
    "run_tasks",
]

MAX_RETRIES = 3
"""Times Ray reruns a task whose worker process died (killed, out of memory, node lost)."""

LOCAL_OBJECT_STORE_BYTES = 256 << 20
"""Object store of a local cluster: only jobs and counts pass through it, never tokens."""

CONNECT_SECONDS = 10.0
"""How long a GCS ``host:port`` may take to accept a TCP connection, and then to answer
(:func:`_check_listening`), before the build gives up."""


class TaskSink(Datasink[list[dict[str, int]]]):
    """Runs the build tasks of the rows it receives; collects their counts on the driver."""

    def __init__(self) -> None:
        self.results: list[TaskResult] = []

    def write(self, blocks: Iterable[Block], ctx: Any) -> list[dict[str, int]]:
        done = []
        for block in blocks:
            for job in BlockAccessor.for_block(block).to_arrow().column("job").to_pylist():
                done.append(run_task(pickle.loads(job)).to_dict())
        return done

    def on_write_complete(self, write_result: Any) -> None:
        self.results = [TaskResult(**r) for rows in write_result.write_returns for r in rows]

    @property
    def min_rows_per_write(self) -> int:
        return 1


@contextlib.contextmanager
def ray_session(address: str | None, quiet: bool = False) -> Iterator[None]:
    """Ray for one build (see the module docstring for how ``address`` resolves);
    ``quiet``: Ray's own lines below errors (starting, connecting, notices) off. A cluster
    that cannot be reached is a :class:`ConfigError`, not a traceback (or minutes of
    retries, for a GCS ``host:port`` where nothing listens)."""
    level = logging.ERROR if quiet else logging.INFO
    if ray.is_initialized():
        yield
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    where = address or os.environ.get("RAY_ADDRESS")
    if where == "auto":  # Ray connects ``auto`` to RAY_ADDRESS when that is set
        _check_listening(os.environ.get("RAY_ADDRESS", "auto"))
    elif where is not None:
        _check_listening(where)
    try:
        if where is None:
            ray.init(
                address="local",
                num_cpus=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                include_dashboard=False,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                _node_ip_address="127.0.0.1",
                log_to_driver=False,
                logging_level=level,
            )
        else:
            ray.init(address=address, log_to_driver=False, logging_level=level)
    except (ConnectionError, ValueError) as exc:
        raise _unreachable(where, exc) from None
    try:
        yield
    finally:
        ray.shutdown()


def _unreachable(address: str | None, why: BaseException | str) -> ConfigError:
    """The error of a Ray cluster at ``address`` that cannot be used, and what to do."""
    text = str(why).strip()
    reason = text.splitlines()[0].rstrip(".") if text else type(why).__name__
    return ConfigError(
        f"--engine ray cannot connect to the Ray cluster at {address}: {reason}; start one "
        "(`ray start --head`) and give its address, or leave --address out and RAY_ADDRESS "
        "unset for a local cluster"
    )


def _check_listening(address: str) -> None:
    """Fail at once when a GCS ``host:port`` accepts no connection, or accepts it but does not
    answer as a GCS does (``ray.init`` would retry either for about ten minutes); ``auto``,
    ``local`` and ``ray://`` addresses pass to Ray. A GCS is a gRPC server: it answers the
    HTTP/2 connection preface with a SETTINGS frame (:func:`_speaks_grpc`); under
    ``RAY_USE_TLS`` it expects TLS first, so only the connection is checked."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or "://" in address:
        return
    try:
        tls = os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")
        with socket.create_connection(
            (host.strip("[]"), int(port)), timeout=CONNECT_SECONDS
        ) as conn:
            if not tls and not _speaks_grpc(conn):
                raise _unreachable(address, "it accepts connections but is not a Ray GCS")
    except TimeoutError:
        raise _unreachable(address, f"no answer in {CONNECT_SECONDS:g} s") from None
    except OSError as exc:
        raise _unreachable(address, exc.strerror or exc) from None


def _speaks_grpc(conn: socket.socket) -> bool:
    """Whether the server on ``conn`` answers the HTTP/2 connection preface with a SETTINGS
    frame, as every gRPC server does (its first 9 bytes: a frame header of type 4)."""
    # the preface, then an empty SETTINGS frame: length 0 (3 bytes), type 4, flags 0, stream 0
    conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
    reply = b""
    while len(reply) < 9:
        chunk = conn.recv(9 - len(reply))
        if not chunk:
            return False
        reply += chunk
    return reply[3] == 4


def _remote_args() -> dict[str, Any]:
    args: dict[str, Any] = {"num_cpus": 1, "max_retries": MAX_RETRIES}
    env = {name: os.environ[name] for name in FAULT_VARIABLES if os.environ.get(name)}
    if env:  # the build's testing hooks reach the workers however the cluster was started
        args["runtime_env"] = {"env_vars": env}
    return args


def run_tasks(jobs: list[TaskJob], *, address: str | None, progress: bool) -> list[TaskResult]:
    """Run ``jobs`` as Ray Data write tasks, one CPU each; their results in index order.

    Jobs go out largest first (as in the local build), so the shortest are left for the
    end when cores run out of work; the order changes only the speed.
    """
    order = sorted(jobs, key=lambda j: (-j.task.size, j.index))
    sink = TaskSink()
    with ray_session(address, quiet=not progress), _progress(progress):
        items = [{"index": j.index, "job": pickle.dumps(j)} for j in order]
        dataset = ray.data.from_items(items, override_num_blocks=len(items))
        dataset.write_datasink(sink, ray_remote_args=_remote_args())
    return sorted(sink.results, key=lambda r: r.index)


@contextlib.contextmanager
def _progress(show: bool) -> Iterator[None]:
    """Ray Data's progress bars and status lines on or off for one build (restored after)."""
    context = ray.data.DataContext.get_current()
    logger = logging.getLogger("ray.data")
    saved = context.enable_progress_bars, logger.level
    context.enable_progress_bars = show
    if not show:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        context.enable_progress_bars = saved[0]
        logger.setLevel(saved[1])

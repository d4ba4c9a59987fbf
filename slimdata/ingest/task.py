"""One build task: read -> stages -> MDS shards in its own sub-directory, then a marker.

A task has two halves: :func:`prepare_task` (read, tokenize, EOS, slice, cost; no
``streaming`` import) and :func:`write_task` (``MDSWriter``, document table, marker). A
serial build runs both in one process, batch by batch (:func:`run_task`); a parallel build
prepares tasks in worker processes and writes them in the parent (see
:mod:`slimdata.ingest.run`). Either way the bytes written are the same.

A task writes into ``task-NNNNN.partial/`` and, once every shard, its document table,
its quarantine file and the ``done.json`` marker are on disk, renames the directory to
``task-NNNNN/`` (an atomic rename). A crash at any point (``kill -9`` included) leaves
either a finished task directory or a ``.partial`` one that a resumed build deletes and
redoes from scratch, so no document is lost or written twice.

Testing hook: ``SLIMDATA_FAULT_KILL=<task>:<docs>`` makes the process preparing task
``task`` SIGKILL itself once it has prepared ``docs`` documents of it: the build process of
a serial build (the task's ``.partial`` directory then exists, earlier batches written), a
worker of a parallel one (used by the crash-resume tests). ``SLIMDATA_FAULT_STALL`` (same
format) makes it wait forever instead (used to kill a build while its workers are busy).
With ``SLIMDATA_FAULT_ONCE=<path>`` the fault fires only in the first process to reach it
(it creates ``path``), so a retried task succeeds (used by the Ray retry test). The ray
engine forwards these variables to its tasks.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from slimdata.columns import COLUMNS
from slimdata.cost import CostModel
from slimdata.ingest.config import BuildConfig
from slimdata.ingest.mds import writer_class
from slimdata.ingest.stages import (
    Document,
    append_eos,
    batch_records,
    make_sample,
    token_digest,
    tokenize_batch,
    truncate_tokens,
)
from slimdata.readers import ReadTask, Rejected, read_task
from slimdata.tokenize import TextTokenizer, load_tokenizer

__all__ = [
    "DOCUMENTS_NAME",
    "DONE_NAME",
    "FAULT_VARIABLES",
    "QUARANTINE_NAME",
    "Chunk",
    "Prepared",
    "TaskJob",
    "TaskResult",
    "collect_task",
    "prepare_task",
    "run_task",
    "task_dir",
    "write_task",
]

DONE_NAME = "done.json"
DOCUMENTS_NAME = "documents.parquet"
QUARANTINE_NAME = "quarantine.jsonl"

_TOKENIZERS: dict[tuple[str, str | None], TextTokenizer] = {}


def task_dir(output: str | Path, index: int, partial: bool = False) -> Path:
    """``output/task-00007`` (or ``task-00007.partial`` while being written)."""
    return Path(output) / (f"task-{index:05d}" + (".partial" if partial else ""))


@dataclass(frozen=True, kw_only=True)
class TaskJob:
    """Everything a worker needs for one task (picklable)."""

    index: int
    task: ReadTask
    output: str
    config: BuildConfig
    cost_model: CostModel
    single_thread: bool = False
    """Run the tokenizer on one thread (set when several worker processes share the cores)."""


@dataclass(frozen=True, kw_only=True)
class TaskResult:
    """Counts of a finished task (also stored in its ``done.json``)."""

    index: int
    documents: int
    tokens: int
    quarantined: int
    truncated_documents: int
    dropped_tokens: int
    slices: int
    input_bytes: int

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def cached_tokenizer(spec: str, eos_token: str | None) -> TextTokenizer:
    """Load a tokenizer once per process (forked workers inherit the parent's copy)."""
    key = (spec, eos_token)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = load_tokenizer(*key)
    return _TOKENIZERS[key]


def _tokenizer(config: BuildConfig, single_thread: bool) -> TextTokenizer:
    """The task's tokenizer; ``single_thread`` in a worker of a parallel build.

    A worker keeps the tokenizer's rayon pool but with one thread (``RAYON_NUM_THREADS``
    is read when the pool starts, at the worker's first encode): encoding on a pool thread
    measured 15-20% less CPU than encoding on the Python main thread with
    ``TOKENIZERS_PARALLELISM=false`` (same tokens). If the pool was already started before
    the fork, ``tokenizers`` itself turns parallelism off in the child (no deadlock).
    """
    if single_thread:
        os.environ["RAYON_NUM_THREADS"] = "1"
    tok = cached_tokenizer(config.tokenizer, config.eos_token)
    tok.threads = 1 if single_thread else 0
    return tok


FAULT_VARIABLES = ("SLIMDATA_FAULT_KILL", "SLIMDATA_FAULT_STALL", "SLIMDATA_FAULT_ONCE")
"""The testing hooks' environment variables (see the module docstring)."""


def _fault_point() -> tuple[int, int, str] | None:
    for name, action in (("SLIMDATA_FAULT_KILL", "kill"), ("SLIMDATA_FAULT_STALL", "stall")):
        spec = os.environ.get(name)
        if spec:
            task, docs = spec.split(":")
            return int(task), int(docs), action
    return None


def _fault(action: str) -> None:
    once = os.environ.get("SLIMDATA_FAULT_ONCE")
    if once:
        try:
            Path(once).touch(exist_ok=False)
        except FileExistsError:
            return  # an earlier attempt already failed here: this one goes on
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # stall: wait for a signal (the test kills the build around us)
        signal.pause()


def _write_documents(path: Path, rows: dict[str, list], source: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cuts = rows["cuts"]
    offsets = np.cumsum([0] + [len(c) for c in cuts], dtype=np.int32)
    values = np.concatenate(cuts) if cuts else np.zeros(0, dtype=np.int64)
    table = pa.table(
        {
            "doc_id": pa.array(rows["doc_id"], pa.string()),
            "source": pa.array([source] * len(cuts), pa.string()),
            "length": pa.array(np.asarray(rows["length"], dtype=np.int64)),
            "cuts": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.astype(np.int64))),
            "digest": pa.array(rows["digest"], pa.binary(32)),
        }
    )
    pq.write_table(table, path)


def _drop_empty_shards(directory: Path) -> None:
    """Remove the 0-sample shard MDSWriter flushes when its first sample exceeds the size
    limit (a stock StreamingDataset divides by zero on it)."""
    index_path = directory / "index.json"
    index = json.loads(index_path.read_text())
    empty = [s for s in index["shards"] if s["samples"] == 0]
    if not empty:
        return
    for shard in empty:
        for key in ("raw_data", "zip_data"):
            if shard.get(key):
                (directory / shard[key]["basename"]).unlink(missing_ok=True)
    index["shards"] = [s for s in index["shards"] if s["samples"] > 0]
    index_path.write_text(json.dumps(index, sort_keys=True))


@dataclass(frozen=True)
class Prepared:
    """A document ready for the writer: its MDS sample and its row of the document table."""

    sample: dict[str, Any]
    cuts: np.ndarray
    digest: bytes
    dropped: int
    """Tokens removed by opt-in truncation."""


Chunk = list[Prepared | Rejected]
"""One tokenizer batch of a task, in input order (rejections included)."""


def prepare_task(job: TaskJob) -> Iterator[Chunk]:
    """Read, tokenize, append EOS, (truncate,) slice and cost one task, batch by batch.

    Needs neither ``streaming`` nor ``pyarrow`` (for text and JSONL inputs), so a worker
    forked before the writer stack is imported starts tokenizing at once.
    """
    cfg = job.config
    tok = _tokenizer(cfg, job.single_thread)
    fault = _fault_point()
    documents = 0
    for batch in batch_records(read_task(job.task, cfg.read_options), cfg.batch_chars):
        chunk: Chunk = []
        for item in tokenize_batch(tok, batch):
            if isinstance(item, Rejected):
                chunk.append(item)
                continue
            tokens, cut = truncate_tokens(append_eos(item.tokens, tok.eos_id), cfg.truncate)
            sample, cuts = make_sample(
                Document(item.doc_id, tokens), job.task.source, cfg.slice_tokens, job.cost_model
            )
            chunk.append(Prepared(sample, cuts, token_digest(item.doc_id, tokens), cut))
            documents += 1
            if fault and fault[:2] == (job.index, documents):
                _fault(fault[2])
        yield chunk


def collect_task(job: TaskJob) -> list[Chunk]:
    """:func:`prepare_task` materialized (what a worker process sends to the writer)."""
    return list(prepare_task(job))


def write_task(job: TaskJob, chunks: Iterable[Chunk]) -> TaskResult:
    """Write prepared chunks of one task into ``task-NNNNN/`` (see the module docstring)."""
    cfg = job.config
    final, partial = task_dir(job.output, job.index), task_dir(job.output, job.index, partial=True)
    shutil.rmtree(partial, ignore_errors=True)
    rows: dict[str, list] = {"doc_id": [], "length": [], "cuts": [], "digest": []}
    quarantined = truncated = dropped = slices = 0
    writer = writer_class()(
        out=str(partial),
        columns=COLUMNS,
        compression=cfg.compression,
        hashes=list(cfg.hashes) or None,
        size_limit=cfg.size_limit,
    )
    with writer, open(partial / QUARANTINE_NAME, "w", encoding="utf-8") as quarantine:
        for chunk in chunks:
            for item in chunk:
                if isinstance(item, Rejected):
                    entry = {
                        "doc_id": item.doc_id,
                        "source": job.task.source,
                        "reason": item.reason,
                        "excerpt": item.excerpt,
                    }
                    quarantine.write(json.dumps(entry, ensure_ascii=False) + "\n")
                    quarantined += 1
                    continue
                writer.write(item.sample)
                truncated += item.dropped > 0
                dropped += item.dropped
                rows["doc_id"].append(item.sample["doc_id"])
                rows["length"].append(item.sample["length"])
                rows["cuts"].append(item.cuts)
                rows["digest"].append(item.digest)
                slices += len(item.cuts) - 1
    _drop_empty_shards(partial)
    _write_documents(partial / DOCUMENTS_NAME, rows, job.task.source)
    result = TaskResult(
        index=job.index,
        documents=len(rows["doc_id"]),
        tokens=int(np.sum(rows["length"], dtype=np.int64)),
        quarantined=quarantined,
        truncated_documents=int(truncated),
        dropped_tokens=int(dropped),
        slices=slices,
        input_bytes=job.task.size,
    )
    (partial / DONE_NAME).write_text(
        json.dumps({"task": job.task.to_dict(), **result.to_dict()}, indent=1, sort_keys=True)
    )
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)
    return result


def run_task(job: TaskJob) -> TaskResult:
    """Prepare and write one task in this process, batch by batch."""
    return write_task(job, prepare_task(job))


def load_result(directory: Path) -> TaskResult | None:
    """The result recorded in a finished task directory, or None if it is not finished."""
    marker = directory / DONE_NAME
    if not marker.is_file():
        return None
    data = json.loads(marker.read_text())
    data.pop("task")
    return TaskResult(**data)

"""Arrow files and ``datasets.Dataset.save_to_disk`` directories.

A ``save_to_disk`` directory holds ``state.json`` listing its ``data-*.arrow`` files (Arrow
IPC streams); a ``DatasetDict`` directory holds ``dataset_dict.json`` and one such directory
per split, read in the listed split order. Files are memory-mapped, so a task reads only its
own row range. Schema rules and document ids as in :mod:`slimdata.readers.parquet`.

A damaged file never stops a build: of a stream cut short or damaged midway, the rows of
the batches before the damage are kept and the rest is quarantined as one entry (id of its
first lost row, ``source/file:4``); a file whose schema cannot be read (truncated, not Arrow,
unreadable), and an IPC *file* whose footer is lost, are quarantined whole (``source/file``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from slimdata.readers.base import (
    ReadOptions,
    ReadResult,
    ReadTask,
    file_rejected,
    input_error,
    unreadable_task,
)
from slimdata.readers.parquet import check_schema, iter_table, read_errors

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["SUFFIXES", "dataset_files", "is_dataset_dir", "plan", "read"]

SUFFIXES = (".arrow",)


def is_dataset_dir(path: Path) -> bool:
    """True for a directory written by ``datasets`` ``save_to_disk``."""
    return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()


def dataset_files(path: Path) -> list[Path]:
    """The Arrow files of a ``save_to_disk`` directory, in the dataset's own order."""
    try:
        if (path / "dataset_dict.json").is_file():
            splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
            return [f for split in splits for f in dataset_files(path / split)]
        state = json.loads((path / "state.json").read_text())
        return [path / entry["filename"] for entry in state["_data_files"]]
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise input_error(path, f"not a readable `datasets` directory: {exc}") from exc


def _open(path: str) -> tuple[pa.Table, BaseException | None] | BaseException:
    """The file's rows and the error that ended the reading of them: ``(table, None)`` for
    a sound file, ``(rows before the damage, error)`` for a stream cut short or damaged
    midway, and the error alone when not even the schema can be read."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    try:
        source = pa.memory_map(path, "r")
        if source.read_at(6, 0) == b"ARROW1":  # the IPC file format, with its footer
            return ipc.open_file(source).read_all(), None
        reader = ipc.open_stream(source)  # what `datasets` writes
    except read_errors() as exc:
        return exc
    batches: list[pa.RecordBatch] = []
    try:
        batches.extend(reader)
    except read_errors() as exc:
        return pa.Table.from_batches(batches, schema=reader.schema), exc
    return pa.Table.from_batches(batches, schema=reader.schema), None


def plan(path: str, rel: str, source: str, task_bytes: int, opts: ReadOptions) -> list[ReadTask]:
    """Row ranges of ~``task_bytes`` of one Arrow file (of its readable rows); one task that
    quarantines the file when its schema cannot be read."""
    opened = _open(path)
    if isinstance(opened, BaseException):
        return [unreadable_task("arrow", path, rel, source)]
    table = opened[0]
    check_schema(path, table.schema, opts)
    rows = table.num_rows
    nbytes = max(1, table.column(opts.text_field).nbytes)
    per_task = max(1, int(rows * task_bytes / nbytes))
    tasks = []
    for start in range(0, max(rows, 1), per_task):
        stop = min(rows, start + per_task)
        size = int(nbytes * (stop - start) / max(rows, 1))
        tasks.append(
            ReadTask(
                format="arrow", path=path, rel=rel, source=source, start=start, stop=stop, size=size
            )
        )
    return tasks


def read(task: ReadTask, opts: ReadOptions) -> Iterator[ReadResult]:
    """Records of the task's row range (zero-copy slice of the memory-mapped table); the
    task ending at the last readable row of a damaged file quarantines the rest."""
    opened = _open(task.path)
    if isinstance(opened, BaseException):
        yield file_rejected(task, opened)
        return
    table, error = opened
    stop = table.num_rows if task.stop < 0 else task.stop
    columns = [opts.text_field] + ([opts.id_field] if opts.id_field else [])
    part = table.select(columns).slice(task.start, stop - task.start)
    yield from iter_table(task, part, opts, task.start)
    if error is not None and stop == table.num_rows:
        yield file_rejected(task, error, table.num_rows)

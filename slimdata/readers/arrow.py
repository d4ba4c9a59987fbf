"""Arrow files and ``datasets.Dataset.save_to_disk`` directories.

A ``save_to_disk`` directory holds ``state.json`` listing its ``data-*.arrow`` files (Arrow
IPC streams); a ``DatasetDict`` directory holds ``dataset_dict.json`` and one such directory
per split, read in the listed split order. Files are memory-mapped, so a task reads only its
own row range. Schema rules and document ids as in :mod:`slimdata.readers.parquet`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from slimdata.readers.base import ReadOptions, ReadResult, ReadTask, input_error
from slimdata.readers.parquet import check_schema, iter_table

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


def _open(path: str) -> pa.Table:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    try:
        source = pa.memory_map(path, "r")
    except OSError as exc:
        raise input_error(path, f"cannot open Arrow file: {exc}") from exc
    try:
        return ipc.open_stream(source).read_all()
    except pa.ArrowInvalid:
        try:
            return ipc.open_file(source).read_all()
        except pa.ArrowInvalid as exc:
            raise input_error(path, f"not an Arrow IPC file: {exc}") from exc


def plan(path: str, rel: str, source: str, task_bytes: int, opts: ReadOptions) -> list[ReadTask]:
    """Row ranges of ~``task_bytes`` of one Arrow file."""
    table = _open(path)
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
    """Records of the task's row range (zero-copy slice of the memory-mapped table)."""
    table = _open(task.path)
    columns = [opts.text_field] + ([opts.id_field] if opts.id_field else [])
    part = table.select(columns).slice(task.start, task.stop - task.start)
    yield from iter_table(task, part, opts, task.start)

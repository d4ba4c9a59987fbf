"""Arrow files and ``datasets.Dataset.save_to_disk`` directories.

A ``save_to_disk`` directory holds ``state.json`` listing its ``data-*.arrow`` files (Arrow
IPC streams); a ``DatasetDict`` directory holds ``dataset_dict.json`` and one such directory
per split, read in the listed split order. Files are memory-mapped, so a task reads only its
own row range. Schema rules and document ids as in :mod:`slimdata.readers.parquet`.

A damaged file never stops a build: of a stream cut short or damaged midway, the rows of
the batches before the damage are kept and the rest is quarantined as one entry (id of its
first lost row, ``source/file:4``); a file whose schema cannot be read (truncated, not Arrow,
unreadable), and an IPC *file* whose footer is lost, are quarantined whole (``source/file``).
So is a ``save_to_disk`` directory, or one split of it, whose file list cannot be read
(``state.json`` or ``dataset_dict.json`` missing, not JSON, without its list, or naming a
path outside the directory): one entry with id ``source/dir``; the other splits are read.
A listed data file that does not exist is quarantined like a dangling link.
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

__all__ = [
    "META_MAX_BYTES",
    "SUFFIXES",
    "ListingError",
    "dataset_entries",
    "dataset_files",
    "is_dataset_dir",
    "listing_error",
    "plan",
    "read",
    "read_unlisted",
]

SUFFIXES = (".arrow",)


META_MAX_BYTES = 16 << 20
"""Largest ``state.json`` or ``dataset_dict.json`` read (16 MiB; ``datasets`` writes a few
KiB): a larger one is refused unread, as a damaged listing."""


class ListingError(ValueError):
    """Why the file list of a ``save_to_disk`` directory (or of one split of it) cannot be
    read: its ``state.json``/``dataset_dict.json`` is missing, not JSON, lacks its list, or
    names a path outside the directory. ``directory`` is the dataset or split directory."""

    def __init__(self, directory: Path, why: str) -> None:
        super().__init__(why)
        self.directory = directory


def is_dataset_dir(path: Path) -> bool:
    """True for a directory written by ``datasets`` ``save_to_disk``."""
    return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()


def dataset_entries(path: Path) -> list[Path | ListingError]:
    """The Arrow files of a ``save_to_disk`` directory, in the dataset's own order; a
    directory whose list cannot be read is one :class:`ListingError` in their place, so the
    caller quarantines it and goes on: ``dataset_dict.json`` listing ``train`` (sound) and
    ``test`` (a ``state.json`` cut short) gives ``[train/data-0.arrow, ListingError(test)]``."""
    if (path / "dataset_dict.json").is_file():
        try:
            splits = _listed(path, "dataset_dict.json", "splits", "split")
        except ListingError as exc:
            return [exc]
        return [e for split in splits for e in _split_entries(split)]
    return _split_entries(path)


def _split_entries(path: Path) -> list[Path | ListingError]:
    """The data files ``path/state.json`` lists (a split is never a ``DatasetDict``)."""
    try:
        return [*_listed(path, "state.json", "_data_files", "data file")]
    except ListingError as exc:
        return [exc]


def listing_error(path: Path) -> ListingError | None:
    """Why the ``save_to_disk`` directory ``path`` cannot list its splits or files, or None."""
    entries = dataset_entries(path)
    return next((e for e in entries if isinstance(e, ListingError) and e.directory == path), None)


def dataset_files(path: Path) -> list[Path]:
    """The Arrow files of a ``save_to_disk`` directory, in the dataset's own order.

    Raises :class:`InputError` for a directory whose list cannot be read (the build instead
    quarantines it, through :func:`dataset_entries`)."""
    entries = dataset_entries(path)
    for entry in entries:
        if isinstance(entry, ListingError):
            raise input_error(entry.directory, f"not a readable `datasets` directory: {entry}")
    return [e for e in entries if isinstance(e, Path)]


def _listed(path: Path, name: str, key: str, what: str) -> list[Path]:
    """The paths ``path/name`` lists under ``key`` (``splits``: names; ``_data_files``:
    ``{"filename": ...}`` objects), each checked to stay inside ``path``; read at bounded
    cost (at most :data:`META_MAX_BYTES`)."""
    here = f"{name} of a `datasets` directory"
    try:
        with open(path / name, "rb") as fh:
            data = fh.read(META_MAX_BYTES + 1)
    except OSError as exc:
        raise ListingError(path, f"cannot read {here}: {exc.strerror or exc}") from exc
    if len(data) > META_MAX_BYTES:
        raise ListingError(path, f"{here} is over {META_MAX_BYTES:,} bytes; not read")
    try:
        listing = json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        why = "nested too deeply to parse" if isinstance(exc, RecursionError) else str(exc)
        raise ListingError(path, f"{here} is not valid JSON: {why}") from exc
    items = listing.get(key) if isinstance(listing, dict) else None
    if not isinstance(items, list):
        raise ListingError(path, f"{here} has no list {key!r}")
    out = []
    for item in items:
        rel = item.get("filename") if isinstance(item, dict) else None
        if key == "splits":
            rel = item  # a split's directory name: {"splits": ["train", "test"]}
        if (
            not isinstance(rel, str)
            or not rel
            or Path(rel).is_absolute()
            or ".." in Path(rel).parts
        ):
            raise ListingError(path, f"{here} names {what} {rel!r}, not a path inside it")
        out.append(path / rel)
    return out


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


def read_unlisted(task: ReadTask, opts: ReadOptions) -> Iterator[ReadResult]:
    """The quarantine entry of a ``save_to_disk`` directory (or split) whose file list cannot
    be read (task format ``datasets``, id ``source/dir``): the whole directory, with the
    reason (``unreadable, corrupt or truncated file: state.json of a `datasets` directory is
    not valid JSON: ...``)."""
    error = listing_error(Path(task.path))
    yield file_rejected(task, error or ListingError(Path(task.path), "its file list changed"))

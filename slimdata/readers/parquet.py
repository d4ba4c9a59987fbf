"""Parquet files: one record per row, the text in a string column (``--text-field``).

Row groups are grouped into tasks of about ``task_bytes`` (uncompressed size), so one big
file feeds several workers. Only the text (and id) columns are read. A missing or
non-string text column is a schema problem of the whole file and raises
:class:`~slimdata.errors.InputError` naming the available columns; a null value rejects
that row only. Document ids are ``source/file:row`` (0-based row number).

A damaged file never stops a build: one whose footer cannot be read (truncated, not
Parquet, unreadable) is quarantined whole (id ``source/file``), and a row group that cannot
be read is quarantined as one entry (id of its first row) while the other row groups are
kept. Row groups are read whole, so no row of a rejected group is yielded.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from slimdata.readers.base import (
    ReadOptions,
    ReadResult,
    ReadTask,
    Rejected,
    check_text,
    doc_id_for,
    error_text,
    file_rejected,
    input_error,
    unreadable_task,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

__all__ = ["SUFFIXES", "check_schema", "plan", "read", "read_errors"]

SUFFIXES = (".parquet", ".pq")


def read_errors() -> tuple[type[BaseException], ...]:
    """Errors of reading a damaged Parquet or Arrow file (pyarrow's, or the system's)."""
    import pyarrow as pa

    return (OSError, pa.ArrowException)


def check_schema(path: str, schema: pa.Schema, opts: ReadOptions) -> None:
    """Raise :class:`InputError` unless the text field is a string column."""
    import pyarrow as pa

    names = schema.names
    if opts.text_field not in names:
        raise input_error(
            path, f"no column {opts.text_field!r} (columns: {', '.join(names)}); use --text-field"
        )
    kind = schema.field(opts.text_field).type
    if not (
        pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
    ):
        raise input_error(
            path, f"column {opts.text_field!r} has type {kind}, not string; use --text-field"
        )
    if opts.id_field and opts.id_field not in names:
        raise input_error(path, f"no id column {opts.id_field!r} (columns: {', '.join(names)})")


def plan(path: str, rel: str, source: str, task_bytes: int, opts: ReadOptions) -> list[ReadTask]:
    """Row ranges made of whole row groups, ~``task_bytes`` each; one task that quarantines
    the file when its footer cannot be read."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except read_errors():
        return [unreadable_task("parquet", path, rel, source)]
    check_schema(path, meta.schema.to_arrow_schema(), opts)
    tasks: list[ReadTask] = []
    start = row = size = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        if row > start and size + group.total_byte_size > task_bytes:
            tasks.append(
                ReadTask(
                    format="parquet",
                    path=path,
                    rel=rel,
                    source=source,
                    start=start,
                    stop=row,
                    size=size,
                )
            )
            start, size = row, 0
        row += group.num_rows
        size += group.total_byte_size
    if row > start or not tasks:
        tasks.append(
            ReadTask(
                format="parquet",
                path=path,
                rel=rel,
                source=source,
                start=start,
                stop=row,
                size=size,
            )
        )
    return tasks


def iter_table(
    task: ReadTask, table: pa.Table, opts: ReadOptions, first_row: int
) -> Iterator[ReadResult]:
    """Records of an Arrow table holding the text (and id) columns; shared with ``arrow``."""
    texts = table.column(opts.text_field).to_pylist()
    ids = table.column(opts.id_field).to_pylist() if opts.id_field else None
    for i, text in enumerate(texts):
        doc_id = doc_id_for(task.source, task.rel, first_row + i)
        if ids is not None and ids[i] is not None:
            doc_id = str(ids[i])
        yield check_text(doc_id, text, opts.text_field)


def read(task: ReadTask, opts: ReadOptions) -> Iterator[ReadResult]:
    """Records of the task's row range, read row group by row group."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(task.path)
    except read_errors() as exc:
        yield file_rejected(task, exc)
        return
    columns = [opts.text_field] + ([opts.id_field] if opts.id_field else [])
    stop = pf.metadata.num_rows if task.stop < 0 else task.stop
    row = 0
    for g in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if n and task.start <= row < stop:
            yield from _read_group(task, pf, g, row, columns, opts)
        row += n


def _read_group(
    task: ReadTask, pf: pq.ParquetFile, group: int, row: int, columns: list[str], opts: ReadOptions
) -> Iterator[ReadResult]:
    """Records of row group ``group`` (first row ``row``), or one rejection for all its rows
    when it cannot be read: ``source/file:2``, "... row group 1 (rows 2-3): ..."."""
    try:
        table = pf.read_row_group(group, columns=columns)
    except read_errors() as exc:
        last = row + pf.metadata.row_group(group).num_rows - 1
        why = error_text(exc)
        yield Rejected(
            doc_id_for(task.source, task.rel, row),
            f"unreadable, corrupt or truncated row group {group} (rows {row}-{last}): {why}",
        )
        return
    yield from iter_table(task, table, opts, row)

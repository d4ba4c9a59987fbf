"""JSON Lines and JSON files (plain, ``.gz``, ``.zst``): one record per line or list item.

Plain files are split into byte-range tasks at line boundaries (so one big file still feeds
several workers); compressed files cannot be seeked and are one task each. A ``.json`` file
whose first non-blank byte is ``[`` is read as one JSON array of objects, and one whose
first line is an incomplete ``{`` object as that single object (one record).

Document ids are ``source/file:line`` (1-based line number) or ``source/file:item`` (0-based
list index) unless ``--id-field`` names a field holding an id.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import mmap
from collections.abc import Iterator
from typing import IO, Any, cast

from slimdata.readers.base import (
    ReadOptions,
    ReadResult,
    ReadTask,
    Rejected,
    check_text,
    doc_id_for,
    file_rejected,
    file_size,
    unencodable,
)

__all__ = ["COMPRESSED", "SUFFIXES", "open_binary", "plan", "read", "read_errors"]

SUFFIXES = (".jsonl", ".ndjson", ".json")
COMPRESSED = (".gz", ".zst", ".zstd")


def _compression(path: str) -> str | None:
    for suffix in COMPRESSED:
        if path.endswith(suffix):
            return suffix
    return None


def open_binary(path: str) -> IO[bytes]:
    """Open a possibly compressed file for binary reading (streamed, never fully loaded)."""
    kind = _compression(path)
    if kind == ".gz":
        return cast(IO[bytes], gzip.open(path, "rb"))
    if kind in (".zst", ".zstd"):
        import zstandard

        raw = open(path, "rb")  # noqa: SIM115 - closed through the wrapper
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    return open(path, "rb")


def read_errors() -> tuple[type[BaseException], ...]:
    """Errors of reading or decompressing a damaged file (not of our own code)."""
    import zlib

    import zstandard

    return (OSError, EOFError, zlib.error, zstandard.ZstdError)


def _is_one_json_value(path: str) -> bool:
    """Whether ``path`` is read whole as one JSON value (a ``json`` task) rather than as JSON
    Lines. Only a ``.json`` file (plain or compressed) can be: one whose first non-blank
    byte is ``[`` (an array, one record per item), or ``{`` with a first line that is no
    JSON value alone (one object over several lines, as ``json.dump(obj, indent=2)``
    writes: one record). A ``.json`` file whose first line is a whole object is JSON Lines.

    Reads the first 4 KiB (and the rest of the first line). A file they cannot be read or
    decompressed from is JSON Lines too: read line by line, it keeps the lines before the
    damage and quarantines the rest, as a damaged ``.jsonl.gz`` does.
    """
    base = path
    kind = _compression(path)
    if kind:
        base = path[: -len(kind)]
    if not base.endswith(".json"):
        return False
    try:
        with open_binary(path) as fh:
            head = fh.read(4096).lstrip()
            if not head.startswith(b"{"):
                return head.startswith(b"[")
            # its first line in full (it may run past the 4096 bytes read)
            first = b"".join([head.split(b"\n", 1)[0], b"" if b"\n" in head else fh.readline()])
    except read_errors():
        return False
    try:
        json.loads(first)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return True
    return False


def plan(path: str, rel: str, source: str, task_bytes: int) -> list[ReadTask]:
    """Tasks of one JSON/JSONL file: byte ranges ending at newlines for plain JSONL; one
    task for a file that cannot be read (its read quarantines it)."""
    size = file_size(path)
    if _is_one_json_value(path):
        return [ReadTask(format="json", path=path, rel=rel, source=source, size=size)]
    if _compression(path) or size <= task_bytes:
        return [
            ReadTask(format="jsonl", path=path, rel=rel, source=source, size=size, first_index=1)
        ]
    tasks = []
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        start, line = 0, 1
        while start < size:
            stop = min(size, start + task_bytes)
            if stop < size:
                nl = mm.find(b"\n", stop - 1)
                stop = size if nl == -1 else nl + 1
            tasks.append(
                ReadTask(
                    format="jsonl",
                    path=path,
                    rel=rel,
                    source=source,
                    start=start,
                    stop=stop,
                    first_index=line,
                    size=stop - start,
                )
            )
            line += mm[start:stop].count(b"\n")
            start = stop
    return tasks


_ABSENT = object()
"""What :func:`_field` returns for a field the record does not have (a JSON null is None)."""


def _field(obj: dict[str, Any], name: str, absent: Any = None) -> Any:
    """Value of a (dotted) field, or ``absent`` when there is none: ``meta.title`` ->
    obj["meta"]["title"]."""
    value: Any = obj
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return absent
        value = value[part]
    return value


def _record(obj: Any, doc_id: str, opts: ReadOptions) -> ReadResult:
    if not isinstance(obj, dict):
        return Rejected(
            doc_id, f"record is a JSON {type(obj).__name__}, not an object", repr(obj)[:200]
        )
    text = _field(obj, opts.text_field, _ABSENT)
    if text is _ABSENT:
        fields = ", ".join(sorted(obj)[:10])
        return Rejected(
            doc_id, f"missing text field {opts.text_field!r} (fields: {fields}); use --text-field"
        )
    if text is None:
        return Rejected(doc_id, f"text field {opts.text_field!r} is null, not a string")
    if opts.id_field:
        ident = _field(obj, opts.id_field)
        if ident is None or isinstance(ident, dict | list):
            return Rejected(doc_id, f"missing or non-scalar id field {opts.id_field!r}")
        reason = unencodable(str(ident))
        if reason is not None:
            return Rejected(
                doc_id, f"id field {opts.id_field!r}: {reason}", ascii(str(ident)[:200])
            )
        doc_id = str(ident)
    return check_text(doc_id, text, opts.text_field)


def _lines(task: ReadTask) -> Iterator[bytes]:
    if _compression(task.path):
        with open_binary(task.path) as fh:
            yield from fh
        return
    with open(task.path, "rb") as fh:
        fh.seek(task.start)
        data = fh.read() if task.stop < 0 else fh.read(task.stop - task.start)
    yield from data.splitlines(keepends=True)


def read(task: ReadTask, opts: ReadOptions) -> Iterator[ReadResult]:
    """Records of a JSONL task; malformed lines become :class:`Rejected` with the reason."""
    if task.format == "json":
        yield from _read_array(task, opts)
        return
    lineno = task.first_index
    try:
        for raw in _lines(task):
            doc_id = doc_id_for(task.source, task.rel, lineno)
            lineno += 1
            if not raw.strip():
                continue  # blank lines are not records
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield Rejected(
                    doc_id,
                    f"undecodable bytes (not UTF-8) at byte {exc.start} of the line",
                    repr(raw[:200]),
                )
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                yield Rejected(
                    doc_id, f"malformed JSON: {exc.msg} at column {exc.colno}", text[:200]
                )
                continue
            except RecursionError:
                yield Rejected(doc_id, "malformed JSON: nested too deeply to parse", text[:200])
                continue
            yield _record(obj, doc_id, opts)
    except read_errors() as exc:
        yield file_rejected(task, exc, lineno)


def _array_error(exc: ValueError | RecursionError) -> str:
    """Why a whole-file JSON value does not parse."""
    if isinstance(exc, UnicodeDecodeError):
        return f"undecodable bytes (not UTF-8) at byte {exc.start}; whole file rejected"
    if isinstance(exc, json.JSONDecodeError):
        return f"malformed JSON array: {exc.msg} at line {exc.lineno}; whole file rejected"
    if isinstance(exc, RecursionError):
        return "malformed JSON array: nested too deeply; whole file rejected"
    return f"malformed JSON array: {exc}; whole file rejected"


def _read_array(task: ReadTask, opts: ReadOptions) -> Iterator[ReadResult]:
    file_id = doc_id_for(task.source, task.rel)
    try:
        with open_binary(task.path) as fh:
            raw = fh.read()
    except read_errors() as exc:
        yield file_rejected(task, exc)
        return
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        if raw.lstrip().startswith(b"{"):
            # no single object after all (JSON Lines whose first line is broken): line by line
            yield from read(dataclasses.replace(task, format="jsonl", first_index=1), opts)
        else:
            yield Rejected(file_id, _array_error(exc))
        return
    if isinstance(data, dict):  # one record: the file's single object
        yield _record(data, doc_id_for(task.source, task.rel, 0), opts)
        return
    if not isinstance(data, list):
        yield Rejected(
            file_id, f"JSON file holds a {type(data).__name__}, expected a list of objects"
        )
        return
    for i, obj in enumerate(data):
        yield _record(obj, doc_id_for(task.source, task.rel, i), opts)

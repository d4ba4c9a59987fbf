"""Shared types of the readers: read tasks, records and rejections.

A *read task* is a deterministic slice of the input (a byte range of a JSONL file, a group of
row groups of a Parquet file, a run of plain-text files, ...). Tasks are planned once from
the inputs alone, never from the number of workers, so a build with ``--workers 1`` and one
with ``--workers 8`` process exactly the same tasks and write identical shards.

Every record a reader yields is either a :class:`Record` (text to tokenize) or a
:class:`Rejected` (sent to ``quarantine.jsonl`` with its reason). Nothing is dropped silently
except blank lines of JSONL files, which are not records.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slimdata.errors import InputError

__all__ = [
    "DEFAULT_TASK_BYTES",
    "MIN_TASK_BYTES",
    "TARGET_TASKS",
    "ReadOptions",
    "ReadResult",
    "ReadTask",
    "Record",
    "Rejected",
    "auto_task_bytes",
    "check_text",
    "doc_id_for",
    "error_text",
    "file_rejected",
    "file_size",
    "input_error",
    "input_stamps",
    "unencodable",
    "unreadable_task",
]

DEFAULT_TASK_BYTES = 4 << 20
"""Largest automatic task size (4 MiB of input): few enough sub-directories and shards for
a tidy output of a large corpus."""

MIN_TASK_BYTES = 256 << 10
"""Smallest automatic task size (256 KiB of input)."""

TARGET_TASKS = 64
"""Number of tasks a small corpus is cut into when sizes are automatic."""


def auto_task_bytes(total_bytes: int) -> int:
    """Task size for a corpus of ``total_bytes``: ``total / 64`` within [256 KiB, 4 MiB].

    A parallel build ends when its last task does, while the other workers may idle for up
    to one task's time; with 4 MiB tasks a 50 MB corpus makes 13 tasks of about 2 s each
    (2 workers, development VM). Smaller tasks for small corpora bound that tail; corpora
    over 256 MiB keep 4 MiB tasks. Depends on the inputs alone, so output stays
    independent of ``workers``.
    """
    return min(DEFAULT_TASK_BYTES, max(MIN_TASK_BYTES, -(-total_bytes // TARGET_TASKS)))


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """What to extract from each record."""

    text_field: str = "text"
    """Field (JSON key, column) holding the document text; dots address nested JSON keys."""
    id_field: str | None = None
    """Optional field with a document id; else the id is ``source/file:row`` (stable)."""


@dataclass(frozen=True, kw_only=True)
class ReadTask:
    """One deterministic piece of the input, processed by one worker into one sub-directory."""

    format: str
    """Reader name in :data:`slimdata.readers.READERS`."""
    path: str
    """File (or, for ``text``, the input root) the task reads."""
    source: str
    """Source name written to every document of the task."""
    rel: str = ""
    """Path of ``path`` relative to its input root (used in document ids)."""
    start: int = 0
    """First byte (``jsonl``) or row (``parquet``, ``arrow``) of the task."""
    stop: int = -1
    """End byte or row (exclusive); -1 means to the end."""
    first_index: int = 0
    """Index (line number for JSONL, 1-based) of the first record of the task."""
    files: tuple[str, ...] = field(default_factory=tuple)
    """For ``text`` tasks: the files (relative to ``path``), one document each."""
    size: int = 0
    """Input bytes of the task (for planning and progress)."""

    def input_paths(self) -> list[str]:
        """The files the task reads: ``path`` itself, or for ``text`` its ``files`` under it."""
        if self.format == "text":
            return [str(Path(self.path, name)) for name in self.files]
        return [self.path]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "path": self.path,
            "source": self.source,
            "rel": self.rel,
            "start": self.start,
            "stop": self.stop,
            "first_index": self.first_index,
            "files": list(self.files),
            "size": self.size,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReadTask:
        return cls(**{**data, "files": tuple(data.get("files", ()))})


@dataclass(frozen=True)
class Record:
    """A document to tokenize."""

    doc_id: str
    text: str


@dataclass(frozen=True)
class Rejected:
    """A record that cannot become a document, with the reason (goes to quarantine)."""

    doc_id: str
    reason: str
    excerpt: str = ""


ReadResult = Record | Rejected


def doc_id_for(source: str, rel: str, index: int | None = None) -> str:
    """Stable id: ``source/rel`` for whole files, ``source/rel:index`` for rows and lines.

    ``doc_id_for("stdlib", "json/decoder.py") == "stdlib/json/decoder.py"``;
    ``doc_id_for("web", "a.jsonl", 7) == "web/a.jsonl:7"`` (line 7).
    """
    base = f"{source}/{rel}" if rel else source
    return base if index is None else f"{base}:{index}"


def unencodable(text: str) -> str | None:
    """Why ``text`` cannot be tokenized (a lone surrogate such as ``"a\\ud800b"``), or None.

    JSON allows ``\\ud800`` escapes that decode to half a UTF-16 pair; such a string has no
    UTF-8 form, and tokenizers refuse it (``TypeError``), so it must be quarantined first.
    """
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"unencodable text: lone surrogate U+{ord(text[exc.start]):04X} at character {exc.start}"
    return None


def check_text(doc_id: str, value: Any, field_name: str) -> ReadResult:
    """A :class:`Record` if ``value`` is a non-empty, UTF-8 encodable string, else a
    :class:`Rejected`."""
    if value is None:
        return Rejected(doc_id, f"text field {field_name!r} is missing or null")
    if not isinstance(value, str):
        return Rejected(
            doc_id,
            f"text field {field_name!r} is {type(value).__name__}, not a string",
            repr(value)[:200],
        )
    if not value.strip():
        return Rejected(doc_id, "empty document (no text)", repr(value)[:200])
    reason = unencodable(value)
    if reason is not None:
        return Rejected(doc_id, reason, ascii(value[:200]))
    return Record(doc_id, value)


def input_stamps(tasks: Sequence[ReadTask]) -> dict[str, list[int] | None]:
    """``[size, st_mtime_ns]`` of every file ``tasks`` read, by path (None where it cannot be
    stat'ed, as a dangling link): what tells a resumed build that an input changed in place,
    even to the same size (``{"/data/a.txt": [1200, 1718000000123456789]}``)."""
    stamps: dict[str, list[int] | None] = {}
    for task in tasks:
        for path in task.input_paths():
            try:
                st = os.stat(path)
            except OSError:
                stamps[path] = None
                continue
            stamps[path] = [st.st_size, st.st_mtime_ns]
    return dict(sorted(stamps.items()))


def input_error(path: str | Path, what: str) -> InputError:
    return InputError(f"{path}: {what}")


def error_text(exc: BaseException) -> str:
    """An error's message on one line (pyarrow's span several), or its type when empty."""
    return " ".join(str(exc).split()) or type(exc).__name__


def file_rejected(task: ReadTask, exc: BaseException, index: int | None = None) -> Rejected:
    """The quarantine entry of a file that cannot be read (truncated, corrupt, not its
    format): the whole file (id ``source/file``), or, with ``index``, the file from that
    record on (id ``source/file:index``), the records before it having been yielded.

    Used by every reader, so a damaged ``.gz``, Parquet or Arrow file reads the same in
    ``quarantine.jsonl``.
    """
    why = error_text(exc)
    if index is None:
        return Rejected(
            doc_id_for(task.source, task.rel), f"unreadable, corrupt or truncated file: {why}"
        )
    return Rejected(
        doc_id_for(task.source, task.rel, index),
        f"unreadable, corrupt or truncated file from here on: {why}",
    )


def unreadable_task(fmt: str, path: str, rel: str, source: str) -> ReadTask:
    """The one task of a file that cannot be planned (its rows cannot be counted): reading
    it quarantines the file with the reason (:func:`file_rejected`) instead of stopping the
    build. ``stop=-1``: all of its rows, should it read after all."""
    size = file_size(path)
    return ReadTask(format=fmt, path=path, rel=rel, source=source, start=0, stop=-1, size=size)


def file_size(path: str) -> int:
    """Size of ``path`` in bytes; 0 when it cannot be stat'ed (a dangling link), for its
    reader to quarantine it with the reason."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0

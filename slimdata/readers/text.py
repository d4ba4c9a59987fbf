"""Plain-text files and directories: one file = one document.

Files are decoded as strict UTF-8; a file that is not UTF-8 is rejected with the byte
offset (never decoded with replacement characters, which would silently change the text).
A file with a NUL byte in its first :data:`BINARY_SNIFF_BYTES` bytes is rejected as binary
(git's rule: text files have no NUL bytes, while UTF-8 alone would accept zero-filled or
ASCII-plus-NUL data).
Consecutive files (in sorted path order) are grouped into tasks of about ``task_bytes``.
Document ids are ``source/relative/path``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from slimdata.readers.base import (
    ReadOptions,
    ReadResult,
    ReadTask,
    Rejected,
    check_text,
    doc_id_for,
)

__all__ = ["BINARY_SNIFF_BYTES", "plan", "read"]

BINARY_SNIFF_BYTES = 8000
"""Bytes at the start of a file searched for a NUL byte (the span git checks)."""


def plan(root: str, files: list[tuple[str, int]], source: str, task_bytes: int) -> list[ReadTask]:
    """Group ``(relative path, size)`` pairs under ``root`` into tasks of ~``task_bytes``."""
    tasks: list[ReadTask] = []
    group: list[str] = []
    size = 0
    for rel, nbytes in files:
        if group and size + nbytes > task_bytes:
            tasks.append(
                ReadTask(format="text", path=root, source=source, files=tuple(group), size=size)
            )
            group, size = [], 0
        group.append(rel)
        size += nbytes
    if group:
        tasks.append(
            ReadTask(format="text", path=root, source=source, files=tuple(group), size=size)
        )
    return tasks


def read(task: ReadTask, opts: ReadOptions) -> Iterator[ReadResult]:
    """One record per file of the task."""
    root = Path(task.path)
    for rel in task.files:
        doc_id = doc_id_for(task.source, rel)
        path = root / rel if rel else root
        try:
            data = path.read_bytes()
        except OSError as exc:
            yield Rejected(doc_id, f"cannot read file: {exc.strerror or exc}")
            continue
        nul = data.find(b"\0", 0, BINARY_SNIFF_BYTES)
        if nul >= 0:
            yield Rejected(
                doc_id, f"binary file (NUL byte at byte {nul}), not text", repr(data[:40])
            )
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield Rejected(
                doc_id,
                f"undecodable bytes (not UTF-8) at byte {exc.start}",
                repr(data[max(0, exc.start - 20) : exc.start + 20]),
            )
            continue
        yield check_text(doc_id, text, "file")

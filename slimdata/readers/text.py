"""Plain-text files and directories: one file = one document.

A file named ``*.gz``, ``*.zst`` or ``*.zstd`` (a Debian package's ``changelog.Debian.gz``, a
compressed man page) is read decompressed, at most :data:`MAX_DECOMPRESSED_BYTES`; a damaged
one is rejected with the decompressor's reason. Files are decoded as strict UTF-8; a file that is not UTF-8 is rejected with the byte
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
from slimdata.readers.jsonl import COMPRESSED, open_binary, read_errors

__all__ = ["BINARY_SNIFF_BYTES", "MAX_DECOMPRESSED_BYTES", "plan", "read"]

BINARY_SNIFF_BYTES = 8000
"""Bytes at the start of a file searched for a NUL byte (the span git checks)."""

MAX_DECOMPRESSED_BYTES = 1 << 30
"""The most a compressed text file may decompress to (a document of a GiB of text is no
training document; a few kilobytes that expand without bound would exhaust memory)."""


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
        data = _contents(path, doc_id)
        if isinstance(data, Rejected):
            yield data
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


def _contents(path: Path, doc_id: str) -> bytes | Rejected:
    """The file's bytes, decompressed where its name says it is compressed
    (:func:`~slimdata.readers.jsonl.open_binary`), or why it cannot be read."""
    compressed = path.name.endswith(COMPRESSED)
    try:
        if not compressed:
            return path.read_bytes()
        with open_binary(str(path)) as f:
            data = f.read(MAX_DECOMPRESSED_BYTES + 1)
    except OSError as exc:
        return Rejected(doc_id, f"cannot read file: {exc.strerror or exc}")
    except read_errors() as exc:
        return Rejected(doc_id, f"cannot decompress {path.suffix} file: {exc}")
    if len(data) > MAX_DECOMPRESSED_BYTES:
        return Rejected(
            doc_id, f"decompresses to more than {MAX_DECOMPRESSED_BYTES:,} bytes, not a document"
        )
    return data

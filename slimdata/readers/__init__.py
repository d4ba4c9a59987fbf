"""Readers: turn input paths into deterministic read tasks, and tasks into records.

Inputs are files, directories (walked recursively in sorted order, hidden entries skipped)
or glob patterns (``data/**/*.jsonl``). The format of each file comes from its suffix
(``--format auto``) or is forced:

=========  ==========================================================================
``jsonl``  ``.jsonl``, ``.ndjson``, ``.json`` (lines or one array), optionally ``.gz``/``.zst``
``parquet`` ``.parquet``, ``.pq``
``arrow``  ``.arrow`` files and ``datasets`` ``save_to_disk`` directories
``text``   anything else: one file = one document
=========  ==========================================================================

Each format is one module with ``plan`` (file -> tasks) and ``read`` (task -> records);
:data:`READERS` maps a task's format to its ``read`` function.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterator, Sequence
from fnmatch import fnmatch
from pathlib import Path

from slimdata.errors import ConfigError, InputError
from slimdata.readers import arrow, jsonl, parquet, text
from slimdata.readers.base import (
    DEFAULT_TASK_BYTES,
    ReadOptions,
    ReadResult,
    ReadTask,
    Record,
    Rejected,
    auto_task_bytes,
)

__all__ = [
    "DEFAULT_TASK_BYTES",
    "FORMATS",
    "READERS",
    "ReadOptions",
    "ReadResult",
    "ReadTask",
    "Record",
    "Rejected",
    "auto_task_bytes",
    "plan_inputs",
    "read_task",
]

FORMATS: tuple[str, ...] = ("auto", "jsonl", "parquet", "arrow", "text")

READERS: dict[str, Callable[[ReadTask, ReadOptions], Iterator[ReadResult]]] = {
    "json": jsonl.read,
    "jsonl": jsonl.read,
    "parquet": parquet.read,
    "arrow": arrow.read,
    "text": text.read,
}


def read_task(task: ReadTask, opts: ReadOptions) -> Iterator[ReadResult]:
    """Records (and rejections) of one task, in input order."""
    return READERS[task.format](task, opts)


def _format_of(name: str, forced: str) -> str:
    if forced != "auto":
        return forced
    lower = name.lower()
    for suffix in (".gz", ".zst", ".zstd"):
        if lower.endswith(suffix):
            lower = lower[: -len(suffix)]
            break
    if lower.endswith(jsonl.SUFFIXES):
        return "jsonl"
    if lower.endswith(parquet.SUFFIXES):
        return "parquet"
    if lower.endswith(arrow.SUFFIXES):
        return "arrow"
    return "text"


def _matches(rel: str, patterns: Sequence[str]) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch(name, p) or fnmatch(rel, p) for p in patterns)


def _walk(root: Path, include: Sequence[str], exclude: Sequence[str]) -> list[tuple[str, int]]:
    """Sorted ``(relative posix path, size)`` of the files under ``root``.

    Hidden entries and ``__pycache__`` are skipped; ``exclude`` patterns prune directories
    and files (matched against the name and the relative path); ``include`` keeps files.
    """
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if base == "." else base + "/"
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not d.startswith(".") and d != "__pycache__" and not _matches(prefix + d, exclude)
        )
        for name in filenames:
            rel = prefix + name
            if name.startswith(".") or _matches(rel, exclude):
                continue
            if include and not _matches(rel, include):
                continue
            found.append((rel, _size(Path(dirpath, name))))
    return sorted(found)


def _size(path: Path) -> int:
    """Bytes of ``path``; 0 when it cannot be read (a dangling link: its reader then
    quarantines it with the reason)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _glob_root(pattern: str) -> Path:
    parts = Path(pattern).parts
    fixed = list(parts[: next((i for i, p in enumerate(parts) if glob.has_magic(p)), len(parts))])
    return Path(*fixed) if fixed else Path(".")


def _source_name(path: Path) -> str:
    name = path.resolve().name if path.name in ("", ".", "..") else path.name
    for suffix in (
        ".gz",
        ".zst",
        ".zstd",
        ".jsonl",
        ".ndjson",
        ".json",
        ".parquet",
        ".pq",
        ".arrow",
        ".txt",
    ):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return name or "input"


def _plan_files(
    root: Path,
    files: list[tuple[str, int]],
    source: str,
    fmt: str,
    opts: ReadOptions,
    task_bytes: int,
) -> list[ReadTask]:
    root = root.resolve()
    tasks: list[ReadTask] = []
    texts: list[tuple[str, int]] = []
    for rel, size in files:
        kind = _format_of(rel, fmt)
        if kind == "text":
            texts.append((rel, size))
            continue
        if texts:
            tasks += text.plan(str(root), texts, source, task_bytes)
            texts = []
        path = str(root / rel)
        if kind == "jsonl":
            tasks += jsonl.plan(path, rel, source, task_bytes)
        elif kind == "parquet":
            tasks += parquet.plan(path, rel, source, task_bytes, opts)
        else:
            tasks += arrow.plan(path, rel, source, task_bytes, opts)
    if texts:
        tasks += text.plan(str(root), texts, source, task_bytes)
    return tasks


def plan_inputs(
    inputs: Sequence[str | Path],
    *,
    opts: ReadOptions,
    fmt: str = "auto",
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    task_bytes: int | None = None,
    source: str | None = None,
) -> list[ReadTask]:
    """Read tasks of all inputs, in input order then sorted path order.

    ``task_bytes=None`` sizes tasks from the inputs' total (:func:`auto_task_bytes`), so the
    plan, and with it the output, still depends on the inputs alone.

    Raises :class:`InputError` for a missing path, a pattern that matches nothing, or an
    input without any file; :class:`ConfigError` for an unknown format.
    """
    if task_bytes is not None:
        return _plan_inputs(inputs, opts, fmt, include, exclude, task_bytes, source)
    tasks = _plan_inputs(inputs, opts, fmt, include, exclude, DEFAULT_TASK_BYTES, source)
    size = auto_task_bytes(sum(t.size for t in tasks))
    if size == DEFAULT_TASK_BYTES:
        return tasks
    return _plan_inputs(inputs, opts, fmt, include, exclude, size, source)


def _plan_inputs(
    inputs: Sequence[str | Path],
    opts: ReadOptions,
    fmt: str,
    include: Sequence[str],
    exclude: Sequence[str],
    task_bytes: int,
    source: str | None,
) -> list[ReadTask]:
    if fmt not in FORMATS:
        raise ConfigError(f"format={fmt!r} is unknown; use one of {', '.join(FORMATS)}")
    if not inputs:
        raise InputError("no input given")
    tasks: list[ReadTask] = []
    for spec in inputs:
        path = Path(spec)
        if not path.exists() and glob.has_magic(str(spec)):
            root = _glob_root(str(spec))
            matches = sorted(
                Path(m)
                for m in glob.glob(str(spec), recursive=True)
                if Path(m).is_file() and not _matches(Path(m).relative_to(root).as_posix(), exclude)
            )
            if not matches:
                raise InputError(f"input pattern {spec!r} matches no file")
            files = [(m.relative_to(root).as_posix(), m.stat().st_size) for m in matches]
            tasks += _plan_files(root, files, source or _source_name(root), fmt, opts, task_bytes)
            continue
        if not path.exists():
            raise InputError(f"input {str(spec)!r} does not exist")
        name = source or _source_name(path)
        if path.is_dir() and (fmt in ("auto", "arrow")) and arrow.is_dataset_dir(path):
            for f in arrow.dataset_files(path):
                tasks += arrow.plan(str(f), f.relative_to(path).as_posix(), name, task_bytes, opts)
        elif path.is_dir():
            files = _walk(path, include, exclude)
            if not files:
                raise InputError(f"input directory {str(spec)!r} holds no matching file")
            tasks += _plan_files(path, files, name, fmt, opts, task_bytes)
        else:
            tasks += _plan_files(
                path.parent, [(path.name, path.stat().st_size)], name, fmt, opts, task_bytes
            )
    return tasks

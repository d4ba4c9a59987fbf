"""Readers: turn input paths into deterministic read tasks, and tasks into records.

Inputs are files, directories (walked recursively in sorted order, hidden entries skipped)
or glob patterns (``data/**/*.jsonl``; a matched directory is walked like a directory
input). The format of each file comes from its suffix (``--format auto``) or is forced:

=========  ==========================================================================
``jsonl``  ``.jsonl``, ``.ndjson``, ``.json`` (lines, one array or object), ``.gz``/``.zst`` too
``parquet`` ``.parquet``, ``.pq``
``arrow``  ``.arrow`` files and ``datasets`` ``save_to_disk`` directories
``text``   anything else: one file = one document (``.gz``, ``.zst`` read decompressed)
=========  ==========================================================================

Each format is one module with ``plan`` (file -> tasks) and ``read`` (task -> records);
:data:`READERS` maps a task's format to its ``read`` function.
"""

from __future__ import annotations

import glob
import logging
import os
import stat
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
    input_stamps,
    unreadable_task,
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
    "input_stamps",
    "plan_inputs",
    "read_task",
]

FORMATS: tuple[str, ...] = ("auto", "jsonl", "parquet", "arrow", "text")

_log = logging.getLogger(__name__)

READERS: dict[str, Callable[[ReadTask, ReadOptions], Iterator[ReadResult]]] = {
    "json": jsonl.read,
    "jsonl": jsonl.read,
    "parquet": parquet.read,
    "arrow": arrow.read,
    "datasets": arrow.read_unlisted,
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


def _walk(
    root: Path,
    include: Sequence[str],
    exclude: Sequence[str],
    notes: list[str],
    datasets: bool = True,
) -> list[tuple[str, int]]:
    """``(relative posix path, size)`` of the files under ``root``, in sorted path order.

    Hidden entries and ``__pycache__`` are skipped; ``exclude`` patterns prune directories
    and files (matched against the name and the relative path); ``include`` keeps files.
    With ``datasets``, a ``save_to_disk`` directory below ``root`` contributes its Arrow
    files in the dataset's own order (not its ``state.json``/``dataset_info.json``), as it
    does when given as an input itself.
    """
    return [(rel, size) for _key, rel, size in _walk_keyed(root, include, exclude, notes, datasets)]


def _walk_keyed(
    root: Path,
    include: Sequence[str],
    exclude: Sequence[str],
    notes: list[str],
    datasets: bool,
    prefix: str = "",
) -> list[tuple[str, str, int]]:
    """:func:`_walk` as sorted ``(sort key, rel, size)``; rel and key start with ``prefix``.

    The key of a plain file is its path; the files of a dataset directory ``d`` sort as
    ``d/`` followed by their position, so they keep the dataset's order where ``d``'s
    files would sort: ``a.txt``, ``ds/<1st arrow file>``, ``ds/<2nd>``, ``z.txt``. A
    dataset directory (or split) whose file list cannot be read is one entry, its path
    with a trailing slash (``ds/``; ``./`` for ``root`` itself), which :func:`_plan_files`
    turns into a task that quarantines it.
    """
    found: list[tuple[str, str, int]] = []

    def keep(rel: str) -> bool:
        return not include or _matches(rel, include)

    if datasets and arrow.is_dataset_dir(root):
        return _dataset_keyed(root, prefix.rstrip("/"), keep, notes)
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath).relative_to(root).as_posix()
        local = "" if base == "." else base + "/"
        subdirs = sorted(
            d
            for d in dirnames
            if not d.startswith(".")
            and d != "__pycache__"
            and not _matches(prefix + local + d, exclude)
        )
        dirnames[:] = []
        for d in subdirs:
            if datasets and arrow.is_dataset_dir(Path(dirpath, d)):
                found += _dataset_keyed(Path(dirpath, d), prefix + local + d, keep, notes)
            else:
                dirnames.append(d)
        for name in filenames:
            rel = prefix + local + name
            if name.startswith(".") or _matches(rel, exclude) or not keep(rel):
                continue
            size = regular_size(Path(dirpath, name), notes)
            if size is not None:
                found.append((rel, rel, size))
    return sorted(found)


def _dataset_keyed(
    path: Path, rel_dir: str, keep: Callable[[str], bool], notes: list[str]
) -> list[tuple[str, str, int]]:
    """The Arrow files of the ``save_to_disk`` directory ``path`` (``rel_dir`` below the
    walked root), keyed to sort together in the dataset's order; a directory whose list
    cannot be read as ``dir/``, and a listed file that does not exist as one of size 0, for
    their readers to quarantine them with the reason."""
    head = f"{rel_dir}/" if rel_dir and rel_dir != "." else ""
    out = []
    for i, f in enumerate(arrow.dataset_entries(path)):
        key = f"{head}\0{i:09d}"
        if isinstance(f, arrow.ListingError):
            sub = f.directory.relative_to(path).as_posix()  # "." or a split: "test"
            out.append((key, head + sub + "/" if sub != "." else head or "./", 0))
            continue
        rel = head + f.relative_to(path).as_posix()
        if not keep(rel):
            continue
        size = regular_size(f, notes) if f.exists() else 0
        if size is not None:
            out.append((key, rel, size))
    return out


def _all(rel: str) -> bool:
    return True


def regular_size(path: Path, notes: list[str]) -> int | None:
    """Size of ``path`` if it is a regular file (symlinks followed), else None and a note why.

    FIFOs, sockets and devices are never opened (reading a FIFO blocks forever). A dangling
    symlink counts as a file of size 0, so that its reader quarantines it with the reason.
    Uses ``stat`` only, so nothing is opened here.
    """
    try:
        st = path.stat()
    except OSError as exc:
        if path.is_symlink():  # a dangling link: its reader quarantines it with the reason
            return 0
        notes.append(f"skipped {path}: cannot stat it ({exc.strerror or exc})")
        return None
    if not stat.S_ISREG(st.st_mode):
        notes.append(f"skipped {path}: not a regular file ({_kind(st.st_mode)}); never opened")
        return None
    return st.st_size


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "named pipe"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISDIR, "directory"),
    ):
        if test(mode):
            return name
    return "special file"


def _unseen(
    root: Path, files: list[tuple[str, int]], seen: set[tuple[int, int]], notes: list[str]
) -> list[tuple[str, int]]:
    """``files`` without those already planned (same file: same device and inode, so a
    symlink or hard link to a file given twice counts once); warns for each duplicate."""
    kept = []
    for rel, size in files:
        try:
            st = (root / rel).stat()
        except OSError:  # the reader reports it as a quarantine line
            kept.append((rel, size))
            continue
        key = (st.st_dev, st.st_ino)
        if key in seen:
            notes.append(f"input {root / rel} is given more than once; it is read once")
            continue
        seen.add(key)
        kept.append((rel, size))
    return kept


def _glob_root(pattern: str) -> Path:
    parts = Path(pattern).parts
    fixed = list(parts[: next((i for i, p in enumerate(parts) if glob.has_magic(p)), len(parts))])
    return Path(*fixed) if fixed else Path(".")


def _glob_files(
    pattern: str,
    root: Path,
    fmt: str,
    include: Sequence[str],
    exclude: Sequence[str],
    notes: list[str],
) -> list[tuple[str, int]]:
    """Files of a glob pattern, relative to its fixed ``root``, in sorted path order.

    A matched file is taken as it is (a dangling link too, for its reader to quarantine
    it; a FIFO, socket or device is skipped with a note); a matched directory is walked as
    a directory input is (``include``, hidden entries, ``save_to_disk`` directories), so a quoted ``'data/*'``
    reads what the shell's expansion of it reads. A file below a matched directory comes
    from that directory's walk only.
    """
    datasets = fmt in ("auto", "arrow")
    matched_dirs: set[str] = set()
    plain: list[tuple[str, str, int]] = []
    walked: list[tuple[str, str, int]] = []
    for m in sorted(glob.glob(pattern, recursive=True)):
        path = Path(m)
        rel = path.relative_to(root).as_posix()
        if _matches(rel, exclude):
            continue
        if path.is_dir():
            if rel in matched_dirs:
                continue
            matched_dirs.add(rel)
            prefix = "" if rel == "." else rel + "/"
            walked += _walk_keyed(path, include, exclude, notes, datasets, prefix)
        else:  # a dangling link counts as a file for its reader to quarantine; a FIFO is noted
            size = regular_size(path, notes)
            if size is not None:
                plain.append((rel, rel, size))
    parents = {rel: {p.as_posix() for p in Path(rel).parents} for rel, _, _ in plain}
    plain = [e for e in plain if not parents[e[1]] & matched_dirs]
    unique = {rel: (key, size) for key, rel, size in walked + plain}
    return [(rel, size) for rel, (_key, size) in sorted(unique.items(), key=lambda e: e[1][0])]


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
        kind = "datasets" if rel.endswith("/") else _format_of(rel, fmt)
        if kind == "text":
            texts.append((rel, size))
            continue
        if texts:
            tasks += text.plan(str(root), texts, source, task_bytes)
            texts = []
        path = str(root / rel)
        if kind == "datasets":  # a save_to_disk directory whose file list cannot be read
            rel = "" if rel == "./" else rel[:-1]
            tasks.append(unreadable_task("datasets", str(root / rel), rel, source))
        elif kind == "jsonl":
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

    Files that are not regular (FIFOs, sockets, devices, broken links) are skipped unopened,
    and a file given twice (same device and inode) is read once; each such case is logged
    as a warning.

    Raises :class:`InputError` for a missing path, a pattern that matches nothing, an input
    that is itself not a regular file or directory, or an input without any file; :class:`ConfigError` for an unknown format.
    """
    notes: list[str] = []
    size = DEFAULT_TASK_BYTES if task_bytes is None else task_bytes
    tasks = _plan_inputs(inputs, opts, fmt, include, exclude, size, source, notes)
    if task_bytes is None and auto_task_bytes(sum(t.size for t in tasks)) != size:
        size = auto_task_bytes(sum(t.size for t in tasks))
        tasks = _plan_inputs(inputs, opts, fmt, include, exclude, size, source, [])
    for note in notes:
        _log.warning("%s", note)
    return tasks


def _plan_inputs(
    inputs: Sequence[str | Path],
    opts: ReadOptions,
    fmt: str,
    include: Sequence[str],
    exclude: Sequence[str],
    task_bytes: int,
    source: str | None,
    notes: list[str],
) -> list[ReadTask]:
    if fmt not in FORMATS:
        raise ConfigError(f"format={fmt!r} is unknown; use one of {', '.join(FORMATS)}")
    if not inputs:
        raise InputError("no input given")
    tasks: list[ReadTask] = []
    seen: set[tuple[int, int]] = set()
    for spec in inputs:
        path = Path(spec)
        if not path.exists() and glob.has_magic(str(spec)):
            root = _glob_root(str(spec))
            files = _glob_files(str(spec), root, fmt, include, exclude, notes)
            if not files:
                raise InputError(f"input pattern {spec!r} matches no file")
            files = _unseen(root, files, seen, notes)
            tasks += _plan_files(root, files, source or _source_name(root), fmt, opts, task_bytes)
            continue
        if not path.exists():
            raise InputError(f"input {str(spec)!r} does not exist")
        name = source or _source_name(path)
        if path.is_dir() and (fmt in ("auto", "arrow")) and arrow.is_dataset_dir(path):
            found = [(rel, size) for _, rel, size in _dataset_keyed(path, "", _all, notes)]
            tasks += _plan_files(
                path, _unseen(path, found, seen, notes), name, "arrow", opts, task_bytes
            )
        elif path.is_dir():
            files = _walk(path, include, exclude, notes, datasets=fmt in ("auto", "arrow"))
            if not files:
                raise InputError(f"input directory {str(spec)!r} holds no matching file")
            tasks += _plan_files(
                path, _unseen(path, files, seen, notes), name, fmt, opts, task_bytes
            )
        else:
            size = regular_size(path, notes)
            if size is None:
                raise InputError(
                    f"input {str(spec)!r} is not a regular file or directory ({notes[-1]})"
                )
            files = _unseen(path.parent, [(path.name, size)], seen, notes)
            tasks += _plan_files(path.parent, files, name, fmt, opts, task_bytes)
    return tasks

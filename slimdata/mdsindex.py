"""Validate an MDS directory's ``index.json`` before streaming touches any shard.

``index.json`` is written by whoever made the dataset; mosaicml-streaming joins every shard
``basename`` to the directory and opens (and, for zipped shards, may delete) that path. A
basename such as ``../outside/shard.00000.mds`` would make it read outside the dataset. So
every slimdata entry point that hands a directory to streaming (``slimdata plan`` and
``simulate`` on shards, ``DocumentLoader`` and ``PlanShardLoader``) first calls
:func:`check_index`; call it yourself before building a ``StreamingDataset`` over files you
did not write.

Cost is bounded by the file, never by a number in it: the file is refused above
:data:`MAX_INDEX_BYTES` before it is read, parsing errors (nesting included) become
:class:`~slimdata.errors.InputError`, each basename costs one path resolution, and each
shard's sample count must fit its stated size (streaming allocates by it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import Any

from slimdata.errors import InputError

__all__ = [
    "MAX_INDEX_BYTES",
    "check_dataset",
    "check_index",
    "check_inside",
    "indexed_samples",
    "local_dirs",
]

MAX_INDEX_BYTES = 256 << 20
"""Largest ``index.json`` read (256 MiB: about 500,000 shard entries of ~500 bytes)."""


def check_inside(directory: Path, name: Any, where: str) -> Path:
    """``directory / name`` if ``name`` is a relative path that stays inside ``directory``
    (symlinks resolved), else an :class:`InputError` naming ``where``."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise InputError(f"{where}: shard basename {name!r} is not a file name")
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or "\\" in name:
        raise InputError(
            f"{where}: shard basename {name!r} points outside the dataset directory; "
            "the index is corrupt or hostile, refusing to read it"
        )
    root = os.path.realpath(directory)
    target = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, target]) != root:
        raise InputError(
            f"{where}: shard basename {name!r} resolves outside the dataset directory "
            f"(to {target}, through a symlink); refusing to read it"
        )
    return Path(target)


def _load(path: Path) -> Any:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InputError(f"{path.parent} has no readable index.json ({exc.strerror})") from None
    if size > MAX_INDEX_BYTES:
        raise InputError(
            f"{path}: {size} bytes is over the {MAX_INDEX_BYTES} byte limit for an index; "
            "split the dataset into several directories (streams)"
        )
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError
        raise InputError(f"{path}: not a valid MDS index ({str(exc)[:200]})") from None


def check_index(directory: str | Path) -> int:
    """Validate ``directory/index.json`` (see module docstring); returns its shard count."""
    return len(_checked_shards(Path(directory)))


def indexed_samples(directory: str | Path) -> int:
    """Samples of all shards of ``directory/index.json``, after :func:`check_index`."""
    return sum(shard["samples"] for shard in _checked_shards(Path(directory)))


def _checked_shards(directory: Path) -> list[dict]:
    path = directory / "index.json"
    index = _load(path)
    shards = index.get("shards") if isinstance(index, dict) else None
    if not isinstance(shards, list):
        raise InputError(f"{path}: not a valid MDS index (no 'shards' list)")
    for i, shard in enumerate(shards):
        where = f"{path}: shard {i}"
        if not isinstance(shard, dict):
            raise InputError(f"{where} is a {type(shard).__name__}, not an object")
        files = [shard.get(key) for key in ("raw_data", "zip_data", "raw_meta", "zip_meta")]
        if not isinstance(files[0], dict):
            raise InputError(f"{where} has no 'raw_data' entry")
        for entry in files:
            if entry is not None:
                if not isinstance(entry, dict):
                    raise InputError(f"{where}: a data entry is not an object")
                check_inside(directory, entry.get("basename"), where)
        _check_counts(shard, where)
    return shards


def _check_counts(shard: dict, where: str) -> None:
    """A shard's ``samples`` is a count its raw file can hold: an MDS shard starts with the
    sample count and one 4-byte offset per sample plus one, so ``n`` samples need at least
    ``4 * (n + 2)`` bytes (streaming would otherwise size arrays by a number it never checks)."""
    samples, size = shard.get("samples"), shard["raw_data"].get("bytes")
    if type(samples) is not int or samples < 0:
        raise InputError(f"{where}: 'samples' is {samples!r}, not a count of samples")
    if type(size) is not int or size < 0:
        raise InputError(f"{where}: its raw data's 'bytes' is {size!r}, not a file size")
    if 4 * (samples + 2) > size:
        raise InputError(
            f"{where} claims {samples} samples in {size} bytes, more than an MDS shard of "
            "that size holds (4 bytes of offset per sample): the index is damaged"
        )


def local_dirs(dataset: Any) -> list[Path]:
    """The local directories of a streaming dataset object
    (``StreamingDataset.streams[i].local`` or ``LocalDataset.local``; none for in-memory
    stand-ins)."""
    streams = getattr(dataset, "streams", None) or [dataset]
    found = [getattr(s, "local", None) for s in streams]
    return [Path(d) for d in found if isinstance(d, str | os.PathLike)]


def check_dataset(dataset: Any) -> int:
    """:func:`check_index` for every local directory of a streaming dataset object
    (:func:`local_dirs`); returns how many directories were checked."""
    dirs = local_dirs(dataset)
    for d in dirs:
        check_index(d)
    return len(dirs)

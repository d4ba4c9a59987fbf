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

Where slimdata reads a directory's samples itself (``slimdata plan``, ``simulate`` and
``stats`` on shards, through :func:`indexed_samples`), every shard entry must also be one
streaming's MDS reader can be built from (version 2, format ``mds``, exactly its fields,
columns listed alike): streaming builds its reader with ``MDSReader(**entry)`` and fails on
anything else with a bare ``KeyError: 'version'`` or ``TypeError``. Column encodings are
checked to be names, not that streaming knows them (that would import streaming, and torch
with it, into every command).
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
    """Samples of all shards of ``directory/index.json``, after :func:`check_index` and a
    check that streaming's MDS reader can be built from every shard entry (module
    docstring)."""
    return sum(shard["samples"] for shard in _checked_shards(Path(directory), readers=True))


def _checked_shards(directory: Path, readers: bool = False) -> list[dict]:
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
    if not readers:
        return shards
    if index.get("version") != 2:
        raise InputError(
            f"{path}: index 'version' is {index.get('version')!r:.40}, not 2: not an index "
            "mosaicml-streaming reads (damaged, or of another version); rebuild the dataset"
        )
    for i, shard in enumerate(shards):
        _check_mds_fields(shard, f"{path}: shard {i}")
    return shards


_MDS_FIELDS = frozenset(
    {
        "column_encodings",
        "column_names",
        "column_sizes",
        "compression",
        "format",
        "hashes",
        "raw_data",
        "samples",
        "size_limit",
        "version",
        "zip_data",
    }
)
"""The fields of an MDS shard entry: the arguments of streaming's ``MDSReader``."""

_FILE_FIELDS = frozenset({"basename", "bytes", "hashes"})
"""The fields of a shard's ``raw_data``/``zip_data`` (streaming's ``FileInfo``)."""


def _check_mds_fields(shard: dict, where: str) -> None:
    """``shard`` is an MDS shard entry streaming can build its reader from (module
    docstring): ``{"version": 2, "format": "mds", "column_names": ["tokens", ...], ...}``."""
    if shard.get("version") != 2 or shard.get("format") != "mds":
        raise InputError(
            f"{where}: version {shard.get('version')!r:.40} and format "
            f"{shard.get('format')!r:.40}, not 2 and 'mds': slimdata reads MDS shards only"
        )
    keys = set(shard)
    if keys != _MDS_FIELDS:
        missing, extra = sorted(_MDS_FIELDS - keys), sorted(map(str, keys - _MDS_FIELDS))[:5]
        raise InputError(
            f"{where}: not an MDS shard entry (missing {missing or 'nothing'}, unknown "
            f"{extra or 'nothing'}): the index is damaged; rebuild the dataset"
        )
    names, encodings, sizes = (
        shard[k] for k in ("column_names", "column_encodings", "column_sizes")
    )
    ok = (
        all(isinstance(x, list) for x in (names, encodings, sizes))
        and len(names) == len(encodings) == len(sizes)
        and all(isinstance(x, str) and x for x in names + encodings)
        and all(x is None or (type(x) is int and x >= 0) for x in sizes)
    )
    if not ok:
        raise InputError(
            f"{where}: its column_names, column_encodings and column_sizes are not lists of "
            "one name, encoding and size (or null) per column: the index is damaged"
        )
    for key in ("raw_data", "zip_data"):
        entry = shard[key]
        if entry is None and key == "zip_data":
            continue
        if not isinstance(entry, dict) or set(entry) != _FILE_FIELDS:
            raise InputError(f"{where}: its {key!r} is not an object of basename, bytes and hashes")
    limit = shard["size_limit"]
    if not isinstance(shard["hashes"], list) or not (
        limit is None or (type(limit) is int and limit >= 0)
    ):
        raise InputError(
            f"{where}: 'hashes' is not a list or 'size_limit' not a size: the index is damaged"
        )
    if shard["compression"] is not None and not isinstance(shard["compression"], str):
        raise InputError(f"{where}: 'compression' is {shard['compression']!r:.40}, not a name")


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

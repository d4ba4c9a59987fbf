"""Where a plan's documents come from: a lengths file, or the manifest of document shards.

A lengths file holds one integer per line, or a JSON list; ``.gz`` is allowed. Document
shards written by ``slimdata build`` carry ``manifest.parquet`` next to ``index.json``: one
row per sample in global sample order (``sample``, ``doc_id``, ``source``, ``length``,
``loss_tokens``, ``cuts``), so planning never has to read token arrays.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np

from slimdata.columns import check_manifest
from slimdata.errors import ConfigError, InputError
from slimdata.mdsindex import indexed_samples
from slimdata.plan.types import Document
from slimdata.slicing import (
    DEFAULT_SLICE_TOKENS,
    MAX_DOCUMENT_TOKENS,
    check_length,
    cut_points_of,
)

__all__ = [
    "MANIFEST_NAME",
    "documents_from_lengths",
    "load_lengths",
    "load_shard_documents",
    "read_manifest",
]

MANIFEST_NAME = "manifest.parquet"


def _parse_lengths(path: Path, text: str) -> tuple[list[object], Callable[[int], str]]:
    """Every entry's value, and ``where(i)`` naming entry ``i``: ``"line 3"`` of a text file,
    ``"entry 3"`` of a JSON list (built only for an error)."""
    stripped = text.lstrip()
    if not stripped.startswith("["):
        values: list[object] = []
        linenos: list[int] = []
        for lineno, line in enumerate(text.splitlines(), 1):
            try:
                values.append(int(line))  # int() ignores surrounding whitespace
            except ValueError:
                if not line.strip():
                    continue
                raise InputError(
                    f"{path}:{lineno}: {line.strip()[:40]!r} is not an integer length"
                ) from None
            linenos.append(lineno)
        return values, lambda i: f"{path}:{linenos[i]}: length"
    try:
        parsed = json.loads(stripped)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"{path}: invalid JSON list: {exc}") from exc
    if not isinstance(parsed, list):
        raise InputError(f"{path}: expected a JSON list of integers")
    return parsed, lambda i: f"{path}: entry {i + 1}: length"


def load_lengths(path: str | Path) -> np.ndarray:
    """Read document lengths (int64). Raises :class:`InputError` naming the bad entry.

    Every entry must be an integer in ``[1, MAX_DOCUMENT_TOKENS]``; it is checked before
    any array is built from it (no allocation follows a number written in the file).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"lengths file {path} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise InputError(f"cannot read lengths file {path}: {exc}") from exc
    values, where = _parse_lengths(path, text)
    if not values:
        raise InputError(f"{path}: no lengths found")
    # all plain ints within bounds: one min and one max; else find and name the first bad one
    ints = cast("list[int]", values) if all(type(v) is int for v in values) else None
    if ints is None or not 1 <= min(ints) <= max(ints) <= MAX_DOCUMENT_TOKENS:
        for i, value in enumerate(values):
            try:
                if check_length(value, where(i)) == 0:
                    raise InputError(f"{where(i)} is 0; lengths must be positive")
            except ConfigError as exc:
                raise InputError(str(exc)) from None
    return np.asarray(values, dtype=np.int64)


def documents_from_lengths(
    lengths, slice_tokens: int = DEFAULT_SLICE_TOKENS, first_id: int = 0
) -> list[Document]:
    """Documents with ids ``first_id, first_id + 1, ...`` cut at ``slice_tokens``."""
    cuts = cut_points_of(lengths, slice_tokens)  # checks every length
    ends = [c[-1] for c in cuts]
    ids = range(first_id, first_id + len(cuts))
    return list(map(Document, ids, ends, [max(n - 1, 0) for n in ends], cuts))


def read_manifest(directory: str | Path, columns: list[str]):
    """The manifest of a ``slimdata build`` output (pyarrow table of ``columns``, sorted by
    sample) after checking it (:func:`~slimdata.columns.check_manifest`) and that it has
    one row per sample of the build's ``index.json`` (a cut manifest would plan part of the
    corpus)."""
    import pyarrow.parquet as pq

    directory = Path(directory)
    manifest = directory / MANIFEST_NAME
    if not (directory / "index.json").is_file():
        raise InputError(
            f"{directory} has no index.json: not an MDS dataset (run `slimdata build` first)"
        )
    samples = indexed_samples(directory)  # checks the index before streaming reads it
    if not manifest.is_file():
        raise InputError(f"{directory} has no {MANIFEST_NAME}: was it written by `slimdata build`?")
    needed = ["sample", "length", "loss_tokens", "cuts"]
    try:
        table = pq.read_table(manifest, columns=list(dict.fromkeys(needed + columns)))
        table = table.sort_by("sample")
    except (OSError, ValueError, KeyError) as exc:  # pyarrow's errors subclass these
        raise InputError(f"{manifest}: unreadable or not a slimdata manifest ({exc})") from None
    if table.num_rows != samples:
        raise InputError(
            f"{manifest}: {table.num_rows} documents where index.json holds {samples} samples: "
            "the manifest is damaged or from another build; rebuild with `slimdata build`"
        )
    check_manifest(table, manifest)  # lengths, loss tokens and the build's cut points
    return table.select(columns)


def load_shard_documents(directory: str | Path) -> list[Document]:
    """Documents of a ``slimdata build`` output directory, in global sample order."""
    columns = ["sample", "doc_id", "length", "loss_tokens", "cuts"]
    rows = read_manifest(directory, columns).to_pylist()
    return [
        Document(
            doc_id=row["doc_id"],
            length=int(row["length"]),
            loss_tokens=int(row["loss_tokens"]),
            cuts=tuple(int(c) for c in row["cuts"]),
            sample=int(row["sample"]),
        )
        for row in rows
    ]

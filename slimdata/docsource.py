"""Where a plan's documents come from: a lengths file, or the manifest of document shards.

A lengths file holds one integer per line, or a JSON list; ``.gz`` is allowed. Document
shards written by ``slimdata build`` carry ``manifest.parquet`` next to ``index.json``: one
row per sample in global sample order (``sample``, ``doc_id``, ``source``, ``length``,
``loss_tokens``, ``cuts``), so planning never has to read token arrays.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from slimdata.errors import InputError
from slimdata.plan.types import Document
from slimdata.slicing import DEFAULT_SLICE_TOKENS, slice_cuts

__all__ = ["MANIFEST_NAME", "documents_from_lengths", "load_lengths", "load_shard_documents"]

MANIFEST_NAME = "manifest.parquet"


def load_lengths(path: str | Path) -> np.ndarray:
    """Read document lengths (int64). Raises :class:`InputError` naming the bad line."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"lengths file {path} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read lengths file {path}: {exc}") from exc
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            values = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: invalid JSON list: {exc}") from exc
    else:
        values = []
        for lineno, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line:
                continue
            try:
                values.append(int(line))
            except ValueError:
                raise InputError(
                    f"{path}:{lineno}: {line[:40]!r} is not an integer length"
                ) from None
    arr = np.asarray(values, dtype=np.int64)
    if arr.ndim != 1 or len(arr) == 0:
        raise InputError(f"{path}: no lengths found")
    if (arr <= 0).any():
        bad = int(np.argmax(arr <= 0))
        raise InputError(f"{path}: entry {bad + 1} is {arr[bad]}; lengths must be positive")
    return arr


def documents_from_lengths(
    lengths, slice_tokens: int = DEFAULT_SLICE_TOKENS, first_id: int = 0
) -> list[Document]:
    """Documents with ids ``first_id, first_id + 1, ...`` cut at ``slice_tokens``."""
    return [
        Document(
            doc_id=first_id + i,
            length=int(n),
            cuts=tuple(int(c) for c in slice_cuts(int(n), slice_tokens)),
        )
        for i, n in enumerate(lengths)
    ]


def load_shard_documents(directory: str | Path) -> list[Document]:
    """Documents of a ``slimdata build`` output directory, in global sample order."""
    import pyarrow.parquet as pq

    directory = Path(directory)
    manifest = directory / MANIFEST_NAME
    if not (directory / "index.json").is_file():
        raise InputError(
            f"{directory} has no index.json: not an MDS dataset (run `slimdata build` first)"
        )
    if not manifest.is_file():
        raise InputError(f"{directory} has no {MANIFEST_NAME}: was it written by `slimdata build`?")
    columns = ["sample", "doc_id", "length", "loss_tokens", "cuts"]
    rows = pq.read_table(manifest, columns=columns).sort_by("sample").to_pylist()
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

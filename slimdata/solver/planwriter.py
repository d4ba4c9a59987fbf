"""The MDS writer of plan shards: ``streaming.MDSWriter``'s bytes for a local directory, no
compression and no hashes, without importing torch.

``MDSWriter`` comes with ``streaming.base.util``, which imports ``torch.distributed``: 1.3 s
of CPU, a tenth of ``slimdata plan --lengths`` on a million documents, for a writer that
needs numpy. This one writes the same files (shards ``shard.00000.mds``, ... and
``index.json``; each shard: sample count, sample offsets, the writer's JSON configuration,
the samples; each sample: the sizes of its variable-size columns, then its columns in name
order, encoded by streaming's own MDS encodings, :func:`slimdata.ingest.mds.mds_encoding`)
and starts a new shard where ``MDSWriter`` does. :func:`plan_writer` returns it for what it
covers and ``MDSWriter`` otherwise (remote output, compression, hashes);
``tests/solver/test_planwriter.py`` checks the bytes equal ``MDSWriter``'s.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from slimdata.ingest.mds import mds_encoding, writer_class

__all__ = ["PlanShardWriter", "plan_writer"]


def plan_writer(
    out: str | Path, columns: dict[str, str], compression: str | None, size_limit: int | str
) -> Any:
    """A writer of MDS samples to ``out`` (a context manager with ``write(sample)``):
    :class:`PlanShardWriter` for a local directory without compression and a size limit in
    bytes, else ``streaming.MDSWriter``."""
    local = not urllib.parse.urlparse(str(out)).scheme
    if compression is None and local and isinstance(size_limit, int):
        return PlanShardWriter(out=out, columns=columns, size_limit=size_limit)
    return writer_class()(
        out=str(out), columns=columns, compression=compression, size_limit=size_limit
    )


class PlanShardWriter:
    """``MDSWriter(out=out, columns=columns, size_limit=size_limit)`` for a local ``out``
    (empty or absent): the same shard and index bytes."""

    def __init__(self, *, out: str | Path, columns: dict[str, str], size_limit: int):
        if not 0 < size_limit < 2**32:
            raise ValueError(f"size_limit={size_limit!r} must be in (0, 2**32)")
        self.local = os.path.expanduser(str(out))
        if os.path.exists(self.local) and os.listdir(self.local):
            raise FileExistsError(f"Directory is not empty: {self.local}")
        os.makedirs(self.local, exist_ok=True)
        self.encode, size_of = mds_encoding()
        self.names = sorted(columns)
        self.encodings = [columns[n] for n in self.names]
        self.sizes = [size_of(e) for e in self.encodings]
        self.config: dict[str, Any] = {
            "version": 2,
            "format": "mds",
            "compression": None,
            "hashes": [],
            "size_limit": size_limit,
            "column_names": self.names,
            "column_encodings": self.encodings,
            "column_sizes": self.sizes,
        }
        self.config_data = json.dumps(self.config, sort_keys=True).encode("utf-8")
        self.size_limit = size_limit
        self.shards: list[dict[str, Any]] = []
        self.samples: list[bytes] = []
        self.shard_size = 8 + len(self.config_data)  # sample count, last offset, config

    def write(self, sample: dict[str, Any]) -> None:
        """Encode ``sample``; first write the open shard if the sample would overflow it."""
        sizes, data = [], []
        for name, encoding, size in zip(self.names, self.encodings, self.sizes, strict=True):
            datum = self.encode(encoding, sample[name])
            if size is None:
                sizes.append(len(datum))
            elif size != len(datum):
                raise KeyError(
                    f"column {name!r}: {len(datum)} bytes, its encoding {encoding} has {size}"
                )
            data.append(datum)
        encoded = np.array(sizes, np.uint32).tobytes() + b"".join(data)
        if self.size_limit < self.shard_size + len(encoded) + 4:
            self._flush()
        self.samples.append(encoded)
        self.shard_size += len(encoded) + 4  # and its offset

    def _flush(self) -> None:
        """Write the open shard's file and record it for ``index.json``."""
        n = len(self.samples)
        offsets = np.array([0, *map(len, self.samples)]).cumsum().astype(np.uint32)
        offsets += 4 + 4 * (n + 1) + len(self.config_data)
        raw = np.uint32(n).tobytes() + offsets.tobytes() + self.config_data + b"".join(self.samples)
        basename = f"shard.{len(self.shards):05}.mds"
        with open(os.path.join(self.local, basename), "wb") as f:
            f.write(raw)
        info = {"basename": basename, "bytes": len(raw), "hashes": {}}
        self.shards.append({"samples": n, "raw_data": info, "zip_data": None, **self.config})
        self.samples = []
        self.shard_size = 8 + len(self.config_data)

    def finish(self) -> None:
        """Write the last shard and ``index.json``."""
        if self.samples:
            self._flush()
        with open(os.path.join(self.local, "index.json"), "w") as f:
            json.dump({"version": 2, "shards": self.shards}, f, sort_keys=True)

    def __enter__(self) -> PlanShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.finish()

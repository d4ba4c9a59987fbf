"""Read the samples of a ``slimdata build`` output in place, compressed or not.

streaming's ``LocalDataset`` reads only raw ``.mds`` files; a build written with
``--compression zstd`` holds ``shard.*.mds.zstd`` only (a ``StreamingDataset`` decompresses
them into its local cache when it streams them). :class:`LocalShards` is ``LocalDataset``
that decompresses a compressed shard on its first read into a private scratch directory,
removed when the reader is closed or collected, so reading a build never writes into it.
A process killed meanwhile removes it too (SIGTERM, Ctrl-C), or the next reader's does
(``kill -9``): :class:`slimdata.scratch.ScratchDir`.

Example: a build with two zstd shards of which a plan reads samples of the second only:
that shard alone is decompressed, once, into
``/tmp/slimdata-shards-<pid>-*/task-00001/...``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streaming import LocalDataset
from streaming.base.compression import decompress

from slimdata.errors import InputError
from slimdata.scratch import ScratchDir

__all__ = ["LocalShards"]

SCRATCH_PREFIX = "slimdata-shards-"
"""Name of the scratch directories, ``$TMPDIR/slimdata-shards-<pid>-<random>``."""


class LocalShards(LocalDataset):
    """``LocalDataset(local)`` that also reads compressed shards (module docstring)."""

    def __init__(self, local: str | Path) -> None:
        super().__init__(local=str(local))
        self._scratch: ScratchDir | None = None
        self._ready: set[int] = set()

    def get_item(self, sample_id: int) -> dict[str, Any]:
        shard_id, _ = self.spanner[sample_id]
        if shard_id not in self._ready:
            self._prepare(shard_id)
            self._ready.add(shard_id)
        return super().get_item(sample_id)

    def close(self) -> None:
        """Remove the decompressed copies (also done when the reader is collected)."""
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None
            self._ready.clear()
            for shard in self.shards:
                shard.dirname = self.local

    def _prepare(self, shard_id: int) -> None:
        """Point a compressed shard whose raw files are absent at decompressed copies."""
        shard = self.shards[shard_id]
        pairs = shard.file_pairs
        if not shard.compression or all(
            Path(shard.dirname, shard.split, raw.basename).is_file() for raw, _zip in pairs
        ):
            self._check_raw_files(shard)
            return
        if self._scratch is None:
            self._scratch = ScratchDir(SCRATCH_PREFIX)
        for raw, packed in pairs:
            if packed is None:
                raise InputError(
                    f"{self.local}: shard {raw.basename} has neither a raw nor a compressed file"
                )
            source = Path(shard.dirname, shard.split, packed.basename)
            dest = Path(self._scratch.name, shard.split, raw.basename)
            dest.parent.mkdir(parents=True, exist_ok=True)
            _decompress_into(source, shard.compression, raw.bytes, dest)
        shard.dirname = self._scratch.name

    def _check_raw_files(self, shard: Any) -> None:
        """Every raw file of ``shard`` exists with the size index.json gives it: a missing,
        cut or replaced shard is a clear error, not a failed read mid-plan."""
        for raw, _zip in shard.file_pairs:
            path = Path(shard.dirname, shard.split or "", raw.basename)
            if not path.is_file():
                raise InputError(f"{self.local}: shard file {raw.basename} is missing")
            size = path.stat().st_size
            if raw.bytes is not None and size != raw.bytes:
                raise InputError(
                    f"{path}: {size} bytes where index.json gives {raw.bytes}: the shard is "
                    "truncated or replaced; rebuild it"
                )


CHUNK = 1 << 20
"""Bytes decompressed at a time: a zstd shard is streamed to disk, never held whole."""


def _decompress_into(source: Path, compression: str, size: int, dest: Path) -> None:
    """Write compressed shard file ``source`` decompressed to ``dest``, refusing it as soon as
    it yields more than the ``size`` bytes index.json gives it (a file cannot make the reader
    write or hold more than its index claims), or ends short of them."""
    try:
        if compression.split(":")[0] == "zstd":
            got = _stream_zstd(source, dest, size)
        else:  # the other codecs streaming offers, whole in memory
            data = decompress(compression, source.read_bytes())
            got = len(data)
            if got == size:
                dest.write_bytes(data)
    except OSError as e:
        raise InputError(f"{source}: cannot read this compressed shard ({e})") from None
    except _TooLong:
        got = size + 1
    except Exception as e:  # the codec's own error types: a damaged file
        raise InputError(
            f"{source}: not a valid {compression} shard ({e}); rebuild the dataset"
        ) from None
    if got != size:
        said = f"{got} bytes" if got <= size else f"more than {size} bytes"
        raise InputError(
            f"{source}: decompresses to {said} but index.json says {size}; the shard or "
            "index.json is damaged: rebuild the dataset"
        )


class _TooLong(Exception):
    """A shard decompressed past its declared size."""


def _stream_zstd(source: Path, dest: Path, size: int) -> int:
    """Decompress a zstd file chunk by chunk; the bytes written (stops past ``size``)."""
    import zstandard

    written = 0
    with source.open("rb") as fin, dest.open("wb") as fout:
        reader = zstandard.ZstdDecompressor().stream_reader(fin, read_across_frames=True)
        while chunk := reader.read(CHUNK):
            written += len(chunk)
            if written > size:
                raise _TooLong
            fout.write(chunk)
    return written

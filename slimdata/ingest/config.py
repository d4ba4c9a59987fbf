"""The build configuration: one frozen value that fully determines the shards written.

Everything that changes the output is here (``workers``, ``engine`` and ``ray_address`` are
the exceptions: they change only where and how fast tasks run, never bytes). Recipes in ``pipelines/`` return instances of
:class:`BuildConfig`; the CLI overrides the fields the user passes explicitly.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from slimdata.errors import ConfigError
from slimdata.readers import FORMATS, ReadOptions
from slimdata.slicing import DEFAULT_SLICE_TOKENS, check_slice_tokens
from slimdata.tokenize import DEFAULT_TOKENIZER

__all__ = ["COMPRESSIONS", "DEFAULT_SIZE_LIMIT", "ENGINES", "HASHES", "BuildConfig", "parse_size"]

COMPRESSIONS: frozenset[str] = frozenset(
    [
        *(
            f"{name}{level}"
            for name, levels in (
                ("br", range(12)),
                ("bz2", range(1, 10)),
                ("gz", range(10)),
                ("zstd", range(1, 23)),
            )
            for level in ("", *(f":{i}" for i in levels))
        ),
        "snappy",
    ]
)
"""Shard compressions ``streaming.MDSWriter`` accepts (its ``get_compressions()`` in 0.13.0,
checked equal by the tests). Kept here so validating options does not import ``streaming``
(and with it torch) before any work starts."""

HASHES: frozenset[str] = frozenset(
    [
        "blake2b",
        "blake2s",
        "md5",
        "sha1",
        "sha224",
        "sha256",
        "sha384",
        "sha3_224",
        "sha3_256",
        "sha3_384",
        "sha3_512",
        "sha512",
        "xxh128",
        "xxh32",
        "xxh3_128",
        "xxh3_64",
        "xxh64",
    ]
)
"""Shard hashes ``streaming.MDSWriter`` accepts (its ``get_hashes()``; tested equal)."""

ENGINES: tuple[str, ...] = ("local", "ray")
"""Where build tasks run: ``local`` (this process and ``workers`` forked processes) or
``ray`` (Ray Data tasks on a Ray cluster, :mod:`slimdata.ingest.ray_engine`)."""

DEFAULT_SIZE_LIMIT = 1 << 26
"""Shard size limit in bytes before compression (64 MiB, the MDSWriter default)."""

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1 << 10,
    "mb": 1 << 20,
    "gb": 1 << 30,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
}


def parse_size(value: int | str) -> int:
    """Bytes from an int or a string like ``64mb`` / ``1gb`` (binary units)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise ConfigError(f"size {value} must be positive")
        return value
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _UNITS or int(match.group(1)) <= 0:
        raise ConfigError(f"size {value!r} is not a positive size like 67108864, 64mb or 1gb")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


@dataclass(frozen=True, kw_only=True)
class BuildConfig:
    """What `slimdata build` reads, how it tokenizes, slices and costs, and how it writes."""

    inputs: tuple[str, ...] = ()
    """Files, directories or glob patterns; empty means the embedded default corpus."""
    format: str = "auto"
    """Input format: ``auto`` (by suffix), ``jsonl``, ``parquet``, ``arrow`` or ``text``."""
    include: tuple[str, ...] = ()
    """Glob patterns (name or relative path) that directory walks keep (empty: all files)."""
    exclude: tuple[str, ...] = ()
    """Glob patterns (name or relative path) of files and directories that walks skip."""
    text_field: str = "text"
    """Field or column holding the text of record formats."""
    id_field: str | None = None
    """Field or column holding a document id (else ``source/file:row``)."""
    source: str | None = None
    """Source name stored with every document (else the input's name)."""
    tokenizer: str = DEFAULT_TOKENIZER
    """Tokenizer spec (see :mod:`slimdata.tokenize`)."""
    eos_token: str | None = None
    """EOS token override (else from the tokenizer's config)."""
    slice_tokens: int = DEFAULT_SLICE_TOKENS
    """Slice length; boundaries are multiples of it (a multiple of 128) except the last."""
    model: str = "llama-8b"
    """Cost-model preset or JSON model config."""
    device: str = "h100"
    """Device preset of the analytic cost model."""
    recompute: str = "full"
    """Activation recompute policy assumed by the cost model (``slimdata build --recompute
    auto``, the default, gives ``full`` from a 32K ``--context`` on, as ``plan`` and
    ``simulate`` assume)."""
    cost_profile: str | None = None
    """Measured coefficient file (overrides the analytic model)."""
    truncate: int | None = None
    """Opt-in: keep at most this many tokens per document (EOS included); None keeps all."""
    compression: str | None = None
    """MDS shard compression (``zstd``, ``zstd:7``, ``br``, ...); None stores raw."""
    hashes: tuple[str, ...] = ()
    """Shard hash algorithms recorded in index.json (``sha1``, ``xxh64``, ...)."""
    size_limit: int = DEFAULT_SIZE_LIMIT
    """Shard size limit in bytes."""
    workers: int = 1
    """Worker processes of the ``local`` engine (changes speed only, never the output)."""
    engine: str = "local"
    """Where tasks run (:data:`ENGINES`); changes speed only, never the output."""
    ray_address: str | None = None
    """Ray cluster of the ``ray`` engine (``auto``, ``ray://host:10001``, a GCS address);
    None: ``RAY_ADDRESS`` if set, else a new local cluster with this machine's cores."""
    task_bytes: int | None = None
    """Target input bytes per task (one output sub-directory each); None: automatic, from
    the inputs' total (:func:`slimdata.readers.auto_task_bytes`: 256 KiB to 4 MiB)."""
    batch_chars: int = 1 << 21
    """Characters per tokenizer batch (bounds memory; large enough for parallel encoding)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(str(p) for p in self.inputs))
        object.__setattr__(self, "include", tuple(self.include))
        object.__setattr__(self, "exclude", tuple(self.exclude))
        object.__setattr__(self, "hashes", tuple(self.hashes))
        object.__setattr__(self, "size_limit", parse_size(self.size_limit))
        if self.format not in FORMATS:
            raise ConfigError(f"format={self.format!r} is unknown; use one of {', '.join(FORMATS)}")
        check_slice_tokens(self.slice_tokens)
        if not self.text_field:
            raise ConfigError(
                "text_field is empty; name the field holding the text, e.g. --text-field text"
            )
        if self.truncate is not None and (not isinstance(self.truncate, int) or self.truncate < 2):
            raise ConfigError(
                f"truncate={self.truncate!r} must be an int >= 2 (one token plus EOS), or unset to keep every token"
            )
        if self.engine not in ENGINES:
            raise ConfigError(f"engine={self.engine!r} is unknown; use one of {', '.join(ENGINES)}")
        if self.ray_address is not None and self.engine != "ray":
            raise ConfigError(
                f"ray_address={self.ray_address!r} needs engine='ray' (--engine ray --address ...)"
            )
        for name in ("workers", "task_bytes", "batch_chars"):
            value = getattr(self, name)
            if name == "task_bytes" and value is None:
                continue
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r} must be a positive int")

    @property
    def read_options(self) -> ReadOptions:
        return ReadOptions(text_field=self.text_field, id_field=self.id_field)

    def replace(self, **changes: Any) -> BuildConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["inputs"] = list(self.inputs)
        data["include"] = list(self.include)
        data["exclude"] = list(self.exclude)
        data["hashes"] = list(self.hashes)
        return data

    def output_dict(self) -> dict[str, Any]:
        """The fields that determine the output bytes (all but ``workers``, ``engine`` and
        ``ray_address``: a build started on one engine can be resumed on the other)."""
        data = self.to_dict()
        for name in ("workers", "engine", "ray_address"):
            del data[name]
        return data

"""Summary of a document-shard directory, computed with polars from ``manifest.parquet``.

No token array is read: lengths and cut points live in the manifest. *Attention work* of a
document of length ``n`` is its causal query-key pairs ``n (n + 1) / 2`` (the sum over its
slices of ``causal_pairs``, independent of slicing). The *tail* is reported two ways: the
longest 1% / 0.1% of documents, and documents longer than fixed thresholds; for each, the
share of documents, tokens and attention work they carry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from slimdata.cost import causal_pairs
from slimdata.docsource import MANIFEST_NAME, read_manifest
from slimdata.errors import InputError
from slimdata.planning import SIDECAR_NAME

__all__ = ["PERCENTILES", "THRESHOLDS", "format_stats", "load_lengths_frame", "shard_stats"]

PERCENTILES = (50, 90, 99, 99.9)
THRESHOLDS = (8_192, 32_768, 131_072)
TOP_FRACTIONS = (0.01, 0.001)


def load_lengths_frame(directory: str | Path):
    """The manifest of a build (polars DataFrame) with an ``attention`` column added."""
    import polars as pl

    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(f"{directory} does not exist or is not a directory")
    if not (directory / MANIFEST_NAME).is_file():
        raise InputError(
            f"{directory} has no {MANIFEST_NAME}: not a finished `slimdata build` output"
        )
    columns = ["sample", "doc_id", "source", "length", "cuts"]
    df = pl.DataFrame(read_manifest(directory, columns))
    attention = causal_pairs(0, df["length"].to_numpy().astype(np.float64))
    return df.with_columns(pl.Series("attention", attention, dtype=pl.Float64))


def _sidecar(path: Path) -> dict[str, Any]:
    """The build's sidecar (``{}`` when there is none), or a clear error when it is not a
    JSON object with object-valued ``counts`` and ``tokenizer``."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:
        raise InputError(f"{path}: unreadable or not a slimdata build sidecar ({exc})") from None
    if not isinstance(data, dict) or not all(
        isinstance(data.get(k, {}), dict) for k in ("counts", "tokenizer")
    ):
        raise InputError(f"{path}: not a slimdata build sidecar (expected a JSON object)")
    return data


def _share(df, mask, total_tokens: float, total_att: float) -> dict[str, float]:
    part = df.filter(mask)
    return {
        "documents": part.height,
        "doc_share": part.height / max(df.height, 1),
        "token_share": float(part["length"].sum()) / total_tokens,
        "attention_share": float(part["attention"].sum()) / total_att,
    }


def shard_stats(directory: str | Path) -> dict[str, Any]:
    """Documents, tokens, length percentiles and tail shares of a build (a JSON-able dict)."""
    import polars as pl

    directory = Path(directory)
    df = load_lengths_frame(directory)
    if df.height == 0:
        raise InputError(f"{directory}: the manifest holds no document")
    sidecar = _sidecar(directory / SIDECAR_NAME)
    lengths = df["length"].cast(pl.Float64)
    total_tokens = float(lengths.sum())
    total_att = float(df["attention"].sum())
    ranked = df.sort("length", descending=True)
    top = {}
    for frac in TOP_FRACTIONS:
        k = max(1, round(frac * df.height))
        head = ranked.head(k)
        top[f"top_{frac * 100:g}pct"] = {
            "documents": k,
            "min_length": int(head["length"].min()),
            "token_share": float(head["length"].sum()) / total_tokens,
            "attention_share": float(head["attention"].sum()) / total_att,
        }
    above = {
        f"over_{t}": _share(df, pl.col("length") > t, total_tokens, total_att) for t in THRESHOLDS
    }
    counts = sidecar.get("counts", {})
    by_source = (
        df.group_by("source")
        .agg(pl.len().alias("documents"), pl.col("length").sum().alias("tokens"))
        .sort("source")
    )
    return {
        "directory": str(directory),
        "documents": df.height,
        "tokens": int(total_tokens),
        "slices": int(df["cuts"].list.len().sum() - df.height),
        "quarantined": counts.get("quarantined"),
        "truncated_documents": counts.get("truncated_documents"),
        "length": {
            "mean": float(lengths.mean()),
            "min": int(df["length"].min()),
            "max": int(df["length"].max()),
            **{
                f"p{p:g}": float(lengths.quantile(p / 100, interpolation="linear"))
                for p in PERCENTILES
            },
        },
        "tail": {**top, **above},
        "sources": {
            row["source"]: {"documents": row["documents"], "tokens": int(row["tokens"])}
            for row in by_source.iter_rows(named=True)
        },
        "tokenizer": sidecar.get("tokenizer", {}).get("name"),
        "model": sidecar.get("model"),
        "slice_tokens": sidecar.get("slice_tokens"),
    }


def format_stats(stats: dict[str, Any]) -> str:
    """Human-readable text of :func:`shard_stats`."""
    ln = stats["length"]
    lines = [
        f"dataset      {stats['directory']}",
        f"documents    {stats['documents']:,}   tokens {stats['tokens']:,}   slices {stats['slices']:,}"
        + (
            f"   quarantined {stats['quarantined']:,}"
            if stats.get("quarantined") is not None
            else ""
        ),
        f"tokenizer    {stats.get('tokenizer')}   model {stats.get('model')}   slice_tokens {stats.get('slice_tokens')}",
        "length       " + "  ".join(f"{k} {v:,.0f}" for k, v in ln.items()),
        "tail         docs    doc%   token%   attention%",
    ]
    for name, t in stats["tail"].items():
        share = t.get("doc_share", t["documents"] / stats["documents"])
        lines.append(
            f"  {name:<11}{t['documents']:>6} {100 * share:>6.2f} {100 * t['token_share']:>8.2f} {100 * t['attention_share']:>12.2f}"
        )
    for source, s in stats["sources"].items():
        lines.append(f"source       {source}: {s['documents']:,} documents, {s['tokens']:,} tokens")
    return "\n".join(lines)

"""The stages of a build, each a small function: batch -> tokenize -> append EOS ->
(truncate, opt-in) -> slice -> annotate cost -> sample.

Stages work on whole tokenizer batches; the only per-document Python work is a handful of
numpy calls (no per-token loops). A 10-token document at ``slice_tokens=4`` (not a legal
value, just the picture): tokens ``t0..t8`` + EOS, cuts ``[0, 4, 8, 10]``, three cost
entries per column.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from slimdata.columns import COST_COLUMNS
from slimdata.cost import CostModel
from slimdata.readers import ReadResult, Record, Rejected
from slimdata.slicing import slice_cuts
from slimdata.tokenize import TextTokenizer

__all__ = [
    "Document",
    "annotate_cost",
    "append_eos",
    "batch_records",
    "make_sample",
    "tokenize_batch",
    "truncate_tokens",
]


@dataclass
class Document:
    """A tokenized document on its way to the writer."""

    doc_id: str
    tokens: np.ndarray
    """uint32 ids, EOS included."""
    dropped: int = 0
    """Tokens removed by opt-in truncation."""


def batch_records(
    results: Iterable[ReadResult], max_chars: int, max_docs: int = 4096
) -> Iterator[list[ReadResult]]:
    """Group reader output into batches of about ``max_chars`` characters of text.

    Rejections travel inside the batches so the quarantine keeps input order.
    """
    batch: list[ReadResult] = []
    chars = 0
    for item in results:
        batch.append(item)
        if isinstance(item, Record):
            chars += len(item.text)
        if chars >= max_chars or len(batch) >= max_docs:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _encode_each(tokenizer: TextTokenizer, records: list[Record]) -> list[np.ndarray | str]:
    """Encode one record at a time: the ids, or why the tokenizer refused the text.

    Only runs when a whole batch was refused, to keep the good records of that batch.
    """
    out: list[np.ndarray | str] = []
    for r in records:
        try:
            out.append(tokenizer.encode_batch([r.text])[0])
        except Exception as exc:  # the tokenizer's own error types vary by backend
            out.append(f"tokenizer refused the text: {type(exc).__name__}: {str(exc)[:200]}")
    return out


def tokenize_batch(tokenizer: TextTokenizer, batch: list[ReadResult]) -> list[Document | Rejected]:
    """Encode every record of the batch in one ``encode_batch`` call; rejections pass through.

    If the tokenizer refuses the batch, records are encoded one by one and the refused ones
    become :class:`Rejected` with the tokenizer's reason (one bad record never ends a build).
    """
    records = [r for r in batch if isinstance(r, Record)]
    try:
        ids_or_errors: list = tokenizer.encode_batch([r.text for r in records]) if records else []
    except Exception:
        ids_or_errors = _encode_each(tokenizer, records)
    encoded = iter(ids_or_errors)
    out: list[Document | Rejected] = []
    for item in batch:
        if isinstance(item, Rejected):
            out.append(item)
            continue
        ids = next(encoded)
        if isinstance(ids, str):
            out.append(Rejected(item.doc_id, ids, ascii(item.text[:200])))
        elif len(ids) == 0:
            out.append(
                Rejected(item.doc_id, "empty document (tokenizes to no tokens)", item.text[:200])
            )
        else:
            out.append(Document(item.doc_id, ids))
    return out


def append_eos(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """``tokens`` followed by the EOS id, as a new uint32 array."""
    out = np.empty(len(tokens) + 1, dtype=np.uint32)
    out[:-1] = tokens
    out[-1] = eos_id
    return out


def truncate_tokens(tokens: np.ndarray, limit: int | None) -> tuple[np.ndarray, int]:
    """Keep the first ``limit - 1`` tokens plus the final EOS; returns (tokens, dropped).

    Only runs when the user opted in with ``--truncate``; ``limit=None`` keeps everything.
    """
    if limit is None or len(tokens) <= limit:
        return tokens, 0
    kept = np.concatenate((tokens[: limit - 1], tokens[-1:]))
    return kept, len(tokens) - limit


def annotate_cost(cost_model: CostModel, cuts: np.ndarray) -> dict[str, np.ndarray]:
    """The per-slice cost columns of one document's cut points."""
    costs = cost_model.cuts_costs(cuts)
    return {
        name: np.ascontiguousarray(getattr(costs, name), dtype=np.float64) for name in COST_COLUMNS
    }


def make_sample(
    doc: Document, source: str, slice_tokens: int, cost_model: CostModel
) -> tuple[dict, np.ndarray]:
    """The MDS sample of a document and its cut points (int64)."""
    cuts = slice_cuts(len(doc.tokens), slice_tokens)
    sample = {
        "tokens": doc.tokens,
        "slices": cuts.astype(np.uint32),
        **annotate_cost(cost_model, cuts),
        "length": len(doc.tokens),
        "doc_id": doc.doc_id,
        "source": source,
    }
    return sample, cuts


def token_digest(doc_id: str, tokens: np.ndarray) -> bytes:
    """sha256 of a document's id and tokens (little-endian uint32), for the fingerprint."""
    h = hashlib.sha256(doc_id.encode("utf-8"))
    h.update(b"\0")
    h.update(tokens.astype("<u4", copy=False).tobytes())
    return h.digest()

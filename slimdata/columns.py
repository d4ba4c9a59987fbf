"""The columns of a document-shard sample (design §8): what ``slimdata build`` writes, and
the checks a reader applies to the samples and the manifest it reads.

A 300-token document built at ``slice_tokens=128`` is one MDS sample::

    tokens   uint32[300]                 length  300
    slices   [0, 128, 256, 300]          doc_id, source
    fwd, bwd, fwd_lin, fwd_att, bwd_lin, bwd_att, act_bytes, kv_bytes
             one float64 per slice (3 here): ``CostModel.cuts_costs`` of the build's model

``manifest.parquet`` repeats ``length`` and the slices (as ``cuts``), one row per sample, so
a plan of millions of documents reads no token array. It is an index of the shards, not a
second truth: every sample a reader decodes is checked against its manifest row
(:class:`SampleReader`), and the manifest itself is checked when it is read
(:func:`check_manifest`). Slice boundaries are read, never recomputed: ``slice_tokens`` in
the sidecar only says how the build cut them.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from slimdata.cost import CostModel
from slimdata.errors import ConfigError, InputError
from slimdata.plan.types import Document
from slimdata.slicing import check_length, first_bad_tiling

__all__ = [
    "COLUMNS",
    "COST_CHECKS",
    "COST_COLUMNS",
    "SampleReader",
    "check_cost_columns",
    "check_manifest",
    "check_sample",
    "sample_document",
]

COST_COLUMNS: tuple[str, ...] = (
    "fwd",
    "bwd",
    "fwd_lin",
    "fwd_att",
    "bwd_lin",
    "bwd_att",
    "act_bytes",
    "kv_bytes",
)
"""Per-slice cost columns (float64 arrays aligned with the slices), from ``CostModel.cuts_costs``."""

COLUMNS: dict[str, str] = {
    "tokens": "ndarray:uint32",
    "slices": "ndarray:uint32",
    **{name: "ndarray:float64" for name in COST_COLUMNS},
    "length": "int",
    "doc_id": "str",
    "source": "str",
}
"""MDS columns of document shards (one sample per document)."""

READ_COLUMNS: tuple[str, ...] = ("tokens", "slices", "length", "doc_id")
"""The columns a :class:`SampleReader` reads of every sample."""

COST_CHECKS = 16
"""Decoded samples per reader whose cost columns are compared with the plan's cost model
(when that model is the build's): the columns are one model's output, so a few samples show
whether the sidecar describes them, at a cost that does not grow with the dataset."""


def _show(cuts: Any) -> str:
    """``[0, 128, 300]``, or the first and last three of a long list."""
    values = np.asarray(cuts).tolist()
    if len(values) <= 6:
        return str(values)
    return f"[{', '.join(map(str, values[:3]))}, ..., {', '.join(map(str, values[-3:]))}]"


def check_manifest(table: Any, manifest: str | Path) -> None:
    """Raise :class:`InputError` unless a manifest table (pyarrow, sorted by ``sample``) is
    one a build writes: lengths within :data:`~slimdata.slicing.MAX_DOCUMENT_TOKENS`,
    samples ``0..n-1``, ``0 <= loss_tokens < length``, every ``cuts`` list tiling ``[0,
    length)`` in strictly increasing order. Vectorized: a few numpy passes over the cut
    points, whatever the number of documents."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name in ("sample", "length", "loss_tokens", "cuts"):
        kind = table.schema.field(name).type
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            kind = kind.value_type
        if not pa.types.is_integer(kind) or table.column(name).null_count:
            raise InputError(
                f"{manifest}: column {name!r} is not all integers ({table.schema.field(name).type}"
                f", {table.column(name).null_count} missing): the manifest is damaged; rebuild it"
            )
    n = table.num_rows
    lengths = table.column("length").to_numpy().astype(np.int64)
    for value in (lengths.max(), lengths.min()) if n else ():
        try:
            check_length(value, f"{manifest}: document length")
        except ConfigError as exc:
            raise InputError(str(exc)) from None
    samples = table.column("sample").to_numpy()
    if not np.array_equal(samples, np.arange(n)):
        bad = int(np.flatnonzero(samples != np.arange(n))[0])
        raise InputError(
            f"{manifest}: its samples are not 0..{n - 1}, one row each (sample {samples[bad]} "
            f"where sample {bad} belongs): the manifest is damaged; rebuild with `slimdata build`"
        )
    loss = table.column("loss_tokens").to_numpy().astype(np.int64)
    bad_loss = np.flatnonzero((loss < 0) | (loss > np.maximum(lengths - 1, 0)))
    if len(bad_loss):
        i = int(bad_loss[0])
        raise InputError(
            f"{manifest}: sample {i} has {loss[i]} loss tokens for {lengths[i]} tokens "
            "(at most one fewer than its length): the manifest is damaged; rebuild it"
        )
    cuts = table.column("cuts").combine_chunks()
    counts = pc.list_value_length(cuts).to_numpy().astype(np.int64)
    flat = pc.list_flatten(cuts)
    if flat.null_count:
        raise InputError(f"{manifest}: column 'cuts' has missing cut points: rebuild it")
    values = flat.to_numpy(zero_copy_only=False).astype(np.int64)
    bad = first_bad_tiling(lengths, counts, values)
    if bad >= 0:
        raise InputError(
            f"{manifest}: sample {bad}: cut points {_show(cuts[bad].as_py())} do not tile its "
            f"{lengths[bad]} tokens (they must rise strictly from 0 to the length): the "
            "manifest is damaged; rebuild with `slimdata build`"
        )


def _tokens_and_cuts(sample: Mapping[str, Any], where: str) -> tuple[np.ndarray, tuple[int, ...]]:
    """A decoded sample's tokens and its ``slices`` as a tuple, after checking that its
    ``length`` column is its number of tokens and its slices tile them (plain Python: a
    document has a handful of slices: cheaper to walk than one numpy call)."""
    tokens = np.asarray(sample["tokens"])
    cuts = tuple(np.asarray(sample["slices"]).tolist())
    try:
        length = check_length(sample["length"], f"{where}: length")
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    if len(tokens) != length:
        raise InputError(
            f"{where}: holds {len(tokens)} tokens but its length column says {length}: "
            "the shard is damaged; rebuild it with `slimdata build`"
        )
    if (
        not cuts
        or cuts[0] != 0
        or cuts[-1] != length
        or any(a >= b for a, b in itertools.pairwise(cuts))
    ):
        raise InputError(
            f"{where}: slices column {_show(cuts)} does not tile its {length} tokens (cut "
            "points must rise strictly from 0 to the length): the shard is damaged; rebuild "
            "it with `slimdata build`"
        )
    return tokens, cuts


_DOCUMENT_COLUMNS = ("tokens", "slices", "length", "doc_id")
"""Columns of a document shard that a reader of documents needs."""


def _check_document_columns(sample: Mapping[str, Any], where: str) -> None:
    """An :class:`InputError` for a sample without a column of :data:`_DOCUMENT_COLUMNS`,
    saying what it is when it is a plan shard's payload (what ``slimdata plan`` writes)."""
    missing = [c for c in _DOCUMENT_COLUMNS if c not in sample]
    if not missing:
        return
    what = (
        "these are plan shards of `slimdata plan`; read them with PlanShardLoader, not as "
        "document shards"
        if "plan" in sample
        else "not a document shard of `slimdata build`"
    )
    raise InputError(
        f"{where}: no {missing[0]!r} column (columns: {', '.join(sorted(sample))}): {what}"
    )


def sample_document(sample: Mapping[str, Any], index: int, where: str = "") -> Document:
    """The :class:`Document` of decoded sample ``index``, its cut points read from the
    ``slices`` column (checked against ``length`` and the tokens)."""
    _check_document_columns(sample, f"{where}sample {index}")
    tokens, cuts = _tokens_and_cuts(sample, f"{where}sample {index}")
    return Document(
        doc_id=str(sample["doc_id"]),
        length=len(tokens),
        cuts=cuts,
        sample=index,
    )


def check_sample(sample: Mapping[str, Any], doc: Document, where: str) -> np.ndarray:
    """The tokens of a decoded sample, after checking that the sample is ``doc`` (its
    manifest row, or what the loader was given): same length, same slices. The manifest's
    cut points are checked when it is read, so equal ones need no second look; the
    diagnosis of a sample that differs is the slow path."""
    _check_document_columns(sample, where)
    tokens = sample["tokens"]
    if len(tokens) == sample["length"] == doc.length and (
        tuple(np.asarray(sample["slices"]).tolist()) == doc.cuts
    ):
        return tokens
    tokens, cuts = _tokens_and_cuts(sample, where)
    if len(tokens) != doc.length:
        raise InputError(
            f"{where}: holds {len(tokens)} tokens, the manifest says {doc.length}: the shards "
            "and manifest.parquet disagree (modified, or from different builds); rebuild them"
        )
    if cuts != tuple(doc.cuts):
        raise InputError(
            f"{where}: slices column {_show(cuts)} differs from the manifest's cut points "
            f"{_show(doc.cuts)}: the shards and manifest.parquet disagree (modified, or from "
            "different builds); rebuild them with `slimdata build`"
        )
    return tokens


def check_cost_columns(sample: Mapping[str, Any], cost: CostModel, where: str) -> None:
    """Raise unless the cost columns a sample has are ``cost.cuts_costs`` of its slices
    (relative tolerance 1e-9: the same formula, evaluated by any slimdata version)."""
    want = cost.cuts_costs(np.asarray(sample["slices"], dtype=np.int64))
    for name in COST_COLUMNS:
        if name not in sample:
            continue  # shards written without cost columns carry nothing to compare
        got = np.asarray(sample[name], dtype=np.float64)
        expected = getattr(want, name)
        if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-9, atol=0.0):
            raise InputError(
                f"{where}: cost column {name!r} {_show(got)} is not what the cost model in "
                f"slimdata.json gives ({_show(expected)}): the sidecar does not describe these "
                "shards; give the cost model explicitly (--model, --cost-device, --recompute "
                "or --cost-profile) or rebuild the shards"
            )


class SampleReader:
    """Tokens of document-shard samples by global index, each decoded sample checked
    against the document it is planned as (:func:`check_sample`) and, for the first
    :data:`COST_CHECKS` samples, its cost columns against ``cost`` (give the build's model
    only: a model the user chose prices slices its own way and has nothing to agree with).

    ``docs`` are the whole documents of the dataset (pieces of a cut document are checked
    by their source document); the check costs a few comparisons per decode, and with
    ``vocab`` (the build's tokenizer's vocabulary size) one pass over the tokens: every id
    must be below it. A sample the shard reader cannot decode (a damaged header or body) is
    an :class:`~slimdata.errors.InputError` naming it, as is every failed check.
    """

    def __init__(
        self,
        dataset: Any,
        docs: Sequence[Document],
        *,
        where: str = "",
        cost: CostModel | None = None,
        vocab: int | None = None,
    ) -> None:
        self.dataset, self.docs, self.where, self.cost = dataset, docs, where, cost
        self.vocab = vocab
        self._by_sample: dict[int, Document] | None = None
        self._cost_checks = COST_CHECKS if cost is not None else 0

    def document(self, sample: int) -> Document | None:
        """The whole document of ``sample`` (``docs[sample]`` when the list is in sample
        order, as a manifest is), or None when ``docs`` hold no whole document of it."""
        doc: Document | None
        if 0 <= sample < len(self.docs) and self.docs[sample].sample == sample:
            doc = self.docs[sample]
        else:
            if self._by_sample is None:
                self._by_sample = {d.sample: d for d in self.docs if d.offset == 0}
            doc = self._by_sample.get(sample)
        return doc if doc is not None and doc.offset == 0 else None

    def __call__(self, sample: int) -> np.ndarray:
        where = f"{self.where}sample {sample}"
        row = self._decoded(sample, where)
        doc = self.document(sample)
        # only pieces of it were given: the sample is checked on its own
        tokens = _tokens_and_cuts(row, where)[0] if doc is None else check_sample(row, doc, where)
        if self.vocab is not None and len(tokens) and int(np.max(tokens)) >= self.vocab:
            raise InputError(
                f"{where}: token id {int(np.max(tokens))} is not below the vocabulary size "
                f"{self.vocab} of the build's tokenizer: the shard is damaged; rebuild it with "
                "`slimdata build`"
            )
        if self._cost_checks:
            self._cost_checks -= 1
            check_cost_columns(row, self.cost, where)  # type: ignore[arg-type]
        return tokens

    def _decoded(self, sample: int, where: str) -> Mapping[str, Any]:
        """Sample ``sample`` as the shard reader decodes it; what the reader raises on a
        damaged shard (an index, header or encoding it cannot read) as an InputError."""
        try:
            row = self.dataset[sample]
        except InputError:
            raise
        except Exception as exc:  # the reader's own error, whatever the damage
            raise InputError(
                f"{where}: the shard reader cannot decode it ({type(exc).__name__}: {exc}): "
                "the shard is damaged; rebuild it with `slimdata build`"
            ) from exc
        missing = [c for c in READ_COLUMNS if c not in row]
        if missing:
            raise InputError(
                f"{where}: no column {', '.join(map(repr, missing))} (the shard's index.json "
                f"names {', '.join(map(repr, row))}): not a slimdata document shard, or its "
                "index was edited; rebuild it with `slimdata build`"
            )
        return row

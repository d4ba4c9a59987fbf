"""Cutting documents into fine-grained slices, stored as cut points.

A document of length ``n`` cut at ``slice_tokens`` gives cut points ``[0, s, 2s, ..., n]``:
every boundary is a multiple of ``slice_tokens`` (itself a multiple of 128, the flash-attn
tile) except the final one. Slices of a 10-token doc at s=4: ``[0,4) [4,8) [8,10)``.
Later stages may run consecutive slices as one unit; no token is ever dropped here.
"""

from __future__ import annotations

import numpy as np

from slimdata.errors import ConfigError

__all__ = [
    "ALIGN",
    "DEFAULT_SLICE_TOKENS",
    "MAX_DOCUMENT_TOKENS",
    "check_cuts",
    "check_length",
    "check_slice_tokens",
    "cut_points",
    "cut_points_of",
    "slice_cuts",
]

ALIGN = 128
"""Slice boundaries (except a document's end) are multiples of this (flash-attn tile)."""

DEFAULT_SLICE_TOKENS = 2048
"""Default slice length: fine enough to balance 16K-token rank budgets (1M tokens over 64
ranks) with <13% granularity, coarse enough that a 256K document is only 128 slices."""


MAX_DOCUMENT_TOKENS = 2**31 - 1
"""Longest document slimdata accepts (2,147,483,647 tokens): flash-attn's varlen offsets
(``cu_seqlens``) are int32. Checked before anything is allocated for a length read from a
file, so a hostile ``10**15`` costs an error, not terabytes."""


def check_length(length: object, where: str = "document length") -> int:
    """``length`` as an int if ``0 <= length <= MAX_DOCUMENT_TOKENS``, else a ConfigError."""
    if isinstance(length, bool) or not isinstance(length, int | np.integer):
        raise ConfigError(f"{where} {length!r} is not an integer")
    value = int(length)
    if value < 0:
        raise ConfigError(f"{where} {length} is negative")
    if value > MAX_DOCUMENT_TOKENS:
        raise ConfigError(
            f"{where} {length} exceeds the maximum of {MAX_DOCUMENT_TOKENS} tokens per document "
            "(int32 attention offsets); split the document"
        )
    return value


def check_slice_tokens(slice_tokens: int) -> int:
    if not isinstance(slice_tokens, int | np.integer) or slice_tokens <= 0 or slice_tokens % ALIGN:
        raise ConfigError(
            f"slice_tokens={slice_tokens!r} must be a positive multiple of {ALIGN} (e.g. 2048)"
        )
    return int(slice_tokens)


def cut_points(length: int, slice_tokens: int = DEFAULT_SLICE_TOKENS) -> tuple[int, ...]:
    """Cut points of a document of ``length`` tokens, as a tuple of ints (the one formula).

    ``cut_points(10, 128) == (0, 10)``; ``cut_points(300, 128) == (0, 128, 256, 300)``;
    ``cut_points(0, 128) == (0,)`` (an empty document has no slice). Pure Python: a plan of
    a million short documents builds its cut points without a numpy call per document.
    """
    return cut_points_of([length], slice_tokens)[0]


def cut_points_of(lengths, slice_tokens: int = DEFAULT_SLICE_TOKENS) -> list[tuple[int, ...]]:
    """:func:`cut_points` of every length, checked once for the whole sequence (an integer
    array within bounds takes one ``min``/``max``; anything else is checked entry by entry,
    so the error names the bad value)."""
    slice_tokens = check_slice_tokens(slice_tokens)
    arr = lengths if isinstance(lengths, np.ndarray) else None
    if (
        arr is not None
        and arr.dtype.kind in "iu"
        and (arr.size == 0 or (arr.min() >= 0 and arr.max() <= MAX_DOCUMENT_TOKENS))
    ):
        ns = arr.tolist()
    else:
        ns = [check_length(n) for n in lengths]
    return [(*range(0, n, slice_tokens), n) if n else (0,) for n in ns]


def slice_cuts(length: int, slice_tokens: int = DEFAULT_SLICE_TOKENS) -> np.ndarray:
    """:func:`cut_points` as an int64 array.

    ``slice_cuts(10, 128) -> [0, 10]``; ``slice_cuts(300, 128) -> [0, 128, 256, 300]``;
    ``slice_cuts(0, 128) -> [0]`` (an empty document has no slice).
    """
    return np.asarray(cut_points(length, slice_tokens), dtype=np.int64)


def check_cuts(cuts, length: int) -> None:
    """Raise unless ``cuts`` tile ``[0, length)`` in strictly increasing order."""
    cuts = np.asarray(cuts)
    if len(cuts) == 0 or cuts[0] != 0 or cuts[-1] != length:
        raise ConfigError(
            f"cut points must start at 0 and end at {length}, got {cuts[:3]}...{cuts[-3:]}"
        )
    if len(cuts) > 1 and np.any(np.diff(cuts) <= 0):
        raise ConfigError("cut points must be strictly increasing")


def first_bad_tiling(lengths, counts, values) -> int:
    """Index of the first document whose cut points do not tile ``[0, length)`` in strictly
    increasing order (what :func:`check_cuts` requires of one document), or -1 if all do.

    The documents' cut points lie end to end in ``values``, ``counts[i]`` of them for
    document ``i`` (an Arrow list column's layout): lengths ``[10, 3]``, cut points
    ``(0, 4, 10)`` and ``(0, 3)`` are ``counts=[3, 2]``, ``values=[0, 4, 10, 0, 3]``. A few
    numpy passes, no Python loop over the documents.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    values = np.asarray(values, dtype=np.int64)
    ends = np.cumsum(counts)
    bad = counts < 1
    has = ~bad
    bad[has] |= values[ends[has] - counts[has]] != 0
    bad[has] |= values[ends[has] - 1] != lengths[has]
    # steps values[j] -> values[j + 1] that go down or stay, ignoring those from one
    # document's last cut point to the next document's first
    falls = np.diff(values) <= 0
    falls[ends[(ends > 0) & (ends < len(values))] - 1] = False
    bad[np.searchsorted(ends, np.flatnonzero(falls), side="right")] = True
    hits = np.flatnonzero(bad)
    return int(hits[0]) if len(hits) else -1

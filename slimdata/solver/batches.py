"""Global batches for an epoch: a seeded shuffle of documents at plan time, then consecutive
batches of about ``global_batch_tokens`` tokens, and the oversize policy.

Batch policy: documents are added in shuffled order while the batch stays within ``T``
tokens; the document that would overflow starts the next batch (a document longer than ``T``
forms a batch alone). The last, partial batch is kept: no document is dropped.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np

from slimdata.errors import ConfigError, PlanError
from slimdata.plan.types import Document
from slimdata.solver.common import cut_document

__all__ = ["OVERSIZE_POLICIES", "apply_oversize", "batch_warnings", "make_batches"]

OVERSIZE_POLICIES = ("split", "truncate", "error")


def make_batches(
    docs: Sequence[Document], global_batch_tokens: int, seed: int
) -> list[list[Document]]:
    """Shuffle ``docs`` with ``seed`` and cut consecutive batches of <= ``global_batch_tokens``.

    ``make_batches([d(5), d(3), d(4)], 8, seed)`` gives e.g. ``[[d(3), d(5)], [d(4)]]``.
    """
    if global_batch_tokens < 1:
        raise ConfigError(f"global_batch_tokens={global_batch_tokens!r} must be >= 1")
    if not docs:
        return []
    perm = np.random.default_rng(seed).permutation(len(docs))
    lengths = np.array(list(map(_LENGTH, docs)), dtype=np.int64)  # faster than np.fromiter
    csum = np.cumsum(lengths[perm])
    out: list[list[Document]] = []
    i, n, base = 0, len(docs), 0
    while i < n:
        j = int(np.searchsorted(csum, base + global_batch_tokens, side="right"))
        j = max(j, i + 1)
        out.append(list(map(docs.__getitem__, perm[i:j].tolist())))
        base = int(csum[j - 1])
        i = j
    return out


_LENGTH = operator.attrgetter("length")


def batch_warnings(
    step_tokens: Sequence[int], corpus_tokens: int, global_batch_tokens: int
) -> list[str]:
    """Steps far from the ``--global-batch-tokens`` asked: the documents (``corpus_tokens``
    in all) hold less than 90% of it, or whole documents overshoot it by more than half on
    average over the steps (``step_tokens``: the tokens of each step)."""
    held = float(np.mean(step_tokens))
    if corpus_tokens < 0.9 * global_batch_tokens:
        why = f"the documents hold {corpus_tokens:,} tokens in all"
    elif held > 1.5 * global_batch_tokens:
        why = "a step takes whole documents, at least one"
    else:
        return []
    return [
        f"steps hold {held:,.0f} tokens on average, not the {global_batch_tokens:,} of "
        f"--global-batch-tokens ({why})"
    ]


def apply_oversize(docs: Sequence[Document], context: int, policy: str = "error") -> list[Document]:
    """Handle documents longer than ``context`` tokens explicitly.

    ``split``: cut into independent pieces of at most ``context`` tokens (pieces do not attend
    to each other; ``Document.offset`` says where each starts); ``truncate``: keep the first
    ``context`` tokens (the rest is dropped on purpose, as the user asked); ``error``: raise
    :class:`PlanError` naming the first such document.
    """
    if policy not in OVERSIZE_POLICIES:
        raise ConfigError(f"oversize={policy!r}: use one of {', '.join(OVERSIZE_POLICIES)}")
    out: list[Document] = []
    for d in docs:
        if d.length <= context:
            out.append(d)
        elif policy == "error":
            raise PlanError(
                f"document doc_id {d.doc_id!r} has {d.length} tokens, more than the context {context}: "
                "raise --context or choose --oversize split|truncate"
            )
        elif policy == "split":
            out.extend(cut_document(d, [*range(0, d.length, context), d.length]))
        else:
            out.append(cut_document(d, [0, context, d.length])[0])
    return out

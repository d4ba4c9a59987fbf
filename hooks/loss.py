"""The step loss of design §4.5: (sum of token losses) / (global count of loss tokens).

Every rank divides its local sum by the *global* count (``StepPlan.loss_tokens``), so summing
gradients over ranks (DP reduction with SUM, or DDP's mean times world size) gives exactly the
gradient of the mean token loss of the unpacked batch, however the tokens were packed.

The loss is chunked over tokens, as the memory model assumes
(:func:`slimdata.cost.loss_chunk_tokens`): a forward that returns :class:`HiddenStates`
(final hidden states and the LM head) never materialises the ``(tokens, vocab)`` logits of a
whole pack; each chunk's logits are computed, reduced to a loss and dropped, and recomputed
from the chunk's hidden states in backward (activation checkpointing). A forward that returns
logits gets its fp32 cross-entropy chunked the same way (no fp32 copy of all logits). Both
give the loss and gradients of the unchunked computation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from slimdata.cost import loss_chunk_tokens

__all__ = ["IGNORE", "HiddenStates", "chunk_tokens_for", "packed_loss", "slice_labels"]

IGNORE = -100


@dataclass(frozen=True)
class HiddenStates:
    """A forward's output for the chunked loss: ``head(hidden[a:b])`` are the logits of
    tokens ``a..b-1``."""

    hidden: torch.Tensor
    """Final hidden states ``(T, H)`` (after the final norm)."""
    head: Callable[[torch.Tensor], torch.Tensor]
    """The LM head: ``(t, H) -> (t, vocab)`` logits."""

    def logits(self) -> torch.Tensor:
        """All logits at once (for small calls; the loss never uses this)."""
        return self.head(self.hidden)


def slice_labels(
    doc_tokens: torch.Tensor, start: int, end: int, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Next-token labels of slice ``[start, end)``: ``doc[start+1 : end+1]``, the document's
    last token labelled :data:`IGNORE`, and tokens whose ``mask`` is 0 too.

    Doc ``[5, 6, 7, 8]``, slice ``[2, 4)`` -> ``[8, IGNORE]``.
    """
    n = doc_tokens.shape[0]
    labels = torch.full((end - start,), IGNORE, dtype=torch.long, device=doc_tokens.device)
    stop = min(end, n - 1)
    if stop > start:
        labels[: stop - start] = doc_tokens[start + 1 : stop + 1].long()
    if mask is not None:
        labels[mask[start:end] == 0] = IGNORE
    return labels


def chunk_tokens_for(out: torch.Tensor | HiddenStates) -> int:
    """Default chunk of :func:`packed_loss`: :func:`slimdata.cost.loss_chunk_tokens` for the
    output's vocabulary and dtype."""
    if isinstance(out, HiddenStates):
        weight = getattr(out.head, "weight", None)
        vocab = weight.shape[0] if weight is not None else out.hidden.shape[-1]
        return loss_chunk_tokens(int(vocab), out.hidden.element_size())
    return loss_chunk_tokens(int(out.shape[-1]), out.element_size())


def _chunk_loss_from_hidden(head, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(head(hidden).float(), labels, ignore_index=IGNORE, reduction="sum")


def _chunk_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE, reduction="sum")


def packed_loss(
    out: torch.Tensor | HiddenStates,
    labels: torch.Tensor,
    loss_tokens: int,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """``sum CE(logits, labels) / loss_tokens`` in fp32, over chunks of ``chunk_tokens``
    tokens (default :func:`chunk_tokens_for`); ``out`` is ``(T, V)`` logits or
    :class:`HiddenStates`."""
    base = out.hidden if isinstance(out, HiddenStates) else out
    if loss_tokens <= 0 or base.shape[0] == 0:
        return base.sum() * 0.0
    chunk = chunk_tokens or chunk_tokens_for(out)
    parts = []
    for a in range(0, base.shape[0], chunk):
        y = labels[a : a + chunk]
        if isinstance(out, HiddenStates):
            h = out.hidden[a : a + chunk]
            if torch.is_grad_enabled() and h.requires_grad:
                # logits of this chunk are recomputed in backward, not held
                parts.append(
                    checkpoint(_chunk_loss_from_hidden, out.head, h, y, use_reentrant=False)
                )
            else:
                parts.append(_chunk_loss_from_hidden(out.head, h, y))
        else:
            parts.append(_chunk_loss(out[a : a + chunk], y))
    return torch.stack(parts).sum() / loss_tokens

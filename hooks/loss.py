"""The step loss of design §4.5: (sum of token losses) / (global count of loss tokens).

Every rank divides its local sum by the *global* count (``StepPlan.loss_tokens``), so summing
gradients over ranks (DP reduction with SUM, or DDP's mean times world size) gives exactly the
gradient of the mean token loss of the unpacked batch, however the tokens were packed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["IGNORE", "packed_loss", "slice_labels"]

IGNORE = -100


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


def packed_loss(logits: torch.Tensor, labels: torch.Tensor, loss_tokens: int) -> torch.Tensor:
    """``sum CE(logits, labels) / loss_tokens``, computed in fp32; ``logits (T, V)``."""
    if loss_tokens <= 0:
        return logits.sum() * 0.0
    return (
        F.cross_entropy(logits.float(), labels, ignore_index=IGNORE, reduction="sum") / loss_tokens
    )

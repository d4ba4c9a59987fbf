"""The per-step key/value store behind slice continuation (design §9).

Every slice's keys and values, per layer, are kept for the whole step as *autograd leaves*
(detached, ``requires_grad=True``). A later slice of the same document that runs in another
pack reads them as leaves: its pack's autograd graph ends there (a per-pack boundary), and its
backward deposits the gradient of those keys/values in ``leaf.grad``, where contributions of
all readers accumulate. When the producing slice's backward pack runs, the executor hands it
that accumulated gradient. Slices of one doc in one pack read each other inside the graph.

Example, doc of 10 tokens cut ``[0,4) [4,8) [8,10)`` in three forward packs: pack 2 reads
``[0,4)`` and ``[4,8)`` as leaves; after backward pack 0 (``[8,10)``) both leaves hold its
gradient; backward pack 1 (``[4,8)``) adds its own part to ``[0,4)``'s leaf; backward pack 2
runs ``[0,4)`` with the sum.
"""

from __future__ import annotations

import torch
from slimdata.hooks.memory import hold_for_meter

from slimdata.plan import Slice

__all__ = ["KVStore"]


class KVStore:
    """Keys/values of one rank's slices for one step, keyed by ``(layer, slice)``."""

    def __init__(self) -> None:
        self._kv: dict[Slice, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        self._held: dict[Slice, list[tuple]] = {}  # what a SavedTensorMeter counts

    def put(self, layer: int, sl: Slice, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keep ``k, v`` (``(tokens, kv_heads, head_dim)``) of ``sl`` as leaves; a slice already
        stored (a recomputed forward) keeps its leaves and their accumulated gradient."""
        layers = self._kv.setdefault(sl, {})
        if layer not in layers:
            layers[layer] = (k.detach().requires_grad_(True), v.detach().requires_grad_(True))
            self._held.setdefault(sl, []).append(hold_for_meter(*layers[layer]))

    def get(self, layer: int, sl: Slice) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            return self._kv[sl][layer]
        except KeyError:
            raise RuntimeError(
                f"no keys/values for slice [{sl.start}, {sl.end}) of document #{sl.doc} at layer {layer}: "
                "its forward pack has not run (plan order violated?)"
            ) from None

    def grad(self, layer: int, sl: Slice) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Accumulated gradient of the slice's keys and values (None where nobody read them)."""
        kv = self._kv.get(sl, {}).get(layer)
        if kv is None:  # never stored: the document's last slice on this rank
            return None, None
        return kv[0].grad, kv[1].grad

    def drop(self, sl: Slice) -> None:
        """Forget a slice once its backward has run (no reader is left)."""
        self._kv.pop(sl, None)
        self._held.pop(sl, None)

    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for layers in self._kv.values() for k, v in layers.values())

    def __len__(self) -> int:
        """Number of slices held."""
        return len(self._kv)

    def clear(self) -> None:
        self._kv.clear()
        self._held.clear()

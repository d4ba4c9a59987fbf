"""Slice continuation inside a pack: the attention every integration point calls.

While the executor runs one pack, a :class:`PackContext` is active (a context variable). A
model's attention layer calls :func:`slice_attention` with the pack's queries, keys and values
(post-RoPE, ``(tokens, heads, head_dim)``, tokens in the pack's slice order). For each slice
``[start, end)`` the context assembles the keys/values of its document ``[0, end)``:

- earlier slices in *this* pack are read inside the autograd graph;
- earlier slices from *earlier* packs are read from the :class:`~slimdata.hooks.kvstore.KVStore`
  as leaves (the per-pack autograd boundary);
- merged documents (DP-Merge) are read from the group's all-gathered keys/values;
- under static context parallelism (:mod:`slimdata.hooks.cp`) the pack's tokens on this
  process are its chunks of every slice; the keys/values of the slices and their prefixes
  are all-gathered from the CP group per layer;

then calls the varlen backend (bottom-right causal per slice). Outside a pack (no context),
:func:`slice_attention` is plain causal attention over one sequence, so the same model runs
unpacked references and inference unchanged.

A checkpointed layer (``recompute="full"``) recomputes its attention in the backward inside
the same pack, re-entered with :meth:`PackContext.replaying` (:mod:`slimdata.hooks.recompute`).

Assumes attention is the only place tokens interact (true for decoder-only transformers) and
a deterministic forward (dropout 0), since backward packs may recompute a forward.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from slimdata.hooks.attention import VarlenBatch, get_backend, resolve_backend
from slimdata.hooks.attention.sdpa import sdpa_pieces
from slimdata.hooks.cp import CpRuntime
from slimdata.hooks.kvstore import KVStore
from slimdata.hooks.memory import hold_for_meter
from slimdata.hooks.merge import MergeRuntime
from torch.utils.checkpoint import checkpoint

from slimdata.execution.cp import cp_gather
from slimdata.plan import Slice

__all__ = ["PackContext", "active_context", "checkpointed_layer", "slice_attention"]

_ACTIVE: contextvars.ContextVar[PackContext | None] = contextvars.ContextVar(
    "slimdata_pack", default=None
)


_IN_LAYER_CHECKPOINT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "slimdata_in_layer_checkpoint", default=False
)


@contextmanager
def checkpointed_layer() -> Iterator[None]:
    """Marks a checkpointed layer's forward (and its recomputation) while it runs: attention
    inside it needs no checkpoint of its own (:mod:`slimdata.hooks.recompute`)."""
    token = _IN_LAYER_CHECKPOINT.set(True)
    try:
        yield
    finally:
        _IN_LAYER_CHECKPOINT.reset(token)


@dataclass
class PackContext:
    """State of one pack's forward (or recomputed forward) on one rank."""

    slices: tuple[Slice, ...]
    """The pack's slices, in token order."""
    doc_slices: dict[int, list[Slice]]
    """Every slice this rank holds of each (non-merged) document, sorted by start."""
    store: KVStore
    mode: str = "keep"
    """``keep`` (graph kept for backward), ``nograd`` (forward only), ``recompute``."""
    backend: str = "auto"
    merge: MergeRuntime | None = None
    """Set when this is the rank's merge pack."""
    cp: CpRuntime | None = None
    """Set under static context parallelism: this process runs its chunks of every slice."""
    live: dict[tuple[int, Slice], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """(layer, slice) -> in-graph keys/values this pack produced (for the backward)."""
    _batch: VarlenBatch | None = None
    _replay: bool = False
    _held: list = field(default_factory=list)
    """What an active :class:`~slimdata.hooks.memory.SavedTensorMeter` counts for ``live``."""

    def __enter__(self) -> PackContext:
        self._token = _ACTIVE.set(self)
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.reset(self._token)

    @contextmanager
    def replaying(self) -> Iterator[PackContext]:
        """Active again for a checkpointed layer's recomputation in the backward
        (:mod:`slimdata.hooks.recompute`): attention reads the same keys/values as the
        forward did and neither stores nor records any."""
        token, was = _ACTIVE.set(self), self._replay
        self._replay = True
        try:
            yield self
        finally:
            self._replay = was
            _ACTIVE.reset(token)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, scale: float
    ) -> torch.Tensor:
        rows = sum(self._q_lens())
        if q.shape[0] != rows:
            raise RuntimeError(f"attention got {q.shape[0]} tokens, the pack has {rows}")
        if self.cp is not None and self.merge is None:
            return self._cp_attend(q, k, v, layer, scale)
        if self.merge is not None:  # a merge pack holds merged slices only (plan rule)
            if not torch.is_grad_enabled() or _IN_LAYER_CHECKPOINT.get():
                # inside a checkpointed layer the gathered keys/values are not saved either:
                # the layer's recomputation gathers them again, once
                return self._merged_attention(q, k, v, scale)
            # the group's keys/values are gathered for this layer and freed after it; the
            # backward gathers them again (context parallelism's memory, design §9)
            return checkpoint(self._merged_attention, q, k, v, scale, use_reentrant=False)
        own = self._per_slice(k, v)
        ks, vs, k_lens = [], [], []
        prefixes = False  # does any slice read keys before its own?
        for s in self.slices:
            # a recomputation (replay) leaves the forward's live tensors and leaves in place:
            # the backward runs through the forward's graph, to which they belong
            if not self._replay:
                self.live[(layer, s)] = own[s]
                self._held.append(hold_for_meter(*own[s]))
                if self.doc_slices[s.doc][-1] != s:  # a later slice of the doc reads it
                    self.store.put(layer, s, *own[s])
            for p in self.doc_slices[s.doc]:
                if p.start >= s.start:
                    break
                pk, pv = own[p] if p in own else self.store.get(layer, p)
                ks.append(pk)
                vs.append(pv)
                prefixes = True
            ks.append(own[s][0])
            vs.append(own[s][1])
            k_lens.append(s.end)
        if not prefixes:  # every slice reads its own keys only: no copy
            ks, vs = [k], [v]
        return self._varlen(q, ks, vs, k_lens, scale)

    def _merged_attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """Every slice (under static CP: every chunk of this member) of a merge pack attends
        to its document's prefix gathered from the group (one all-gather per call)."""
        assert self.merge is not None
        full = self.merge.gather(self._per_slice(k, v))
        if self.cp is None:
            rows = [(s, s.start, s.end) for s in self.slices]
        else:
            rows = self.cp.local(self.slices)
        if not rows:  # a CP member's empty share: its padding token (see _cp_attention)
            anchor = sum(kv[0].sum() + kv[1].sum() for kv in full.values()) * 0
            return self._varlen(q, [k], [v], [1], scale) + anchor
        ks = [full[s.doc][0][:b] for s, _a, b in rows]
        vs = [full[s.doc][1][:b] for s, _a, b in rows]
        return self._varlen(q, ks, vs, [b for _s, _a, b in rows], scale)

    def _cp_attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, scale: float
    ) -> torch.Tensor:
        """Static CP: keep this member's chunks of the pack's slices (live, and in the store
        for later slices), then attend over the keys/values gathered from the group."""
        own = self._per_slice(k, v)
        if not self._replay:
            for s in self.slices:
                self.live[(layer, s)] = own[s]
                self._held.append(hold_for_meter(*own[s]))
                if self.doc_slices[s.doc][-1] != s:
                    self.store.put(layer, s, *own[s])
        if torch.is_grad_enabled() and not _IN_LAYER_CHECKPOINT.get():
            # one layer's gathered keys/values at a time: the backward gathers them again
            return checkpoint(self._cp_attention, q, k, v, layer, scale, use_reentrant=False)
        return self._cp_attention(q, k, v, layer, scale)

    def _cp_attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, scale: float
    ) -> torch.Tensor:
        """Every chunk of this member attends to its document's keys ``[0, chunk end)``,
        gathered from the group: the pack's slices and their prefixes (one all-gather)."""
        assert self.cp is not None
        own = self._per_slice(k, v)
        g = cp_gather(self.slices, self.doc_slices, self.cp.cp)  # the same on every member
        full = self.cp.gather(
            g, [own[p] if p in own else self.store.get(layer, p) for p in g.items]
        )
        chunks = self.cp.local(self.slices)
        if not chunks:  # one padding token attending to itself; the gather's backward must
            # still run on this member, so the output depends on the gathered keys (times 0)
            anchor = sum(kv[0].sum() + kv[1].sum() for kv in full.values()) * 0
            return self._varlen(q, [k], [v], [1], scale) + anchor
        ks, vs = [], []
        for s, _a, b in chunks:
            for p in self.doc_slices[s.doc]:
                if p.start < s.start:
                    ks.append(full[p][0])
                    vs.append(full[p][1])
            ks.append(full[s][0][: b - s.start])
            vs.append(full[s][1][: b - s.start])
        return self._varlen(q, ks, vs, [b for _s, _a, b in chunks], scale)

    def _q_lens(self) -> list[int]:
        """Query rows per varlen sequence: the slices, or this CP member's chunks of them."""
        if self.cp is None:
            return [s.tokens for s in self.slices]
        return [b - a for _s, a, b in self.cp.local(self.slices)] or [1]  # [1]: padding token

    def _per_slice(
        self, k: torch.Tensor, v: torch.Tensor
    ) -> dict[Slice, tuple[torch.Tensor, torch.Tensor]]:
        """The pack's keys/values cut into its slices (this CP member's rows of them)."""
        own, off = {}, 0
        for s in self.slices:
            n = s.tokens if self.cp is None else self.cp.local_tokens(s)
            own[s] = (k[off : off + n], v[off : off + n])
            off += n
        return own

    def _varlen(self, q, ks: list, vs: list, k_lens: list[int], scale: float) -> torch.Tensor:
        """Varlen attention over the keys/values ``torch.cat(ks)``, ``torch.cat(vs)``. The
        ``sdpa`` backend holds the pieces for backward, not their concatenation
        (:func:`~slimdata.hooks.attention.sdpa.sdpa_pieces`); kernels that take one key
        tensor get the concatenation."""
        if self._batch is None:  # same for every layer of the pack (masks cached inside)
            self._batch = VarlenBatch.from_lengths(self._q_lens(), k_lens, device=q.device)
        if resolve_backend(self.backend, q.device, q.dtype) == "sdpa":
            return sdpa_pieces(q, ks, vs, self._batch, scale)
        k, v = (ks[0], vs[0]) if len(ks) == 1 else (torch.cat(ks), torch.cat(vs))
        return get_backend(self.backend)(q, k, v, self._batch, scale)


def active_context() -> PackContext | None:
    """The pack being executed, or None outside the executor."""
    return _ACTIVE.get()


def slice_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, scale: float | None = None
) -> torch.Tensor:
    """Attention for custom models: ``q (T, Hq, D)``, ``k, v (T, Hkv, D)`` -> ``(T, Hq, D)``.

    Inside the executor, ``T`` is the current pack's tokens and attention follows the plan
    (slice continuation, no cross-document attention, DP-Merge); ``layer`` must identify the
    layer (0-based, unique per attention call in a forward). Outside, plain causal attention.
    """
    if scale is None:
        scale = q.shape[-1] ** -0.5
    ctx = _ACTIVE.get()
    if ctx is not None:
        return ctx.attend(q, k, v, layer, scale)
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=scale
    )
    return out.transpose(0, 1)

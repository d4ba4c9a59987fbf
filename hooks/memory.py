"""Bytes a step holds from forward to backward, measured: what the memory model predicts.

:class:`SavedTensorMeter` counts the distinct storages that ``saved_tensors_hooks`` see packed
and not yet released, plus the keys/values the runtime keeps outside autograd's saved tensors
(the per-step K/V store, and the in-graph keys/values a pack keeps to receive their gradient,
:func:`hold_for_meter`), parameters excluded (model states are outside the memory budget). It
works on any device, CPU included (on CUDA, ``torch.cuda.memory_allocated`` sees the same
bytes plus whatever else is allocated)."""

from __future__ import annotations

import contextvars
from collections.abc import Iterable
from contextlib import contextmanager

import torch

__all__ = ["SavedTensorMeter", "hold_for_meter"]

_METER: contextvars.ContextVar[SavedTensorMeter | None] = contextvars.ContextVar(
    "slimdata_meter", default=None
)


def hold_for_meter(*tensors: torch.Tensor) -> tuple:
    """Count ``tensors`` as held, while the returned handles live, by the meter watching now
    (none: an empty tuple). The runtime calls it for the keys/values it keeps outside
    autograd's saved tensors; under ``recompute="full"`` autograd saves none of them."""
    meter = _METER.get()
    if meter is None:
        return ()
    return tuple(meter._pack(t) for t in tensors)


class SavedTensorMeter:
    """Live bytes of the tensors autograd saved for backward (each storage counted once).

    ``with meter.watch(): loss = model(x)...`` -- ``meter.live`` is the bytes held now."""

    def __init__(self, params: Iterable[torch.Tensor]) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.refs: dict[int, list[int]] = {}  # data_ptr -> [refcount, bytes]
        self.live = 0

    @contextmanager
    def watch(self):
        token = _METER.set(self)
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield self
        finally:
            _METER.reset(token)

    def _pack(self, t: torch.Tensor):
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in self.params or st.nbytes() == 0:
            return t
        return _Held(self, key, st.nbytes(), t)

    @staticmethod
    def _unpack(h):
        return h.t if isinstance(h, _Held) else h

    def _add(self, key: int, nbytes: int) -> None:
        ref = self.refs.setdefault(key, [0, nbytes])
        if ref[0] == 0:
            self.live += nbytes
        ref[0] += 1

    def _drop(self, key: int) -> None:
        ref = self.refs[key]
        ref[0] -= 1
        if ref[0] == 0:
            self.live -= ref[1]
            del self.refs[key]


class _Held:
    def __init__(self, owner: SavedTensorMeter, key: int, nbytes: int, t: torch.Tensor) -> None:
        self.owner, self.key, self.t = owner, key, t
        owner._add(key, nbytes)

    def __del__(self) -> None:
        self.owner._drop(self.key)

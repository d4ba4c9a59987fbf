"""Bytes autograd holds for backward, measured: what the memory model's activation term is.

:class:`SavedTensorMeter` counts the distinct storages that ``saved_tensors_hooks`` see packed
and not yet released, parameters excluded (model states are outside the memory budget), so it
works on any device, CPU included (on CUDA, ``torch.cuda.memory_allocated`` sees the same
bytes plus whatever else is allocated)."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import contextmanager

import torch

__all__ = ["SavedTensorMeter"]


class SavedTensorMeter:
    """Live bytes of the tensors autograd saved for backward (each storage counted once).

    ``with meter.watch(): loss = model(x)...`` -- ``meter.live`` is the bytes held now."""

    def __init__(self, params: Iterable[torch.Tensor]) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.refs: dict[int, list[int]] = {}  # data_ptr -> [refcount, bytes]
        self.live = 0

    @contextmanager
    def watch(self):
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield self

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

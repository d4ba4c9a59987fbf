"""The pieces of mosaicml-streaming a build writes with: ``MDSWriter``, ``merge_index``, (for
plan shards) the partitioner ``get_partitions`` and the MDS column encodings.

``import streaming`` runs the package ``__init__``, which imports ``StreamingDataset``, the
data loader, the multimodal and text datasets and with them torch and transformers: 6.2 s of
wall time and 6.4 s of CPU on the development VM (2 cores; ``python -c "from streaming import
MDSWriter"``, compiled bytecode). A build needs none of that. This module imports only the
modules asked for, each when first needed: the writer (``streaming.base.format.mds.writer``
and ``streaming.base.util``, which still import ``torch.distributed``: 1.8-2.2 s of CPU, so a
small build is several seconds faster and the parent of a parallel build takes that much
less CPU from its tokenizing workers), the partitioner and the encodings (numpy only, 20 ms:
``slimdata plan`` writes its shards with them, :mod:`slimdata.solver.planwriter`, and never
imports torch).

How: the parent packages ``streaming``, ``streaming.base``, ``streaming.base.format`` and
``streaming.base.format.mds`` are registered in ``sys.modules`` as packages whose ``__init__``
has not run yet (their ``__path__`` is the installed one), so Python imports the writer's
submodules without running the parents. The first lookup of any other attribute of such a
parent (``from streaming import StreamingDataset``, ``streaming.Stream``) runs its real
``__init__`` in place, so the rest of the process sees the whole package exactly as a plain
``import streaming`` would have given it, just imported later.

The light path is used only while no ``streaming`` module but those it imported is in the
process (if one is, ``from streaming import MDSWriter`` costs nothing) and falls back to that public import
on any error, so a future streaming layout costs start-up time, never correctness.
``tests/ingest/test_mds.py`` checks that both paths write identical bytes and that the
package is whole afterwards.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

__all__ = ["get_partitions", "mds_encoding", "merge_index", "writer_class"]

_PARENTS = ("streaming", "streaming.base", "streaming.base.format", "streaming.base.format.mds")
_LOCK = threading.RLock()


class _DeferredPackage(types.ModuleType):
    """A package in ``sys.modules`` whose ``__init__`` runs at its first missing attribute."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # import machinery probing dunders: not a use
            raise AttributeError(name)
        with _LOCK:
            if type(self) is _DeferredPackage:
                self.__class__ = types.ModuleType  # type: ignore[assignment]
                spec = self.__spec__
                assert spec is not None and spec.loader is not None
                spec.loader.exec_module(self)
        return getattr(self, name)


def _is_streaming(name: str) -> bool:
    return name == "streaming" or name.startswith("streaming.")


_registered = False  # the deferred parents in sys.modules are this module's


def _defer_parents() -> bool:
    """Register the deferred parents unless a streaming module was imported otherwise; whether
    they are (now) registered."""
    global _registered
    if _registered and sys.modules.get("streaming") is not None:
        return True
    if any(_is_streaming(name) for name in sys.modules):
        return False
    for name in _PARENTS:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.submodule_search_locations is None:
            raise ImportError(name)
        parent = _DeferredPackage(name)
        parent.__spec__ = spec
        parent.__path__ = list(spec.submodule_search_locations)
        parent.__file__ = spec.origin
        parent.__package__ = name
        sys.modules[name] = parent
        if "." in name:
            head, _, tail = name.rpartition(".")
            setattr(sys.modules[head], tail, parent)
    _registered = True
    return True


@functools.cache
def _light(module: str) -> types.ModuleType | None:
    """``module`` (a streaming submodule) imported under deferred parents, or None where not
    possible (then every streaming module is forgotten, for the public import)."""
    global _registered
    with _LOCK:
        try:
            if not _defer_parents():
                return None
            return importlib.import_module(module)
        except Exception:
            for name in [n for n in sys.modules if _is_streaming(n)]:
                del sys.modules[name]
            _registered = False
            return None


def writer_class() -> type:
    """``streaming.MDSWriter``, imported without the rest of the package where possible."""
    light = _light("streaming.base.format.mds.writer")
    if light is not None:
        return light.MDSWriter
    from streaming import MDSWriter

    return MDSWriter


def merge_index(*args: Any, **kwargs: Any) -> None:
    """``streaming.base.util.merge_index`` (same arguments), imported light where possible."""
    light = _light("streaming.base.util")
    if light is not None:
        light.merge_index(*args, **kwargs)
        return
    from streaming.base.util import merge_index as merge

    merge(*args, **kwargs)


def get_partitions(*args: Any, **kwargs: Any) -> Any:
    """``streaming.base.partition.get_partitions`` (same arguments), imported light where
    possible (without torch: the partitioner needs only numpy)."""
    light = _light("streaming.base.partition")
    if light is not None:
        return light.get_partitions(*args, **kwargs)
    from streaming.base.partition import get_partitions as partitions

    return partitions(*args, **kwargs)


def mds_encoding() -> tuple[Callable[[str, Any], bytes], Callable[[str], int | None]]:
    """``(mds_encode, get_mds_encoded_size)`` of ``streaming.base.format.mds.encodings`` (MDS's
    column encodings), imported light where possible (without torch)."""
    light = _light("streaming.base.format.mds.encodings")
    if light is not None:
        return light.mds_encode, light.get_mds_encoded_size
    from streaming.base.format.mds.encodings import get_mds_encoded_size, mds_encode

    return mds_encode, get_mds_encoded_size

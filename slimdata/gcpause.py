"""Cyclic garbage collection paused while plan objects are built.

A solve makes many short-lived, acyclic lists and tuples (reference counting frees them);
a cyclic collection that runs meanwhile re-scans everything the caller keeps alive (an
epoch's documents, a training job's state), at a cost that has nothing to do with the solve:
at 4M tokens / 64 ranks a lockstep slimpack solve spent about 7 ms of its ~90 ms in
collections, most of it in the occasional full one.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["cyclic_gc_paused"]


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Cyclic garbage collection off inside; restored on exit, and left alone when it is off
    already (nested use, or a caller that turned it off). Usable as a decorator (per call)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()

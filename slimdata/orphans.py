"""Workers die with their parent: no worker outlives a killed build or simulation.

A parallel build (or ``simulate --jobs``) starts worker processes. If its main process is
killed (``kill -9`` included, which runs no cleanup), its workers would go on working,
holding the caller's stdout/stderr pipes open. :func:`die_with_parent` runs first in every worker: on Linux it
asks the kernel to SIGKILL the worker when its parent dies (``prctl(PR_SET_PDEATHSIG)``);
elsewhere a daemon thread polls the parent id once a second and exits the worker when it
changes. Either way a parent that died before the call is caught by comparing
``os.getppid()`` with the pid the parent passed in.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1
_POLL_SECONDS = 1.0


def _prctl_deathsig() -> bool:
    """Ask the kernel for SIGKILL on parent death; False where prctl is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_POLL_SECONDS)
    os._exit(1)


def die_with_parent(parent: int) -> None:
    """Make this (worker) process end when process ``parent`` ends (see module docstring)."""
    if not _prctl_deathsig():
        threading.Thread(target=_watch, args=(parent,), daemon=True, name="parent-watch").start()
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)

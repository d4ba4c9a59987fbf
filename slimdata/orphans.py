"""Workers die with their parent: no worker outlives a killed build or simulation.

A parallel build (or ``simulate --jobs``) starts worker processes. If its main process is
killed (``kill -9`` included, which runs no cleanup), its workers would go on working,
holding the caller's stdout/stderr pipes open. :func:`die_with_parent` runs first in every worker: on Linux it
asks the kernel to SIGKILL the worker when its parent dies (``prctl(PR_SET_PDEATHSIG)``);
elsewhere a daemon thread polls the parent id once a second and exits the worker when it
changes. Either way a parent that died before the call is caught by comparing
``os.getppid()`` with the pid the parent passed in.

A process holding something to clean up (workers to stop, a scratch directory to remove) is
ended by SIGTERM as by Ctrl-C, through every ``finally`` and finalizer, while it holds it:
:func:`exit_on_sigterm` is that handler, and :func:`hold_sigterm_exit` installs it for as long
as some holder needs it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from typing import Any

__all__ = ["die_with_parent", "exit_on_sigterm", "hold_sigterm_exit", "release_sigterm_exit"]

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


def exit_on_sigterm(signum: int, _frame: Any) -> None:
    """SIGTERM handler: leave as Ctrl-C would, through every ``finally`` and finalizer
    (``SystemExit(143)``)."""
    raise SystemExit(128 + signum)


_holds = 0
"""Holders of :func:`hold_sigterm_exit` that installed, or found, :func:`exit_on_sigterm`."""
_hold_lock = threading.Lock()


def hold_sigterm_exit() -> bool:
    """Make SIGTERM raise ``SystemExit`` (:func:`exit_on_sigterm`) until the matching
    :func:`release_sigterm_exit`: installed over the default action from the main thread; a
    program's own SIGTERM handler is left alone. True when this call holds it (then call
    :func:`release_sigterm_exit` once); the last release restores the default action."""
    global _holds
    if threading.current_thread() is not threading.main_thread():
        return False
    with _hold_lock:
        handler = signal.getsignal(signal.SIGTERM)
        if _holds == 0 and handler is not signal.SIG_DFL:
            return False
        if _holds and handler is not exit_on_sigterm:  # replaced meanwhile: theirs now
            return False
        signal.signal(signal.SIGTERM, exit_on_sigterm)
        _holds += 1
        return True


def release_sigterm_exit() -> None:
    """End one hold of :func:`hold_sigterm_exit` (from any thread, at interpreter exit too)."""
    global _holds
    with _hold_lock:
        _holds = max(0, _holds - 1)
        if _holds or threading.current_thread() is not threading.main_thread():
            return
        with contextlib.suppress(ValueError, TypeError):
            if signal.getsignal(signal.SIGTERM) is exit_on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)

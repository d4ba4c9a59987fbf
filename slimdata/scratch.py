"""Private scratch directories that a killed process does not leave behind.

A :class:`ScratchDir` is a temporary directory named after its process,
``$TMPDIR/slimdata-shards-<pid>-<random>``, removed by :meth:`ScratchDir.cleanup`, when it is
collected, and at interpreter exit. A killed process cannot run that cleanup, so:

* While a scratch directory exists, SIGTERM ends the process as Ctrl-C does, through every
  ``finally`` and finalizer (exit status 143; :func:`slimdata.orphans.hold_sigterm_exit`),
  where the program has no SIGTERM handler of its own. Ctrl-C (KeyboardInterrupt) unwinds
  the same way already.
* A process that still dies without cleanup (``kill -9``, the OOM killer, a handler of its
  own that exits at once) leaves its directory, and the next scratch directory made with
  that prefix removes it: one whose process no longer exists and whose ``flock`` nobody
  holds (each holder locks its directory for its lifetime, and the kernel releases the lock
  when it dies; the lock keeps a process of another pid namespace sharing ``/tmp`` from
  losing its directory). Directories of other users, of live processes and of older names
  without a pid are left alone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import weakref
from pathlib import Path

from slimdata.orphans import hold_sigterm_exit, release_sigterm_exit

__all__ = ["ScratchDir", "remove_stale"]


class ScratchDir:
    """A temporary directory ``<prefix><pid>-<random>`` (module docstring)."""

    def __init__(self, prefix: str) -> None:
        remove_stale(prefix)
        self.name = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
        self._fd = _lock(self.name)
        held = hold_sigterm_exit()
        self._finalizer = weakref.finalize(self, _remove, self.name, self._fd, held)

    def cleanup(self) -> None:
        """Remove the directory (once; later calls do nothing)."""
        self._finalizer()


def _remove(name: str, fd: int | None, held: bool) -> None:
    shutil.rmtree(name, ignore_errors=True)
    if fd is not None:
        os.close(fd)
    if held:
        release_sigterm_exit()


def _lock(directory: str) -> int | None:
    """An open descriptor of ``directory`` holding its exclusive ``flock`` (None without
    ``fcntl``)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on POSIX
        return None
    fd = os.open(directory, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, under another user
        return True
    return True


def _unlocked(path: Path) -> bool:
    """True when nobody holds ``path``'s ``flock`` (False without ``fcntl``: keep it)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on POSIX
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def remove_stale(prefix: str) -> list[Path]:
    """Remove the scratch directories ``$TMPDIR/<prefix><pid>-*`` left by dead processes of
    this user (module docstring); the paths removed."""
    removed = []
    uid = os.getuid() if hasattr(os, "getuid") else None
    with contextlib.suppress(OSError):
        for entry in os.scandir(tempfile.gettempdir()):
            pid = entry.name[len(prefix) :].split("-", 1)[0]
            if not entry.name.startswith(prefix) or not pid.isdigit():
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if not entry.is_dir(follow_symlinks=False) or (
                    uid is not None and st.st_uid != uid
                ):
                    continue
                if _alive(int(pid)) or not _unlocked(Path(entry.path)):
                    continue
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(Path(entry.path))
    return removed

"""Output folders checked before the work that fills them."""

from __future__ import annotations

import os
from pathlib import Path

from slimdata.errors import InputError

__all__ = ["check_creatable"]


def check_creatable(out: str | Path) -> None:
    """``out`` is a folder or can be made as one, with any missing parents: the nearest path
    on the way up that exists is a writable folder (``README.md/x``, a file on the way, is an
    :class:`~slimdata.errors.InputError`, not a traceback once the work is done)."""
    path = Path(out)
    there = next(p for p in (path, *path.parents) if p.exists() or p.is_symlink())
    if there.is_symlink() and not there.exists():
        raise InputError(f"{out}: {there} is a link to {os.readlink(there)}, which does not exist")
    if not there.is_dir():
        raise InputError(f"{out}: {there} is a file, not a folder")
    if not os.access(there, os.W_OK | os.X_OK):
        raise InputError(f"{out}: the folder {there} is not writable")

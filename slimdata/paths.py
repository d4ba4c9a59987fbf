"""Output folders checked before the work that fills them, and the record that makes one
recognisable and resumable.

A command that writes a folder (``slimdata build``, ``slimdata plan``) first writes a
*record* into it, atomically (:func:`write_atomic`): the format, inputs and options of the
run, e.g. ``build_plan.json``, ``plan_request.json``. A run killed at any later point
(``kill -9`` included) leaves the record, so the folder is known to be that command's
output (``--overwrite`` may replace it: :func:`holds_any`) and ``--resume`` can check it
continues the same run (:func:`read_record`, :func:`check_same_record`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from slimdata.errors import ConfigError, InputError

__all__ = ["check_creatable", "check_same_record", "holds_any", "read_record", "write_atomic"]


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


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``path`` through ``<path>.tmp`` and a rename: after a crash it is complete or
    absent (only the ``.tmp`` file may be left)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    os.replace(tmp, path)


def holds_any(folder: Path, names: Iterable[str]) -> bool:
    """Whether ``folder`` holds a file of one of ``names``, or its ``.tmp`` of
    :func:`write_atomic` (a run killed while writing it)."""
    return any((folder / n).is_file() or (folder / f"{n}.tmp").is_file() for n in names)


def read_record(output: Path, name: str, key: str, version: int, note: str = "") -> dict[str, Any]:
    """The record ``output/name`` of the run ``--resume`` is to continue, when it is readable
    JSON whose ``key`` is ``version``; else a :class:`ConfigError` that says to start over
    (``note``: why another format cannot be continued)."""
    try:
        old = json.loads((output / name).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"cannot resume {output}: its {name} is unreadable ({exc}); use --overwrite to start over"
        ) from None
    found = old.get(key) if isinstance(old, dict) else None
    if found != version:
        raise ConfigError(
            f"cannot resume {output}: its {name} has format {found}, not {version}{note}; "
            "use --overwrite to start over"
        )
    return old


def check_same_record(output: Path, old: dict[str, Any], new: dict[str, Any], verb: str) -> None:
    """Refuse to resume ``output`` unless its record ``old`` equals ``new``, naming up to 8
    fields that differ (``verb``: how the run made it, "built", "planned")."""
    if old != new:
        changed = ", ".join(_diff(old, new)[:8])
        raise ConfigError(
            f"cannot resume {output}: it was {verb} with different inputs or options (changed: "
            f"{changed}); rerun with the original options, or use --overwrite to start over"
        )


def _diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of the fields that differ: ``{"a": {"b": 1}}`` vs ``{"a": {"b": 2}}`` ->
    ``["a.b"]``."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}")
    return out

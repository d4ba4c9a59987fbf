"""The embedded default corpus: the running interpreter's standard-library ``.py`` sources.

Every Python installation has it, it is real text (code, docstrings, comments) and it is
long-tailed: for CPython 3.11 about 1,760 files, median ~1.6K tokens, p99 ~40K, max ~160K
(``pydoc_data/topics.py``). ``site-packages`` and ``dist-packages`` (third-party code) and
``__pycache__`` are excluded so the corpus is the same on every machine with the same Python
version; the standard library's own test suites (``test/``, ``*/tests/``) are part of it.

Provenance and license: the files are the CPython standard library, distributed with the
interpreter under the Python Software Foundation License Version 2 (PSF-2.0); slimdata does
not copy or ship them, it reads them from the local installation. Nothing is truncated
unless the user asks (``--truncate 160000`` reproduces the "~160K tokens per file" cap).
"""

from __future__ import annotations

import platform
import sysconfig
from pathlib import Path
from typing import Any

from slimdata.errors import InputError

__all__ = [
    "DEFAULT_CORPUS_SOURCE",
    "EXCLUDE",
    "corpus_info",
    "default_corpus_config",
    "stdlib_root",
]

DEFAULT_CORPUS_SOURCE = "python-stdlib"

EXCLUDE = ("site-packages", "dist-packages", "__pycache__")
"""Directory names skipped under the standard-library root."""


def stdlib_root() -> Path:
    """Directory of the running interpreter's standard library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise InputError(
            f"the standard library directory {root} does not exist; pass an INPUT corpus"
        )
    return root


def corpus_info() -> dict[str, Any]:
    """Provenance record written to the sidecar when the default corpus is built."""
    return {
        "name": DEFAULT_CORPUS_SOURCE,
        "description": "standard-library .py sources of the running interpreter (site-packages, dist-packages and __pycache__ excluded; the test suites included)",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "license": "PSF-2.0 (Python Software Foundation License Version 2)",
        "provenance": "read from the local interpreter installation; not shipped by slimdata",
    }


def default_corpus_config() -> dict[str, Any]:
    """Reader settings for the default corpus (a text corpus of ``.py`` files)."""
    return {
        "inputs": (str(stdlib_root()),),
        "format": "text",
        "include": ("*.py",),
        "exclude": EXCLUDE,
        "source": DEFAULT_CORPUS_SOURCE,
    }

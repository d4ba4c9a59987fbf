"""Recipe: the embedded default corpus (the interpreter's standard-library sources)."""

from __future__ import annotations

from slimdata.corpus import default_corpus_config
from slimdata.ingest import BuildConfig


def stdlib() -> BuildConfig:
    """What ``slimdata build`` reads without INPUT: stdlib ``.py`` files (PSF-2.0), whole."""
    return BuildConfig(**default_corpus_config())

"""Recipe: long documents (books, manuals, long reports), one text file per document."""

from __future__ import annotations

from slimdata.ingest import BuildConfig


def books() -> BuildConfig:
    """Long-document corpus: ``.txt``/``.md``/``.rst`` files, 4096-token slices.

    Books run 100K-1M+ tokens, so coarser slices keep a 256K-token book at 64 slices while
    still balancing at 4K granularity. Nothing is truncated.
    """
    return BuildConfig(
        format="text", include=("*.txt", "*.md", "*.rst", "*.text"), slice_tokens=4096
    )

"""Recipe: web text as JSON Lines (C4 / FineWeb / RefinedWeb style ``{"text": ...}`` rows)."""

from __future__ import annotations

from slimdata.ingest import BuildConfig


def web() -> BuildConfig:
    """Web-text JSONL: one document per line from the ``text`` field (plain, .gz or .zst).

    Mostly short documents, so the default 2048-token slices leave nearly every document
    in one slice; ids are ``source/file:line`` (pass ``--id-field id`` to use the rows' ids).
    """
    return BuildConfig(format="jsonl", text_field="text", slice_tokens=2048)

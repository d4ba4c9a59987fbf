"""Ready build recipes (no logic): each a function returning a :class:`BuildConfig`.

Run one with ``slimdata build --pipeline NAME [INPUT...]``; options given on the command
line override the recipe's fields. Add a recipe by writing a function and listing it in
:data:`PIPELINES`.
"""

from __future__ import annotations

from collections.abc import Callable

from pipelines.books import books
from pipelines.code import code
from pipelines.stdlib import stdlib
from pipelines.web import web
from slimdata.ingest import BuildConfig

__all__ = ["PIPELINES", "books", "code", "stdlib", "web"]

PIPELINES: dict[str, Callable[[], BuildConfig]] = {
    "stdlib": stdlib,
    "code": code,
    "web": web,
    "books": books,
}

"""The one small error hierarchy of slimdata.

Every error a user can cause derives from :class:`SlimdataError`; the CLI turns these into a
one-line message and exit code 2 instead of a traceback. Messages say what was wrong, where,
and what to do.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "InputError",
    "OutputExistsError",
    "PlanError",
    "PlanFormatError",
    "SlimdataError",
    "TokenizerError",
]


class SlimdataError(Exception):
    """Base class of every error slimdata raises on purpose."""


class ConfigError(SlimdataError, ValueError):
    """A configuration value is invalid (names the value and the fix)."""


class InputError(SlimdataError):
    """Input data is missing or cannot be read."""


class TokenizerError(SlimdataError):
    """A tokenizer spec cannot be resolved offline."""


class OutputExistsError(SlimdataError):
    """The output directory exists and is not empty (use --overwrite or --resume)."""


class PlanError(SlimdataError):
    """A packing plan is invalid or cannot be made for the given layout."""


class PlanFormatError(PlanError):
    """Plan shards were written in a format this version does not read (rewrite them)."""

"""Amounts as users read them: the one GiB constant and how a GiB amount is printed, a count
with its noun, and the one bound on how many ranks a layout has."""

from __future__ import annotations

__all__ = ["GIB", "MAX_RANKS", "gib", "plural"]

GIB = 1 << 30
"""Bytes in a GiB."""

MAX_RANKS = 1 << 17
"""The most ranks a layout has (131,072 DP ranks, nodes or ranks per node; beyond the
largest training clusters): a larger number is a typo that would only exhaust memory."""


def gib(amount: float, digits: int = 1) -> str:
    """``amount`` GiB as text with ``digits`` decimals, or two significant digits where those
    decimals would print a positive amount as 0: ``gib(3.14159) == "3.1 GiB"``,
    ``gib(0.001) == "0.001 GiB"``, ``gib(0.0012, 2) == "0.0012 GiB"``."""
    if 0 < abs(amount) < 0.5 * 10.0**-digits:
        return f"{amount:.2g} GiB"
    return f"{amount:.{digits}f} GiB"


def plural(count: int, noun: str) -> str:
    """``count`` with thousands separators and ``noun``, singular for exactly one:
    ``plural(1, "task") == "1 task"``, ``plural(1200, "record") == "1,200 records"``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"

"""Static context parallelism: which tokens of a slice each member of a CP group holds.

Under static CP ``k`` (``ExecutionConfig.cp``, ``Layout.cp``) every pack of a DP rank runs on
``k`` members. Each slice of ``s`` tokens is padded to ``s' = ceil(s / 2k) * 2k`` tokens
(:func:`slimdata.execution.program.padded`) and cut into ``2k`` chunks of ``c = s' / 2k``
tokens; member ``i`` holds chunks ``i`` and ``2k - 1 - i`` (Megatron's load-balanced
zig-zag), so every member computes ``1 / k`` of the padded slice's tokens and causal pairs.
The padding sits at the slice's end: the last chunks are short or empty, never padded with
real work.

Example, a slice ``[10, 20)`` at ``k = 2``: ``s' = 12``, ``c = 3``, chunks ``[10,13) [13,16)
[16,19) [19,20)``; member 0 holds ``[10,13) [19,20)``, member 1 ``[13,16) [16,19)``.

The simulator prices exactly this split (:mod:`slimdata.sim.cp`); the runtime executes it
(:mod:`slimdata.hooks.cp`).
"""

from __future__ import annotations

__all__ = ["cp_chunks"]


def cp_chunks(start: int, end: int, cp: int, member: int) -> list[tuple[int, int]]:
    """Token ranges of slice ``[start, end)`` that ``member`` of a CP group of ``cp`` holds,
    in token order, empty ranges left out (module docstring)."""
    if not 0 <= member < cp:
        raise ValueError(f"member={member} outside a CP group of {cp}")
    if cp == 1:
        return [(start, end)] if end > start else []
    c = -(-(end - start) // (2 * cp))  # ceil(s / 2k) = s' / 2k
    out = []
    for j in (member, 2 * cp - 1 - member):
        a, b = min(start + j * c, end), min(start + (j + 1) * c, end)
        if b > a:
            out.append((a, b))
    return out

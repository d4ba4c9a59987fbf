"""The order a pipeline stage runs a rank's packs in under 1F1B: the one definition the
execution model's stage order (:mod:`slimdata.execution.schedule`) builds on, which the
solver's estimate (:mod:`slimdata.execution.critical`) and the simulator share, and how the layers split into pipeline chunks.

With ``pp`` stages, stage ``s`` runs the rank's own order (``RankStep.order``) with every
backward pack delayed by ``pp - 1 - s`` forward packs (the warm-up). For symmetric packs and
the eager order ``F0 B0 F1 B1 ...`` this is Megatron's 1F1B: stage 0 runs ``F0 .. F(pp-1)``
before ``B0``; the last stage runs the rank order unchanged (with ``pp == 1``: exactly the
plan's order). An operation is ``(pass, chunk, pack)``; ``chunk`` is the global model chunk
(device ``chunk % pp`` holds it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "Op",
    "chunk_fractions",
    "interleave",
    "merge_exchange_tokens",
    "one_f_one_b",
    "ready_index",
    "stage_share",
]

Op = tuple[str, int, int]
"""``(pass, chunk, pack)``: pass ``F`` or ``B``, global model chunk, pack index."""


def ready_index(order: Sequence[tuple[str, int]]) -> list[int]:
    """For every backward pack, the last forward pack that precedes it in ``order``.

    ``ready_index([("F", 0), ("B", 0), ("F", 1), ("B", 1)]) == [0, 1]``.
    """
    out: dict[int, int] = {}
    last = -1
    for kind, i in order:
        if kind == "F":
            last = i
        else:
            out[i] = last
    return [out[j] for j in range(len(out))]


def interleave(n_fwd: int, ready: Sequence[int]) -> tuple[tuple[str, int], ...]:
    """A rank's plan order: forward packs in order, backward pack ``j`` (in order) right after
    forward pack ``ready[j]`` once every earlier backward pack has run, then any backward
    packs left (the inverse of :func:`ready_index`). Every per-rank order is one of these:
    eager (``ready`` = the last forward of the pack's documents), lockstep with a lag
    (``ready[j] = j + lag``), common across ranks (the latest over ranks).

    ``interleave(3, [0, 2, 2]) == F0 B0 F1 F2 B1 B2``.
    """
    order: list[tuple[str, int]] = []
    b = 0
    for i in range(n_fwd):
        order.append(("F", i))
        while b < len(ready) and ready[b] <= i:
            order.append(("B", b))
            b += 1
    order.extend(("B", j) for j in range(b, len(ready)))
    return tuple(order)


def one_f_one_b(order: Sequence[tuple[str, int]], stage: int, pp: int, v: int = 1) -> list[Op]:
    """Operations of ``stage`` (chunk ``stage``) for a rank whose plan order is ``order``."""
    nf = sum(1 for k, _ in order if k == "F")
    ready = ready_index(order)
    shift = pp - 1 - stage
    after: list[list[int]] = [[] for _ in range(max(nf, 1))]
    for j, r in enumerate(ready):
        after[max(min(nf - 1, r + shift), 0) if nf else 0].append(j)
    ops: list[Op] = [("B", stage, j) for j in after[0]] if nf == 0 else []
    for i in range(nf):
        ops.append(("F", stage, i))
        ops.extend(("B", stage, j) for j in after[i])
    return ops


def chunk_fractions(layers: int, chunks: int) -> np.ndarray:
    """Share of the model in each of ``chunks`` consecutive pipeline chunks.

    Layers are split as evenly as possible, earlier chunks taking the remainder
    (``chunk_fractions(10, 4) -> [3, 3, 2, 2] / 10``); with fewer layers than chunks (or an
    unknown layer count) every chunk gets ``1 / chunks``.
    """
    if layers < chunks:
        return np.full(chunks, 1.0 / chunks)
    k = np.full(chunks, layers // chunks, dtype=np.float64)
    k[: layers % chunks] += 1
    return k / layers


def stage_share(layers: int, pp: int) -> float:
    """Share of the model's layers on the first (largest) of ``pp`` pipeline stages, by the
    split every consumer uses (:func:`chunk_fractions`): ``stage_share(32, 6) == 6 / 32``."""
    return float(chunk_fractions(layers, pp).max())


def merge_exchange_tokens(shares: Sequence[int]) -> int:
    """Tokens of one layer's gathered keys/values of a merge group whose members hold
    ``shares`` tokens of it: the runtime pads every member's share to the largest
    (:mod:`slimdata.hooks.merge`), so the gathered tensor, and its gradient, hold
    ``k * max(shares)`` tokens. ``merge_exchange_tokens([2, 3]) == 6``. Bytes per layer:
    :meth:`slimdata.cost.CostModel.gathered_kv_bytes` of this."""
    return len(shares) * max(shares, default=0)

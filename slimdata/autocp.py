"""How ``slimdata plan --cp auto`` (its default) chooses the static context-parallel size.

Static CP ``k`` (:attr:`slimdata.solver.Layout.cp`) runs every DP rank's packs on ``k``
devices: it costs padding and a per-layer K/V exchange, and pays when a document is too
large for one device's memory or outweighs a rank's share of the step. So:

1. **When it cannot pay, 1.** Every document (after the oversize rule) fits one device's
   memory and costs at most :data:`HEAVY` times a device's share of a full step's time (the
   epoch's time over its steps and ranks; DP-Merge carries such a document for its step):
   ``cp = 1``, nothing solved or simulated.
2. **Otherwise, the simulator's choice.** On the epoch's first step (as ``simulate``
   screens), each size ``k`` (powers of two dividing the ranks) is solved and
   simulated exactly as ``slimdata simulate`` screens a strategy's configurations
   (:func:`slimdata.sim.search.search`, ``best``, the first step), fastest first; sizes
   that fail there (memory, no room for a merge group) come last, smallest first.
3. The epoch is planned at the first size of that order that plans every step
   (:func:`slimdata.planning.plan_to_shards`).

Example: the Linux 6.1 ``kernel/ mm/ fs/ext4`` and amdgpu ``dcn`` register headers, 64
ranks, 8M-token steps, 128K context, llama-8b on H100 (40.7 GiB budget): a 131,072-token
piece needs 52.1 GiB, so the sizes are screened on the first step: ``cp = 8`` is fastest
there (50.45 s; ``cp = 16`` 53.80 s) and plans every step; ``cp = 1`` cannot plan that step
(several such pieces, each needing a merge group of 2 ranks, and too few free ranks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from slimdata.cost import CostModel
from slimdata.plan import Document
from slimdata.solver.layout import GIB, Layout
from slimdata.units import gib

__all__ = ["HEAVY", "CpChoice", "cp_preference"]


@dataclass(frozen=True)
class CpChoice:
    """Static CP sizes to plan an epoch with, in order of preference, and why."""

    order: list[int]
    reason: str
    tried: list[dict] = field(default_factory=list)
    """Per screened size: ``cp`` and the simulated first-step ``step_time`` or ``error``."""


def cp_preference(
    docs: Sequence[Document],
    *,
    ranks: int,
    ranks_per_node: int,
    global_batch_tokens: int,
    memory_gib: float,
    context: int,
    mode: str,
    strategy: str,
    seed: int,
    cost: CostModel | None,
    oversize: str,
) -> CpChoice:
    """The static CP sizes to try for an epoch, best first (module docstring)."""
    from slimdata.solver.common import default_cost
    from slimdata.solver.config import PlanConfig

    cost = cost or default_cost()
    why = _outweighs(docs, cost, ranks, global_batch_tokens, memory_gib, context)
    if why is None:
        return CpChoice(
            [1], f"every document fits one device and costs at most {HEAVY:g}x its share of a step"
        )
    base = Layout(dp=ranks, ranks_per_node=ranks_per_node, memory_gib=memory_gib,
                  context=context, mode=mode)  # fmt: skip
    config = PlanConfig(layout=base, global_batch_tokens=global_batch_tokens,
                        strategy=strategy, seed=seed, oversize=oversize, cost=cost)  # fmt: skip
    return _screened(config.batches(docs)[0], base, cost, strategy, seed, mode, why)


HEAVY = 2.0
"""A document costing up to this many devices' shares of a step is left to DP-Merge (which
merges it for that step only) without screening static CP sizes."""


def _outweighs(
    docs: Sequence[Document],
    cost: CostModel,
    ranks: int,
    global_batch_tokens: int,
    memory_gib: float,
    context: int,
) -> str | None:
    """Why static CP may pay: the document (pieces at most ``context`` long) that weighs most
    against one device, in memory or against a device's share of a full step's time (the
    epoch's time over its steps and ranks); None when none outweighs it. The reason names
    only what it outweighs: memory, time or both."""
    n = np.minimum(np.fromiter((d.length for d in docs), np.int64, len(docs)), context)
    if not len(n):
        return None
    time = cost.forward(0, n) + cost.backward(0, n)
    mem = cost.activation_bytes(0, n) + cost.kv_bytes(n)
    steps = max(1.0, float(n.sum()) / global_batch_tokens)
    share = float(time.sum()) / steps / ranks
    heavy, large = time / share / HEAVY, mem / (memory_gib * GIB)
    j = int(np.argmax(np.maximum(heavy, large)))
    reasons = []
    if large[j] > 1.0:
        reasons.append(
            f"needs {gib(mem[j] / GIB)}, more than the {gib(memory_gib)} budget of a device"
        )
    if heavy[j] > 1.0:
        reasons.append(
            f"costs {time[j] / share:.2f}x a device's share of a step's time (more than {HEAVY:g}x)"
        )
    if not reasons:
        return None
    return f"a {int(n[j]):,}-token document {', and '.join(reasons)}"


def _screened(
    batch: Sequence[Document],
    base: Layout,
    cost: CostModel,
    strategy: str,
    seed: int,
    mode: str,
    why: str,
) -> CpChoice:
    """Every CP size simulated on ``batch`` as ``simulate`` screens them: fastest first,
    then the sizes that failed, smallest first."""
    from slimdata.sim.config import SimConfig
    from slimdata.sim.search import BaselineConfig, Evaluator, cp_sizes, search
    from slimdata.solver import solve

    config = SimConfig(parallelism="fsdp" if mode == "lockstep" else "ddp")
    ev = Evaluator([list(batch)], base, cost, config, seed, solve)
    search(ev, strategy, BaselineConfig("best"))
    times: dict[int, float] = {}
    tried = []
    for t in ev.log.tried:
        first = t["first_step"]
        if isinstance(first, str):
            tried.append({"cp": t["cp"], "error": first})
        else:
            tried.append({"cp": t["cp"], "step_time": first})
            times[t["cp"]] = min(first, times.get(t["cp"], first))
    order = sorted(times, key=lambda k: (times[k], k))
    order += [k for k in cp_sizes(base.dp) if k not in times]
    return CpChoice(order, why, tried)

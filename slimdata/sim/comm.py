"""Communication volumes and times of the collectives the simulator models.

Device ``d = stage * dp + rank`` sits on node ``d // ranks_per_node`` (DP ranks of one
stage are contiguous, as in Megatron's default rank order), so a group spans nodes when its
devices do. Times come from the alpha-beta :class:`~slimdata.cost.Interconnect`.

- DDP: one ring all-reduce of a stage's gradients over the stage's DP ranks at step end.
- FSDP / ZeRO-3: an all-gather of a chunk's parameters before every forward and backward
  pack and a reduce-scatter of its gradients after every backward pack.
- Context parallelism (static CP, DP-Merge, dcp): the per-layer K/V exchange of
  :mod:`slimdata.sim.cp`.
- Pipeline: a point-to-point send of a pack's hidden states (``tokens * hidden * dtype``)
  between consecutive chunks, in each direction.
"""

from __future__ import annotations

from collections.abc import Iterable

from slimdata.cost import CostModel, Interconnect

__all__ = ["p2p_time", "spans_nodes"]


def spans_nodes(devices: Iterable[int], ranks_per_node: int) -> bool:
    return len({d // ranks_per_node for d in devices}) > 1


def p2p_time(
    net: Interconnect, cost: CostModel, tokens: float, src: int, dst: int, ranks_per_node: int
) -> float:
    if tokens <= 0:
        return 0.0
    return net.p2p(
        tokens * cost.hidden * cost.dtype_bytes, src // ranks_per_node != dst // ranks_per_node
    )

"""Times of the collectives the simulator models; their volumes are the execution model's
(the :class:`~slimdata.execution.Collective` ops of the programs,
:mod:`slimdata.execution.program`).

Device ``d = stage * dp + rank`` sits on node ``d // ranks_per_node`` (DP ranks of one
stage are contiguous, as in Megatron's default rank order), so a group spans nodes when its
devices do. Times come from the alpha-beta :class:`~slimdata.cost.Interconnect`.

- DDP: one ring all-reduce of a stage's gradients over the stage's DP ranks at step end.
- FSDP / ZeRO-3: an all-gather of a chunk's parameters before every forward and backward
  pack and a reduce-scatter of its gradients after every backward pack.
- Context parallelism (static CP, DP-Merge, dcp): the per-layer K/V exchange of
  :mod:`slimdata.sim.cp`.
- Pipeline: the program's point-to-point ``send`` of a pack's hidden states between
  consecutive chunks, in each direction.
"""

from __future__ import annotations

from collections.abc import Iterable

from slimdata.cost import Interconnect

__all__ = ["p2p_time", "spans_nodes"]


def spans_nodes(devices: Iterable[int], ranks_per_node: int) -> bool:
    return len({d // ranks_per_node for d in devices}) > 1


def p2p_time(net: Interconnect, nbytes: float, src: int, dst: int, ranks_per_node: int) -> float:
    """Seconds of a point-to-point send of ``nbytes`` from device ``src`` to ``dst``."""
    if nbytes <= 0:
        return 0.0
    return net.p2p(nbytes, src // ranks_per_node != dst // ranks_per_node)

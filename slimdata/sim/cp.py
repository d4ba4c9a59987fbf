"""Static context parallelism (CP): every pack split across a fixed group of ``cp`` devices.

This is how a Megatron-style job runs rows that do not fit one device
(``--context-parallel-size k`` with THD/varlen packing): the CP size is fixed for the whole
job, so every row, short or long, is split across ``k`` devices, and only ``dp / k`` DP
groups remain. SlimPack instead keeps CP at 1 and merges DP ranks only for the documents that
need it (DP-Merge, :mod:`slimdata.sim.dag`). Modelling assumptions:

- **Placement.** A plan solved for ``dp / k`` DP groups runs on ``dp`` devices per pipeline
  stage. DP group ``g`` of stage ``s`` is devices ``s * dp + g * k .. s * dp + g * k + k - 1``
  (Megatron orders TP-CP-DP-PP, CP inside DP), so a CP group is intra-node when ``k`` divides
  ``ranks_per_node``. The ``k`` members of a group run identical schedules; the simulator
  evaluates one representative per group and reports every device.
- **Compute.** Each member computes exactly ``1 / k`` of every pack's linear tokens and
  causal query-key pairs (ideal zigzag / head-tail load balancing of every document); the
  per-slice fixed overhead (kernel launches) is paid by every member, not divided.
- **Exchange, per layer.** The forward all-gathers the pack's keys and values,
  ``tokens * kv_dim * 2 * dtype_bytes`` bytes (``CostModel.kv_bytes_per_token / layers``),
  over the ``k`` members (alpha-beta ring: ``latency + (k - 1) / k * bytes / bandwidth``).
  The backward gathers them again and reduce-scatters their gradients (2 collectives), plus
  one more gather when the backward re-runs the forward (``recompute=full``: 3).
- **Overlap.** Ring attention sends the next K/V block while computing attention on the
  current one: ``k - 1`` transfers hide behind ``k - 1`` of the ``k`` attention blocks, so up
  to ``cp_overlap * (k - 1) / k`` of a member's attention time per layer hides that layer's
  exchange; the rest is exposed. Linear layers hide none of it.
- **Memory per device.** The activations and retained K/V of the plan's rule (design §5,
  :mod:`slimdata.solver.memory`) divided by ``k``, plus the gathered K/V of one layer while a
  pack runs (twice that in the backward: K/V and their gradients).
- **Other collectives.** DDP's gradient all-reduce and FSDP's parameter collectives span all
  ``dp`` devices (DP x CP), as Megatron reduces gradients over the DP x CP group; pipeline
  sends carry each member's ``1 / k`` of the hidden states.

Example: ``k = 2``, one pack of 1000 tokens whose forward takes 10 s (8 s linear, 2 s
attention, no constants) on one device: each member computes 5 s; with 1 layer, 1 byte of
K/V per token and 100 B/s intra-node, the gather moves ``1000 * 1/2 = 500`` bytes, 5 s, of
which ``(k - 1) / k * 1 s = 0.5 s`` hides behind the member's attention: 4.5 s exposed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slimdata.cost import CostModel, Interconnect
from slimdata.plan import StepPlan
from slimdata.sim.packs import PackTimes

__all__ = ["CpPacks", "cp_packs", "cp_peak_memory", "real_devices"]


@dataclass(frozen=True)
class CpPacks:
    """Per-member times of every flat pack under static CP (full model, all layers)."""

    fwd: np.ndarray
    """Compute seconds of one member per flat forward pack."""
    bwd: np.ndarray
    f_comm: np.ndarray
    """Exposed exchange seconds per flat forward pack, shape ``(2, packs)``: row 0 for a CP
    group inside one node, row 1 for one spanning nodes."""
    b_comm: np.ndarray
    f_layer_kv: np.ndarray
    """Bytes of one layer's gathered K/V per flat forward pack (held while the pack runs)."""
    b_layer_kv: np.ndarray


def real_devices(devices: list[int] | tuple[int, ...], groups: int, cp: int) -> list[int]:
    """Map representative devices ``stage * groups + g`` to the ``cp`` real devices each stands for.

    ``real_devices([1], groups=2, cp=4) == [4, 5, 6, 7]``; ``cp == 1`` is the identity.
    """
    if cp == 1:
        return list(devices)
    out: list[int] = []
    for d in devices:
        s, g = divmod(d, groups)
        base = s * groups * cp + g * cp
        out.extend(range(base, base + cp))
    return out


def _exposed(
    net: Interconnect,
    layer_bytes: np.ndarray,
    collectives: int,
    att_member: np.ndarray,
    cp: int,
    layers: int,
    overlap: float,
) -> np.ndarray:
    """``(2, packs)`` exposed seconds over all layers, intra-node row then inter-node row."""
    out = np.zeros((2, len(layer_bytes)))
    if cp == 1:
        return out
    hide = overlap * (cp - 1) / cp * att_member / layers
    for row, spans in enumerate((False, True)):
        per_layer = collectives * (
            net.latency_s + layer_bytes * (cp - 1) / cp / net.bandwidth(spans)
        )
        out[row] = np.where(layer_bytes > 0, layers * np.maximum(per_layer - hide, 0.0), 0.0)
    return out


def cp_packs(
    pt: PackTimes,
    cost: CostModel,
    cp: int,
    net: Interconnect,
    *,
    recompute_full: bool,
    overlap: float = 1.0,
) -> CpPacks:
    """Member compute, exposed exchange and gathered bytes of every pack (module docstring)."""
    layers = max(cost.layers, 1)
    f_kv = cost.kv_bytes_per_token / layers * pt.f_tokens
    b_kv = cost.kv_bytes_per_token / layers * pt.b_tokens
    return CpPacks(
        fwd=(pt.fwd - pt.f_const) / cp + pt.f_const,
        bwd=(pt.bwd - pt.b_const) / cp + pt.b_const,
        f_comm=_exposed(net, f_kv, 1, pt.f_att / cp, cp, layers, overlap),
        b_comm=_exposed(net, b_kv, 3 if recompute_full else 2, pt.b_att / cp, cp, layers, overlap),
        f_layer_kv=f_kv if cp > 1 else np.zeros_like(f_kv),
        b_layer_kv=b_kv if cp > 1 else np.zeros_like(b_kv),
    )


def cp_peak_memory(plan: StepPlan, cost: CostModel, cp: int) -> np.ndarray:
    """Peak bytes of one device of every DP group of ``plan`` run with static CP ``cp``.

    The solver's memory rule (:func:`slimdata.solver.memory.plan_peak_memory`) divided by
    ``cp``, plus (``cp > 1``) twice the gathered one-layer K/V of the group's largest pack (a
    bound: it assumes the backward buffer coincides with the peak). ``cp == 1`` is exactly
    ``plan_peak_memory``. Shape ``(plan.dp,)``.
    """
    from slimdata.solver.memory import plan_peak_memory

    peak = plan_peak_memory(plan, cost) / cp
    if cp > 1:
        per_layer = cost.kv_bytes_per_token / max(cost.layers, 1)
        for rs in plan.ranks:
            most = max(
                (sum(s.tokens for s in p.slices) for p in (*rs.forward, *rs.backward)), default=0
            )
            peak[rs.rank] += 2 * per_layer * most
    return peak

"""The one context-parallel (CP) cost model: static CP, Megatron dynamic CP and DP-Merge.

Three mechanisms split a sequence over ``k`` devices: static CP (``SimConfig.cp = k``: every
pack of a plan solved for ``dp / k`` DP groups runs on a fixed group of ``k`` devices, as
Megatron's ``--context-parallel-size``), and merge groups of a plan (DP-Merge of
``slimpack``; the per-sequence CP groups of ``dcp``). All are priced here, alike, except
where a merge group's exchange follows what the runtime issues (:func:`merge_layer_tokens`,
:func:`merge_collectives`: members padded to the largest share, not to ``2 k``; one more
gather when the executor recomputes the merge pack):

- **Padding and chunks.** A sequence of ``s`` tokens under static CP is padded to a multiple
  of ``2 k`` (``s' = ceil(s / 2k) * 2k``, Megatron's THD requirement) and cut into ``2 k``
  load-balanced chunks (member ``i`` holds chunks ``i`` and ``2k - 1 - i``), so each member
  computes ``1 / k`` of the padded sequence's linear tokens and causal pairs. A merge group
  runs the slices its plan gives each member (``dcp``: the ``2 k`` chunks; ``slimpack``: its
  own slices), priced slice by slice (the compute of both: :mod:`slimdata.execution.compute`).
- **Kernel efficiency.** Attention on a chunk of ``c`` tokens of a ``w``-token sequence costs
  ``chunk_factor(w, c)`` times the unsplit time per pair (:mod:`slimdata.cost.attention`, a
  published FlashAttention-3 curve): static CP ``w = s'``, ``c = s' / 2k``; a merge member's
  slice ``w = `` its document's length, ``c = `` the slice's tokens.
- **K/V exchange, per layer.** The forward all-gathers the keys and values its queries read
  over the ``k`` members (alpha-beta ring: ``latency + (k - 1) / k * bytes / bandwidth``);
  the backward gathers them again and reduce-scatters their gradients (2 collectives), one
  more gather when it re-runs the forward. Static CP gathers what the runtime gathers
  (:func:`slimdata.execution.cp.cp_gather`, the execution model's
  :attr:`~slimdata.execution.Programs.cp_gathers`): per model call, its slices and the
  earlier slices of their documents (the continuation prefix), each member's chunks padded
  to the longest member's rows; a pack of several calls pays every call's collectives
  against its attention. Intra- or inter-node bandwidth by the members' placement.
- **Overlap.** Ring/all-gather attention sends the next K/V block while computing attention
  on the current one, so up to ``cp_overlap * (k - 1) / k`` of a member's attention time of
  that layer hides that layer's exchange; the rest is exposed. Linear layers hide none of it.
- **Memory per device** (static CP). The activations and retained K/V of the execution
  model's rule (:mod:`slimdata.execution.memory`) divided by ``k``, plus the gathered K/V of
  one layer while a pack runs (twice that in the backward: K/V and their gradients).
- **Placement and other collectives** (static CP). DP group ``g`` of stage ``s`` is devices
  ``s * dp + g * k .. + k - 1`` (Megatron orders TP-CP-DP-PP), so a CP group is intra-node
  when ``k`` divides ``ranks_per_node``; the ``k`` members run identical schedules and the
  simulator evaluates one representative per group. DDP's all-reduce and FSDP's collectives
  span all ``dp`` devices (DP x CP); pipeline sends carry each member's ``1 / k``.

Example (static CP): ``k = 2``, one pack holding a 1000-token sequence whose forward takes
10 s (8 s linear, 2 s attention, no constants) on one device: 1000 is a multiple of 4 (no
padding), its chunks of 250 tokens and the sequence are both below the curve's first point
(factor 1), so each member computes 5 s; each member holds 500 tokens (no prefix to read),
so the gathered buffer is 1000 tokens; with 1 layer, 1 byte of K/V per token and 100 B/s
intra-node, the gather moves ``1000 * 1/2 = 500`` bytes, 5 s, of which
``(k - 1) / k * 1 s = 0.5 s`` hides behind the member's attention: 4.5 s exposed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slimdata.cost import CostModel, Interconnect
from slimdata.execution.compute import PackCompute, merge_attention_scale, padded
from slimdata.execution.cp import PassGathers
from slimdata.execution.merge import merge_collectives, merge_layer_tokens
from slimdata.execution.pricing import PackTimes
from slimdata.execution.program import ExecutionConfig
from slimdata.plan import StepPlan

__all__ = [
    "CpPacks",
    "cp_packs",
    "cp_peak_memory",
    "exchange_exposed",
    "merge_attention_scale",
    "merge_collectives",
    "merge_layer_tokens",
    "padded",
    "real_devices",
]


@dataclass(frozen=True)
class CpPacks:
    """Per-member K/V exchange of every flat pack under static CP (full model, all layers);
    the member's compute is :func:`~slimdata.execution.compute.pack_compute`'s."""

    f_comm: np.ndarray
    """Exposed exchange seconds per flat forward pack, shape ``(2, packs)``: row 0 for a CP
    group inside one node, row 1 for one spanning nodes."""
    b_comm: np.ndarray
    f_layer_kv: np.ndarray
    """Bytes of one layer's gathered K/V per flat forward pack (its largest call's, held
    while the pack runs)."""
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


def exchange_exposed(
    net: Interconnect,
    layer_bytes: np.ndarray,
    collectives: int | np.ndarray,
    att_member: np.ndarray,
    k: int,
    layers: int,
    overlap: float,
    spans_nodes: bool,
) -> np.ndarray:
    """Exposed K/V exchange seconds over all ``layers`` (module docstring): per layer
    ``collectives`` ring collectives of ``layer_bytes`` each (a number or one per pack) over
    ``k`` members, less up to
    ``overlap * (k - 1) / k`` of the member's per-layer attention time ``att_member / layers``."""
    layer_bytes = np.asarray(layer_bytes, dtype=np.float64)
    if k == 1:
        return np.zeros_like(layer_bytes)
    hide = overlap * (k - 1) / k * np.asarray(att_member) / layers
    per_layer = collectives * (
        net.latency_s + layer_bytes * (k - 1) / k / net.bandwidth(spans_nodes)
    )
    return np.where(layer_bytes > 0, layers * np.maximum(per_layer - hide, 0.0), 0.0)


def cp_packs(
    pt: PackTimes,
    compute: PackCompute,
    cost: CostModel,
    cp: int,
    net: Interconnect,
    gathers: PassGathers | None,
    *,
    overlap: float = 1.0,
) -> CpPacks:
    """Exposed exchange and gathered bytes of every pack (module docstring): ``compute``'s
    member attention hides up to its share of the exchange; ``gathers``: the execution
    model's static-CP gathers (needed for ``cp > 1``)."""
    if cp == 1:
        zf, zb = np.zeros((2, len(pt.fwd))), np.zeros((2, len(pt.bwd)))
        return CpPacks(zf, zb, np.zeros(len(pt.fwd)), np.zeros(len(pt.bwd)))
    assert gathers is not None, "static CP is priced from the execution model's gathers"
    layers = max(cost.layers, 1)
    out = []
    for kind, member_att in (("F", compute.f_att), ("B", compute.b_att)):
        n = len(member_att)
        # per layer: ``coll`` collectives moving ``moved`` bytes in all (their mean each)
        coll = np.array([gathers.collectives(kind, k) for k in range(n)], dtype=np.float64)
        moved = cost.gathered_kv_bytes([gathers.tokens(kind, k) for k in range(n)])
        mean = np.divide(moved, coll, out=np.zeros(n), where=coll > 0)
        comm = np.stack(
            [
                exchange_exposed(net, mean, coll, member_att, cp, layers, overlap, spans)
                for spans in (False, True)
            ]
        )
        kv = cost.gathered_kv_bytes([gathers.largest(kind, k) for k in range(n)])
        out.append((comm, kv))
    (f_comm, f_kv), (b_comm, b_kv) = out
    return CpPacks(f_comm, b_comm, f_kv, b_kv)


def cp_peak_memory(plan: StepPlan, cost: CostModel, cp: int) -> np.ndarray:
    """Peak bytes of one device of every DP group of ``plan`` run with static CP ``cp``: the
    execution model's memory rule (:mod:`slimdata.execution.memory`) with ``cp`` members,
    each holding ``1 / cp`` of every slice's bytes plus one layer's gathered K/V of the pass
    it runs (twice that in the backward). ``cp == 1`` is exactly
    :func:`slimdata.solver.memory.plan_peak_memory`. Shape ``(plan.dp,)``.
    """
    from slimdata.solver.memory import plan_peak_memory

    return plan_peak_memory(plan, cost, ExecutionConfig(cp=cp))

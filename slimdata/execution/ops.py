"""The operations of a :class:`Program`: what one device does, in order, during one step.

Four kinds, all plain values (no tensors; slotted dataclasses that nobody mutates, not
frozen because a step lists tens of thousands of them and frozen construction is 5x slower):

- :class:`Compute`: one pass of one pack on one model chunk, with its price in seconds;
- :class:`Collective`: a communication call, with the devices taking part and its bytes;
- :class:`Alloc` / :class:`Free`: device memory that starts / stops being held. An
  allocation takes effect when the next :class:`Compute` of the program starts, a free when
  the previous one ends (so a buffer allocated right before a compute and freed right after
  it is held exactly while that compute runs).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "COLLECTIVES",
    "MEMORY",
    "Alloc",
    "Collective",
    "Compute",
    "Free",
    "Operation",
    "Program",
]

COLLECTIVES = (
    "ddp_all_reduce",
    "fsdp_all_gather",
    "fsdp_reduce_scatter",
    "merge_kv_all_gather",
    "merge_kv_reduce_scatter",
    "merge_tokens_all_gather",
    "cp_kv_all_gather",
    "cp_kv_reduce_scatter",
    "send",
    "recv",
)
"""Collective kinds: DDP's gradient all-reduce (once per stage, at the end of the step);
FSDP's parameter all-gather (every pack pass) and gradient reduce-scatter (every backward
pass); DP-Merge's per-layer K/V all-gather and K/V-gradient reduce-scatter (merge packs) and
its members' exchange of the merged documents' token ids and loss masks (once, at the start of
the step: :func:`slimdata.execution.merge.merge_token_bytes`);
static CP's per-layer K/V all-gather and K/V-gradient reduce-scatter of every model call
(:func:`slimdata.execution.cp.cp_pass_gathers`); pipeline point-to-point hidden states (``send`` / ``recv`` between neighbouring chunks)."""

MEMORY = ("activations", "kv", "gathered_kv")
"""What an allocation holds: the activations of a pass's slices, their retained keys/values
(the per-step K/V store, held per slice until the slice's backward pack ends), one layer's
gathered keys/values of a context-parallel group (DP-Merge, static CP; with their gradients
in the backward). Slice memory is listed per pass: the slices of one pack start (forward)
and stop (backward pack) holding it together."""


@dataclass(slots=True)
class Compute:
    """One pass of one pack on one model chunk."""

    pass_: str
    """``"F"`` forward or ``"B"`` backward (a recomputed backward re-runs the forward first)."""
    chunk: int
    """Global model chunk (its device holds stage ``chunk % pp``)."""
    pack: int
    """The rank's forward (``F``) or backward (``B``) pack index."""
    seconds: float
    """This chunk's share of the pack's price (:func:`slimdata.execution.pricing.pack_times`)."""
    tokens: int
    pairs: float
    """Causal query-key pairs of the pack's slices (design §3)."""
    calls: int
    """Model calls (0: the pack is empty here and runs nothing)."""
    graph_free: bool = False
    """A forward run without an autograd graph (its backward pack recomputes it)."""
    recompute: bool = False
    """A backward that re-runs its pack's forward first."""
    merge: int | None = None
    """The merge group this pack runs with (DP-Merge), else None."""


@dataclass(slots=True)
class Collective:
    """A communication call; every device of ``group`` issues the same one."""

    kind: str
    """One of :data:`COLLECTIVES`."""
    group: tuple[int, ...]
    """Devices taking part (device ``stage * dp + rank``), ascending; ``send``/``recv``:
    ``(source, destination)``. Under static CP a device stands for the ``cp`` processes of
    its CP group (:func:`slimdata.sim.cp.real_devices`): ``cp_kv_*`` name that one device."""
    bytes: float
    """Bytes of the full (gathered / reduced / sent) buffer of one call."""
    pass_: str = ""
    """The pass it belongs to (``""``: the step, e.g. DDP's all-reduce)."""
    chunk: int = -1
    pack: int = -1
    layer: int = -1
    """Per-layer collectives (DP-Merge and static-CP K/V): the global layer index."""


@dataclass(slots=True)
class Alloc:
    """Memory held from the start of the next compute."""

    what: str
    """One of :data:`MEMORY`."""
    bytes: float


@dataclass(slots=True)
class Free:
    """Memory released at the end of the previous compute."""

    what: str
    bytes: float


Operation = Compute | Collective | Alloc | Free


@dataclass(frozen=True)
class Program:
    """Ordered operations of one device of one step: DP rank ``rank`` at pipeline ``stage``
    (all its virtual chunks), device ``stage * dp + rank``."""

    rank: int
    stage: int
    device: int
    ops: tuple[Operation, ...]

    def computes(self) -> list[Compute]:
        return [op for op in self.ops if isinstance(op, Compute)]

    def collectives(self) -> list[Collective]:
        return [op for op in self.ops if isinstance(op, Collective)]

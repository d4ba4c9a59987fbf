"""How the step executor runs a plan's packs: which forwards keep their graph, which backward
packs recompute (design §9). Pure Python, shared by the runtime and the simulator.

A backward pack that is exactly a union of forward packs runs backward through the graphs
those forward packs kept. Any other backward pack (asymmetric partitioning) recomputes its
forward from the saved boundary states and runs backward through that; a forward pack that
feeds only such packs runs without a graph (*graph-free*).

Free mode (DDP, one rank alone) decides per rank (:func:`kept_forward_packs`). Lockstep mode
(FSDP) decides from the whole plan so that every rank makes the same model calls
(:func:`lockstep_schedule`). Example, packs ``fwd [[a], [b, c]]``: ``bwd [[b, c, a]]`` is a
union of both forward packs (no recompute); ``bwd [[c], [a, b]]`` has no union, so both
backward packs recompute and both forward packs run graph-free.

Outside FSDP the executor's default is to *split* instead (:func:`split_calls`): a forward pack
runs one model call per backward pack its slices go to, every call keeps its graph, and a
backward pack runs backward through its calls. Nothing is recomputed; the price is more,
smaller calls. Same example, ``bwd [[c], [a, b]]``: forward pack 1 runs ``[c]`` then ``[b]``,
backward pack 0 runs ``[c]``'s graph, backward pack 1 runs ``[b]``'s then ``[a]``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slimdata.errors import PlanError
from slimdata.plan.types import MicroPack, Slice, StepPlan

if TYPE_CHECKING:
    from slimdata.plan.rankplan import RankPlan

__all__ = [
    "LockstepSchedule",
    "RankExecution",
    "check_lockstep",
    "execution",
    "kept_forward_packs",
    "lockstep_schedule",
    "split_calls",
]


def kept_forward_packs(
    forward: Sequence[MicroPack], backward: Sequence[MicroPack]
) -> tuple[set[int], dict[int, list[int]]]:
    """Which forward packs keep their graph, and the forward packs of each union backward pack.

    Backward pack ``j`` is a union when every slice of every forward pack it touches is in
    ``j``: ``fwd [[a], [b, c]]`` and ``bwd [[b, c, a]]`` -> union; ``bwd [[c], [a, b]]`` -> none.
    """
    unions: dict[int, list[int]] = {j: [] for j, p in enumerate(backward) if not p.slices}
    unions.update({j: list(fs) for j, fs in _rank_unions(forward, backward).items() if fs})
    return {i for fs in unions.values() for i in fs}, unions


def check_lockstep(plan: StepPlan | RankPlan) -> None:
    """Raise :class:`PlanError` unless every rank makes the same sequence of pack calls (a
    rank's view: unless it carries the lockstep schedule its whole plan passed this check for)."""
    if not isinstance(plan, StepPlan):
        if plan.lockstep is None:
            raise PlanError(
                f"step {plan.step}: FSDP needs a lockstep plan (same pack counts and F/B order on "
                "every rank, merge packs at the same indices on every member); this rank's plan "
                'carries no lockstep schedule -- solve with Layout(mode="lockstep")'
            )
        return
    shapes = {(len(rs.forward), len(rs.backward), rs.order) for rs in plan.ranks}
    if len(shapes) != 1:
        raise PlanError(
            f"step {plan.step}: FSDP needs a lockstep plan (same pack counts and F/B order on every "
            "rank), got "
            + ", ".join(
                f"rank {rs.rank}: {len(rs.forward)}F/{len(rs.backward)}B" for rs in plan.ranks
            )
            + ' -- solve with Layout(mode="lockstep")'
        )
    for g, m in enumerate(plan.merges):
        for kind in ("forward", "backward"):
            idx = {
                r: [i for i, p in enumerate(getattr(plan.ranks[r], kind)) if p.merge == g]
                for r in m.ranks
            }
            if len({tuple(v) for v in idx.values()}) != 1:
                raise PlanError(
                    f"step {plan.step}: FSDP lockstep: merge group {g} runs its {kind} merge pack at "
                    f"different indices on its members {idx}; align them"
                )


@dataclass(frozen=True)
class LockstepSchedule:
    """Plan-global execution decisions (identical on every rank)."""

    kept: frozenset[int]
    """Forward packs that keep their graph (on every rank)."""
    unions: dict[int, tuple[int, ...]]
    """Backward pack -> the forward packs it is the union of (on every rank)."""
    idle_forward: frozenset[int]
    """Forward packs empty on every rank: no call at all."""
    idle_backward: frozenset[int]
    """Backward packs empty on every rank: no call at all."""


def _rank_unions(
    forward: Sequence[MicroPack], backward: Sequence[MicroPack]
) -> dict[int, tuple[int, ...] | None]:
    """Per non-empty backward pack: the forward packs it is exactly the union of, or None."""
    fwd_of = {s: i for i, p in enumerate(forward) for s in p.slices}
    out: dict[int, tuple[int, ...] | None] = {}
    for j, p in enumerate(backward):
        if not p.slices:
            continue
        fs = sorted({fwd_of[s] for s in p.slices})
        mine = set(p.slices)
        whole = all(s in mine for i in fs for s in forward[i].slices)
        out[j] = tuple(fs) if whole else None
    return out


def lockstep_schedule(plan: StepPlan | RankPlan, keep: bool = True) -> LockstepSchedule:
    """Kept/union decisions from the whole plan (a rank's view carries them).

    Backward pack ``j`` runs as a union of forward packs ``S`` when every rank on which ``j`` is
    non-empty has ``j`` as exactly the union of its forward packs ``S``, every rank on which ``j``
    is empty has all of ``S`` empty too (it replays ``S`` with dummy calls), and no forward pack
    is claimed twice; otherwise ``j`` is recomputed on every rank. ``keep=False``: recompute
    every backward pack (FSDP1, which supports one backward right after its forward only).
    Assumes :func:`check_lockstep`.
    """
    if not isinstance(plan, StepPlan):
        carried = plan.lockstep
        assert carried is not None, "check_lockstep first"
        if keep:
            return carried
        return LockstepSchedule(frozenset(), {}, carried.idle_forward, carried.idle_backward)
    nf, nb = len(plan.ranks[0].forward), len(plan.ranks[0].backward)
    per_rank = [_rank_unions(rs.forward, rs.backward) for rs in plan.ranks]
    unions: dict[int, tuple[int, ...]] = {}
    claimed: set[int] = set()
    for j in range(nb if keep else 0):
        cands = {u[j] for u in per_rank if j in u}
        if len(cands) != 1:
            continue  # empty everywhere, disagreement or a recomputed rank
        s = next(iter(cands))
        if s is None or claimed & set(s):
            continue
        if any(
            j not in u and any(rs.forward[i].slices for i in s)
            for u, rs in zip(per_rank, plan.ranks, strict=True)
        ):
            continue
        unions[j] = s
        claimed.update(s)
    return LockstepSchedule(
        kept=frozenset(claimed),
        unions=unions,
        idle_forward=frozenset(
            i for i in range(nf) if not any(rs.forward[i].slices for rs in plan.ranks)
        ),
        idle_backward=frozenset(
            j for j in range(nb) if not any(rs.backward[j].slices for rs in plan.ranks)
        ),
    )


@dataclass(frozen=True)
class SplitCalls:
    """One rank's model calls when forward packs are split by backward pack."""

    forward: tuple[tuple[tuple[int, tuple[Slice, ...]], ...], ...]
    """Per forward pack, its calls in run order: ``(backward pack, slices)``, backward packs
    descending (a document's earlier slices go to later backward packs and run first)."""
    backward: tuple[tuple[int, ...], ...]
    """Per backward pack, the forward packs whose calls it runs backward through, latest
    first (readers before the slices they read)."""


def split_calls(forward: Sequence[MicroPack], backward: Sequence[MicroPack]) -> SplitCalls | None:
    """Split every forward pack into one call per backward pack its slices belong to; None
    when a merge forward pack would be split (it must stay one call, one gather on every
    member), and the rank then runs by the recompute rules.

    ``fwd [[a], [b, c]]``, ``bwd [[c], [a, b]]`` -> forward calls ``[[(1, [a])], [(1, [b]),
    (0, [c])]]``, backward calls ``[[1], [1, 0]]``. A backward pack that is a union of forward
    packs gets one call per forward pack, which then run whole.
    """
    # a rank's slices of one document never overlap: (doc, start) names a slice (hashed
    # faster than the dataclass)
    bwd_of = {(s.doc, s.start): j for j, p in enumerate(backward) for s in p.slices}
    fcalls = []
    into: list[set[int]] = [set() for _ in backward]
    for i, p in enumerate(forward):
        groups: dict[int, list[Slice]] = {}
        for s in p.slices:
            j = bwd_of[s.doc, s.start]
            groups.setdefault(j, []).append(s)
            into[j].add(i)
        if p.merge is not None and len(groups) > 1:
            return None
        fcalls.append(tuple((j, tuple(groups[j])) for j in sorted(groups, reverse=True)))
    return SplitCalls(tuple(fcalls), tuple(tuple(sorted(f, reverse=True)) for f in into))


@dataclass(frozen=True)
class RankExecution:
    """One rank's packs that do not run the plain way: packs that hold slices and, under
    lockstep rules, *padding* packs (empty on this rank, not on every rank), which the FSDP
    executor replays with one-token dummy calls (:func:`slimdata.hooks.fsdp.dummy_loss`) so
    every rank makes the same model calls."""

    graph_free: frozenset[int]
    """Forward packs run without an autograd graph (their backward packs recompute them)."""
    recomputed: frozenset[int]
    """Backward packs that re-run their own forward before their backward."""
    f_calls: tuple[int, ...]
    """Model calls of each forward pack (0 for an empty pack; a padding pack: 1 dummy call)."""
    b_calls: tuple[int, ...]
    """Backward calls of each backward pack (a recomputed pack: 1, after its 1 forward; a
    padding pack: as the pack holding slices elsewhere, with dummy calls)."""


def execution(
    plan: StepPlan, lockstep: bool = False, split: bool = False, keep: bool = True
) -> list[RankExecution]:
    """Per rank, how the executor runs the packs: free-mode rules, with ``split`` the split
    calls of :func:`split_calls` (the executor's default outside FSDP), or with ``lockstep``
    the plan-global rules of FSDP (:func:`lockstep_schedule`; assumes :func:`check_lockstep`;
    ``split`` is then ignored, as FSDP never splits): ``keep``, FSDP2's, whose union backward
    packs run through their forward packs' graphs; ``keep=False``, FSDP1's, where every
    backward pack recomputes its forward."""
    sched = lockstep_schedule(plan, keep) if lockstep else None
    out = []
    for rs in plan.ranks:
        sc = split_calls(rs.forward, rs.backward) if sched is None and split else None
        if sc is not None:
            out.append(
                RankExecution(
                    frozenset(),
                    frozenset(),
                    tuple(len(c) for c in sc.forward),
                    tuple(len(c) for c in sc.backward),
                )
            )
            continue
        if sched is not None:
            kept, unions = set(sched.kept), {j: list(f) for j, f in sched.unions.items()}
            # lockstep: a pack runs (with dummy calls where it is padding) unless idle everywhere
            runs_f = [i not in sched.idle_forward for i in range(len(rs.forward))]
            runs_b = [j not in sched.idle_backward for j in range(len(rs.backward))]
        else:
            kept, unions = kept_forward_packs(rs.forward, rs.backward)
            runs_f = [bool(p.slices) for p in rs.forward]
            runs_b = [bool(p.slices) for p in rs.backward]
        out.append(
            RankExecution(
                graph_free=frozenset(i for i, run in enumerate(runs_f) if run and i not in kept),
                recomputed=frozenset(j for j, run in enumerate(runs_b) if run and j not in unions),
                f_calls=tuple(int(run) for run in runs_f),
                b_calls=tuple(
                    (len(unions[j]) if j in unions else 1) if run else 0
                    for j, run in enumerate(runs_b)
                ),
            )
        )
    return out

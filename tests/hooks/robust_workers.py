"""Rank bodies of the robust-collectives tests: idle ranks, shares without a loss token, a merge
member with no document of its own. Every body records the collectives its rank issues."""

from __future__ import annotations

import torch
import torch.distributed as dist
from hooks_helpers import (
    MergeGroup,
    TinyLM,
    doc_tokens,
    grads_of,
    make_plan,
    max_rel_err,
    reference_grads,
    tiny_forward,
)
from slimdata.hooks import make_payload, run_step
from torch.nn.parallel import DistributedDataParallel

COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "reduce_scatter_tensor", "barrier")


class CollectiveLog:
    """Wraps the ``torch.distributed`` collectives to record ``(name, elements)`` per call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self._orig = {n: getattr(dist, n) for n in COLLECTIVES}

    def __enter__(self) -> CollectiveLog:
        for name, fn in self._orig.items():
            setattr(dist, name, self._wrap(name, fn))
        return self

    def __exit__(self, *exc) -> None:
        for name, fn in self._orig.items():
            setattr(dist, name, fn)

    def _wrap(self, name, fn):
        def call(*args, **kwargs):
            t = args[0] if args else None
            n = t.numel() if isinstance(t, torch.Tensor) else len(t) if isinstance(t, list) else 0
            self.calls.append((name, n))
            return fn(*args, **kwargs)

        return call


def plan_idle2():
    # one document for two ranks: rank 1 has nothing to run
    lengths = [24]
    return lengths, make_plan(
        lengths, [([[(0, 0, 10)], [(0, 10, 24)]], [[(0, 10, 24)], [(0, 0, 10)]]), ([], [])]
    )


def plan_no_loss2():
    # rank 1 holds only a length-1 document: no token of its share carries a label
    lengths = [20, 1]
    return lengths, make_plan(
        lengths, [([[(0, 0, 20)]], [[(0, 0, 20)]]), ([[(1, 0, 1)]], [[(1, 0, 1)]])]
    )


def plan_member_only2():
    # doc 0 merged over ranks 0 and 1; rank 1 has no document of its own
    lengths = [30, 8]
    r0 = ([[(1, 0, 8)], [(0, 0, 14)]], [[(0, 0, 14)], [(1, 0, 8)]])
    r1 = ([[(0, 14, 30)]], [[(0, 14, 30)]])
    return lengths, make_plan(
        lengths, [r0, r1], merges=[MergeGroup((0, 1), (0,))], merge_packs={0: (1, 0), 1: (0, 0)}
    )


def plan_idle4():
    # four ranks, two documents (one of length 1): ranks 2 and 3 idle, rank 1 without a label
    lengths = [18, 1]
    empty = ([], [])
    r0 = ([[(0, 0, 18)]], [[(0, 0, 18)]])
    r1 = ([[(1, 0, 1)]], [[(1, 0, 1)]])
    return lengths, make_plan(lengths, [r0, r1, empty, empty])


PLANS = {
    "idle2": plan_idle2,
    "no_loss2": plan_no_loss2,
    "member_only2": plan_member_only2,
    "idle4": plan_idle4,
}


def robust(rank: int, world: int, names: list[str]) -> list[tuple]:
    """Per plan and wrapper (bare + reduce_grads, DDP): (loss share, reference loss, max
    relative gradient error, collectives issued)."""
    out = []
    for name in names:
        lengths, plan = PLANS[name]()
        toks = doc_tokens(lengths, seed=11)
        for ddp in (False, True):
            model = TinyLM(seed=3)
            ref_loss, ref = reference_grads(model, tiny_forward, toks, plan)
            model.zero_grad(set_to_none=True)
            wrapped = DistributedDataParallel(model) if ddp else model
            with CollectiveLog() as log:
                summary = run_step(
                    wrapped, make_payload(plan, rank, toks), forward=tiny_forward, reduce_grads=True
                )
            err = max_rel_err(grads_of(model), ref)
            out.append((summary.loss, ref_loss, err, log.calls))
    return out


def merge_collective_bytes(rank: int, world: int) -> list[tuple[str, int]]:
    """(collective, bytes) of every floating-point collective this rank issues while running
    :func:`plan_member_only2` (the K/V exchange; token ids are integers)."""
    seen: list[tuple[str, int]] = []
    gather, scatter = dist.all_gather, dist.reduce_scatter_tensor

    def all_gather(parts, t, *args, **kwargs):
        if t.is_floating_point():
            seen.append(("all_gather", sum(p.numel() * p.element_size() for p in parts)))
        return gather(parts, t, *args, **kwargs)

    def reduce_scatter_tensor(out, t, *args, **kwargs):
        if t.is_floating_point():
            seen.append(("reduce_scatter", t.numel() * t.element_size()))
        return scatter(out, t, *args, **kwargs)

    dist.all_gather, dist.reduce_scatter_tensor = all_gather, reduce_scatter_tensor
    try:
        lengths, plan = plan_member_only2()
        run_step(
            TinyLM(seed=0), make_payload(plan, rank, doc_tokens(lengths)), forward=tiny_forward
        )
    finally:
        dist.all_gather, dist.reduce_scatter_tensor = gather, scatter
    return seen


def wrong_processes(rank: int, world: int) -> list[str]:
    """``run_step`` under DDP on a plan for another world size and on another rank's payload:
    the message of each ``ConfigError`` (or ``"ran"``), after one correct step."""
    from slimdata.errors import ConfigError

    lengths = [6, 4, 5, 3]
    per_rank = [([[(d, 0, n)]], [[(d, 0, n)]]) for d, n in enumerate(lengths)]
    cases = [
        (make_plan(lengths[:world], per_rank[:world]), rank),  # correct: runs
        (make_plan(lengths, per_rank), rank),  # a plan for 4 processes
        (make_plan(lengths[:world], per_rank[:world]), world - 1 - rank),  # swapped payloads
    ]
    model = DistributedDataParallel(TinyLM())
    out = []
    for plan, r in cases:
        tokens = doc_tokens(lengths[: len(plan.docs)])
        try:
            run_step(model, make_payload(plan, r, tokens), forward=tiny_forward)
            out.append("ran")
        except ConfigError as exc:
            out.append(str(exc))
    return out

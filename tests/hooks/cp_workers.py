"""Rank bodies of the static-CP runtime tests (module level so spawned ranks can import them)."""

from __future__ import annotations

import dataclasses

from hooks_helpers import (
    TinyLM,
    doc_tokens,
    grads_of,
    make_plan,
    max_rel_err,
    reference_grads,
    tiny_forward,
)
from hooks_workers import _fully_shard, lock_solver2_asym, lock_solver2_merge, plan_merge2
from slimdata.hooks import make_payload, run_step
from torch.nn.parallel import DistributedDataParallel

# DP rank 0: doc 0 (23 tokens) cut into three slices over three forward packs, doc 1 has one
# token (no loss token; at cp=2 member 1 holds none of it), docs 2 and 3 whole
RANK0_UNION = (
    [[(0, 0, 10), (1, 0, 1)], [(0, 10, 17), (2, 0, 9)], [(0, 17, 23), (3, 0, 5)]],
    [[(0, 17, 23), (3, 0, 5)], [(0, 10, 17), (2, 0, 9)], [(0, 0, 10), (1, 0, 1)]],
)
# the same slices with asymmetric backward packs (split calls / recomputed packs)
RANK0_ASYM = (
    RANK0_UNION[0],
    [[(0, 17, 23)], [(3, 0, 5), (0, 10, 17)], [(2, 0, 9), (0, 0, 10), (1, 0, 1)]],
)
# a pack holding only the one-token doc: member 1 runs it on no token (empty share)
RANK0_LONE = (
    [[(0, 0, 10)], [(1, 0, 1)], [(0, 10, 17), (2, 0, 9)], [(0, 17, 23), (3, 0, 5)]],
    [[(0, 17, 23), (3, 0, 5)], [(0, 10, 17), (2, 0, 9)], [(1, 0, 1)], [(0, 0, 10)]],
)
# DP rank 1: doc 4 (30 tokens) cut into three slices, with doc 5 inside the first pack
RANK1 = (
    [[(4, 0, 13), (5, 0, 6)], [(4, 13, 22)], [(4, 22, 30)]],
    [[(4, 22, 30)], [(4, 13, 22)], [(5, 0, 6), (4, 0, 13)]],
)
LENGTHS1 = [23, 1, 9, 5]
LENGTHS2 = [23, 1, 9, 5, 30, 6]


def _lockstep(plan):
    return dataclasses.replace(plan, mode="lockstep").validate()


PLANS = {
    "one_rank": lambda: (LENGTHS1, make_plan(LENGTHS1, [RANK0_UNION])),
    "one_rank_asym": lambda: (LENGTHS1, make_plan(LENGTHS1, [RANK0_ASYM])),
    "lone_token": lambda: (LENGTHS1, make_plan(LENGTHS1, [RANK0_LONE])),
    "two_ranks": lambda: (LENGTHS2, make_plan(LENGTHS2, [RANK0_UNION, RANK1])),
    "two_ranks_asym": lambda: (LENGTHS2, make_plan(LENGTHS2, [RANK0_ASYM, RANK1])),
    # DP-Merge over both DP ranks (4 processes at cp=2): doc 0 (40 tokens) in shares
    # [0,12) [25,33) and [12,25) [33,40), each cut into chunks again by the CP members
    "merge2": plan_merge2,
}
SOLVER_PLANS = {  # (tokens, lockstep plan) from the solver, with a merge group / asymmetric packs
    "solver2_merge": lock_solver2_merge,
    "solver2_asym": lock_solver2_asym,
}


def _case(name):
    """(tokens of the plan's documents, plan) of a named case."""
    if name in SOLVER_PLANS:
        return SOLVER_PLANS[name]()
    lengths, plan = PLANS[name]()
    return doc_tokens(lengths, seed=3), plan


def cp_equivalence(
    rank: int, world: int, cases: list[tuple[str, str]], cp: int = 2
) -> list[tuple[float, float, float]]:
    """For each (plan, wrapper): (this process's loss share, reference loss, max relative
    gradient error after the reduction). Wrappers: ``bare`` (``reduce_grads=True``), ``ddp``,
    ``meta`` (bare, cp read from ``plan.meta``), ``recompute`` (bare, asymmetric backward
    packs recomputed), ``full`` (DDP, every layer checkpointed), ``fsdp2`` (``fully_shard`` over every process, lockstep plan)."""
    out = []
    for name, wrapper in cases:
        toks, plan = _case(name)
        if wrapper == "fsdp2" and plan.mode != "lockstep":
            plan = _lockstep(plan)
        if wrapper == "meta":
            plan = dataclasses.replace(plan, meta={"cp": cp})
        model = TinyLM(seed=4)
        ref_loss, ref = reference_grads(model, tiny_forward, toks, plan)
        model.zero_grad(set_to_none=True)
        payload = make_payload(plan, rank // cp, toks)
        run = {"forward": tiny_forward, "cp": None if wrapper == "meta" else cp}
        if wrapper == "fsdp2":
            model = _fully_shard(model, world)
            summary = run_step(model, payload, **run)
            got = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        elif wrapper in ("ddp", "full"):
            policy = "full" if wrapper == "full" else None
            summary = run_step(DistributedDataParallel(model), payload, recompute=policy, **run)
            got = grads_of(model)
        else:
            asym = "recompute" if wrapper == "recompute" else "split"
            summary = run_step(model, payload, reduce_grads=True, asymmetric=asym, **run)
            got = grads_of(model)
        out.append((summary.loss, ref_loss, max_rel_err(got, ref)))
    return out


def cp_collectives(rank: int, world: int) -> list[tuple[str, int, int, int, list[int]]]:
    """Per pack of plan ``one_rank`` at cp=2: (pass, pack, K/V all-gathers, reduce-scatters,
    bytes of every K/V all-gather) this process made while it ran."""
    import torch.distributed as dist
    from slimdata.hooks import Callback

    counts = {"gather": 0, "scatter": 0}
    sizes: list[int] = []
    real = dist.all_gather, dist.reduce_scatter_tensor

    def all_gather(parts, t, *a, **k):
        if t.is_floating_point():
            counts["gather"] += 1
            sizes.append(t.numel() * t.element_size() * len(parts))
        return real[0](parts, t, *a, **k)

    def reduce_scatter_tensor(o, t, *a, **k):
        counts["scatter"] += 1
        return real[1](o, t, *a, **k)

    events: list[tuple[str, int, int, int, list[int]]] = []

    class Record(Callback):
        def on_pack_end(self, event) -> None:
            events.append((event.pass_, event.pack, *counts.values(), list(sizes)))
            counts.update(gather=0, scatter=0)
            sizes.clear()

    lengths, plan = PLANS["one_rank"]()
    dist.all_gather, dist.reduce_scatter_tensor = all_gather, reduce_scatter_tensor
    try:
        run_step(
            TinyLM(seed=4),
            make_payload(plan, 0, doc_tokens(lengths, seed=3)),
            forward=tiny_forward,
            callbacks=[Record()],
            cp=2,
        )
    finally:
        dist.all_gather, dist.reduce_scatter_tensor = real
    return events


def cp_errors(rank: int, world: int) -> list[str]:
    """Messages of the runs static CP refuses, before any collective (on 2 processes)."""
    from slimdata.errors import SlimdataError

    lengths, plan = PLANS["one_rank"]()
    toks = doc_tokens(lengths, seed=3)
    _l2, plan2 = PLANS["two_ranks"]()
    toks2 = doc_tokens(_l2, seed=3)
    runs = [
        (plan2, 0, toks2, 2),  # 2 DP ranks x cp=2 need 4 processes
        (plan, 0, toks, 3),  # cp=3 on 2 processes
        (dataclasses.replace(plan, meta={"cp": 0}), 0, toks, None),  # a broken plan.meta
    ]
    out = []
    for p, r, t, cp in runs:
        try:
            run_step(TinyLM(seed=4), make_payload(p, r, t), forward=tiny_forward, cp=cp)
            out.append("ran")
        except SlimdataError as exc:
            out.append(str(exc))
    return out


def cp_two_process_suite(rank: int, world: int) -> tuple[list, list, list]:
    """The 2-process bodies (one DP rank, cp=2) in one spawn."""
    cases = [
        ("one_rank", "bare"),
        ("one_rank", "ddp"),
        ("one_rank", "meta"),
        ("one_rank_asym", "ddp"),
        ("one_rank_asym", "recompute"),
        ("one_rank", "fsdp2"),
        ("one_rank_asym", "fsdp2"),
        ("one_rank_asym", "full"),
        ("lone_token", "ddp"),
        ("lone_token", "fsdp2"),
    ]
    return cp_equivalence(rank, world, cases), cp_collectives(rank, world), cp_errors(rank, world)


def cp_four_process_suite(rank: int, world: int) -> list:
    """Two DP ranks of cp=2 on four processes, DDP and FSDP2, DP-Merge over both DP ranks
    (the merge group is all four processes), in one spawn."""
    cases = [
        ("two_ranks", "ddp"),
        ("two_ranks_asym", "ddp"),
        ("merge2", "ddp"),
        ("merge2", "full"),
        ("two_ranks", "fsdp2"),
        ("two_ranks_asym", "fsdp2"),
        ("solver2_merge", "fsdp2"),
        ("solver2_asym", "fsdp2"),
    ]
    return cp_equivalence(rank, world, cases)

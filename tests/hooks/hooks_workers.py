"""Rank bodies of the distributed hooks tests (module level so spawned ranks can import them)."""

from __future__ import annotations

import torch
from hooks_helpers import (
    MergeGroup,
    TinyLM,
    doc_tokens,
    grads_of,
    make_plan,
    max_rel_err,
    reference_grads,
    solver_case,
    tiny_forward,
)
from slimdata.hooks import make_payload, run_step
from torch.nn.parallel import DistributedDataParallel


def plan_merge2():
    # doc 0 (40 tokens) merged over ranks 0 and 1: rank 0 holds [0,12) and [25,33), rank 1
    # holds [12,25) and [33,40); the merge pack runs between ordinary packs on both ranks.
    lengths = [40, 10, 7]
    r0 = (
        [[(1, 0, 4)], [(0, 0, 12), (0, 25, 33)], [(1, 4, 10)]],
        [[(0, 0, 12), (0, 25, 33)], [(1, 4, 10), (1, 0, 4)]],
    )
    r1 = (
        [[(2, 0, 3)], [(0, 12, 25), (0, 33, 40)], [(2, 3, 7)]],
        [[(2, 3, 7)], [(0, 12, 25), (0, 33, 40)], [(2, 0, 3)]],
    )
    return lengths, make_plan(
        lengths, [r0, r1], merges=[MergeGroup((0, 1), (0,))], merge_packs={0: (1, 0), 1: (1, 1)}
    )


def plan_merge4():
    # doc 0 (48 tokens) over all four ranks, interleaved shares, plus short docs per rank
    lengths = [48, 6, 9, 5, 8]
    spec = {
        0: ([[(1, 0, 6)], [(0, 0, 8), (0, 40, 48)]], [[(0, 0, 8), (0, 40, 48)], [(1, 0, 6)]]),
        1: ([[(0, 8, 20)], [(2, 0, 9)]], [[(2, 0, 9)], [(0, 8, 20)]]),
        2: ([[(3, 0, 5)], [(0, 20, 30)]], [[(0, 20, 30)], [(3, 0, 5)]]),
        3: ([[(4, 0, 3)], [(4, 3, 8)], [(0, 30, 40)]], [[(4, 3, 8)], [(0, 30, 40)], [(4, 0, 3)]]),
    }
    mp = {0: (1, 0), 1: (0, 1), 2: (1, 0), 3: (2, 1)}
    return lengths, make_plan(
        lengths,
        [spec[r] for r in range(4)],
        merges=[MergeGroup((0, 1, 2, 3), (0,))],
        merge_packs=mp,
    )


def plan_two_groups4():
    # two merge groups on four ranks in one step: (0, 2) runs doc 0, (1, 3) runs docs 1 and 2
    lengths = [30, 20, 16, 4]
    spec = {
        0: ([[(0, 0, 15)], [(3, 0, 4)]], [[(0, 0, 15)], [(3, 0, 4)]]),
        2: ([[(0, 15, 30)]], [[(0, 15, 30)]]),
        1: ([[(1, 0, 10), (2, 8, 16)]], [[(2, 8, 16), (1, 0, 10)]]),
        3: ([[(2, 0, 8), (1, 10, 20)]], [[(2, 0, 8), (1, 10, 20)]]),
    }
    mp = {r: (0, 0) for r in range(4)}
    merges = [MergeGroup((0, 2), (0,)), MergeGroup((1, 3), (1, 2))]
    return lengths, make_plan(lengths, [spec[r] for r in range(4)], merges=merges, merge_packs=mp)


def plan_solver2():
    plan, toks = solver_case([60, 25, 130, 700], "slimpack", 2, 0)
    assert plan.merges, "the solver was expected to merge the 700-token document"
    return toks, plan


def plan_solver4():
    plan, toks = solver_case([45, 90, 10, 600, 120], "slimpack", 4, 1)
    assert plan.merges, "the solver was expected to merge the 600-token document"
    return toks, plan


PLANS = {
    "merge2": plan_merge2,
    "merge4": plan_merge4,
    "two_groups4": plan_two_groups4,
    "solver2": plan_solver2,
    "solver4": plan_solver4,
}


def equivalence(
    rank: int, world: int, names: list[str], ddp: bool = False
) -> list[tuple[float, float, float]]:
    """For each plan: (this rank's loss share, reference loss, max relative gradient error)."""
    out = []
    for name in names:
        lengths, plan = PLANS[name]()
        toks = lengths if name.startswith("solver") else doc_tokens(lengths, seed=7)
        model = TinyLM(seed=1)
        ref_loss, ref = reference_grads(model, tiny_forward, toks, plan)
        model.zero_grad(set_to_none=True)
        wrapped = DistributedDataParallel(model) if ddp else model
        summary = run_step(
            wrapped, make_payload(plan, rank, toks), forward=tiny_forward, reduce_grads=True
        )
        out.append((summary.loss, ref_loss, max_rel_err(grads_of(model), ref)))
    return out


def ddp_no_merge(rank: int, world: int) -> tuple[float, float, float]:
    lengths = [20, 9, 14, 5]
    r0 = ([[(0, 0, 8), (3, 0, 5)], [(0, 8, 20)]], [[(0, 8, 20)], [(3, 0, 5), (0, 0, 8)]])
    r1 = ([[(1, 0, 9), (2, 0, 6)], [(2, 6, 14)]], [[(2, 6, 14), (1, 0, 9)], [(2, 0, 6)]])
    plan = make_plan(lengths, [r0, r1])
    toks = doc_tokens(lengths, seed=5)
    model = TinyLM(seed=2)
    ref_loss, ref = reference_grads(model, tiny_forward, toks, plan)
    model.zero_grad(set_to_none=True)
    ddp = DistributedDataParallel(model)
    summary = run_step(ddp, make_payload(plan, rank, toks), forward=tiny_forward)
    return summary.loss, ref_loss, max_rel_err(grads_of(model), ref)


def check_torch_threads(rank: int, world: int) -> int:
    return torch.get_num_threads()


def two_rank_suite(rank: int, world: int) -> tuple[list, tuple]:
    """Both 2-rank bodies in one spawn (saves a process start on busy CI machines)."""
    return equivalence(rank, world, ["merge2", "solver2"], True), ddp_no_merge(rank, world)

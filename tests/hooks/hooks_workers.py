"""Rank bodies of the distributed hooks tests (module level so spawned ranks can import them)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from hooks_helpers import (
    MergeGroup,
    TinyLM,
    doc_tokens,
    grads_of,
    lockstep_hand_plan,
    make_plan,
    max_rel_err,
    reference_grads,
    solver_case,
    tiny_forward,
    tiny_llama,
)
from slimdata.hooks import hf, hf_forward, make_payload, run_step
from slimdata.hooks.fsdp import lockstep_schedule
from torch.nn.parallel import DistributedDataParallel


def plan_merge2(loss_tokens: list[int] | None = None):
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
        lengths,
        [r0, r1],
        merges=[MergeGroup((0, 1), (0,))],
        merge_packs={0: (1, 0), 1: (1, 1)},
        loss_tokens=loss_tokens,
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
    # 512-token packs: a 2-rank merge of the 700-token document has ~350-token shares, which
    # a 256-token cap (pack_tokens is a hard cap for merge shares too) would not allow; its
    # 2.8 MiB of activations and K/V do not fit a 2.5 MiB device, so it must be merged
    plan, toks = solver_case([60, 25, 130, 700], "slimpack", 2, 0, context=512, memory_gib=0.0025)
    assert plan.merges, "the solver was expected to merge the 700-token document"
    return toks, plan


def plan_solver2_coarse():
    # three 600-token documents on two ranks, planned with llama-1b's costs: whole, one rank
    # runs two; one is merged over both ranks instead (too coarse to balance whole)
    plan, toks = solver_case(
        [600, 600, 600], "slimpack", 2, 0, context=1024, memory_gib=40, model="llama-1b"
    )
    assert [m.ranks for m in plan.merges] == [(0, 1)] and "coarse_merge" in plan.meta, plan.meta
    return toks, plan


def plan_solver4_coarse():
    # six 600-token documents on four ranks (llama-1b's costs): whole, two ranks run two;
    # each of those ranks' second document is merged over two ranks instead
    plan, toks = solver_case(
        [600] * 6, "slimpack", 4, 0, context=1024, memory_gib=40, model="llama-1b"
    )
    assert [m.ranks for m in plan.merges] == [(0, 1), (2, 3)], plan.merges
    assert len(plan.meta["coarse_merge"]) == 2, plan.meta
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
    "solver2_coarse": plan_solver2_coarse,
    "solver4": plan_solver4,
    "solver4_coarse": plan_solver4_coarse,
}


def equivalence(
    rank: int, world: int, names: list[str], ddp: bool = False, recompute: str | None = None
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
            wrapped,
            make_payload(plan, rank, toks),
            forward=tiny_forward,
            reduce_grads=True,
            recompute=recompute,
        )
        out.append((summary.loss, ref_loss, max_rel_err(grads_of(model), ref)))
    return out


def masked_merge(rank: int, world: int) -> tuple[float, float, float]:
    """plan_merge2 with a loss mask on every document (the merged one's masked tokens on both
    members' shares): this rank's loss share, the masked reference loss and the largest
    relative gradient error."""
    lengths, _plan = plan_merge2()
    toks = doc_tokens(lengths, seed=7)
    rng = np.random.default_rng(11)
    masks = [rng.integers(0, 2, size=n).astype(np.int64) for n in lengths]
    masks[0][11:14] = 0  # around the members' share boundary (rank 0 [0, 12), rank 1 [12, 25))
    counted = [int(m[:-1].sum()) for m in masks]  # a masked position has no label
    _lengths, plan = plan_merge2(loss_tokens=counted)
    model = TinyLM(seed=1)
    total = 0.0
    for ids_np, m in zip(toks, masks, strict=True):
        ids = torch.as_tensor(ids_np.astype("int64"))
        logits = tiny_forward(model, ids, torch.arange(len(ids)))
        keep = torch.as_tensor(m[:-1]).bool()
        loss = torch.nn.functional.cross_entropy(logits[:-1][keep], ids[1:][keep], reduction="sum")
        (loss / plan.loss_tokens).backward()
        total += float(loss.detach()) / plan.loss_tokens
    ref = grads_of(model)
    model.zero_grad(set_to_none=True)
    summary = run_step(
        model, make_payload(plan, rank, toks, masks), forward=tiny_forward, reduce_grads=True
    )
    return summary.loss, total, max_rel_err(grads_of(model), ref)


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


def merge_exchanges(
    rank: int, world: int, recompute: str | None = None
) -> list[tuple[str, int, int, int, int]]:
    """Per executed pack of plan ``merge2``: (pass, pack, K/V all-gathers, reduce-scatters,
    all-reduces) this rank made while the pack ran (token all-gathers, which are integer, not
    counted)."""
    import torch.distributed as dist
    from slimdata.hooks import Callback

    counts = {"gather": 0, "scatter": 0, "reduce": 0}
    real = dist.all_gather, dist.reduce_scatter_tensor, dist.all_reduce

    def all_gather(parts, t, *a, **k):
        counts["gather"] += t.is_floating_point()
        return real[0](parts, t, *a, **k)

    def reduce_scatter_tensor(out, t, *a, **k):
        counts["scatter"] += 1
        return real[1](out, t, *a, **k)

    def all_reduce(t, *a, **k):
        counts["reduce"] += 1
        return real[2](t, *a, **k)

    events: list[tuple[str, int, int, int, int]] = []

    class Record(Callback):
        def on_pack_end(self, event) -> None:
            events.append((event.pass_, event.pack, *counts.values()))
            counts.update(gather=0, scatter=0, reduce=0)

    lengths, plan = PLANS["merge2"]()
    dist.all_gather, dist.reduce_scatter_tensor, dist.all_reduce = (
        all_gather,
        reduce_scatter_tensor,
        all_reduce,
    )
    try:
        run_step(
            TinyLM(seed=1),
            make_payload(plan, rank, doc_tokens(lengths, seed=7)),
            forward=tiny_forward,
            callbacks=[Record()],
            recompute=recompute,
        )
    finally:
        dist.all_gather, dist.reduce_scatter_tensor, dist.all_reduce = real
    return events


def two_rank_suite(rank: int, world: int) -> tuple[list, tuple, list]:
    """The 2-rank bodies in one spawn (saves a process start on busy CI machines)."""
    return (
        equivalence(rank, world, ["merge2", "solver2", "solver2_coarse"], True),
        ddp_no_merge(rank, world),
        merge_exchanges(rank, world),
    )


def recompute_suite(rank: int, world: int, policy: str = "full") -> tuple[list, list, list]:
    """2-rank bodies with ``recompute=policy``: DP-Merge plans (bare and DDP), and the merge
    exchanges with ``policy`` and with ``none``."""
    return (
        equivalence(rank, world, ["merge2", "solver2"], False, policy)
        + equivalence(rank, world, ["merge2"], True, policy),
        merge_exchanges(rank, world, policy),
        merge_exchanges(rank, world, "none"),
    )


def recompute_suite4(rank: int, world: int) -> list:
    """4-rank DP-Merge plans (one group of 4, two groups of 2, a solver plan) under
    ``recompute="full"`` and ``"selective"``, bare and (merge4) under DDP."""
    return [
        equivalence(rank, world, ["merge4", "two_groups4", "solver4"], False, policy)
        + equivalence(rank, world, ["merge4"], True, policy)
        for policy in ("full", "selective")
    ]


def selective_suite(rank: int, world: int) -> tuple[list, list, list]:
    """:func:`recompute_suite` under ``recompute="selective"``."""
    return recompute_suite(rank, world, "selective")


# --- FSDP2 (fully_shard) on lockstep plans --------------------------------------------------


def lock_hand2():
    lengths, plan = lockstep_hand_plan()
    return doc_tokens(lengths, seed=3), plan


def lock_solver2_merge():
    # [30, 400] on 2 ranks: the 400-token doc is merged over both ranks, pack 1 is padding on rank 0
    plan, toks = solver_case([30, 400], "slimpack", 2, 0, mode="lockstep", memory_gib=4)
    assert plan.merges and any(not p.slices for p in plan.ranks[0].forward), plan
    return toks, plan


def lock_solver2_asym():
    # rank 0's backward packs are not unions of its forward packs: recomputed on both ranks
    plan, toks = solver_case([60, 25, 130, 300, 40, 70], "slimpack", 2, 3, mode="lockstep")
    return toks, plan


def lock_solver2_whole():
    # token-bound packs of <= 256 tokens: each rank's documents kept whole (backward packs
    # equal to forward packs), a 255-token document in two slices
    plan, toks = solver_case([255] * 6 + [5] * 8, "slimpack", 2, 0, mode="lockstep")
    assert plan.meta["whole_documents"], plan.meta
    return toks, plan


def lock_solver4_merge():
    # a 3-rank merge group over the 601-token doc, padding packs on two of its members
    plan, toks = solver_case([45, 94, 79, 601], "slimpack", 4, 1, mode="lockstep")
    assert plan.merges and plan.mode == "lockstep", plan
    return toks, plan


def lock_merge_recompute4():
    # doc 0 merged over ranks 0-1 (their packs are unions), but rank 2's packs are asymmetric, so
    # every backward pack -- the merge pack included -- is recomputed on every rank; rank 3
    # pads pack 0 (dummy calls)
    lengths = [24, 6, 8, 5, 7, 9]
    order = [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    spec = [
        ([[(0, 0, 12)], [(1, 0, 6)]], [[(0, 0, 12)], [(1, 0, 6)]], order),
        ([[(0, 12, 24)], [(3, 0, 5)]], [[(0, 12, 24)], [(3, 0, 5)]], order),
        ([[(2, 0, 4), (4, 0, 7)], [(2, 4, 8)]], [[(2, 4, 8), (4, 0, 7)], [(2, 0, 4)]], order),
        ([[], [(5, 0, 9)]], [[], [(5, 0, 9)]], order),
    ]
    plan = make_plan(
        lengths, spec, merges=[MergeGroup((0, 1), (0,))], merge_packs={0: (0, 0), 1: (0, 0)}
    )
    plan = dataclasses.replace(plan, mode="lockstep").validate()
    assert not lockstep_schedule(plan).unions
    return doc_tokens(lengths, seed=4), plan


FSDP_PLANS = {
    "merge_recompute4": lock_merge_recompute4,
    "hand2": lock_hand2,
    "solver2_merge": lock_solver2_merge,
    "solver2_asym": lock_solver2_asym,
    "solver2_whole": lock_solver2_whole,
    "solver4_merge": lock_solver4_merge,
}


def _fully_shard(model: TinyLM, world: int) -> TinyLM:
    """Shard the k/v/up projections of every block as their own FSDP units, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for b in model.blocks:
        for key in ("k", "v", "up"):
            fully_shard(b[key], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _fsdp1(model: TinyLM) -> torch.nn.Module:
    """FSDP1: the k/v/up projections of every block as nested wrappers, then the root."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    cpu = torch.device("cpu")
    for b in model.blocks:
        for key in ("k", "v", "up"):
            b[key] = FSDP(b[key], device_id=cpu, use_orig_params=True)
    return FSDP(model, device_id=cpu, use_orig_params=True)


def _fsdp1_grads(wrapped) -> dict[str, torch.Tensor]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.summon_full_params(wrapped, with_grads=True):
        return {
            n.replace("_fsdp_wrapped_module.", ""): p.grad.clone()
            for n, p in wrapped.named_parameters()
        }


def fsdp_equivalence(
    rank: int, world: int, cases: list[tuple[str, str]]
) -> list[tuple[float, float, float]]:
    """For each (plan, mode): (this rank's loss share, reference loss, max relative gradient
    error). Modes: ``each``/``last`` (FSDP2, ``fsdp_grad_sync``), ``fsdp1`` or ``bare`` (plain
    module, ``reduce_grads=True``)."""
    out = []
    for name, mode in cases:
        toks, plan = FSDP_PLANS[name]()
        model = TinyLM(seed=1)
        ref_loss, ref = reference_grads(model, tiny_forward, toks, plan)
        model.zero_grad(set_to_none=True)
        payload = make_payload(plan, rank, toks)
        if mode == "bare":
            summary = run_step(model, payload, forward=tiny_forward, reduce_grads=True)
            got = grads_of(model)
        elif mode == "fsdp1":
            wrapped = _fsdp1(model)
            summary = run_step(wrapped, payload, forward=tiny_forward)
            got = _fsdp1_grads(wrapped)
        else:
            model = _fully_shard(model, world)
            summary = run_step(model, payload, forward=tiny_forward, fsdp_grad_sync=mode)
            got = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        out.append((summary.loss, ref_loss, max_rel_err(got, ref)))
    return out


def fsdp_hf(rank: int, world: int, kind: str) -> tuple[float, float, float]:
    """A stock tiny ``LlamaForCausalLM`` (attn "slimdata") sharded per decoder layer and at the
    root (``kind``: ``fsdp2`` = ``fully_shard``, ``fsdp1`` = ``FullyShardedDataParallel`` with
    ``ModuleWrapPolicy``), on the hand lockstep plan, against the eager model run unpacked."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    toks, plan = lock_hand2()
    model, ref_model = tiny_llama(hf.register()), tiny_llama("eager")
    ref_model.load_state_dict(model.state_dict())
    ref_loss, ref = reference_grads(ref_model, hf_forward, toks, plan)
    if kind == "fsdp1":
        wrapped = FullyShardedDataParallel(
            model,
            auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}),
            device_id=torch.device("cpu"),
            use_orig_params=True,
        )
        summary = run_step(wrapped, make_payload(plan, rank, toks))
        return summary.loss, ref_loss, max_rel_err(_fsdp1_grads(wrapped), ref)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    summary = run_step(model, make_payload(plan, rank, toks))
    got = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    return summary.loss, ref_loss, max_rel_err(got, ref)


def fsdp_two_rank_suite(rank: int, world: int) -> tuple[list, tuple]:
    """The 2-rank FSDP bodies in one spawn."""
    cases = [
        ("hand2", "each"),
        ("hand2", "last"),
        ("hand2", "bare"),
        ("solver2_merge", "each"),
        ("solver2_asym", "each"),
        ("solver2_whole", "each"),
        ("hand2", "fsdp1"),
        ("solver2_merge", "fsdp1"),
    ]
    return fsdp_equivalence(rank, world, cases), [fsdp_hf(rank, world, "fsdp2")]


def four_rank_suite(rank: int, world: int) -> tuple[list, list]:
    """DP-Merge plans (plain modules) and FSDP2 on a lockstep solver plan, one spawn."""
    plain = equivalence(rank, world, ["merge4", "two_groups4", "solver4", "solver4_coarse"])
    cases = [("solver4_merge", "each"), ("solver4_merge", "last"), ("merge_recompute4", "each")]
    fsdp = fsdp_equivalence(rank, world, cases)
    return plain, fsdp

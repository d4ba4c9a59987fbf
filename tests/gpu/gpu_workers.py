"""Rank bodies of the GPU two-process checks, DP-Merge and static CP (module level so spawned
ranks can import them), and their case table."""

from __future__ import annotations

import numpy as np
from slimdata.hooks import make_payload, run_step
from slimdata.hooks.profile import tiny_llama
from slimdata.hooks.verify import grad_error, run_plan, whole_document_plan

from slimdata.cost import CostModel, ModelConfig
from slimdata.docsource import documents_from_lengths
from slimdata.solver import Layout, SolveOptions, solve

SHAPE = ModelConfig(name="t", layers=3, hidden=512, heads=8, kv_heads=2, ffn=1376, vocab=1024)


def _solved(layout: Layout, lengths, slice_tokens: int, options: SolveOptions | None = None):
    """slimpack's plan of ``lengths`` for ``layout`` and random tokens of its documents."""
    docs = documents_from_lengths(lengths, slice_tokens=slice_tokens)
    cost = CostModel.analytic(SHAPE, "h100", "none")
    plan = solve(docs, layout, "slimpack", seed=0, cost=cost, options=options or SolveOptions())
    rng = np.random.default_rng(0)
    return plan, [rng.integers(0, SHAPE.vocab, d.length).astype(np.uint32) for d in plan.docs]


def _against_reference(plan, toks, device: str, dtype: str, rank: int, **run):
    """Run ``rank``'s payload of ``plan`` with gradients reduced over the processes:
    (this process's loss share, reference loss, packed grad error, repacking noise)."""
    net = tiny_llama(SHAPE, device, dtype)
    ref_loss, ref = run_plan(net, whole_document_plan(plan.docs), toks)
    _, noise = run_plan(net, whole_document_plan(plan.docs, per_pack=3, reverse=True), toks)
    net.zero_grad(set_to_none=True)
    summary = run_step(net, make_payload(plan, rank, toks), reduce_grads=True, **run)
    got = {n: p.grad.detach().float() for n, p in net.named_parameters()}
    return summary.loss, ref_loss, grad_error(got, ref), grad_error(noise, ref)


def merged_case(lengths, memory_gib):
    """A 2-rank slimpack plan whose longest document does not fit one rank: DP-Merge."""
    layout = Layout(dp=2, context=1 << 16, pack_tokens=4096, memory_gib=memory_gib)
    return _solved(layout, lengths, 256)


def merge_equivalence(rank: int, world: int, device: str, dtype: str, lengths, memory_gib):
    """(this process's loss share, reference loss, packed grad error, repacking noise, merge
    groups)."""
    plan, toks = merged_case(lengths, memory_gib)
    return (*_against_reference(plan, toks, device, dtype, rank), len(plan.merges))


def cp_case(lengths, cp: int):
    """A slimpack plan of one DP rank run by a static CP group of ``cp`` processes: every slice
    cut into load-balanced chunks, keys/values exchanged per layer (no DP-Merge)."""
    layout = Layout(dp=1, cp=cp, context=1 << 16, pack_tokens=2048, memory_gib=1e3)
    return _solved(layout, lengths, 512, SolveOptions().forced_merges_only())


def cp_equivalence(rank: int, world: int, device: str, dtype: str, lengths):
    """Static CP over all ``world`` processes: (this process's loss share, reference loss,
    packed grad error after the reduction, repacking noise, slices cut from a document)."""
    plan, toks = cp_case(lengths, cp=world)
    sliced = sum(s.start > 0 for r in plan.ranks for p in r.forward for s in p.slices)
    return (*_against_reference(plan, toks, device, dtype, 0, cp=world), sliced)


LENGTHS = [6000, 700, 1300, 300, 129]

TWO_PROCESSES = {
    # both DP ranks on the one GPU, the 6000-token document merged over them (0.25 GiB each):
    # gloo carries the K/V all-gather and the gradient all-reduce
    "dp_merge": (merge_equivalence, (LENGTHS, 0.25)),
    # one DP rank run by a CP group of two processes: every slice cut into load-balanced
    # chunks, keys/values all-gathered per layer and reduce-scattered back
    "static_cp": (cp_equivalence, (LENGTHS,)),
}
"""The two-process cases of ``tests/gpu`` and of the GPU report: rank body and arguments after
``(device, dtype)``; each returns (loss share, reference loss, grad error, noise, count of the
feature: merge groups or slices cut)."""

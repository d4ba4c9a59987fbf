"""Rank bodies of the GPU DP-Merge check (module level so spawned ranks can import them)."""

from __future__ import annotations

import numpy as np
from slimdata.hooks import make_payload, run_step
from slimdata.hooks.profile import tiny_llama
from slimdata.hooks.verify import grad_error, run_plan, whole_document_plan

from slimdata.cost import CostModel, ModelConfig
from slimdata.docsource import documents_from_lengths
from slimdata.solver import Layout, SolveOptions, solve

SHAPE = ModelConfig(name="t", layers=3, hidden=512, heads=8, kv_heads=2, ffn=1376, vocab=1024)


def merged_case(lengths, memory_gib):
    """A 2-rank slimpack plan whose longest document does not fit one rank: DP-Merge."""
    docs = documents_from_lengths(lengths, slice_tokens=256)
    layout = Layout(dp=2, context=1 << 16, pack_tokens=4096, memory_gib=memory_gib)
    plan = solve(docs, layout, "slimpack", seed=0, cost=CostModel.analytic(SHAPE, "h100", "none"))
    rng = np.random.default_rng(0)
    return plan, [rng.integers(0, SHAPE.vocab, d.length).astype(np.uint32) for d in plan.docs]


def merge_equivalence(rank: int, world: int, device: str, dtype: str, lengths, memory_gib):
    """(this process's loss share, reference loss, packed grad error, repacking noise, merge
    groups)."""
    plan, toks = merged_case(lengths, memory_gib)
    net = tiny_llama(SHAPE, device, dtype)
    ref_loss, ref = run_plan(net, whole_document_plan(plan.docs), toks)
    _, noise = run_plan(net, whole_document_plan(plan.docs, per_pack=3, reverse=True), toks)
    net.zero_grad(set_to_none=True)
    summary = run_step(net, make_payload(plan, rank, toks), reduce_grads=True)
    got = {n: p.grad.detach().float() for n, p in net.named_parameters()}
    return summary.loss, ref_loss, grad_error(got, ref), grad_error(noise, ref), len(plan.merges)


def cp_case(lengths, cp: int):
    """A slimpack plan of one DP rank run by a static CP group of ``cp`` processes: every slice
    cut into load-balanced chunks, keys/values exchanged per layer (no DP-Merge)."""
    docs = documents_from_lengths(lengths, slice_tokens=512)
    layout = Layout(dp=1, cp=cp, context=1 << 16, pack_tokens=2048, memory_gib=1e3)
    cost = CostModel.analytic(SHAPE, "h100", "none")
    no_merges = SolveOptions(merge_share=1e9, skew_merge=False)
    plan = solve(docs, layout, "slimpack", seed=0, cost=cost, options=no_merges)
    rng = np.random.default_rng(0)
    return plan, [rng.integers(0, SHAPE.vocab, d.length).astype(np.uint32) for d in plan.docs]


def cp_equivalence(rank: int, world: int, device: str, dtype: str, lengths):
    """Static CP over all ``world`` processes: (this process's loss share, reference loss,
    packed grad error after the reduction, repacking noise, slices cut from a document)."""
    plan, toks = cp_case(lengths, cp=world)
    net = tiny_llama(SHAPE, device, dtype)
    ref_loss, ref = run_plan(net, whole_document_plan(plan.docs), toks)
    _, noise = run_plan(net, whole_document_plan(plan.docs, per_pack=3, reverse=True), toks)
    net.zero_grad(set_to_none=True)
    summary = run_step(net, make_payload(plan, 0, toks), reduce_grads=True, cp=world)
    got = {n: p.grad.detach().float() for n, p in net.named_parameters()}
    sliced = sum(s.start > 0 for r in plan.ranks for p in r.forward for s in p.slices)
    return summary.loss, ref_loss, grad_error(got, ref), grad_error(noise, ref), sliced

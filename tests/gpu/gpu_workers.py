"""Rank bodies of the GPU DP-Merge check (module level so spawned ranks can import them)."""

from __future__ import annotations

import numpy as np
import torch
from slimdata.hooks import hf, make_payload, run_step
from slimdata.hooks.verify import grad_error, run_plan, whole_document_plan

from slimdata.cost import CostModel, ModelConfig
from slimdata.docsource import documents_from_lengths
from slimdata.solver import Layout, solve

SHAPE = ModelConfig(name="t", layers=3, hidden=512, heads=8, kv_heads=2, ffn=1376, vocab=1024)


def merged_case(lengths, memory_gib):
    """A 2-rank slimpack plan whose longest document does not fit one rank: DP-Merge."""
    docs = documents_from_lengths(lengths, slice_tokens=256)
    layout = Layout(dp=2, context=1 << 16, pack_tokens=2048, memory_gib=memory_gib)
    plan = solve(docs, layout, "slimpack", seed=0, cost=CostModel.analytic(SHAPE, "h100", "none"))
    rng = np.random.default_rng(0)
    return plan, [rng.integers(0, SHAPE.vocab, d.length).astype(np.uint32) for d in plan.docs]


def model(device: str, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=SHAPE.vocab,
        hidden_size=SHAPE.hidden,
        intermediate_size=SHAPE.ffn,
        num_hidden_layers=SHAPE.layers,
        num_attention_heads=SHAPE.heads,
        num_key_value_heads=SHAPE.kv_heads,
        max_position_embeddings=1 << 16,
        attn_implementation=hf.register(),
    )
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype)


def merge_equivalence(rank: int, world: int, device: str, dtype: str, lengths, memory_gib):
    """(merge groups, loss share, reference loss, packed grad error, repacking noise)."""
    dt = getattr(torch, dtype)
    plan, toks = merged_case(lengths, memory_gib)
    net = model(device, dt)
    ref_loss, ref = run_plan(net, whole_document_plan(plan.docs), toks)
    _, noise = run_plan(net, whole_document_plan(plan.docs, per_pack=3, reverse=True), toks)
    net.zero_grad(set_to_none=True)
    summary = run_step(net, make_payload(plan, rank, toks), reduce_grads=True)
    got = {n: p.grad.detach().float() for n, p in net.named_parameters()}
    return len(plan.merges), summary.loss, ref_loss, grad_error(got, ref), grad_error(noise, ref)

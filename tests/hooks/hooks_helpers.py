"""Shared helpers of the hooks tests: a tiny custom model, hand-made plans, the unpacked reference."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import torch
from slimdata.hooks import recompute_layer, slice_attention, swiglu_down
from torch import nn

from slimdata.plan import Document, MergeGroup, MicroPack, RankStep, Slice, StepPlan

VOCAB = 61


class TinyLM(nn.Module):
    """Llama-shaped: RMSNorm, GQA with RoPE, SwiGLU; attention through ``slice_attention``."""

    def __init__(self, layers=2, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=VOCAB, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.heads, self.kv_heads, self.hd = heads, kv_heads, hidden // heads
        self.emb = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            b = nn.ModuleDict(
                {
                    "n1": nn.RMSNorm(hidden),
                    "q": nn.Linear(hidden, heads * self.hd, bias=False),
                    "k": nn.Linear(hidden, kv_heads * self.hd, bias=False),
                    "v": nn.Linear(hidden, kv_heads * self.hd, bias=False),
                    "o": nn.Linear(heads * self.hd, hidden, bias=False),
                    "n2": nn.RMSNorm(hidden),
                    "up": nn.Linear(hidden, 2 * ffn, bias=False),
                    "down": nn.Linear(ffn, hidden, bias=False),
                }
            )
            self.blocks.append(b)
        self.norm = nn.RMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() > 1:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.2)

    def rope(self, x, pos):
        half = self.hd // 2
        inv = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
        ang = pos[:, None].float() * inv[None, :]
        cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def block(self, i, x, pos):
        """Decoder layer ``i``: ``x (T, hidden)`` -> ``(T, hidden)``."""
        b, T = self.blocks[i], x.shape[0]
        h = b["n1"](x)
        q = self.rope(b["q"](h).view(T, self.heads, self.hd), pos)
        k = self.rope(b["k"](h).view(T, self.kv_heads, self.hd), pos)
        v = b["v"](h).view(T, self.kv_heads, self.hd)
        x = x + b["o"](slice_attention(q, k, v, layer=i).reshape(T, -1))
        a, c = b["up"](b["n2"](x)).chunk(2, dim=-1)
        return x + swiglu_down(a, c, b["down"])  # recomputed under recompute="selective"

    def forward(self, ids, pos):
        x = self.emb(ids)
        for i in range(len(self.blocks)):
            x = recompute_layer(self.block, i, x, pos)  # checkpointed under recompute="full"
        return self.head(self.norm(x))


def tiny_llama(attn: str):
    """A random-init 2-layer Llama (``transformers``) with attention implementation ``attn``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        attn_implementation=attn,
    )
    return LlamaForCausalLM(cfg)


def tiny_forward(module, ids, pos):
    return module(ids, pos)


def doc_tokens(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, size=n).astype(np.uint32) for n in lengths]


def packs(spec):
    return tuple(MicroPack(tuple(Slice(*s) for s in p)) for p in spec)


def make_plan(lengths, ranks, merges=(), step=0, merge_packs=None, loss_tokens=None):
    """``ranks``: list of (forward spec, backward spec[, order]); a spec is a list of packs, a
    pack a list of (doc, start, end). ``merge_packs``: {rank: (fwd index, bwd index)}."""
    docs = tuple(
        Document(doc_id=f"d{i}", length=n, loss_tokens=(loss_tokens[i] if loss_tokens else -1))
        for i, n in enumerate(lengths)
    )
    rss = []
    for r, spec in enumerate(ranks):
        fwd, bwd = list(packs(spec[0])), list(packs(spec[1]))
        if merge_packs and r in merge_packs:
            fi, bi = merge_packs[r]
            g = next(gi for gi, m in enumerate(merges) if r in m.ranks)
            fwd[fi] = MicroPack(fwd[fi].slices, merge=g)
            bwd[bi] = MicroPack(bwd[bi].slices, merge=g)
        order = tuple(spec[2]) if len(spec) > 2 else ()
        rss.append(RankStep(rank=r, forward=tuple(fwd), backward=tuple(bwd), order=order))
    return StepPlan(
        step=step, strategy="hand", docs=docs, ranks=tuple(rss), merges=tuple(merges)
    ).validate()


def random_rank_plan(rng: random.Random, lengths, max_cuts=3, nf=None, nb=None):
    """A random valid one-rank plan spec over documents ``lengths``."""
    slices = []
    for d, n in enumerate(lengths):
        k = rng.randint(0, min(max_cuts, n - 1))
        cuts = sorted(rng.sample(range(1, n), k)) if k else []
        b = [0, *cuts, n]
        slices.append([(d, b[i], b[i + 1]) for i in range(len(b) - 1)])
    nf = nf or rng.randint(1, 4)
    nb = nb or rng.randint(1, 4)
    F = [[] for _ in range(nf)]
    B = [[] for _ in range(nb)]
    for sl in slices:
        fi = sorted(rng.randrange(nf) for _ in sl)
        bi = sorted((rng.randrange(nb) for _ in sl), reverse=True)
        for s, a, b in zip(sl, fi, bi, strict=True):
            F[a].append(s)
            B[b].append(s)
    for p in F + B:
        rng.shuffle(p)
    return [p for p in F if p], [p for p in B if p]


def solver_case(
    lengths, strategy, dp, seed, context=256, mode="free", memory_gib=1, cp=1, model=None
):
    """A validated solver plan for a tiny model and the token arrays of its documents
    (pieces of split documents cut at ``Document.offset``); ``cp``: planned for static CP;
    ``model``: plan with that model preset's costs instead (the plan runs on the tiny model
    all the same)."""
    from slimdata.cost import CostModel, ModelConfig
    from slimdata.docsource import documents_from_lengths
    from slimdata.solver import Layout, solve

    tiny = ModelConfig(
        name="tiny", layers=2, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=VOCAB, dtype_bytes=4
    )
    docs = documents_from_lengths(lengths, slice_tokens=128)
    layout = Layout(
        dp=dp, cp=cp, context=context, pack_tokens=context, memory_gib=memory_gib, mode=mode
    )
    plan = solve(
        docs, layout, strategy, seed=seed, cost=CostModel.analytic(model or tiny, "h100", "none")
    ).validate()
    rng = np.random.default_rng(seed)
    src = {d.doc_id: rng.integers(0, VOCAB, size=d.length).astype(np.uint32) for d in docs}
    return plan, [src[d.doc_id][d.offset : d.offset + d.length] for d in plan.docs]


def lockstep_hand_plan():
    """2-rank lockstep plan, order ``F0 F1 F2 B0 F3 B1 B2 B3 F4 B4``: rank 0 slices doc 0 over
    three packs (all unions); rank 1 has asymmetric backward packs 0-1 (so B0, B1 are recomputed
    on both ranks) and a union B2 (kept on both); pack 3 is empty on rank 1 (dummy calls) and
    pack 4 on both (no call)."""
    lengths = [30, 9, 12, 7, 5, 6]
    order = [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)]
    order += [("F", 4), ("B", 4)]
    r0 = (
        [[(0, 0, 10)], [(0, 10, 22)], [(0, 22, 30), (4, 0, 5)], [(5, 0, 6)], []],
        [[(4, 0, 5), (0, 22, 30)], [(0, 10, 22)], [(0, 0, 10)], [(5, 0, 6)], []],
        order,
    )
    r1 = (
        [[(1, 0, 4), (2, 0, 5)], [(1, 4, 9), (2, 5, 12)], [(3, 0, 7)], [], []],
        [[(3, 0, 7), (2, 5, 12)], [(1, 4, 9)], [(2, 0, 5), (1, 0, 4)], [], []],
        order,
    )
    plan = make_plan(lengths, [r0, r1])
    return lengths, dataclasses.replace(plan, mode="lockstep").validate()


def reference_grads(model, forward, tokens, plan):
    """Loss and gradients of the unpacked batch: every document (or independent piece of a
    cut one) whole, one sequence each, its loss summed over the ``len - 1`` next-token labels
    it has and divided by the number of those labels in the batch (counted here from the
    sequences, not taken from ``plan.loss_tokens``)."""
    model.zero_grad(set_to_none=True)
    seqs = [torch.as_tensor(np.asarray(tokens[d], dtype=np.int64)) for d in range(len(plan.docs))]
    labels = sum(max(len(ids) - 1, 0) for ids in seqs)
    total = 0.0
    for ids in seqs:
        if len(ids) < 2:
            continue  # no label
        logits = forward(model, ids, torch.arange(len(ids)))
        loss = nn.functional.cross_entropy(logits[:-1].float(), ids[1:], reduction="sum") / labels
        loss.backward()
        total += float(loss.detach())
    return total, {n: p.grad.clone() for n, p in model.named_parameters()}


def grads_of(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def max_rel_err(got, ref):
    """max over parameters of ||got - ref||_inf / ||ref||_inf."""
    assert set(got) == set(ref)
    errs = []
    for n in ref:
        denom = ref[n].abs().max().item()
        assert denom > 0, f"reference gradient of {n} is zero: vacuous comparison"
        errs.append((got[n] - ref[n]).abs().max().item() / denom)
    return max(errs)


__all__ = [
    "MergeGroup",
    "TinyLM",
    "doc_tokens",
    "grads_of",
    "lockstep_hand_plan",
    "make_plan",
    "max_rel_err",
    "random_rank_plan",
    "reference_grads",
    "solver_case",
    "tiny_forward",
    "tiny_llama",
]


def held_after_forward_packs(model, plan: StepPlan, lengths, **run) -> list[int]:
    """Bytes :class:`SavedTensorMeter` counts after each forward pack of ``plan`` (rank 0) run
    by ``run_step(model, ..., **run)``; asserts the backward released every one of them."""
    from slimdata.hooks import Callback, make_payload, run_step
    from slimdata.hooks.memory import SavedTensorMeter

    meter = SavedTensorMeter(model.parameters())
    seen: list[int] = []

    class AfterForward(Callback):
        def on_pack_end(self, event) -> None:
            if event.pass_ == "F":
                seen.append(meter.live)

    with meter.watch():
        run_step(
            model, make_payload(plan, 0, doc_tokens(lengths, 0)), callbacks=[AfterForward()], **run
        )
    assert meter.live == 0  # everything released by the backward
    return seen

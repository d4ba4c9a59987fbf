"""Shared helpers of the hooks tests: a tiny custom model, hand-made plans, the unpacked reference."""

from __future__ import annotations

import random

import numpy as np
import torch
from slimdata.hooks import slice_attention
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

    def forward(self, ids, pos):
        x = self.emb(ids)
        T = ids.shape[0]
        for i, b in enumerate(self.blocks):
            h = b["n1"](x)
            q = self.rope(b["q"](h).view(T, self.heads, self.hd), pos)
            k = self.rope(b["k"](h).view(T, self.kv_heads, self.hd), pos)
            v = b["v"](h).view(T, self.kv_heads, self.hd)
            x = x + b["o"](slice_attention(q, k, v, layer=i).reshape(T, -1))
            a, c = b["up"](b["n2"](x)).chunk(2, dim=-1)
            x = x + b["down"](nn.functional.silu(a) * c)
        return self.head(self.norm(x))


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


def solver_case(lengths, strategy, dp, seed, context=256):
    """A validated solver plan for a tiny model and the token arrays of its documents
    (pieces of split documents cut at ``Document.offset``)."""
    from slimdata.cost import CostModel, ModelConfig
    from slimdata.docsource import documents_from_lengths
    from slimdata.solver import Layout, solve

    tiny = ModelConfig(
        name="tiny", layers=2, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=VOCAB, dtype_bytes=4
    )
    docs = documents_from_lengths(lengths, slice_tokens=128)
    layout = Layout(dp=dp, context=context, pack_tokens=context, memory_gib=1)
    plan = solve(
        docs, layout, strategy, seed=seed, cost=CostModel.analytic(tiny, "h100", "none")
    ).validate()
    rng = np.random.default_rng(seed)
    src = {d.doc_id: rng.integers(0, VOCAB, size=d.length).astype(np.uint32) for d in docs}
    return plan, [src[d.doc_id][d.offset : d.offset + d.length] for d in plan.docs]


def reference_grads(model, forward, tokens, plan):
    """Loss and gradients of the unpacked batch: every document whole, one sequence each."""
    model.zero_grad(set_to_none=True)
    total = 0.0
    for d in range(len(plan.docs)):
        ids = torch.as_tensor(np.asarray(tokens[d], dtype=np.int64))
        logits = forward(model, ids, torch.arange(len(ids)))
        loss = (
            nn.functional.cross_entropy(logits[:-1].float(), ids[1:], reduction="sum")
            / plan.loss_tokens
        )
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
    "make_plan",
    "max_rel_err",
    "random_rank_plan",
    "reference_grads",
    "solver_case",
    "tiny_forward",
]

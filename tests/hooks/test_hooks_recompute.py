"""Gradient checkpointing in the runtime (``run_step(recompute=...)``): exact gradients against
the unpacked reference with every decoder layer recomputed inside its pack, the bytes saved
for backward, and the policy the step runs (CPU fp32)."""

from __future__ import annotations

import copy
import dataclasses
from contextlib import nullcontext

import hooks_helpers as H
import hooks_workers as W
import pytest
import torch
from slimdata.hooks import (
    checkpoint_layers,
    hf,
    hf_forward,
    make_payload,
    run_step,
)
from slimdata.hooks import recompute as rc_mod
from slimdata.hooks.continuation import PackContext
from slimdata.hooks.distributed import run_distributed
from slimdata.hooks.kvstore import KVStore
from torch import nn

from slimdata.errors import ConfigError
from slimdata.plan import Slice

pytestmark = pytest.mark.timeout(300)
TOL = 1e-5

# doc of 40 tokens cut [0,10) [10,25) [25,40), one slice per pack, backward reversed
LONG = (
    [40],
    [[(0, 0, 10)], [(0, 10, 25)], [(0, 25, 40)]],
    [[(0, 25, 40)], [(0, 10, 25)], [(0, 0, 10)]],
)
# no backward pack is a union of forward packs: split or recompute (asymmetric)
ASYM = (
    [30, 8, 14],
    [[(0, 0, 12), (1, 0, 8)], [(0, 12, 30), (2, 0, 6)], [(2, 6, 14)]],
    [[(2, 6, 14), (0, 12, 30)], [(2, 0, 6), (1, 0, 8)], [(0, 0, 12)]],
)


@pytest.fixture
def replays(monkeypatch):
    """Counts recomputations that re-entered their pack (``PackContext.replaying``)."""
    count = [0]
    real = PackContext.replaying

    def counting(self):
        count[0] += 1
        return real(self)

    monkeypatch.setattr(PackContext, "replaying", counting)
    return count


def check(
    case, model, recompute="full", asymmetric="split", forward=H.tiny_forward, ref_model=None
):
    lengths, fwd, bwd = case
    plan = H.make_plan(lengths, [(fwd, bwd)])
    toks = H.doc_tokens(lengths, 3)
    ref_loss, ref = H.reference_grads(ref_model or model, forward, toks, plan)
    model.zero_grad(set_to_none=True)
    summary = run_step(
        model,
        make_payload(plan, 0, toks),
        forward=forward if ref_model is None else None,
        asymmetric=asymmetric,
        recompute=recompute,
    )
    assert summary.loss == pytest.approx(ref_loss, rel=1e-6)
    return H.max_rel_err(H.grads_of(model), ref)


def test_full_recompute_slice_continuation_over_packs(replays):
    assert check(LONG, H.TinyLM()) <= TOL
    # every pack's 2 layers are checkpointed in its forward and recomputed once, in its pack
    assert replays[0] == 3 * 2


@pytest.mark.parametrize("asymmetric", ["split", "recompute"])
def test_full_recompute_asymmetric_backward_packs(replays, asymmetric):
    assert check(ASYM, H.TinyLM(seed=1), asymmetric=asymmetric) <= TOL
    # split: 5 forward calls keep graphs (F0 and F1 two each, F2 one); recompute: the 3
    # backward packs re-run their forward with a graph (the forward packs ran without one)
    assert replays[0] == (5 if asymmetric == "split" else 3) * 2


def test_without_reentering_the_pack_the_gradients_are_wrong(monkeypatch):
    # guard: the recomputed attention must run inside its pack (outside, it is plain causal
    # attention over the whole pack, across documents and without the stored prefixes)
    monkeypatch.setattr(rc_mod, "_pack_contexts", lambda: (nullcontext(), nullcontext()))
    try:
        err = check(ASYM, H.TinyLM(seed=1))
    except torch.utils.checkpoint.CheckpointError:  # torch noticed the different graph
        return
    assert err > 1e-3


def test_replay_neither_stores_nor_records():
    store = KVStore()
    s0, s1 = Slice(0, 0, 3), Slice(0, 3, 5)
    ctx = PackContext((s0,), {0: [s0, s1]}, store)
    q, k, v = (torch.randn(3, 2, 4) for _ in range(3))
    with ctx:
        out = ctx.attend(q, k, v, 0, 0.5)
    leaf, live = store.get(0, s0), dict(ctx.live)
    with ctx.replaying():
        again = ctx.attend(q, 2 * k, 2 * v, 0, 0.5)
    assert store.get(0, s0) is leaf and torch.equal(leaf[0], k)  # stored once, unchanged
    assert ctx.live.keys() == live.keys() and all(ctx.live[x] is live[x] for x in live)
    assert not torch.equal(out, again)  # the replay did attend (to what it was given)


class _Layer(nn.Module):
    """A decoder layer of :class:`LayeredLM` as a module (weights stay in the TinyLM)."""

    def __init__(self, lm, i):
        super().__init__()
        object.__setattr__(self, "lm", lm)  # not a submodule: no cycle
        self.i = i

    def forward(self, x, pos):
        return self.lm.block(self.i, x, pos)


class LayeredLM(H.TinyLM):
    """TinyLM whose forward calls layer modules (no :func:`recompute_layer`)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        object.__setattr__(self, "layers", [_Layer(self, i) for i in range(len(self.blocks))])

    def forward(self, ids, pos):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x, pos)
        return self.head(self.norm(x))


def test_checkpoint_layers_names_a_custom_models_layers(replays):
    model = LayeredLM(seed=2)
    with pytest.raises(ConfigError, match="checkpointed no decoder layer"):
        check(LONG, model)
    checkpoint_layers(model, model.layers)
    replays[0] = 0
    assert check(LONG, model) <= TOL
    assert replays[0] == 3 * 2
    assert all("forward" not in layer.__dict__ for layer in model.layers)  # restored


def test_hf_llama_full_recompute(replays):
    name = hf.register()
    model = H.tiny_llama(name)
    ref_model = H.tiny_llama("eager")
    ref_model.load_state_dict(copy.deepcopy(model.state_dict()))
    assert check(LONG, model, forward=hf_forward, ref_model=ref_model) <= TOL
    assert replays[0] == 3 * 2
    layers = model.model.layers
    assert all("forward" not in layer.__dict__ for layer in layers)
    # HF's own checkpointing (reentrant by default) runs through the pack-aware checkpoint
    model.gradient_checkpointing_enable()
    model.train()
    hf_func = layers[0]._gradient_checkpointing_func
    replays[0] = 0
    assert check(ASYM, model, forward=hf_forward, ref_model=ref_model) <= TOL
    assert replays[0] == 5 * 2
    assert all(layer._gradient_checkpointing_func is hf_func for layer in layers)
    with pytest.raises(ConfigError, match=r"gradient checkpointing on.*'none'"):
        check(LONG, model, recompute="none", forward=hf_forward, ref_model=ref_model)


def test_dp_merge_full_recompute_two_gloo_ranks():
    res = run_distributed(W.recompute_suite, 2)
    for step in zip(*(r[0] for r in res), strict=True):  # merge2, solver2, merge2 under DDP
        shares, refs, errs = zip(*step, strict=True)
        assert sum(shares) == pytest.approx(refs[0], rel=1e-6)
        assert max(errs) <= TOL, errs
    # the merge pack's exchanges are the ones without recompute (test_hooks_distributed
    # checks those exactly): per layer one all-gather in the forward, and one in the backward
    # (the layer's recomputation, whose attention is not checkpointed again) with one
    # reduce-scatter
    for _rank, full, none in res:
        assert full == none
        assert sum(e[2] for e in full) == 4  # 2 layers, gathered in forward and backward


def _saved_after_forward(layers: int, recompute: str, tokens: int) -> int:
    """Bytes autograd holds after the forward of one pack of whole documents (no K/V kept:
    no slice is read by a later pack)."""
    lengths = [tokens // 2, tokens - tokens // 2]
    plan = H.make_plan(
        lengths,
        [([[(0, 0, lengths[0]), (1, 0, lengths[1])]], [[(1, 0, lengths[1]), (0, 0, lengths[0])]])],
    )
    model = H.TinyLM(layers=layers)
    seen = H.held_after_forward_packs(
        model, plan, lengths, forward=H.tiny_forward, recompute=recompute
    )
    return seen[0]


def test_full_recompute_saves_the_layer_inputs_only():
    T, hidden = 40, 32
    none2, full2 = _saved_after_forward(2, "none", T), _saved_after_forward(2, "full", T)
    none4, full4 = _saved_after_forward(4, "none", T), _saved_after_forward(4, "full", T)
    assert full2 < none2 and full4 < none4
    # under full, a layer holds its input, (T, hidden) fp32, and the pack keeps its keys and
    # values (T, 2 * kv_dim) fp32 for their gradient (kv_dim = 2 kv heads * 8 = 16); autograd
    # saves nothing else of it: per layer 40 * (32 + 32) * 4 = 10240 bytes, two more layers
    assert full4 - full2 == 2 * T * (hidden + 2 * 16) * 4 == 20480
    assert none4 - none2 > 4 * (full4 - full2)  # without recompute a layer holds far more


def test_policy_from_the_plan_and_refusals(replays):
    from slimdata.cost import CostModel, ModelConfig
    from slimdata.docsource import documents_from_lengths
    from slimdata.solver import Layout, solve

    plan, toks = H.solver_case([30, 50], "bfd", 1, 0)
    assert plan.meta["recompute"] == "none"  # solver_case's cost model
    tiny = ModelConfig(name="t", layers=2, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=61)
    docs = documents_from_lengths([30, 50], slice_tokens=128)
    layout = Layout(dp=1, context=256, pack_tokens=256, memory_gib=1)
    full = solve(docs, layout, "bfd", cost=CostModel.analytic(tiny, "h100", "full"))
    assert full.meta["recompute"] == "full"
    assert solve(docs, layout, "bfd").meta["recompute"] == "selective"  # llama-8b default
    model = H.TinyLM()
    ref_loss, ref = H.reference_grads(model, H.tiny_forward, toks, plan)

    def run(p, **kw):
        model.zero_grad(set_to_none=True)
        return run_step(model, make_payload(p, 0, toks), forward=H.tiny_forward, **kw)

    assert run(plan).loss == pytest.approx(ref_loss, rel=1e-6) and replays[0] == 0
    as_full = dataclasses.replace(plan, meta={**plan.meta, "recompute": "full"})
    run(as_full)
    assert replays[0] == 2 and H.max_rel_err(H.grads_of(model), ref) <= TOL  # one pack, 2 layers
    as_selective = dataclasses.replace(plan, meta={**plan.meta, "recompute": "selective"})
    run(as_selective)  # 5 norms checkpointed (2 per layer, the final one), each replayed once
    assert replays[0] == 2 + 5 and H.max_rel_err(H.grads_of(model), ref) <= TOL
    run(as_selective, recompute="none")  # an explicit policy overrides the plan's
    assert replays[0] == 2 + 5
    with pytest.raises(ConfigError, match="recompute='bogus'"):
        run(plan, recompute="bogus")
    no_meta = dataclasses.replace(plan, meta={})
    run(no_meta)
    assert replays[0] == 2 + 5  # no policy in the plan: none

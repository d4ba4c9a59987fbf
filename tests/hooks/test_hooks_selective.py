"""Selective recompute in the runtime (``run_step(recompute="selective")``): exact gradients
against the unpacked reference with every norm checkpointed and the SwiGLU product rebuilt in
the backward, and the bytes each policy holds after a forward, enumerated by hand for a tiny
Hugging Face Llama (CPU fp32)."""

from __future__ import annotations

import copy

import hooks_helpers as H
import hooks_workers as W
import numpy as np
import pytest
import torch
from slimdata.hooks import (
    hf,
    hf_forward,
    make_payload,
    run_step,
    selective_norm,
    slice_attention,
    swiglu_down,
)
from slimdata.hooks import selective as sel_mod
from slimdata.hooks.distributed import run_distributed
from test_hooks_recompute import ASYM, LONG, TOL, check, replays  # noqa: F401 (fixture)
from torch import nn

from slimdata.cost import CostModel, ModelConfig
from slimdata.errors import ConfigError

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def swiglus(monkeypatch):
    """Counts MLP calls that held ``gate`` and ``up`` only."""
    count = [0]
    real = sel_mod._SwiGLUDown.apply

    def counting(*a):
        count[0] += 1
        return real(*a)

    monkeypatch.setattr(sel_mod._SwiGLUDown, "apply", counting)
    return count


def test_selective_slice_continuation_over_packs(replays, swiglus):  # noqa: F811
    assert check(LONG, H.TinyLM(), recompute="selective") <= TOL
    # 3 packs: 5 norms each (2 per layer and the final one) replayed once in their pack;
    # 2 MLPs each through swiglu_down
    assert replays[0] == 3 * 5
    assert swiglus[0] == 3 * 2


@pytest.mark.parametrize("asymmetric", ["split", "recompute"])
def test_selective_asymmetric_backward_packs(replays, swiglus, asymmetric):  # noqa: F811
    assert check(ASYM, H.TinyLM(seed=1), recompute="selective", asymmetric=asymmetric) <= TOL
    # split: 5 forward calls keep graphs; recompute: the 3 backward packs re-run their forward
    # with a graph (the forward packs ran without one: plain calls, nothing held)
    calls = 5 if asymmetric == "split" else 3
    assert replays[0] == calls * 5
    assert swiglus[0] == calls * 2


def test_hf_llama_selective(replays, swiglus):  # noqa: F811
    model = H.tiny_llama(hf.register())
    ref_model = H.tiny_llama("eager")
    ref_model.load_state_dict(copy.deepcopy(model.state_dict()))
    for case, calls in ((LONG, 3), (ASYM, 5)):
        replays[0] = swiglus[0] = 0
        err = check(case, model, "selective", forward=hf_forward, ref_model=ref_model)
        assert err <= TOL
        # found without edits: LlamaRMSNorm x 5 and LlamaMLP x 2 per forward call
        assert (replays[0], swiglus[0]) == (calls * 5, calls * 2)
    patched = [*sel_mod.norm_modules(model), *sel_mod.swiglu_modules(model)]
    assert len(patched) == 7 and all("forward" not in m.__dict__ for m in patched)  # restored
    model.gradient_checkpointing_enable()
    model.train()
    with pytest.raises(ConfigError, match=r"gradient checkpointing on.*'selective'"):
        check(LONG, model, "selective", forward=hf_forward, ref_model=ref_model)


def test_a_model_without_norms_or_mlps_is_refused():
    class Bare(H.TinyLM):
        def forward(self, ids, pos):
            return self.head(self.emb(ids))

    lengths, fwd, bwd = LONG
    plan = H.make_plan(lengths, [(fwd, bwd)])
    payload = make_payload(plan, 0, H.doc_tokens(lengths, 3))
    with pytest.raises(ConfigError, match="recomputed no norm and no MLP"):
        run_step(Bare(), payload, forward=H.tiny_forward, recompute="selective")


def test_selective_dp_merge_and_ddp_two_gloo_ranks():
    res = run_distributed(W.selective_suite, 2)
    for step in zip(*(r[0] for r in res), strict=True):  # merge2, solver2, merge2 under DDP
        shares, refs, errs = zip(*step, strict=True)
        assert sum(shares) == pytest.approx(refs[0], rel=1e-6)
        assert max(errs) <= TOL, errs
    for _rank, selective, none in res:  # attention is not recomputed: the same exchanges
        assert selective == none and len(selective) > 0


@pytest.mark.slow
def test_full_and_selective_recompute_four_gloo_ranks():
    res = run_distributed(W.recompute_suite4, 4)
    for policy in range(2):  # full, selective
        for step in zip(*(r[policy] for r in res), strict=True):
            shares, refs, errs = zip(*step, strict=True)
            assert sum(shares) == pytest.approx(refs[0], rel=1e-6)
            assert max(errs) <= TOL, errs


# Bytes per token a tiny LlamaForCausalLM (2 layers, hidden 32, 4 heads, 2 kv heads (kv_dim
# 16), head_dim 8, ffn 48, fp32) holds after the forward of one pack of whole documents,
# enumerated tensor by tensor (slimdata.cost.activations):
#   RMSNorm: fp32 input 128 + normalised 128 + statistic 4 = 260
#   none, per layer: 2 norms 520 + q/k/v input 128 + queries 128 + attention output 128
#     + its fp32 softmax log-sum-exp, 4 heads * 4 = 16 + gate_proj input 128
#     + gate, silu(gate), up, product 4 * 192 = 1816
#   selective, per layer: norm inputs 2 * 128 + the same four h-sized tensors 512 + 16
#     + gate and up 2 * 192 = 1168
#   full, per layer: the layer input 128
#   keys and values: 2 layers * 2 * 16 * 4 = 256 (saved, or kept by the pack under full)
#   once: ids and labels 2 * 8 + rotary cos/sin 2 * 8 * 4 + LM-head input 128 + final norm
#     (260; its input 128 under selective) + under full the position ids and cache
#     positions the checkpoints hold 2 * 8
HAND = {
    "none": 2 * 1816 + 256 + 16 + 64 + 128 + 260,
    "selective": 2 * 1168 + 256 + 16 + 64 + 128 + 128,
    "full": 2 * 128 + 256 + 16 + 64 + 128 + 260 + 16,
}


# The same model in bf16: a norm holds its fp32 input 4 * 32, fp32 statistic 4 and bf16
# output 2 * 32 = 196; the softmax statistics stay fp32, 4 * 4 = 16; other tensors 2 bytes
# per element:
#   none, per layer: 2 * 196 + 2 * (4 * 32 + 4 * 48) + 16 = 1048; selective
#   2 * (6 * 32 + 2 * 48) + 16 = 592; full 2 * 32 = 64; keys and values 2 * 2 * 16 * 2 = 128
#   once: 16 + cos/sin 2 * 8 * 2 + LM-head input 64 + final norm 196 (selective: 64) + full 16
HAND_BF16 = {
    "none": 2 * 1048 + 128 + 16 + 32 + 64 + 196,
    "selective": 2 * 592 + 128 + 16 + 32 + 64 + 64,
    "full": 2 * 64 + 128 + 16 + 32 + 64 + 196 + 16,
}
WHOLE = ([30, 20], [[(0, 0, 30), (1, 0, 20)]], [[(1, 0, 20), (0, 0, 30)]])


@pytest.mark.parametrize("policy", ["none", "selective", "full"])
@pytest.mark.parametrize(
    ("case", "after_forward"),
    [
        (WHOLE, [50]),  # one pack of two whole documents
        # a document over three packs: each pack holds its own tokens, and a slice that reads
        # its prefix holds the store's keys/values, not a copy (keys/values counted once)
        (LONG, [10, 25, 40]),
    ],
)
def test_bytes_held_after_a_forward_match_the_hand_count(policy, case, after_forward):
    assert HAND == {"none": 4356, "selective": 2928, "full": 996}
    assert held_after_forwards(case, policy, torch.float32) == [
        t * HAND[policy] for t in after_forward
    ]


@pytest.mark.parametrize("policy", ["none", "selective", "full"])
def test_bf16_bytes_held_match_the_hand_count(policy):
    assert HAND_BF16 == {"none": 2532, "selective": 1488, "full": 580}
    held = held_after_forwards(LONG, policy, torch.bfloat16)
    assert held == [t * HAND_BF16[policy] for t in (10, 25, 40)]


def held_after_forwards(case, policy: str, dtype: torch.dtype) -> list[int]:
    """Bytes the meter counts after each forward pack of ``case`` on the tiny Llama in
    ``dtype``; checks that the analytic cost model predicts the same per token."""
    lengths, fwd, bwd = case
    plan = H.make_plan(lengths, [(fwd, bwd)])
    model = H.tiny_llama(hf.register()).to(dtype)
    seen = H.held_after_forward_packs(model, plan, lengths, recompute=policy)
    cost = CostModel.analytic(ModelConfig.from_hf(model), "h100", policy)
    per_token = cost.act_bytes_per_token + cost.kv_bytes_per_token
    assert seen == [t * per_token for t in np.cumsum([sum(e - b for _, b, e in p) for p in fwd])]
    return seen


def test_selective_under_fsdp_is_refused_before_any_collective(monkeypatch):
    from slimdata.hooks import fsdp as fsdp_rt

    monkeypatch.setattr(fsdp_rt, "fsdp_kind", lambda model: "fsdp2")
    plan, toks = H.solver_case([30, 50], "bfd", 1, 0)
    with pytest.raises(ConfigError, match=r"recompute='selective'.*under FSDP.*'none'"):
        run_step(H.TinyLM(), make_payload(plan, 0, toks), recompute="selective")


class MyNorm(nn.Module):
    """An RMSNorm that selective recompute does not find by class."""

    def __init__(self, norm: nn.RMSNorm):
        super().__init__()
        self.weight = norm.weight

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class CustomNormLM(H.TinyLM):
    """TinyLM whose first norms are :class:`MyNorm` through ``selective_norm``; its second
    norms (``nn.RMSNorm``, found by class) go through ``selective_norm`` too."""

    def __init__(self, **kw):
        super().__init__(**kw)
        for b in self.blocks:
            b["n1"] = MyNorm(b["n1"])

    def block(self, i, x, pos):
        b, T = self.blocks[i], x.shape[0]
        h = selective_norm(b["n1"], x)
        q = self.rope(b["q"](h).view(T, self.heads, self.hd), pos)
        k = self.rope(b["k"](h).view(T, self.kv_heads, self.hd), pos)
        v = b["v"](h).view(T, self.kv_heads, self.hd)
        x = x + b["o"](slice_attention(q, k, v, layer=i).reshape(T, -1))
        a, c = b["up"](selective_norm(b["n2"], x)).chunk(2, dim=-1)
        return x + swiglu_down(a, c, b["down"])


def test_selective_norm_for_custom_norms(replays):  # noqa: F811
    assert check(LONG, CustomNormLM(seed=4), recompute="selective") <= TOL
    # per pack: MyNorm x 2 through selective_norm, nn.RMSNorm x 2 found by class (not
    # checkpointed twice), the final nn.RMSNorm: 5 replays in each of the 3 packs
    assert replays[0] == 3 * 5

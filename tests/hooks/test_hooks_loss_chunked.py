"""Chunked cross-entropy: the loss and gradients of the unchunked loss, and no tensor of a
whole pack's logits is held for backward."""

from __future__ import annotations

import copy

import pytest
import torch
from hooks_helpers import (
    VOCAB,
    doc_tokens,
    grads_of,
    make_plan,
    max_rel_err,
    reference_grads,
    tiny_llama,
)
from slimdata.hooks import hf, hf_forward, make_payload, run_step
from slimdata.hooks.hf import hf_hidden_forward
from slimdata.hooks.loss import IGNORE, HiddenStates, packed_loss

pytestmark = pytest.mark.timeout(120)
T, H = 23, 16


def _case():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(T, H, generator=g, requires_grad=True)
    head = torch.nn.Linear(H, VOCAB, bias=False)
    labels = torch.randint(0, VOCAB, (T,), generator=g)
    labels[[4, 9, T - 1]] = IGNORE
    return hidden, head, labels


@pytest.mark.parametrize("chunk", [1, 5, 7, T, 100])
def test_chunked_loss_equals_unchunked(chunk):
    hidden, head, labels = _case()
    ref = torch.nn.functional.cross_entropy(head(hidden), labels, reduction="sum") / 17
    ref.backward()
    want = (hidden.grad.clone(), head.weight.grad.clone())
    hidden.grad, head.weight.grad = None, None
    got = packed_loss(HiddenStates(hidden, head), labels, 17, chunk)
    got.backward()
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(hidden.grad, want[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(head.weight.grad, want[1], rtol=1e-5, atol=1e-7)
    # a logits tensor is chunked the same way
    logits = head(hidden.detach())
    torch.testing.assert_close(packed_loss(logits, labels, 17, chunk), ref.detach())


def test_no_whole_pack_logits_saved_for_backward():
    hidden, head, labels = _case()
    saved: list[tuple[int, ...]] = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        packed_loss(HiddenStates(hidden, head), labels, 17, 5)
    assert saved, "nothing recorded: the check would be vacuous"
    assert all(s[-1] != VOCAB for s in saved if len(s) == 2), saved
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        packed_loss(head(hidden), labels, 17, 5)
    assert (T, VOCAB) not in saved  # the fp32 copy is made per chunk


def test_hf_default_forward_is_chunked_and_exact():
    name = hf.register()
    model = tiny_llama(name)
    ref_model = tiny_llama("eager")
    ref_model.load_state_dict(copy.deepcopy(model.state_dict()))
    out = hf_hidden_forward(model, torch.arange(6), torch.arange(6))
    assert isinstance(out, HiddenStates) and out.hidden.shape == (6, 32)
    lengths = [33, 7, 18]
    fwd = [[(0, 0, 10), (1, 0, 7)], [(0, 10, 25), (2, 0, 9)], [(0, 25, 33), (2, 9, 18)]]
    bwd = [[(2, 9, 18), (0, 25, 33), (0, 10, 25)], [(2, 0, 9), (1, 0, 7)], [(0, 0, 10)]]
    plan = make_plan(lengths, [(fwd, bwd)])
    toks = doc_tokens(lengths, 2)
    ref_loss, ref = reference_grads(ref_model, hf_forward, toks, plan)
    summary = run_step(model, make_payload(plan, 0, toks), loss_chunk_tokens=4)
    assert summary.loss == pytest.approx(ref_loss, rel=1e-6)
    assert max_rel_err(grads_of(model), ref) <= 1e-5


def test_gradient_checkpointing_is_refused_not_silently_wrong():
    from slimdata.errors import ConfigError

    model = tiny_llama(hf.register())
    model.gradient_checkpointing_enable()
    plan = make_plan([9], [([[(0, 0, 9)]], [[(0, 0, 9)]])])
    with pytest.raises(ConfigError, match="gradient_checkpointing_disable"):
        run_step(model, make_payload(plan, 0, doc_tokens([9])))

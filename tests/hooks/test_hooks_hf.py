"""(e) The Hugging Face path: a stock tiny LlamaForCausalLM with attn_implementation="slimdata"."""

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

pytestmark = pytest.mark.timeout(120)


def test_hf_llama_gradients_match_eager_reference():
    name = hf.register()
    model = tiny_llama(name)
    assert model.config._attn_implementation == "slimdata"
    ref_model = tiny_llama("eager")
    ref_model.load_state_dict(copy.deepcopy(model.state_dict()))
    lengths = [33, 7, 18]
    fwd = [[(0, 0, 10), (1, 0, 7)], [(0, 10, 25), (2, 0, 9)], [(0, 25, 33), (2, 9, 18)]]
    bwd = [[(2, 9, 18), (0, 25, 33), (0, 10, 25)], [(2, 0, 9), (1, 0, 7)], [(0, 0, 10)]]
    plan = make_plan(lengths, [(fwd, bwd)])
    toks = doc_tokens(lengths, 1)
    ref_loss, ref = reference_grads(ref_model, hf_forward, toks, plan)
    summary = run_step(model, make_payload(plan, 0, toks))
    assert summary.loss == pytest.approx(ref_loss, rel=1e-6)
    assert max_rel_err(grads_of(model), ref) <= 1e-5


def test_hf_attention_outside_executor_is_plain_causal():
    hf.register()
    model, ref_model = tiny_llama("slimdata"), tiny_llama("eager")
    ref_model.load_state_dict(model.state_dict())
    ids = torch.arange(20)[None] % VOCAB
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref_model(ids).logits, rtol=1e-5, atol=1e-5)

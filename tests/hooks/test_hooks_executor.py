"""Gradient equivalence of the executor against the unpacked reference (single rank, CPU fp32)."""

from __future__ import annotations

import random

import pytest
import torch
from hooks_helpers import (
    TinyLM,
    doc_tokens,
    grads_of,
    make_plan,
    max_rel_err,
    random_rank_plan,
    reference_grads,
    tiny_forward,
)
from slimdata.hooks import make_payload, run_step
from slimdata.hooks.executor import kept_forward_packs

from slimdata.plan import RankExecution, execution

pytestmark = pytest.mark.timeout(120)
TOL = 1e-5


def check(lengths, fwd, bwd, order=(), seed=0, asymmetric="split"):
    plan = make_plan(lengths, [(fwd, bwd, order)] if order else [(fwd, bwd)])
    toks = doc_tokens(lengths, seed)
    model = TinyLM(seed=seed)
    ref_loss, ref = reference_grads(model, tiny_forward, toks, plan)
    model.zero_grad(set_to_none=True)
    summary = run_step(
        model, make_payload(plan, 0, toks), forward=tiny_forward, asymmetric=asymmetric
    )
    assert summary.loss == pytest.approx(ref_loss, rel=1e-6)
    err = max_rel_err(grads_of(model), ref)
    assert err <= TOL, err
    return plan, summary


def test_one_long_doc_sliced_across_packs():
    # doc of 40 tokens cut [0,10) [10,25) [25,40), one slice per pack, backward reversed
    fwd = [[(0, 0, 10)], [(0, 10, 25)], [(0, 25, 40)]]
    bwd = [[(0, 25, 40)], [(0, 10, 25)], [(0, 0, 10)]]
    _plan, summary = check([40], fwd, bwd)
    assert [(e.pass_, e.pack, e.recomputed) for e in summary.events] == [
        ("F", 0, False),
        ("F", 1, False),
        ("F", 2, False),
        ("B", 0, False),
        ("B", 1, False),
        ("B", 2, False),
    ]


def test_many_short_docs_packed_together():
    lengths = [5, 9, 3, 12, 7, 2, 11]
    fwd = [[(0, 0, 5), (1, 0, 9), (2, 0, 3)], [(3, 0, 12), (4, 0, 7)], [(5, 0, 2), (6, 0, 11)]]
    check(lengths, fwd, fwd)


def calls(summary, pass_):
    return [(e.recomputed, e.calls) for e in summary.events if e.pass_ == pass_]


def test_asymmetric_backward_packs_recompute_or_split():
    # forward groups by one split, backward by another: no backward pack is a union
    lengths = [30, 8, 14]
    fwd = [[(0, 0, 12), (1, 0, 8)], [(0, 12, 30), (2, 0, 6)], [(2, 6, 14)]]
    bwd = [[(2, 6, 14), (0, 12, 30)], [(2, 0, 6), (1, 0, 8)], [(0, 0, 12)]]
    rs = make_plan(lengths, [(fwd, bwd)]).ranks[0]
    kept, unions = kept_forward_packs(rs.forward, rs.backward)
    assert kept == set() and unions == {}
    _plan, summary = check(lengths, fwd, bwd, asymmetric="recompute")
    assert calls(summary, "F") == [(True, 1)] * 3
    assert calls(summary, "B") == [(True, 1)] * 3
    # split: F0 -> [0,12) for B2, [0,8) of doc 1 for B1 (B2's call first); F1 -> B1, B0; F2 -> B0
    _plan, summary = check(lengths, fwd, bwd)
    assert calls(summary, "F") == [(False, 2), (False, 2), (False, 1)]
    assert calls(summary, "B") == [(False, 2), (False, 2), (False, 1)]


@pytest.mark.parametrize("asymmetric", ["recompute", "split"])
def test_mixed_union_and_recompute_and_same_pack_continuation(asymmetric):
    # slices [0,6) and [6,15) of doc 0 in one forward pack (read in-graph when whole; split,
    # [6,15) reads [0,6) from the store), backward pack 0 is the union of forward packs 1 and 2,
    # backward packs 1 and 2 are not unions
    lengths = [15, 10, 4]
    fwd = [[(0, 0, 6), (0, 6, 15)], [(1, 0, 5)], [(1, 5, 10), (2, 0, 4)]]
    bwd = [[(2, 0, 4), (1, 5, 10), (1, 0, 5)], [(0, 6, 15)], [(0, 0, 6)]]
    plan = make_plan(lengths, [(fwd, bwd)])
    kept, unions = kept_forward_packs(plan.ranks[0].forward, plan.ranks[0].backward)
    assert kept == {1, 2} and unions == {0: [1, 2]}
    _plan, summary = check(lengths, fwd, bwd, asymmetric=asymmetric)
    ex = execution(plan, split=asymmetric == "split")
    if asymmetric == "recompute":
        assert calls(summary, "B") == [(False, 2), (True, 1), (True, 1)]
        # forward pack 0 feeds only recomputing backward packs: it runs without a graph
        assert calls(summary, "F") == [(True, 1), (False, 1), (False, 1)]
        assert ex == [RankExecution(frozenset({0}), frozenset({1, 2}), (1, 1, 1), (2, 1, 1))]
    else:
        assert calls(summary, "B") == [(False, 2), (False, 1), (False, 1)]
        assert calls(summary, "F") == [(False, 2), (False, 1), (False, 1)]
        assert ex == [RankExecution(frozenset(), frozenset(), (2, 1, 1), (2, 1, 1))]


def test_interleaved_order_backward_before_later_forward():
    lengths = [6, 20]
    fwd = [[(0, 0, 6)], [(1, 0, 7)], [(1, 7, 20)]]
    bwd = [[(0, 0, 6)], [(1, 7, 20)], [(1, 0, 7)]]
    _plan, summary = check(
        lengths, fwd, bwd, order=[("F", 0), ("B", 0), ("F", 1), ("F", 2), ("B", 1), ("B", 2)]
    )
    assert [(e.pass_, e.pack) for e in summary.events][:2] == [("F", 0), ("B", 0)]


def test_single_token_docs_and_one_token_slices():
    lengths = [1, 2, 5]
    fwd = [[(0, 0, 1), (2, 0, 1)], [(1, 0, 1), (2, 1, 2)], [(1, 1, 2), (2, 2, 5)]]
    bwd = [[(2, 2, 5), (1, 1, 2)], [(2, 1, 2), (1, 0, 1)], [(2, 0, 1), (0, 0, 1)]]
    check(lengths, fwd, bwd)


def test_loss_mask_matches_masked_reference():
    lengths = [12, 9]
    toks = doc_tokens(lengths, 3)
    masks = [
        torch.tensor([1, 0, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1]).numpy(),
        torch.tensor([0, 0, 0, 1, 1, 1, 1, 1, 1]).numpy(),
    ]
    counted = [int(m[:-1].sum()) for m in masks]  # the last token never carries a loss
    plan = make_plan(
        lengths,
        [([[(0, 0, 5)], [(0, 5, 12), (1, 0, 9)]], [[(1, 0, 9), (0, 5, 12)], [(0, 0, 5)]])],
        loss_tokens=counted,
    )
    model = TinyLM(seed=3)
    model.zero_grad(set_to_none=True)
    for d in range(2):
        ids = torch.as_tensor(toks[d].astype("int64"))
        logits = tiny_forward(model, ids, torch.arange(len(ids)))
        m = torch.as_tensor(masks[d][:-1]).bool()
        torch.nn.functional.cross_entropy(logits[:-1][m], ids[1:][m], reduction="sum").div(
            plan.loss_tokens
        ).backward()
    ref = grads_of(model)
    model.zero_grad(set_to_none=True)
    run_step(model, make_payload(plan, 0, toks, masks), forward=tiny_forward)
    assert max_rel_err(grads_of(model), ref) <= TOL


@pytest.mark.parametrize("asymmetric", ["recompute", "split"])
@pytest.mark.parametrize("seed", range(12))
def test_random_plans(seed, asymmetric):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 24) for _ in range(rng.randint(1, 5))]
    fwd, bwd = random_rank_plan(rng, lengths)
    plan, summary = check(lengths, fwd, bwd, seed=seed, asymmetric=asymmetric)
    ex = execution(plan, split=asymmetric == "split")[0]
    assert [e.calls for e in summary.events if e.pass_ == "F"] == list(ex.f_calls)
    assert [e.calls for e in summary.events if e.pass_ == "B"] == list(ex.b_calls)
    assert {e.pack for e in summary.events if e.pass_ == "B" and e.recomputed} == ex.recomputed


def test_sdpa_tiles_agree_with_one_masked_call_and_mask_is_bottom_right():
    from slimdata.hooks.attention import VarlenBatch, sdpa_varlen, varlen_mask
    from slimdata.hooks.attention.sdpa import BLOCK

    b = VarlenBatch.from_lengths([2, 3], [4, 3])
    m = varlen_mask(b)
    # sequence 0: 2 queries are the tail of 4 keys; sequence 1: plain causal; no cross terms
    assert m.int().tolist() == [
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [0, 0, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 1, 1, 1],
    ]
    assert BLOCK == 128
    g = torch.Generator().manual_seed(0)
    lq, lk = [3, 1, 300, 7, 2, 2], [9, 1, 400, 7, 30, 2]
    q = torch.randn(sum(lq), 4, 8, generator=g)
    k, v = torch.randn(2, sum(lk), 2, 8, generator=g)
    batch = VarlenBatch.from_lengths(lq, lk)
    tiled = sdpa_varlen(q, k, v, batch, 0.3)
    # the 300 queries after 100 prefix keys: blocks of 128, each reading keys up to its end
    calls = [(a, b, c, d) for a, b, c, d, _ in batch.cache["calls"]]
    assert calls == [
        (0, 3, 0, 9),
        (3, 4, 9, 10),
        (4, 132, 10, 238),
        (132, 260, 10, 366),
        (260, 304, 10, 410),
        (304, 311, 410, 417),
        (311, 313, 417, 447),
        (313, 315, 447, 449),
    ]
    full = varlen_mask(batch)
    for a, b, c, d, mask in batch.cache["calls"]:  # each tile's mask is the full mask's block
        assert torch.equal(mask, full[a:b, c:d])
        assert full[a:b, :c].sum() == 0 and full[a:b, d:].sum() == 0  # nothing left out
    dense = sdpa_varlen(q, k, v, batch, 0.3, mask=full)
    torch.testing.assert_close(tiled, dense, rtol=1e-6, atol=1e-6)

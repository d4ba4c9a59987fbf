"""``StepPlan.loss_tokens`` is the number of labels the runtime sums, for every strategy.

A strategy that cuts documents (``concat``, ``bfd``, ``wlb`` ...) trains every piece as its
own sequence: a piece's last token has no label. The batch below (context 128) has cut
documents, documents of 1 token (no label) and cut pieces of 1 token (``129 = 128 + 1``,
``257 = 128 + 128 + 1`` when cut every 128 tokens; ``concat`` lays 300 tokens out first, so
the 85-token document fills the 84 tokens left in its row and 1 token of the next).
"""

from __future__ import annotations

import numpy as np
import pytest
import slimdata.hooks.executor as executor
import torch
from hooks_helpers import TinyLM, grads_of, max_rel_err, solver_case, tiny_forward
from slimdata.hooks import make_payload, run_step
from slimdata.hooks.loss import IGNORE
from slimdata.hooks.verify import run_plan

from slimdata.plan import Document, loss_token_count
from slimdata.solver import STRATEGIES
from slimdata.solver.common import cut_document, split_into_pieces

pytestmark = pytest.mark.timeout(300)

LENGTHS = [300, 85, 129, 1, 257, 60, 1, 140]
"""Whole documents: 299 + 84 + 128 + 0 + 256 + 59 + 0 + 139 = 965 labels."""


def runtime_labels(plan, toks, monkeypatch) -> tuple[int, int]:
    """(labels, tokens) the executor passes to its loss over all ranks of ``plan``."""
    seen = {"labels": 0, "tokens": 0}
    real = executor.packed_loss

    def counting(out, labels, *args, **kwargs):
        seen["labels"] += int((labels != IGNORE).sum())
        seen["tokens"] += int(labels.numel())
        return real(out, labels, *args, **kwargs)

    monkeypatch.setattr(executor, "packed_loss", counting)
    model = TinyLM(seed=0)
    for r in range(plan.dp):  # asymmetric="split": every slice in exactly one forward call
        run_step(model, make_payload(plan, r, toks), forward=tiny_forward)
    return seen["labels"], seen["tokens"]


def test_loss_token_count_by_hand():
    assert [loss_token_count(n) for n in (0, 1, 2, 128)] == [0, 0, 1, 127]
    assert loss_token_count(4, [1, 0, 1, 1]) == 2  # token 1 masked, token 3 is the last
    assert loss_token_count(3, [0, 0, 1]) == 0
    assert Document(doc_id=0, length=1).loss_tokens == 0


def test_cut_pieces_lose_the_label_of_their_last_token():
    d = Document(doc_id=0, length=10)
    assert [p.loss_tokens for p in cut_document(d, [0, 4, 8, 10])] == [3, 3, 1]
    assert [p.loss_tokens for p in cut_document(d, [0, 9, 10])] == [8, 0]  # a 1-token piece
    # 2 masked labels of the source come off the pieces in order
    masked = Document(doc_id=0, length=10, loss_tokens=7)
    assert [p.loss_tokens for p in cut_document(masked, [0, 4, 8, 10])] == [1, 3, 1]
    pieces = split_into_pieces([Document(doc_id=i, length=n) for i, n in enumerate(LENGTHS)], 128)
    # 300: 127+127+43, 85: 84, 129: 127+0, 1: 0, 257: 127+127+0, 60: 59, 1: 0, 140: 127+11
    assert sum(p.loss_tokens for p in pieces) == 959


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_plan_loss_tokens_equal_runtime_labels(strategy, monkeypatch):
    plan, toks = solver_case(LENGTHS, strategy, 1, 0, context=128)
    assert not plan.merges
    labels, tokens = runtime_labels(plan, toks, monkeypatch)
    assert tokens == sum(LENGTHS)  # every token went through the loss once
    assert plan.loss_tokens == labels
    cut = [d for d in plan.docs if d.offset > 0]
    if cut:  # the pieces lose labels; a piece of one token carries none
        assert labels < 965
        assert any(d.length == 1 for d in cut)
    else:
        assert labels == 965


def test_every_cutting_strategy_is_covered():
    cutting = set()
    for strategy in sorted(STRATEGIES):
        plan, _ = solver_case(LENGTHS, strategy, 1, 0, context=128)
        if any(d.offset > 0 for d in plan.docs):
            cutting.add(strategy)
    assert cutting == {"bfd", "concat", "multipack", "sorted", "wlb-ideal"}


@pytest.mark.parametrize("strategy", ["concat", "bfd", "wlb-ideal"])
def test_cut_plan_gradients_equal_the_pieces_reference(strategy):
    plan, toks = solver_case(LENGTHS, strategy, 2, 0, context=128)
    assert not plan.merges and any(d.offset > 0 for d in plan.docs)
    model = TinyLM(seed=1)
    # reference: every piece its own sequence, mean over the labels actually summed
    seqs = [torch.as_tensor(np.asarray(t, dtype=np.int64)) for t in toks]
    n_labels = sum(len(s) - 1 for s in seqs if len(s) > 1)
    model.zero_grad(set_to_none=True)
    ref_loss = 0.0
    for ids in seqs:
        if len(ids) > 1:
            logits = tiny_forward(model, ids, torch.arange(len(ids)))
            loss = torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="sum")
            (loss / n_labels).backward()
            ref_loss += float(loss.detach()) / n_labels
    ref = grads_of(model)
    got, grads = run_plan(model, plan, toks, forward=tiny_forward)  # ranks in sequence
    assert got == pytest.approx(ref_loss, rel=1e-6)
    assert max_rel_err(grads, ref) <= 1e-5


def test_cut_pieces_keep_the_build_cuts_inside_them():
    # build-time cuts at 3, 4 and 7 of a 10-token document; pieces [0, 4), [4, 8), [8, 10):
    # a cut on a piece's boundary is that boundary, the others move with the piece's start
    d = Document(doc_id=0, length=10, cuts=(0, 3, 4, 7, 10), offset=5)
    pieces = cut_document(d, [0, 4, 8, 10])
    assert [p.cuts for p in pieces] == [(0, 3, 4), (0, 3, 4), (0, 2)]
    assert [(p.offset, p.length) for p in pieces] == [(5, 4), (9, 4), (13, 2)]
    # a document of 2**20 slices cut in 2**10 pieces: each piece holds its 2**10 slices
    many = Document(doc_id=1, length=1 << 20, cuts=tuple(range((1 << 20) + 1)))
    big = cut_document(many, list(range(0, (1 << 20) + 1, 1 << 10)))
    assert len(big) == 1 << 10
    assert all(p.cuts == tuple(range((1 << 10) + 1)) for p in big)

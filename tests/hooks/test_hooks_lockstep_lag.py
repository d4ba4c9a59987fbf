"""A one-stage lockstep plan whose backward lag is not 0 (a document longer than the pack cap,
all its forward packs before any backward pack) runs to the unpacked reference's gradients."""

from __future__ import annotations

import pytest
from hooks_helpers import TinyLM, doc_tokens, max_rel_err, reference_grads, tiny_forward
from slimdata.hooks.verify import run_plan

from slimdata.cost import CostModel, ModelConfig
from slimdata.docsource import documents_from_lengths
from slimdata.solver import Layout, solve
from slimdata.solver.common import interleaved_order

TINY = ModelConfig(name="tiny", layers=2, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=61)


def assert_matches_unpacked_reference(plan, token_seed: int, model_seed: int) -> None:
    """One process runs every rank of ``plan``: loss and gradients equal the unpacked
    reference's (loss within 1e-6, gradients within 1e-5 relative)."""
    toks = doc_tokens([d.length for d in plan.docs], seed=token_seed)
    model = TinyLM(seed=model_seed)
    ref_loss, ref = reference_grads(model, tiny_forward, toks, plan)
    loss, got = run_plan(model, plan, toks, forward=tiny_forward)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert max_rel_err(got, ref) <= 1e-5


def test_lockstep_plan_with_a_lag_matches_the_unpacked_reference():
    docs = documents_from_lengths([520, 100, 90, 40, 1], slice_tokens=128)
    layout = Layout(dp=2, mode="lockstep", context=4096, pack_tokens=256, memory_gib=1)
    plan = solve(docs, layout, "slimpack", 0, CostModel.analytic(TINY, "h100", "none"))
    m = len(plan.ranks[0].forward)
    assert plan.meta["lag"] >= 1 and plan.ranks[0].order == interleaved_order(
        m, m, plan.meta["lag"]
    )
    assert_matches_unpacked_reference(plan, token_seed=5, model_seed=2)


@pytest.mark.parametrize(
    ("pp", "lengths"),
    [(1, [255] * 6 + [5] * 8), (2, [256] * 4 + [60, 50, 40, 30, 20, 10])],
)
def test_lockstep_plan_with_documents_kept_whole_matches_the_unpacked_reference(pp, lengths):
    # token-bound packs of <= 256 tokens: the plan keeps each rank's documents whole, every
    # backward pack its forward pack's slices (a 255-token document is two slices)
    docs = documents_from_lengths(lengths, slice_tokens=128)
    layout = Layout(dp=2, pp=pp, mode="lockstep", context=4096, pack_tokens=256, memory_gib=1)
    plan = solve(docs, layout, "slimpack", 0, CostModel.analytic(TINY, "h100", "none"))
    assert plan.meta["whole_documents"] and plan.meta["lag"] == 0
    for rs in plan.ranks:
        assert [set(p.slices) for p in rs.forward] == [set(p.slices) for p in rs.backward]
    assert_matches_unpacked_reference(plan, token_seed=7, model_seed=3)

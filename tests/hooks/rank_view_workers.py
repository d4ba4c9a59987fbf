"""Rank bodies of the rank-view tests: every rank runs from its own view of the plan, after a
JSON round trip (what a plan-shard payload hands it), never from the whole plan."""

from __future__ import annotations

import hooks_workers as W
from hooks_helpers import TinyLM, doc_tokens, grads_of, max_rel_err, reference_grads, tiny_forward
from slimdata.hooks import StepPayload, make_payload, run_step

from slimdata.plan import StepPlan
from slimdata.plan.load import parse_rank_plan


def view_payload(plan: StepPlan, rank: int, toks) -> StepPayload:
    """``rank``'s payload as plan shards hold it: its view, serialized and parsed back."""
    tokens = make_payload(plan, rank, toks).tokens
    view = parse_rank_plan(plan.rank_view(rank).to_json(), dp=plan.dp)
    assert len(view.ranks) < plan.dp or plan.merges  # the view, not the whole plan
    return StepPayload(plan=view, rank=rank, tokens=tokens)


def from_views(rank: int, world: int) -> tuple[list, list]:
    """DP-Merge plans on plain modules and a lockstep solver plan under FSDP2, from views:
    per plan (this rank's loss share, reference loss, max relative gradient error)."""
    plain = []
    for name in ["merge4", "two_groups4", "solver4"]:
        lengths, plan = W.PLANS[name]()
        toks = lengths if name.startswith("solver") else doc_tokens(lengths, seed=7)
        model = TinyLM(seed=1)
        ref_loss, ref = reference_grads(model, tiny_forward, toks, plan)
        model.zero_grad(set_to_none=True)
        payload = view_payload(plan, rank, toks)
        summary = run_step(model, payload, forward=tiny_forward, reduce_grads=True)
        plain.append((summary.loss, ref_loss, max_rel_err(grads_of(model), ref)))
    fsdp = []
    for name in ["solver4_merge", "merge_recompute4"]:
        toks, plan = W.FSDP_PLANS[name]()
        model = TinyLM(seed=1)
        ref_loss, ref = reference_grads(model, tiny_forward, toks, plan)
        model.zero_grad(set_to_none=True)
        payload = view_payload(plan, rank, toks)
        assert payload.plan.lockstep is not None
        model = W._fully_shard(model, world)
        summary = run_step(model, payload, forward=tiny_forward)
        got = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        fsdp.append((summary.loss, ref_loss, max_rel_err(got, ref)))
    return plain, fsdp

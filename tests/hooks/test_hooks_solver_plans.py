"""(f) Random plans from the solver (every strategy), executed and compared with the unpacked
reference. Plans without merge groups run all their ranks in one process, one after the other
(gradients accumulate, which is exactly the SUM reduction); merge plans run in test_hooks_distributed."""

from __future__ import annotations

import pytest
from hooks_helpers import TinyLM, grads_of, max_rel_err, reference_grads, solver_case, tiny_forward
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from slimdata.hooks import make_payload, run_step

from slimdata.solver import STRATEGIES

pytestmark = pytest.mark.timeout(300)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 200), min_size=1, max_size=6).filter(lambda x: sum(x) > len(x)),
    strategy=st.sampled_from(sorted(STRATEGIES)),
    dp=st.integers(1, 3),
    seed=st.integers(0, 3),
)
def test_solver_plans_match_reference(lengths, strategy, dp, seed):
    plan, toks = solver_case(lengths, strategy, dp, seed)
    if plan.merges:  # needs a process group: covered by test_hooks_distributed
        return
    model = TinyLM(seed=seed)
    ref_loss, ref = reference_grads(model, tiny_forward, toks, plan)
    model.zero_grad(set_to_none=True)
    loss = sum(
        run_step(model, make_payload(plan, r, toks), forward=tiny_forward).loss
        for r in range(plan.dp)
    )
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert max_rel_err(grads_of(model), ref) <= 1e-5


def test_slices_longer_than_one_pack_are_continued():
    # a 700-token document on one rank is cut into 128-token slices over several packs
    plan, toks = solver_case([700, 40, 90], "slimpack", 1, 0)
    rs = plan.ranks[0]
    assert len(rs.forward) >= 3 and any(s.start > 0 for s in rs.slices())
    model = TinyLM(seed=0)
    _loss, ref = reference_grads(model, tiny_forward, toks, plan)
    model.zero_grad(set_to_none=True)
    run_step(model, make_payload(plan, 0, toks), forward=tiny_forward)
    assert max_rel_err(grads_of(model), ref) <= 1e-5


def test_batch_without_loss_tokens_gives_zero_loss_and_gradient():
    plan, toks = solver_case([1, 1, 1], "bfd", 1, 0)
    assert plan.loss_tokens == 0
    model = TinyLM()
    summary = run_step(model, make_payload(plan, 0, toks), forward=tiny_forward)
    assert summary.loss == 0.0
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())

"""The recompute policy is a field of the cost model, and K/V memory is counted once.

Tiny model for hand-counted bytes: 1 layer, hidden 2, 1 head of 2 (kv_dim 2), ffn 4,
1 byte per element. Per token: K/V ``2 * kv_dim = 4`` bytes; activations without K/V
(``slimdata.cost.activations``, derived in the parametrisation below) 92 (none), 48
(selective), 54 (full).
"""

from __future__ import annotations

import pytest
from sim_helpers import kv_cost, merge_plan, whole_doc_plan

from slimdata.cost import CostModel, Interconnect, ModelConfig
from slimdata.plan import Document, MicroPack, RankStep, Slice, StepPlan
from slimdata.sim import SimConfig, simulate_step
from slimdata.solver.layout import Layout
from slimdata.solver.memory import plan_peak_memory

BYTE = ModelConfig(
    name="byte", layers=1, hidden=2, heads=1, kv_heads=1, ffn=4, vocab=10, dtype_bytes=1
)
NET = Interconnect(intra_node_gbps=1.0, inter_node_gbps=0.5, latency_s=0.0)


def sliced_plan() -> StepPlan:
    """One rank: a 3-token document as forward packs [0, 2), [2, 3) and one backward pack."""
    doc = Document(doc_id=0, length=3)
    a, b = Slice(0, 0, 2), Slice(0, 2, 3)
    rs = RankStep(rank=0, forward=(MicroPack((a,)), MicroPack((b,))), backward=(MicroPack((b, a)),))
    return StepPlan(step=0, strategy="hand", docs=(doc,), ranks=(rs,)).validate()


@pytest.mark.parametrize(
    ("policy", "act", "peak"),
    # BYTE (slimdata.cost.activations, d=1, h=2, head_dim 2, ffn 4, 1 layer): a norm holds
    # (4 + 1) * 2 + 4 = 14; per layer none 2 * 14 + (4 * 2 + 4 * 4) + fp32 softmax stats
    # 4 * 1 head = 56, selective 6 * 2 + 2 * 4 + 4 = 24, full 2; once: ids+labels 16,
    # cos/sin 2 * 2 = 4, LM-head input 2, final norm 14 (selective: its input, 2), full's
    # position inputs 16
    [
        ("none", 56.0 + 16 + 4 + 2 + 14, 3 * (92.0 + 4)),
        ("selective", 24.0 + 16 + 4 + 2 + 2, 3 * (48.0 + 4)),
        ("full", 2.0 + 16 + 4 + 2 + 14 + 16, 3 * (54.0 + 4)),
    ],
)
def test_kv_counted_once_by_solver_and_simulator(policy, act, peak):
    cost = CostModel.analytic(BYTE, "h100", policy)
    assert cost.kv_bytes_per_token == 4.0
    assert cost.act_bytes_per_token == act
    # 3 tokens held at once: 3 * (act + 4)
    for plan in (whole_doc_plan([[[3]]]), sliced_plan()):
        assert plan_peak_memory(plan, cost).tolist() == [peak]
        r = simulate_step(plan, cost, Layout(dp=1, context=128))
        assert r.peak_memory.tolist() == [[peak]]


def test_the_policy_is_the_cost_models_field_never_its_label():
    # a 4-token document merged over 2 ranks: the label says "full" (an analytic name) or
    # nothing of it (a profile's), the field says otherwise; the plan records the field,
    # which run_step runs, and the simulator prices by the coefficients, so a model differing
    # only in its label simulates exactly alike. The K/V exchange is the same under every
    # policy (2 collectives per layer backward: the runtime's recomputation of a
    # checkpointed layer is its re-gather, tests/hooks/test_hooks_execution.py records it).
    from slimdata.solver import solve

    lay, cfg = Layout(dp=2, context=128), SimConfig(interconnect=NET)
    base = kv_cost().to_dict()
    full = CostModel(
        **{**base, "recompute": "full", "source": "profile:cpu", "label": "t@cpu/float32"}
    )
    none = CostModel(**{**base, "recompute": "none", "label": "t@h100/full"})
    relabelled = CostModel(**{**base, "recompute": "none", "label": "t@cpu/float32"})
    plan = merge_plan()
    t_none = simulate_step(plan, none, lay, cfg).step_time
    assert simulate_step(plan, relabelled, lay, cfg).step_time == t_none
    assert simulate_step(plan, full, lay, cfg).step_time == t_none
    docs = plan.docs
    assert solve(docs, lay, "slimpack", 0, full).meta["recompute"] == "full"
    assert solve(docs, lay, "slimpack", 0, none).meta["recompute"] == "none"

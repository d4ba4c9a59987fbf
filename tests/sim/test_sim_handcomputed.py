"""Hand-computed DAGs: every expected number is worked out in the comment next to it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from sim_helpers import linear_cost, merge_plan, whole_doc_plan

from slimdata.cost import Interconnect
from slimdata.errors import PlanError
from slimdata.execution import chunk_fractions, pack_times, stage_ops
from slimdata.execution import program as execution_program
from slimdata.plan import Document, MicroPack, RankStep, Slice, StepPlan
from slimdata.sim import SimConfig, simulate_step
from slimdata.sim.cp import merge_layer_tokens
from slimdata.solver.common import interleaved_order
from slimdata.solver.layout import Layout

NO_LATENCY = SimConfig(interconnect=Interconnect(latency_s=0.0))


def test_two_packs_two_ranks():
    # rank 0: doc of 3 tokens -> F 3 s, B 6 s; rank 1: doc of 5 -> F 5, B 10
    plan = whole_doc_plan([[[3]], [[5]]])
    r = simulate_step(plan, linear_cost(), Layout(dp=2, context=128))
    assert r.step_time == 15.0  # the slower rank: 5 + 10
    assert r.busy.tolist() == [[9.0, 15.0]]
    assert r.work == 24.0
    assert r.lower_bound == 12.0  # 24 s of work over 2 devices
    assert r.imbalance == pytest.approx(15 * 2 / 24)
    assert r.bubble == pytest.approx(1 - 24 / 30)
    assert r.peak_memory.tolist() == [[3.0, 5.0]]  # 1 byte per token held F..B
    assert r.comm_time == 0.0


def test_pack_order_and_memory_on_one_rank():
    # one rank, packs [2] then [4]: F0 [0,2) B0 [2,6) F1 [6,10) B1 [10,18)
    plan = whole_doc_plan([[[2], [4]]])
    r = simulate_step(plan, linear_cost(), Layout(dp=1, context=128))
    assert r.step_time == 18.0
    tl = r.timeline
    assert tl["start"].tolist() == [0.0, 2.0, 6.0, 10.0]
    assert tl["end"].tolist() == [2.0, 6.0, 10.0, 18.0]
    assert r.peak_memory.tolist() == [[4.0]]  # eager order frees pack 0 before pack 1 starts


def test_pack_times_recomputed_not_trusted():
    doc = Document(doc_id=0, length=6)
    lying = MicroPack((Slice(0, 0, 6),), cost=123.0)
    plan = StepPlan(
        step=0,
        strategy="t",
        docs=(doc,),
        ranks=(RankStep(rank=0, forward=(lying,), backward=(lying,)),),
    )
    pt = pack_times(plan, linear_cost(att_f=1.0, att_b=1.0))
    assert pt.fwd.tolist() == [6 + 21]  # 6 tokens + 21 causal pairs
    assert pt.bwd.tolist() == [12 + 21]


def one_rank_plan(docs, forward, backward) -> StepPlan:
    """A validated one-rank plan from lists of slices per forward and backward pack."""
    rs = RankStep(
        rank=0,
        forward=tuple(MicroPack(tuple(p)) for p in forward),
        backward=tuple(MicroPack(tuple(p)) for p in backward),
    )
    return StepPlan(step=0, strategy="t", docs=docs, ranks=(rs,)).validate()


def test_pack_times_follow_the_executor():
    # doc 0 = a [0,2) + b [2,4), doc 1 = c [0,3); fwd [a, c] [b], bwd [b] [c] [a]
    # B0 = [b] is the union of F1 (kept); B1 = [c] and B2 = [a] are no union of forward
    # packs: they re-run their own forward, and F0 = [a, c] runs graph-free
    docs = (Document(doc_id=0, length=4, cuts=(0, 2, 4)), Document(doc_id=1, length=3))
    a, b, c = Slice(0, 0, 2), Slice(0, 2, 4), Slice(1, 0, 3)
    plan = one_rank_plan(docs, [[a, c], [b]], [[b], [c], [a]])
    cost = dataclasses.replace(
        linear_cost(fwd=1.0, bwd=2.0),
        fwd_const=0.5,
        bwd_const=0.25,
        fwd_pack_const=10.0,
        bwd_pack_const=20.0,
        graph_free_scale=0.5,
    )
    pt = pack_times(plan, cost)
    assert pt.f_graph_free.tolist() == [True, False]
    assert pt.b_recomputed.tolist() == [False, True, True]
    # F0: (5 tokens + 2 slices * 0.5 + 10) * 0.5 = 8; F1: 2 + 0.5 + 10 = 12.5
    assert pt.fwd.tolist() == [8.0, 12.5]
    # B0: 2*2 + 0.25 + 20 = 24.25; B1: forward 3 + 0.5 + 10 plus backward 6 + 0.25 + 20
    # = 39.75; B2: forward 2 + 0.5 + 10 plus backward 4 + 0.25 + 20 = 36.75
    assert pt.bwd.tolist() == [24.25, 39.75, 36.75]
    assert pt.f_const.tolist() == [5.5, 10.5]  # (2 * 0.5 + 10) * 0.5, 0.5 + 10
    assert pt.b_const.tolist() == [20.25, 30.75, 30.75]  # + 0.5 + 10 where recomputed
    # the simulator adds up the same times: one rank, no communication
    recompute = SimConfig(asymmetric="recompute")
    r = simulate_step(plan, cost, Layout(dp=1, context=128), recompute)
    assert r.step_time == 8.0 + 12.5 + 24.25 + 39.75 + 36.75
    # split (the executor's default): F0 runs [a] (for B2) and [c] (for B1) as two calls,
    # every call keeps its graph, nothing is recomputed; one pack constant per call
    sp = pack_times(plan, cost, split=True)
    assert not sp.f_graph_free.any() and not sp.b_recomputed.any()
    assert sp.f_calls.tolist() == [2, 1] and sp.b_calls.tolist() == [1, 1, 1]
    assert sp.fwd.tolist() == [5.0 + 2 * 0.5 + 2 * 10.0, 12.5]
    assert sp.bwd.tolist() == [24.25, 6.0 + 0.25 + 20.0, 24.25]
    r = simulate_step(plan, cost, Layout(dp=1, context=128))
    assert r.step_time == 26.0 + 12.5 + 24.25 + 26.25 + 24.25


def test_graph_free_forwards_hold_no_activations_between_passes():
    # docs a, c, e of 2 tokens, 1 byte per token; F0 = [a, c] feeds the asymmetric B1 = [c],
    # B2 = [a]; F1 = [e], B0 = [e]. Split: a, c, e are all held after F1 -> 6 bytes.
    # Recompute: F0 runs graph-free (a, c held only while it runs: 4 bytes), F1 holds e (2),
    # B1 and B2 hold their own slice while they recompute and run backward (2 each) -> 4.
    docs = tuple(Document(doc_id=i, length=2) for i in range(3))
    a, c, e = (Slice(d, 0, 2) for d in range(3))
    plan = one_rank_plan(docs, [[a, c], [e]], [[e], [c], [a]])
    cost, layout = linear_cost(), Layout(dp=1, context=128)
    assert simulate_step(plan, cost, layout).peak_memory.max() == 6.0
    rec = simulate_step(plan, cost, layout, SimConfig(asymmetric="recompute"))
    assert rec.peak_memory.max() == 4.0


def test_lockstep_rules_recompute_on_every_rank():
    # 2 ranks, F0 B0 each: rank 0's B0 is the union of its F0, rank 1's B0 [y] is not (F0 =
    # [x, y], B0 = [y], B1 = [x]). Free (DDP) mode decides per rank; lockstep (FSDP) makes
    # every rank recompute B0 so they all make the same model calls.
    docs = tuple(Document(doc_id=i, length=n) for i, n in enumerate((4, 2, 3)))
    p0 = MicroPack((Slice(0, 0, 4),))
    x, y = Slice(1, 0, 2), Slice(2, 0, 3)
    plan = StepPlan(
        step=0,
        strategy="t",
        docs=docs,
        ranks=(
            RankStep(rank=0, forward=(p0,), backward=(p0, MicroPack(()))),
            RankStep(
                rank=1, forward=(MicroPack((x, y)),), backward=(MicroPack((y,)), MicroPack((x,)))
            ),
        ),
    ).validate()
    cost = linear_cost(fwd=1.0, bwd=2.0)
    free = pack_times(plan, cost)
    assert free.b_recomputed.tolist() == [False, False, True, True]
    assert free.bwd.tolist() == [8.0, 0.0, 3.0 + 6.0, 2.0 + 4.0]
    lock = pack_times(plan, cost, lockstep=True, split=True)  # FSDP never splits
    # rank 0's B1 is padding (rank 1's holds x): a recomputed one-token dummy call, 1 + 2 s
    assert lock.f_calls.tolist() == [1, 1] and lock.b_calls.tolist() == [1, 1, 1, 1]
    assert lock.f_graph_free.tolist() == [True, True]
    assert lock.b_recomputed.tolist() == [True, True, True, True]
    assert lock.bwd.tolist() == [4.0 + 8.0, 1.0 + 2.0, 3.0 + 6.0, 2.0 + 4.0]


def test_continuation_pairs_count_the_prefix():
    # slices [0,4) and [4,6) of one 6-token doc: pairs 10 and 2*4 + 3 = 11, 21 in total
    doc = Document(doc_id=0, length=6, cuts=(0, 4, 6))
    a, b = MicroPack((Slice(0, 0, 4),)), MicroPack((Slice(0, 4, 6),))
    plan = StepPlan(
        step=0,
        strategy="t",
        docs=(doc,),
        ranks=(RankStep(rank=0, forward=(a, b), backward=(b, a)),),
    ).validate()
    pt = pack_times(plan, linear_cost(fwd=0.0, bwd=0.0, att_f=1.0, att_b=1.0))
    assert pt.fwd.tolist() == [10.0, 11.0]
    assert pt.bwd.tolist() == [11.0, 10.0]
    r = simulate_step(
        plan, linear_cost(fwd=0.0, bwd=0.0, att_f=1.0, att_b=1.0), Layout(dp=1, context=128)
    )
    assert r.step_time == 42.0
    assert r.peak_memory.tolist() == [[6.0]]  # both slices in flight after the second forward


def test_two_stage_1f1b_known_bubble():
    # pp=2, two equal packs of 2 tokens, 2 layers -> per stage F = 1 s, B = 2 s.
    # stage 0: F0 F1 B0 B1   stage 1: F0 B0 F1 B1
    # S0F0 [0,1] S0F1 [1,2] S1F0 [1,2] S1B0 [2,4] S1F1 [4,5] S0B0 [4,6] S1B1 [5,7] S0B1 [7,9]
    plan = whole_doc_plan([[[2], [2]]], mode="lockstep")
    r = simulate_step(plan, linear_cost(layers=2), Layout(dp=1, pp=2, context=128), NO_LATENCY)
    assert r.step_time == pytest.approx(9.0)
    assert r.work == 12.0
    assert r.bubble == pytest.approx(1 / 3)  # (p - 1) / (m + p - 1) for equal packs
    assert r.lower_bound == pytest.approx((12 + 3) / 2)  # stage 1 waits >= F + B of stage 0
    assert r.busy.tolist() == [[6.0], [6.0]]
    assert r.peak_memory.tolist() == [[2.0], [1.0]]  # stage 0 holds both packs (1 byte each)


def test_stage_orders_are_megatron_1f1b():
    order = (("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3))
    s0 = stage_ops("1f1b", order, 0, 3)
    assert [f"{k}{i}" for k, _c, i in s0] == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
    s2 = stage_ops("1f1b", order, 2, 3)
    assert [f"{k}{i}" for k, _c, i in s2] == [f"{k}{i}" for k, i in order]


def test_interleaved_orders_megatron():
    # pp=2, v=2, 4 packs; device 0 holds chunks 0 and 2; warm-up (2-0-1)*2 + (2-1)*2 = 4
    order = tuple(x for i in range(4) for x in (("F", i), ("B", i)))
    ops = stage_ops("interleaved", order, 0, 2, 2)
    got = [f"{k}{c}.{i}" for k, c, i in ops]
    assert got[:4] == ["F0.0", "F0.1", "F2.0", "F2.1"]
    assert got[4:6] == ["F0.2", "B2.0"]
    assert sorted(got) == sorted(
        [f"F{c}.{i}" for c in (0, 2) for i in range(4)]
        + [f"B{c}.{i}" for c in (0, 2) for i in range(4)]
    )


def test_interleaved_beats_1f1b_bubble():
    plan = whole_doc_plan([[[2]] * 4], mode="lockstep")
    lay = Layout(dp=1, pp=2, context=128)
    plain = simulate_step(plan, linear_cost(layers=4), lay, NO_LATENCY)
    inter = simulate_step(
        plan,
        linear_cost(layers=4),
        lay,
        SimConfig(
            schedule="interleaved", virtual_stages=2, interconnect=Interconnect(latency_s=0.0)
        ),
    )
    assert plain.step_time == pytest.approx(15.0)  # (m + p - 1) * (F + B) = 5 * 3
    assert inter.step_time < plain.step_time
    assert inter.work == plain.work == 24.0
    assert inter.lower_bound <= inter.step_time


def test_merge_group_members_leave_together():
    # slices [0,2) on rank 0 (pairs 3) and [2,4) on rank 1 (pairs 2*2 + 3 = 7), att = 1 s/pair
    # F: rank 0 2+3 = 5, rank 1 2+7 = 9 -> both leave at 9; B: 4+6 = 10, 4+14 = 18 -> 27
    plan = merge_plan()
    r = simulate_step(
        plan, linear_cost(att_f=1.0, att_b=2.0), Layout(dp=2, context=128), NO_LATENCY
    )
    # first the members gather the document's token ids and loss masks: 2 ranks x 2 rows x
    # 2 tokens x 8 bytes = 64 bytes, of which each moves half at 450 GB/s
    exchange = 32 / 450e9
    assert r.step_time == pytest.approx(27.0 + exchange, rel=0, abs=1e-13)
    assert r.busy.tolist() == [[15.0, 27.0]]
    assert r.lower_bound == 21.0


def test_merge_kv_exchange_is_exposed():
    cost = linear_cost(att_f=1.0, att_b=2.0)
    cost = type(cost)(**{**cost.to_dict(), "kv_bytes_per_token": 1e9})  # 1 GB per token
    net = Interconnect(intra_node_gbps=1.0, latency_s=0.0)  # 1 GB/s
    cfg = SimConfig(interconnect=net, cp_overlap=0.0)  # nothing hides the exchange
    r = simulate_step(merge_plan(), cost, Layout(dp=2, context=128), cfg)
    # all-gather of 4 GB over 2 ranks moves half: 2 s in forward; the backward gathers again
    # and reduce-scatters the gradients: 4 s. F: 2 + 9 = 11, B: 4 + 18 = 22
    assert r.step_time == pytest.approx(33.0)
    # and first the document's ids and loss masks: 2 ranks x 2 rows x 2 tokens x 8 bytes,
    # half of the 64 bytes moved: 32 ns
    tokens = 32e-9
    np.testing.assert_allclose(r.comm, [[6.0 + tokens, 6.0 + tokens]], rtol=0, atol=1e-15)
    # the gathered K/V (4 GB) is held during the forward, K/V and grads (8 GB) during the
    # backward, on top of the member's own 2 tokens: 2 bytes of activations, 2 GB of K/V
    assert r.peak_memory.max() == pytest.approx(8e9 + 2e9 + 2)


def test_merge_kv_exchange_hides_behind_attention():
    cost = linear_cost(att_f=1.0, att_b=2.0)
    cost = type(cost)(**{**cost.to_dict(), "kv_bytes_per_token": 1e9})
    net = Interconnect(intra_node_gbps=1.0, latency_s=0.0)
    r = simulate_step(merge_plan(), cost, Layout(dp=2, context=128), SimConfig(interconnect=net))
    # up to (k - 1) / k = 1/2 of a member's attention hides its exchange: rank 0 (attention
    # 3 s F, 6 s B) exposes 2 - 1.5 = 0.5 s and 4 - 3 = 1 s; rank 1 (7 s, 14 s) exposes none.
    # F: max(0.5 + 5, 9) = 9, B: max(1 + 10, 18) = 18 -> 27, as without any exchange
    assert r.step_time == pytest.approx(27.0)
    tokens = 32e-9  # the ids and loss masks exchanged first (as above), exposed on both
    np.testing.assert_allclose(r.comm, [[1.5 + tokens, tokens]], rtol=0, atol=1e-15)


def test_fsdp_lockstep_sums_packwise_maxima():
    # rank 0 packs 1 and 3 tokens, rank 1 packs 3 and 1 -> DDP: each rank 4 F + 8 B = 12
    # FSDP: F max(1,3) + max(3,1) = 6, B 6 + 6 = 12 -> 18
    plan = whole_doc_plan([[[1], [3]], [[3], [1]]], mode="lockstep")
    lay = Layout(dp=2, context=128)
    ddp = simulate_step(plan, linear_cost(), lay, NO_LATENCY)
    fsdp = simulate_step(
        plan,
        linear_cost(),
        lay,
        SimConfig(parallelism="fsdp", interconnect=Interconnect(latency_s=0.0)),
    )
    assert ddp.step_time == 12.0
    assert fsdp.step_time == 18.0
    assert fsdp.lower_bound == ddp.lower_bound == 12.0


def test_fsdp_comm_longer_than_compute_is_exposed():
    # 1e9 params * 2 bytes = 2 GB; all-gather over 2 ranks at 1 GB/s = 1 s per forward pack,
    # 2 s per backward pack (re-gather + reduce-scatter); compute 1 s F and 2 s B per pack
    plan = whole_doc_plan([[[1]], [[1]]], mode="lockstep")
    net = Interconnect(intra_node_gbps=1.0, latency_s=0.0)
    r = simulate_step(
        plan,
        linear_cost(fwd=0.5, bwd=1.0, params=10**9),
        Layout(dp=2, context=128),
        SimConfig(parallelism="fsdp", interconnect=net),
    )
    assert r.step_time == pytest.approx(1.0 + 2.0)
    off = simulate_step(
        plan,
        linear_cost(fwd=0.5, bwd=1.0, params=10**9),
        Layout(dp=2, context=128),
        SimConfig(parallelism="fsdp", interconnect=net, overlap_param_comm=False),
    )
    assert off.step_time == pytest.approx(0.5 + 1 + 1 + 2)


def test_ddp_all_reduce_overlaps_last_backward():
    # 2 GB of gradients, ring all-reduce over 2 ranks at 1 GB/s: 2 * 2 * 1/2 = 2 s.
    # rank 0: F 1, B 2 (last B starts at 1); rank 1: F 3, B 6 (starts at 3) -> ends max(9, 3 + 2)
    plan = whole_doc_plan([[[1]], [[3]]])
    net = Interconnect(intra_node_gbps=1.0, latency_s=0.0)
    cost = linear_cost(params=10**9)
    r = simulate_step(plan, cost, Layout(dp=2, context=128), SimConfig(interconnect=net))
    assert r.step_time == pytest.approx(9.0)
    slow = simulate_step(
        plan,
        linear_cost(fwd=0.1, bwd=0.2, params=10**9),
        Layout(dp=2, context=128),
        SimConfig(interconnect=net),
    )
    assert slow.step_time == pytest.approx(
        0.3 + 2.0
    )  # last B starts at 0.3, then 2 s of all-reduce
    exposed = simulate_step(
        plan, cost, Layout(dp=2, context=128), SimConfig(interconnect=net, overlap_param_comm=False)
    )
    assert exposed.step_time == pytest.approx(11.0)
    assert exposed.comm.tolist() == [[2.0, 2.0]]


def test_inter_node_groups_use_inter_node_bandwidth():
    plan = whole_doc_plan([[[1]], [[1]]])
    net = Interconnect(intra_node_gbps=4.0, inter_node_gbps=1.0, latency_s=0.0)
    kw = dict(parallelism="ddp", overlap_param_comm=False, interconnect=net)
    intra = simulate_step(
        plan,
        linear_cost(params=10**9),
        Layout(dp=2, context=128, ranks_per_node=8),
        SimConfig(**kw),
    )
    inter = simulate_step(
        plan,
        linear_cost(params=10**9),
        Layout(dp=2, context=128, ranks_per_node=1),
        SimConfig(**kw),
    )
    assert intra.step_time == pytest.approx(3 + 0.5)
    assert inter.step_time == pytest.approx(3 + 2.0)


def test_pipeline_p2p_lag():
    # one pack of 1 token, 2 stages of 1 layer each; hidden=1, dtype 2 bytes -> 2 bytes at 1 GB/s
    plan = whole_doc_plan([[[1]]], mode="lockstep")
    net = Interconnect(intra_node_gbps=1e-9, latency_s=0.0)  # 1 byte/s
    r = simulate_step(
        plan, linear_cost(layers=2), Layout(dp=1, pp=2, context=128), SimConfig(interconnect=net)
    )
    # S0F [0,.5] send 2 s, S1F [2.5,3], S1B [3,4], send 2 s, S0B [6,7]
    assert r.step_time == pytest.approx(7.0)
    assert r.lower_bound <= r.step_time


def test_pipeline_lag_is_the_programs_send(monkeypatch):
    # the setting of test_pipeline_p2p_lag with the execution model's hidden states doubled
    # (4 bytes a send): the simulator times the program's send ops, 4 s each way
    # S0F [0,.5] send 4 s, S1F [4.5,5], S1B [5,6], send 4 s, S0B [10,11]
    hidden_bytes = execution_program._Builder.hidden_bytes
    monkeypatch.setattr(
        execution_program._Builder,
        "hidden_bytes",
        lambda self, kind, k: 2 * hidden_bytes(self, kind, k),
    )
    plan = whole_doc_plan([[[1]]], mode="lockstep")
    net = Interconnect(intra_node_gbps=1e-9, latency_s=0.0)
    r = simulate_step(
        plan, linear_cost(layers=2), Layout(dp=1, pp=2, context=128), SimConfig(interconnect=net)
    )
    assert r.step_time == pytest.approx(11.0)


def test_layout_dp_must_match():
    with pytest.raises(PlanError, match="dp=3"):
        simulate_step(whole_doc_plan([[[1]]]), linear_cost(), Layout(dp=3, context=128))


def test_chunk_fractions():
    assert chunk_fractions(10, 4).tolist() == [0.3, 0.3, 0.2, 0.2]
    assert chunk_fractions(1, 4).tolist() == [0.25] * 4
    assert np.isclose(chunk_fractions(32, 8).sum(), 1.0)


def test_empty_rank_and_single_item_edges():
    # one rank with nothing to do next to a rank with one doc: no crash, imbalance = n
    docs = (Document(doc_id=0, length=4),)
    p = MicroPack((Slice(0, 0, 4),))
    plan = StepPlan(
        step=0,
        strategy="t",
        docs=docs,
        ranks=(
            RankStep(rank=0, forward=(p,), backward=(p,)),
            RankStep(rank=1, forward=(), backward=()),
        ),
    ).validate()
    r = simulate_step(plan, linear_cost(), Layout(dp=2, context=128))
    assert r.step_time == 12.0
    assert r.imbalance == 2.0
    assert r.busy.tolist() == [[12.0, 0.0]]


def test_lower_bound_ignores_empty_packs():
    # pp=2, a 2-token pack and an empty one (lockstep padding); 2 layers -> per stage F 1, B 2.
    # S0F0 [0,1] S1F0 [1,2] S1B0 [2,4] S0B0 [4,6]: step 6. Stage 1 waits >= F + B of stage 0
    # on the smallest *non-empty* pack: bound (6 + 3) / 2 (the empty pack would give 6 / 2).
    plan = whole_doc_plan([[[2], []]], mode="lockstep")
    r = simulate_step(plan, linear_cost(layers=2), Layout(dp=1, pp=2, context=128), NO_LATENCY)
    assert r.step_time == pytest.approx(6.0)
    assert r.lower_bound == pytest.approx(4.5)


def test_merge_exchange_of_uneven_shares_is_what_the_runtime_moves():
    # a 5-token document merged over 2 ranks, shares 2 ([0, 2)) and 3 ([2, 5)); the runtime
    # pads every share to 3, so each collective moves 2 * 3 = 6 tokens' K/V: 6 GB per layer
    # (1 layer, 1 GB/token); over 2 ranks at 1 GB/s a ring collective takes 6 * 1/2 = 3 s.
    # F: 1 all-gather; B: 1 re-gather and 1 reduce-scatter, under every recompute policy
    # (with recompute=full the layer's recomputation is the re-gather: what the runtime
    # issues, recorded in tests/hooks/test_hooks_execution.py).
    plan = merge_plan(length=5, cut=2)
    assert merge_layer_tokens(plan, 0) == 6
    cost = linear_cost()  # F 1 s, B 2 s per token, no attention (nothing hides)
    cost = type(cost)(**{**cost.to_dict(), "kv_bytes_per_token": 1e9})
    cfg = SimConfig(interconnect=Interconnect(intra_node_gbps=1.0, latency_s=0.0))
    r = simulate_step(plan, cost, Layout(dp=2, context=128), cfg)
    # F max(2, 3) + 3 = 6, B max(4, 6) + 6 = 12; first the ids and loss masks: 2 ranks x 2
    # rows x 3 tokens (the larger share) x 8 bytes, half of the 96 bytes moved: 48 ns
    tokens = 48e-9
    np.testing.assert_allclose(r.comm, [[9.0 + tokens] * 2], rtol=0, atol=1e-15)
    assert r.step_time == pytest.approx(18.0)
    full = type(cost)(**{**cost.to_dict(), "recompute": "full"})
    r = simulate_step(plan, full, Layout(dp=2, context=128), cfg)
    np.testing.assert_allclose(r.comm, [[9.0 + tokens] * 2], rtol=0, atol=1e-15)
    assert r.step_time == pytest.approx(18.0)


def test_merge_exchange_is_the_programs_collectives(monkeypatch):
    # the setting of test_merge_exchange_of_uneven_shares_is_what_the_runtime_moves with an
    # execution model that gathers twice the tokens (12 GB a collective, 6 s over 2 ranks)
    # and issues one gather more per layer in the backward (F 1, B 3 collectives): the
    # simulator times the program's merge_kv ops. F max(2, 3) + 6 = 9, B max(4, 6) + 18 = 24
    monkeypatch.setattr(
        execution_program,
        "merge_layer_tokens",
        lambda plan, g, cp=1: 2 * merge_layer_tokens(plan, g, cp),
    )
    monkeypatch.setattr(
        execution_program,
        "merge_collectives",
        lambda kind, recomputed=False: 1 if kind == "F" else 3,
    )
    plan = merge_plan(length=5, cut=2)
    cost = linear_cost()
    cost = type(cost)(**{**cost.to_dict(), "kv_bytes_per_token": 1e9})
    cfg = SimConfig(interconnect=Interconnect(intra_node_gbps=1.0, latency_s=0.0))
    r = simulate_step(plan, cost, Layout(dp=2, context=128), cfg)
    tokens = 48e-9  # the ids and loss masks exchanged first (as above)
    np.testing.assert_allclose(r.comm, [[24.0 + tokens] * 2], rtol=0, atol=1e-15)
    assert r.step_time == pytest.approx(33.0)


def test_merge_on_static_cp_rings_over_every_process_of_its_members():
    # an 8-token document merged over DP ranks 0 ([0, 4)) and 1 ([4, 8)), each a CP group
    # of 2 processes: every process holds 2 of its rank's 4 tokens (chunks of 1: member 0
    # [0,1) [3,4), member 1 [1,2) [2,3)), so each layer gathers 4 processes x 2 rows = 8
    # tokens, 8 GB. The ring has 4 processes: (4 - 1) / 4 * 8 GB at 1 GB/s = 6 s per
    # collective; F 1, B 2 (no attention hides any): 18 s. Compute per process: F 4 tokens
    # x 1 s / 2 = 2 s, B 4 s: step 2 + 6 + 4 + 12 = 24 s.
    plan = merge_plan(length=8, cut=4)
    assert merge_layer_tokens(plan, 0, 2) == 8
    cost = linear_cost()
    cost = type(cost)(**{**cost.to_dict(), "kv_bytes_per_token": 1e9})
    cfg = SimConfig(cp=2, interconnect=Interconnect(intra_node_gbps=1.0, latency_s=0.0))
    r = simulate_step(plan, cost, Layout(dp=4, context=128), cfg)
    # first the ids and loss masks: 4 processes x 2 rows x 4 tokens (a rank's whole slices)
    # x 8 bytes, of which (4 - 1) / 4 of the 256 bytes moved: 192 ns
    tokens = 192e-9
    np.testing.assert_allclose(r.comm, [[18.0 + tokens] * 4], rtol=0, atol=1e-15)
    assert r.step_time == pytest.approx(24.0)


def test_merge_on_static_cp_hides_behind_the_priced_attention_of_a_process():
    # a 6-token document merged over DP ranks 0 ([0, 3)) and 1 ([3, 6)) on static CP 2: each
    # 3-token slice is padded to 4 (chunks of 1), a process computes half of the padded
    # slice's causal pairs ([0, 4): 10, [3, 7): 22), at 1 s/pair F and 2 s/pair B: attention
    # 5 s and 11 s F, 10 s and 22 s B (the execution model's price of the pack, the part
    # that hides the exchange; half the unpadded pairs, 3 s and 7.5 s, hid it before). Each
    # layer gathers 4 processes x 2 rows = 8 tokens, 8 GB: (4 - 1) / 4 x 8 GB at 1 GB/s =
    # 6 s per collective, of which up to (4 - 1) / 4 of the attention hides. Rank 0: F
    # 6 - 3.75 = 2.25 s, B 12 - 7.5 = 4.5 s exposed; rank 1 none. Compute per process
    # (1 s/token F, 2 s/token B on 4 padded tokens, halved): F 2 + 5 = 7 s and 2 + 11 = 13 s,
    # B 14 s and 26 s; members leave together: F max(7 + 2.25, 13) = 13, B max(18.5, 26) = 26
    plan = merge_plan(length=6, cut=3)
    assert merge_layer_tokens(plan, 0, 2) == 8
    cost = linear_cost(att_f=1.0, att_b=2.0)
    cost = type(cost)(**{**cost.to_dict(), "kv_bytes_per_token": 1e9})
    cfg = SimConfig(cp=2, interconnect=Interconnect(intra_node_gbps=1.0, latency_s=0.0))
    r = simulate_step(plan, cost, Layout(dp=4, context=128), cfg)
    # and, exposed on every process, the ids and loss masks exchanged first: 4 processes x 2
    # rows x 3 tokens x 8 bytes, (4 - 1) / 4 of the 192 bytes moved: 144 ns
    tokens = 144e-9
    want = [[6.75 + tokens, 6.75 + tokens, tokens, tokens]]
    np.testing.assert_allclose(r.comm, want, rtol=0, atol=1e-15)
    assert r.step_time == pytest.approx(39.0)


def test_interleaved_runs_a_lagged_plan_without_serialising_round_trips():
    # 16 equal packs on pp=4 stages whose backward pack j waits for forward pack j + 8 (a lag,
    # as slimpack's lockstep plans have): interleaved still has the smaller bubble, and its
    # first backward on stage 0 comes after Megatron's warm-up plus the lag's forward ops
    lagged = whole_doc_plan([[[2]] * 16], mode="lockstep")
    order = interleaved_order(16, 16, 8)
    plan = dataclasses.replace(
        lagged, ranks=(dataclasses.replace(lagged.ranks[0], order=order),)
    ).validate()
    lay = Layout(dp=1, pp=4, context=128)
    cost = linear_cost(layers=8)
    plain = simulate_step(plan, cost, lay, NO_LATENCY)
    inter = simulate_step(
        plan,
        cost,
        lay,
        SimConfig(
            schedule="interleaved", virtual_stages=2, interconnect=Interconnect(latency_s=0.0)
        ),
    )
    assert inter.work == plain.work
    assert inter.step_time < plain.step_time
    ops = stage_ops("interleaved", order, 0, 4, 2)
    first_backward = next(i for i, (k, _c, _j) in enumerate(ops) if k == "B")
    # Megatron runs warm-up + 1 forward ops before the first backward: (4 - 0 - 1) * 2 +
    # (2 - 1) * 4 + 1 = 11 on stage 0; the lag of 8 packs adds their ops on 2 chunks, 16
    assert first_backward == 11 + 16

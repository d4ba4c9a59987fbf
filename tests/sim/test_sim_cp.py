"""Static context parallelism: hand-computed packs, cp=1 identity, invariants."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_helpers import kv_cost, linear_cost, whole_doc_plan
from test_sim_properties import random_plan

from slimdata.cost import CostModel, Interconnect
from slimdata.errors import ConfigError, PlanError
from slimdata.plan import Document, MicroPack, RankStep, Slice, StepPlan
from slimdata.sim import SimConfig, simulate_step
from slimdata.sim.cp import cp_peak_memory, real_devices
from slimdata.solver.layout import Layout

NET = Interconnect(intra_node_gbps=1.0, inter_node_gbps=0.5, latency_s=0.0)  # 1 GB/s, 0.5 GB/s


def test_one_pack_cp2_known_time():
    # members compute F 10/2 = 5 s, B 20/2 = 10 s.
    # F: gather 4 GB over 2 ranks -> 2 GB at 1 GB/s = 2 s; hidden (k-1)/k * 1 s attention = 0.5
    #    -> 1.5 s exposed.  B: gather + reduce-scatter = 4 s; hidden 1/2 * 2 s = 1 s -> 3 s.
    plan = whole_doc_plan([[[4]]])
    r = simulate_step(plan, kv_cost(), Layout(dp=2, context=128), SimConfig(cp=2, interconnect=NET))
    assert r.step_time == pytest.approx(5 + 1.5 + 10 + 3)
    assert r.cp == 2
    assert r.busy.tolist() == [[15.0, 15.0]]  # both members of the one CP group
    assert r.work == 30.0
    assert r.lower_bound == 15.0
    assert r.comm.tolist() == [[4.5, 4.5]]
    # 4 bytes of activations and 4 GB of retained K/V, both / 2, plus the gathered layer
    # K/V: 4 GB in F, 8 GB (+ grads) in B
    assert r.peak_memory.tolist() == [[2 + 2e9 + 8e9, 2 + 2e9 + 8e9]]
    assert sorted(set(r.timeline["device"].tolist())) == [0, 1]


def test_full_recompute_regathers_once_per_layer():
    # recompute="full": the layer's recomputation re-gathers (the attention inside it is not
    # checkpointed again), so B still runs 2 collectives, 4 s, 1 s hidden -> 3 s exposed, as
    # without recompute; retained K/V (4 GB, halved: 2 GB) is held from F to B on top of the
    # gathered buffers.
    plan = whole_doc_plan([[[4]]])
    r = simulate_step(
        plan, kv_cost("full"), Layout(dp=2, context=128), SimConfig(cp=2, interconnect=NET)
    )
    assert r.step_time == pytest.approx(5 + 1.5 + 10 + 3)
    assert r.peak_memory.max() == pytest.approx(2 + 2e9 + 8e9)


def test_a_recomputed_pack_pays_a_third_backward_gather():
    # doc 0 [0,4) and doc 1 [0,4) in one forward pack, backward packs [d1] then [d0]: not a
    # union, so with asymmetric="recompute" the forward runs graph-free and each backward
    # pack re-runs its forward (one gather) before its gather and reduce-scatter.
    # Linear only (1 s/token F, 2 s B), 1 GB of K/V per token, no attention to hide behind.
    # Graph-free F: 8 tokens / 2 members = 4 s (graph_free_scale 1); its one call gathers
    # 2 x 4 rows = 8 GB -> (1/2) * 8 GB at 1 GB/s = 4 s. Each B: forward 4 / 2 = 2 s and
    # backward 8 / 2 = 4 s of compute, 3 collectives of 4 GB = 3 * 2 s = 6 s: 12 s.
    docs = (Document(0, 4), Document(1, 4))
    a, b = Slice(0, 0, 4), Slice(1, 0, 4)
    rs = RankStep(0, (MicroPack((a, b)),), (MicroPack((b,)), MicroPack((a,))))
    plan = StepPlan(0, "test", docs, (rs,)).validate()
    c = CostModel(**{**linear_cost().to_dict(), "kv_bytes_per_token": 1e9})
    cfg = SimConfig(cp=2, interconnect=NET, asymmetric="recompute")
    r = simulate_step(plan, c, Layout(dp=2, context=128), cfg)
    assert r.step_time == pytest.approx(4 + 4 + 2 * 12)


def test_static_cp_exchanges_the_continuation_prefix():
    # doc 0 of 7 tokens cut [0,4) [4,7) over two forward packs, backward packs mirrored;
    # cp=2, 1 layer, linear only (1 s/token F, 2 s B), 1 GB of K/V per token, 1 GB/s, so
    # every collective of g gathered tokens costs (1/2) * g s and nothing hides it.
    # members' rows: [0,4) chunks of 1: member 0 [0,1) [3,4), member 1 [1,3) -> 2 and 2;
    # [4,7) chunks of 1: member 0 [4,5), member 1 [5,7) -> 1 and 2.
    # F0 gathers [0,4): 2 x 2 = 4 tokens -> 2 s; F1 gathers its prefix [0,4) and [4,7):
    # member 0 3 rows, member 1 4 -> 2 x 4 = 8 tokens -> 4 s (the slice alone, padded to
    # 2 * cp, would be 4 tokens). B of [4,7): gather + reduce-scatter of 8 -> 8 s; B of
    # [0,4): 2 x 2 s = 4 s. Compute per member: F 4 / 2 = 2 s, F 3 padded to 4 / 2 = 2 s,
    # B 4 s and 4 s.
    docs = (Document(0, 7),)
    s0, s1 = Slice(0, 0, 4), Slice(0, 4, 7)
    rs = RankStep(0, (MicroPack((s0,)), MicroPack((s1,))), (MicroPack((s1,)), MicroPack((s0,))))
    plan = StepPlan(0, "test", docs, (rs,)).validate()
    c = CostModel(**{**linear_cost().to_dict(), "kv_bytes_per_token": 1e9})
    r = simulate_step(plan, c, Layout(dp=2, context=128), SimConfig(cp=2, interconnect=NET))
    assert r.step_time == pytest.approx((2 + 2 + 4 + 4) + (2 + 4 + 8 + 4))
    assert r.comm.tolist() == [[pytest.approx(18.0)] * 2]
    # the gathered layer K/V held: F1's 8 GB, twice in B of [4,7) (with gradients): 16 GB
    # on top of half the slices' 7 bytes of activations and 7 GB of K/V
    assert r.peak_memory.max() == pytest.approx(3.5 + 3.5e9 + 16e9)


def test_inter_node_cp_group_and_overlap_off():
    plan = whole_doc_plan([[[4]]])
    lay = Layout(dp=2, context=128, ranks_per_node=1)  # the 2 members sit on 2 nodes
    # F gather 2 GB at 0.5 GB/s = 4 s, 0.5 hidden -> 3.5; B 8 s, 1 hidden -> 7
    r = simulate_step(plan, kv_cost(), lay, SimConfig(cp=2, interconnect=NET))
    assert r.step_time == pytest.approx(5 + 3.5 + 10 + 7)
    # no overlap: everything exposed, 4 + 8
    r0 = simulate_step(plan, kv_cost(), lay, SimConfig(cp=2, interconnect=NET, cp_overlap=0.0))
    assert r0.step_time == pytest.approx(5 + 4 + 10 + 8)


def test_attention_longer_than_exchange_hides_it():
    # 1 byte of K/V per token: a 2-byte gather is negligible next to the attention
    c = kv_cost()
    c = CostModel(**{**c.to_dict(), "kv_bytes_per_token": 1.0})
    net = Interconnect(intra_node_gbps=1.0, latency_s=0.0)
    r = simulate_step(
        whole_doc_plan([[[4]]]), c, Layout(dp=2, context=128), SimConfig(cp=2, interconnect=net)
    )
    assert r.step_time == pytest.approx(15.0)  # compute / 2, nothing exposed
    assert r.comm_time == 0.0


def test_cp1_is_the_plain_model():
    plan = whole_doc_plan([[[3], [5]], [[4]]])
    lay = Layout(dp=2, context=128)
    a = simulate_step(plan, kv_cost(params=10**9), lay, SimConfig(interconnect=NET))
    b = simulate_step(plan, kv_cost(params=10**9), lay, SimConfig(interconnect=NET, cp=1))
    assert a.step_time == b.step_time
    assert a.busy.tolist() == b.busy.tolist()
    # hand-computed: rank 0 packs 3 (F 6+1.2, B 12+2.4) and 5 (F 10+3, B 20+6); rank 1: 4 (10, 20)
    assert a.busy.tolist() == [[pytest.approx(7.2 + 14.4 + 13 + 26), 30.0]]
    assert a.step_time == pytest.approx(7.2 + 14.4 + 13 + 26)  # all-reduce hides in the last B


def test_ddp_all_reduce_spans_all_cp_devices():
    # one DP group of 2 CP members still all-reduces gradients over both devices:
    # 2 GB, ring over 2 at 1 GB/s = 2 s, streamed during the last backward -> ends at
    # max(B end, B start + 2). Without CP (dp=1) there is no all-reduce at all.
    plan = whole_doc_plan([[[4]]])
    c = kv_cost(params=10**9)
    c = CostModel(**{**c.to_dict(), "kv_bytes_per_token": 0.0})
    r = simulate_step(plan, c, Layout(dp=2, context=128), SimConfig(cp=2, interconnect=NET))
    assert r.step_time == pytest.approx(15.0)  # B [5, 15] hides the 2 s
    slow = simulate_step(
        plan,
        c,
        Layout(dp=2, context=128),
        SimConfig(cp=2, interconnect=NET, overlap_param_comm=False),
    )
    assert slow.step_time == pytest.approx(17.0)


def test_layout_must_hold_dp_times_cp_devices():
    with pytest.raises(PlanError, match="cp=2"):
        simulate_step(
            whole_doc_plan([[[4]]]), kv_cost(), Layout(dp=1, context=128), SimConfig(cp=2)
        )
    with pytest.raises(ConfigError, match="cp=0"):
        SimConfig(cp=0)
    with pytest.raises(ConfigError, match="cp_overlap"):
        SimConfig(cp_overlap=1.5)


def test_real_devices_and_cp_peak_memory():
    assert real_devices([1], 2, 4) == [4, 5, 6, 7]
    assert real_devices([2, 3], 2, 2) == [4, 5, 6, 7]  # stage 1 of 2 groups x 2
    assert real_devices([0, 1], 2, 1) == [0, 1]
    plan = whole_doc_plan([[[4]]])
    c = linear_cost()
    c = CostModel(**{**c.to_dict(), "kv_bytes_per_token": 2.0})
    # one rule: 4 act + 4 * 2 K/V = 12 bytes; cp=2: half of it (6) + the backward pass's
    # gathered one-layer K/V and their gradients, 2 * (2 * 4) = 16: 22
    assert cp_peak_memory(plan, c, 1).tolist() == [12.0]
    assert cp_peak_memory(plan, c, 2).tolist() == [22.0]


def test_cp_pipeline_sends_a_share_of_the_hidden_states():
    # 1 token, 2 stages of 1 layer; hidden 1, 2 bytes -> 2 bytes; cp=2 sends 1 byte at 1 B/s
    plan = whole_doc_plan([[[1]]], mode="lockstep")
    c = linear_cost(layers=2)
    net = Interconnect(intra_node_gbps=1e-9, latency_s=0.0)
    r = simulate_step(plan, c, Layout(dp=2, pp=2, context=128), SimConfig(cp=2, interconnect=net))
    # the token is padded to 2 * cp = 4 (2 per member, computed), the send carries the real
    # token's share: S0F 2 tokens * 1 s * 1/2 layers = [0,1], send 1 s, S1F [2,3], S1B [3,5],
    # send 1 s, S0B [6,8]
    assert r.step_time == pytest.approx(8.0)
    assert r.busy.shape == (2, 2)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 10**6),
    st.integers(1, 3),
    st.booleans(),
    st.integers(1, 3),
    st.sampled_from([2, 4]),
    st.sampled_from(["ddp", "fsdp"]),
)
def test_cp_invariants(seed, dp, merge, pp, cp, par):
    plan = random_plan(seed, dp, merge)
    cost = CostModel(
        **{
            **linear_cost(att_f=0.01, att_b=0.03, layers=6, params=1000).to_dict(),
            "kv_bytes_per_token": 1e3,
        }
    )
    net = Interconnect(latency_s=0.01, intra_node_gbps=1e-6, inter_node_gbps=1e-7)
    lay = Layout(dp=dp * cp, pp=pp, ranks_per_node=4, context=128)
    runs = [
        simulate_step(
            plan, cost, lay, SimConfig(cp=cp, parallelism=par, interconnect=net, cp_overlap=o)
        )
        for o in (1.0, 0.0)
    ]
    for r in runs:
        assert r.lower_bound <= r.step_time * (1 + 1e-12)
        assert r.busy.shape == (pp, dp * cp)
        assert r.work == pytest.approx(r.busy.sum())
    assert runs[1].step_time >= runs[0].step_time * (1 - 1e-12)  # less overlap never helps

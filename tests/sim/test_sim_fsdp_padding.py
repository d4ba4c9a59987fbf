"""FSDP padding packs are timed as the executor runs them (one-token dummy calls) and a pack
empty on every rank costs nothing (no call, no collective)."""

from __future__ import annotations

import pytest
from sim_helpers import linear_cost

from slimdata.cost import Interconnect
from slimdata.execution import pack_times
from slimdata.plan import Document, MicroPack, RankStep, Slice, StepPlan
from slimdata.sim import SimConfig, simulate_step
from slimdata.solver.layout import Layout

NET = Interconnect(intra_node_gbps=1.0, latency_s=0.0)


def lockstep(per_rank: list[list[list[int]]], lengths: list[int]) -> StepPlan:
    """``per_rank[r][i]``: documents (whole, one slice each) of rank r's pack i; backward
    packs mirror forward packs; order F0 B0 F1 B1 ... on every rank."""
    docs = tuple(Document(doc_id=i, length=n) for i, n in enumerate(lengths))
    ranks = []
    for r, packs in enumerate(per_rank):
        fwd = tuple(MicroPack(tuple(Slice(d, 0, lengths[d]) for d in p)) for p in packs)
        order = tuple(x for i in range(len(packs)) for x in (("F", i), ("B", i)))
        ranks.append(RankStep(rank=r, forward=fwd, backward=fwd, order=order))
    return StepPlan(
        step=0, strategy="t", docs=tuple(docs), ranks=tuple(ranks), mode="lockstep"
    ).validate()


def test_padding_pack_runs_a_one_token_dummy_call():
    # pack 1 holds 2 tokens on rank 1 and is padding on rank 0: 1 dummy token there,
    # F 1 s, B 2 s (plus the pack constants 0.25 s and 0.5 s per call)
    plan = lockstep([[[0], []], [[1], [2]]], [3, 3, 2])
    cost = linear_cost(fwd=1.0, bwd=2.0)
    cost = type(cost)(**{**cost.to_dict(), "fwd_pack_const": 0.25, "bwd_pack_const": 0.5})
    pt = pack_times(plan, cost, lockstep=True)
    assert pt.f_calls.tolist() == [1, 1, 1, 1]
    assert pt.fwd.tolist() == [3.25, 1.25, 3.25, 2.25]
    assert pt.bwd.tolist() == [6.5, 2.5, 6.5, 4.5]
    free = pack_times(plan, cost)  # DDP: an empty pack makes no call
    assert free.fwd.tolist() == [3.25, 0.0, 3.25, 2.25]


def test_pack_empty_on_every_rank_pays_no_fsdp_collective():
    # 2 GB of parameters, all-gather over 2 ranks at 1 GB/s: 1 s per F, 2 s per B pack,
    # longer than the compute (F 0.5 s, B 1 s): 3 s per pack that runs. An idle pack 1 on
    # both ranks adds nothing.
    cost = linear_cost(fwd=0.5, bwd=1.0, params=10**9)
    lay, cfg = Layout(dp=2, context=128), SimConfig(parallelism="fsdp", interconnect=NET)
    one = simulate_step(lockstep([[[0]], [[1]]], [1, 1]), cost, lay, cfg)
    idle = simulate_step(lockstep([[[0], []], [[1], []]], [1, 1]), cost, lay, cfg)
    assert one.step_time == pytest.approx(3.0)
    assert idle.step_time == pytest.approx(3.0)

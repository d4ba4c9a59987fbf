"""Invariants on random valid plans: no deadlock, lower bound <= simulated time, and more
work never shortens the step."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_helpers import linear_cost

from slimdata.cost import Interconnect
from slimdata.plan import Document, MergeGroup, MicroPack, RankStep, Slice, StepPlan
from slimdata.sim import SimConfig, simulate_step
from slimdata.solver.layout import Layout


def random_plan(seed: int, dp: int, with_merge: bool) -> StepPlan:
    rng = random.Random(seed)
    n_docs = rng.randint(1, 7)
    docs, per_rank = [], [[] for _ in range(dp)]
    merged = with_merge and dp >= 2
    for d in range(n_docs):
        n = rng.randint(1, 40)
        cuts = sorted({0, n, *(rng.randint(1, n - 1) for _ in range(rng.randint(0, 3)) if n > 1)})
        docs.append(Document(doc_id=d, length=n, cuts=tuple(cuts)))
        slices = [Slice(d, a, b) for a, b in itertools.pairwise(cuts)]
        if merged and d == 0:
            continue
        per_rank[rng.randrange(dp)].extend(slices)
    merge_slices: dict[int, list[Slice]] = {0: [], 1: []}
    if merged:
        for k, (a, b) in enumerate(zip(docs[0].cuts, docs[0].cuts[1:], strict=False)):
            merge_slices[k % 2].append(Slice(0, a, b))
    ranks = []
    for r in range(dp):
        seq = per_rank[r]
        fwd, bwd = _groups(seq, rng), _groups(list(reversed(seq)), rng)
        if merged and r in (0, 1) and merge_slices[r]:
            mp = MicroPack(tuple(merge_slices[r]), merge=0)
            fwd, bwd = [mp, *fwd], [mp, *bwd]
        ranks.append(RankStep(rank=r, forward=tuple(fwd), backward=tuple(bwd)))
    merges = (MergeGroup((0, 1), (0,)),) if merged and merge_slices[1] else ()
    if merged and not merge_slices[1]:  # a 1-slice doc cannot be shared: give it to rank 0 alone
        r0 = ranks[0]
        fwd = (MicroPack(r0.forward[0].slices), *r0.forward[1:])
        bwd = (MicroPack(r0.backward[0].slices), *r0.backward[1:])
        ranks[0] = RankStep(rank=0, forward=fwd, backward=bwd)
    return StepPlan(
        step=0, strategy="random", docs=tuple(docs), ranks=tuple(ranks), merges=merges
    ).validate()


def _groups(seq: list[Slice], rng: random.Random) -> list[MicroPack]:
    out, cur = [], []
    for s in seq:
        cur.append(s)
        if rng.random() < 0.5:
            out.append(MicroPack(tuple(cur)))
            cur = []
    if cur:
        out.append(MicroPack(tuple(cur)))
    return out


configs = st.builds(
    lambda par, sched, v, lat, ov, asym: SimConfig(
        parallelism=par,
        asymmetric=asym,
        schedule=sched,
        virtual_stages=v,
        interconnect=Interconnect(latency_s=lat, intra_node_gbps=1e-6, inter_node_gbps=1e-7),
        overlap_param_comm=ov,
    ),
    st.sampled_from(["ddp", "fsdp"]),
    st.sampled_from(["1f1b", "interleaved"]),
    st.integers(1, 3),
    st.sampled_from([0.0, 0.5]),
    st.booleans(),
    st.sampled_from(["split", "recompute"]),
)
cases = st.tuples(
    st.integers(0, 10**6),
    st.integers(1, 3),
    st.booleans(),
    st.integers(1, 3),
    st.integers(1, 4),
    configs,
)


def _sim(case, durations=None, cost=None):
    seed, dp, merge, pp, rpn, config = case
    plan = random_plan(seed, dp, merge)
    cost = cost or linear_cost(fwd=1.0, bwd=2.0, att_f=0.01, att_b=0.03, layers=6, params=1000)
    return plan, simulate_step(
        plan,
        cost,
        Layout(dp=dp, pp=pp, ranks_per_node=rpn, context=128),
        config,
        durations=durations,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_lower_bound_never_exceeds_step_time(case):
    _plan, r = _sim(case)
    assert r.step_time > 0
    assert r.lower_bound <= r.step_time * (1 + 1e-12)
    assert 0.0 <= r.bubble < 1.0
    assert r.imbalance >= 1.0 - 1e-12
    assert r.work == pytest.approx(r.busy.sum())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases, st.integers(0, 10**6))
def test_more_work_never_shortens_the_step(case, seed):
    plan, base = _sim(case)
    rng = random.Random(seed)
    pp = case[3]
    v = case[5].chunks_per_device if pp > 1 else 1
    # stretch a random subset of (chunk, rank, pass, pack) durations
    durations = {}
    stretched_work = 0.0
    from slimdata.execution import chunk_fractions, pack_times

    config = case[5]
    pt = pack_times(
        plan,
        linear_cost(fwd=1.0, bwd=2.0, att_f=0.01, att_b=0.03, layers=6, params=1000),
        lockstep=config.parallelism == "fsdp",
        split=config.split,
    )
    frac = chunk_fractions(6, pp * v)
    for rs in plan.ranks:
        for kind, packs, base_t, off in (
            ("F", rs.forward, pt.fwd, pt.f_offset),
            ("B", rs.backward, pt.bwd, pt.b_offset),
        ):
            for i in range(len(packs)):
                for c in range(pp * v):
                    if rng.random() < 0.3:
                        t = base_t[off[rs.rank] + i] * frac[c]
                        durations[(c, rs.rank, kind, i)] = t * rng.uniform(1.0, 3.0) + rng.uniform(
                            0, 1
                        )
                        stretched_work += durations[(c, rs.rank, kind, i)] - t
    _plan, more = _sim(case, durations=durations)
    assert more.step_time >= base.step_time * (1 - 1e-12)
    assert more.work == pytest.approx(base.work + stretched_work)


def test_random_plans_are_not_vacuous():
    # guard: the generator does produce merges, several packs and several ranks
    plans = [random_plan(s, 3, True) for s in range(50)]
    assert sum(bool(p.merges) for p in plans) > 10
    assert max(len(rs.forward) for p in plans for rs in p.ranks) >= 3
    assert any(len(rs.forward) != len(rs.backward) for p in plans for rs in p.ranks)

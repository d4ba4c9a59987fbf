"""The faithful ``wlb``: outlier delay queues and deferral over a stream of steps."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slimdata.errors import ConfigError
from slimdata.solver import Layout, solve
from slimdata.solver.strategies.wlb_queue import OutlierQueues, Waiting, WlbStream, tuned_thresholds

from .conftest import docs_of, unit_cost


def waiting(length: int, arrived: int = 0) -> Waiting:
    return Waiting(docs_of([length])[0], arrived, 3.0 * length)


def test_queue_of_thresholds():
    q = OutlierQueues([100, 200], n=3)
    assert [q.queue_of(x) for x in (1, 99, 100, 199, 200, 10**6)] == [-1, -1, 0, 0, 1, 1]
    with pytest.raises(ConfigError, match="increasing"):
        OutlierQueues([200, 100], n=3)


def test_queue_pops_n_at_a_time_in_fifo_order():
    q = OutlierQueues([100, 200], n=3)
    assert not q.push(waiting(50))  # not an outlier
    for x in (150, 110, 250):
        assert q.push(waiting(x))
    assert q.pop_full() == [] and len(q) == 3  # no queue holds 3 yet
    assert q.push(waiting(120))
    groups = q.pop_full()
    assert [[w.doc.length for w in g] for g in groups] == [[150, 110, 120]]  # queue 0, FIFO
    assert len(q) == 1  # 250 still waits in queue 1
    q.push(waiting(130))
    assert [w.doc.length for w in q.drain()] == [130, 250] and len(q) == 0


def test_tuned_thresholds_double_the_workload():
    # workload 3 s/token: mean micro-batch workload 300 s -> L_1 = 100, W(L_2) = 600 -> 200
    assert tuned_thresholds(unit_cost(), 300.0, 1000, queues=2) == [100, 200]
    assert tuned_thresholds(unit_cost(), 300.0, 150, queues=2) == [100]  # L_2 above the cap


def trained(plan) -> list[list[int]]:
    """Per rank, the document lengths of each forward pack."""
    return [[[plan.docs[s.doc].length for s in p.slices] for p in rs.forward] for rs in plan.ranks]


def test_wlb_stream_by_hand():
    # dp = 2, cap 128, one queue from 80 tokens; workload 3 s/token.
    # step 0: 290 tokens -> m = ceil(290 / 256) = 2, N = 4 micro-batches; 90 waits (1 of 4)
    lengths = [[90, 60, 50, 40, 30, 20], [100, 85, 70, 70, 70], [95, 120, 65, 64], [70, 60]]
    flat = docs_of([x for b in lengths for x in b])
    batches, i = [], 0
    for b in lengths:
        batches.append(flat[i : i + len(b)])
        i += len(b)
    s = WlbStream(Layout(dp=2, context=128), 0, unit_cost(), thresholds=[80])
    plans = [s.step(b, k) for k, b in enumerate(batches)]
    # mb j on rank j % 2: 60 -> mb0, 50 -> mb1, 40 -> mb2, 30 -> mb3, 20 -> mb3 (least load 90)
    assert trained(plans[0]) == [[[60], [40]], [[50], [30, 20]]]
    assert s.m == 2
    # step 1: 100 and 85 wait (3 of 4); the three 70s fill mb0..mb2
    assert trained(plans[1]) == [[[70], [70]], [[70]]]  # free mode: empty mb3 dropped
    # step 2: 95 and 120 arrive, queue holds 4 -> 90, 100, 85, 95 popped, one per micro-batch,
    # longest first: 100, 95, 90, 85 to mb0..mb3 (120 stays); 65 and 64 fit under 128 nowhere
    # -> deferred
    assert trained(plans[2]) == [[[100], [90]], [[95], [85]]]
    # step 3: leftovers 65, 64 first (mb0, mb1), then the new 70, 60 (not 70 first)
    assert trained(plans[3]) == [[[65], [70]], [[64], [60]]]
    # flush: 120 alone in one extra iteration
    flush = s.flush(4)
    assert [trained(p) for p in flush] == [[[[120]], []]]
    # delays: 90 x 2, 100 + 85 x 1, 65 + 64 x 1, 120 x 2 over 1159 tokens
    assert s.mean_token_delay() == pytest.approx((180 + 185 + 129 + 240) / 1159)
    assert s.waiting() == 0


def test_wlb_stream_never_runs_an_empty_iteration():
    # every document is an outlier and the queue (N = 2) is not full: released, not idle
    s = WlbStream(Layout(dp=2, context=128), 0, unit_cost(), thresholds=[100])
    plan = s.step(docs_of([110]), 0)
    assert plan.tokens == 110 and s.waiting() == 0
    assert s.flush(1) == []


def test_solve_refuses_a_stream_strategy():
    with pytest.raises(ConfigError, match="wlb-ideal"):
        solve(docs_of([10]), Layout(dp=1), "wlb")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(
        st.lists(st.integers(1, 400), min_size=1, max_size=25), min_size=1, max_size=5
    ),
    dp=st.integers(1, 4),
    thresholds=st.one_of(st.none(), st.lists(st.integers(20, 300), min_size=1, max_size=3)),
)
def test_wlb_stream_trains_every_token_once(lengths, dp, thresholds):
    """Token conservation across steps, flush included: the documents trained over the run are
    exactly the pieces of the batches, each once; every iteration is a valid plan."""
    if thresholds is not None:
        thresholds = sorted(set(thresholds))
    flat = docs_of([x for b in lengths for x in b])
    batches, i = [], 0
    for b in lengths:
        batches.append(flat[i : i + len(b)])
        i += len(b)
    layout = Layout(dp=dp, context=128)
    s = WlbStream(layout, 0, unit_cost(), thresholds=thresholds, validate=True)
    plans = [s.step(b, k) for k, b in enumerate(batches)]
    plans += s.flush(len(batches))
    assert s.waiting() == 0
    seen = Counter(
        (p.docs[sl.doc].doc_id, p.docs[sl.doc].offset, sl.start, sl.end)
        for p in plans
        for rs in p.ranks
        for pack in rs.forward
        for sl in pack.slices
    )
    want = Counter()
    for d in flat:  # pieces of at most 128 tokens, sliced as documents_from_lengths does
        for off in range(0, d.length, 128):
            piece = min(128, d.length - off)
            for a in range(0, piece, 128):
                want[(d.doc_id, off, a, min(piece, a + 128))] += 1
    assert seen == want
    assert sum(p.tokens for p in plans) == sum(d.length for d in flat) > 0
    m = s.m
    for p in plans:  # at most N = dp * m micro-batches per iteration, none over the cap
        assert all(len(rs.forward) <= m for rs in p.ranks)
        assert all(pack.tokens <= 128 for rs in p.ranks for pack in rs.forward)

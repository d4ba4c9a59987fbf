"""Every solved plan's pack prices (``MicroPack.cost``) and imbalance are the execution
model's: the per-call constants, graph-free forwards and recomputed backward packs the
executor runs, priced once (:func:`slimdata.execution.pack_prices`)."""

from toy_costs import call_priced_cost

from slimdata.solver import Layout
from slimdata.solver.common import BatchView, assemble_plan

from .conftest import docs_of

CALLS = call_priced_cost()


def test_a_rank_with_more_calls_is_priced_and_counted_slower():
    # four 128-token documents on 2 ranks, one pack each way on rank 0 (documents 0, 1), two
    # on rank 1 (documents 2, 3): the same tokens, but rank 1 makes two calls a pass.
    # rank 0: forward 256 + 5 = 261 s, backward 512 + 7 = 519 s (780 s);
    # rank 1: forward packs 128 + 5 = 133 s, backward 256 + 7 = 263 s (792 s)
    view = BatchView.build(docs_of([128, 128, 128, 128]), CALLS)
    plan = assemble_plan(
        view=view,
        layout=Layout(dp=2, context=1024),
        cost=CALLS,
        strategy="hand",
        step=0,
        forward=[[[0, 1]], [[2], [3]]],
        backward=[[[1, 0]], [[2], [3]]],
    )
    assert [[p.cost for p in rs.forward] for rs in plan.ranks] == [[261.0], [133.0, 133.0]]
    assert [[p.cost for p in rs.backward] for rs in plan.ranks] == [[519.0], [263.0, 263.0]]
    assert plan.meta["imbalance_fwd"] == round(2 * 266 / 527, 6)
    assert plan.meta["imbalance_bwd"] == round(2 * 526 / 1045, 6)
    assert plan.meta["imbalance"] == round(2 * 792 / 1572, 6)


def test_fsdp_recomputed_packs_are_priced_as_they_run():
    # one 256-token document of slices [0, 128) [128, 256), one forward pack, one backward
    # pack per slice: under FSDP's rules (lockstep, one stage) neither backward pack is a
    # union of forward packs, so each re-runs its slice's forward (128 + 5 s) before its
    # backward (256 + 7 s): 396 s; the forward pack runs without a graph: (256 + 5) / 2 s
    view = BatchView.build(docs_of([256]), CALLS)
    plan = assemble_plan(
        view=view,
        layout=Layout(dp=1, context=1024, mode="lockstep"),
        cost=CALLS,
        strategy="hand",
        step=0,
        forward=[[[0, 1]]],
        backward=[[[1], [0]]],
        mode="lockstep",
    )
    (rs,) = plan.ranks
    assert [p.cost for p in rs.forward] == [130.5]
    assert [p.cost for p in rs.backward] == [396.0, 396.0]

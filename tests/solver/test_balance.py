"""Forward AND backward balance of free-mode SlimPack plans: documents whose backward/forward
skew cannot be evened out whole are merged, costly tail slices are cut finer, and the local
search trades documents with any rank."""

import numpy as np
import pytest

from slimdata.cost import CostModel
from slimdata.docsource import documents_from_lengths
from slimdata.solver import Layout, SolveOptions, solve
from slimdata.solver.common import BatchView
from slimdata.solver.merge import skew_group_sizes
from slimdata.solver.refine import refine_costly_slices

from .conftest import GIB, attention_cost, docs_of, unit_cost

LLAMA8B = CostModel.analytic("llama-8b", "h100", "full")


def test_refine_halves_costly_slices_only():
    # one 4096-token document cut at 2048 on 2 ranks: slice [0, 2048) has 2048*2049/2 =
    # 2,098,176 pairs, [2048, 4096) 2048*2048 + 2,098,176 = 6,292,480; balanced time
    # 4,195,328. At share 1 only the tail is cut: [2048, 3072) 2,621,952, [3072, 4096) 3,670,528
    cost = attention_cost()
    view = BatchView.build(docs_of([4096], 2048), cost)
    (doc,) = refine_costly_slices(view, 2, cost, share=1.0)
    assert doc.cuts == (0, 2048, 3072, 4096) and doc.length == 4096
    # linear toy (3 s per token), two 4096-token documents on 2 ranks: balanced 12288 s;
    # at share 0.3 (3686.4 s) a 2048-token slice (6144 s) is halved once (3072 s)
    ucost = unit_cost()
    view = BatchView.build(docs_of([4096, 4096], 2048), ucost)
    docs = refine_costly_slices(view, 2, ucost, share=0.3)
    assert [d.cuts for d in docs] == [(0, 1024, 2048, 3072, 4096)] * 2
    # slices of 512 tokens are never cut (min_tokens), nothing costly: None
    assert refine_costly_slices(view, 2, ucost, share=0.5) is None
    docs = refine_costly_slices(view, 2, ucost, share=0.01)
    assert [d.cuts for d in docs] == [tuple(range(0, 4097, 512))] * 2


def test_skew_group_sizes_by_hand():
    # toy model: linear forward 1 s/token, backward 1 s/token; attention backward only
    # (1 s per pair): short documents are forward-heavy, a long one backward-heavy.
    cost = CostModel(
        fwd_lin=1.0,
        fwd_att=0.0,
        fwd_const=0.0,
        bwd_lin=1.0,
        bwd_att=1e-3,
        bwd_const=0.0,
        act_bytes_per_token=1.0,
        kv_bytes_per_token=0.0,
    )
    view = BatchView.build(docs_of([3000] + [100] * 30, 4096), cost)
    f = view.doc_fwd / (view.doc_fwd.sum() / 2)
    b = view.doc_bwd / (view.doc_bwd.sum() / 2)
    rho = b[1:].sum() / f[1:].sum()  # the short documents' mean ratio (all below 1)
    need = (b[0] - rho * f[0]) / (1.005 - rho)
    k = skew_group_sizes(view, 2, np.zeros(31, dtype=bool), tol=0.005)
    assert k[0] == min(int(np.ceil(need)), 2) and need > 1
    assert (k[1:] == 0).all()


def synthetic(longs, total, seed):
    rng = np.random.default_rng(seed)
    lengths = list(longs)
    while sum(lengths) < total:
        lengths.append(int(np.clip(rng.lognormal(7.5, 1.0), 16, 16000)))
    return docs_of(lengths, 2048)


@pytest.mark.parametrize(
    ("dp", "longs", "total", "context"),
    [
        (16, [120000, 90000], 2_000_000, 131072),  # backward-heavy long documents
        (64, [120000], 1 << 20, 131072),  # a 2048-token tail slice is half a rank's time
    ],
)
def test_free_plans_balance_each_ranks_total_time(dp, longs, total, context):
    # free mode balances a rank's forward plus backward time, all a DDP step waits for
    # (whole long documents and coarse tail slices once left 1.025-1.039 here)
    for seed in (0, 1):
        plan = solve(
            synthetic(longs, total, seed),
            Layout(dp=dp, memory_gib=60, context=context),
            "slimpack",
            0,
            LLAMA8B,
        )
        assert plan.meta["imbalance"] <= 1.005


def test_skew_merge_can_be_turned_off():
    docs = synthetic([120000, 90000], 2_000_000, 0)
    layout = Layout(dp=16, memory_gib=60, context=131072)
    on = solve(docs, layout, "slimpack", 0, LLAMA8B)
    off = solve(docs, layout, "slimpack", 0, LLAMA8B, options=SolveOptions(skew_merge=False))
    ranks = lambda p: sum(len(g.ranks) for g in p.merges)  # noqa: E731
    assert ranks(off) < ranks(on)
    assert max(off.meta["imbalance_fwd"], off.meta["imbalance_bwd"]) > 1.02


def test_members_merge_shares_stay_within_the_group_largest():
    # the merge pack runs in lockstep on its members: the local search must not make any
    # member's share larger than the largest share LPT produced
    docs = synthetic([120000], 1 << 20, 0)
    plan = solve(docs, Layout(dp=64, memory_gib=60, context=131072), "slimpack", 0, LLAMA8B)
    solo = solve(
        docs,
        Layout(dp=64, memory_gib=60, context=131072),
        "slimpack",
        0,
        LLAMA8B,
        options=SolveOptions(improve_rounds=0),
    )
    for g, g0 in zip(plan.merges, solo.merges, strict=True):
        assert g.ranks == g0.ranks

        def shares(p, ranks):
            return [(rs.forward[0].cost, rs.backward[0].cost) for r in ranks for rs in [p.ranks[r]]]

        after, before = shares(plan, g.ranks), shares(solo, g0.ranks)
        assert max(f for f, _ in after) <= max(f for f, _ in before) * (1 + 1e-9)
        assert max(b for _, b in after) <= max(b for _, b in before) * (1 + 1e-9)


def test_a_document_is_priced_as_it_runs_whole():
    # 1 s a token forward, 2 s backward, and 5 s / 7 s a call: a document of 3 slices of 128
    # tokens runs as one call in a pack that holds it whole (384 + 5 and 768 + 7 s), not as
    # 3 calls (384 + 15 and 768 + 21 s)
    cost = CostModel(
        fwd_lin=1.0,
        fwd_att=0.0,
        fwd_const=5.0,
        bwd_lin=2.0,
        bwd_att=0.0,
        bwd_const=7.0,
        act_bytes_per_token=1.0,
        kv_bytes_per_token=0.0,
    )
    view = BatchView.build(docs_of([384, 100], 128), cost)
    assert view.doc_fwd.tolist() == [389.0, 105.0]
    assert view.doc_bwd.tolist() == [775.0, 207.0]
    assert view.fwd.tolist() == [133.0, 133.0, 133.0, 105.0]


def test_merges_memory_does_not_force_are_kept_only_when_they_pay():
    # a step of a code corpus split at the 8K context: six 8,192-token pieces and four
    # shorter documents on 8 ranks. One piece per rank is already the best a rank can hold
    # (0.7547 s, what bfd reaches); merging pieces over rank pairs only adds the K/V exchange
    # (0.795 s simulated), so the plan merges nothing and matches bfd's step
    from slimdata.sim import SimConfig, simulate_step

    cost = CostModel.analytic("llama-8b", "h100", "selective")
    layout = Layout(dp=8, context=8192, memory_gib=30.9)
    docs = documents_from_lengths([8192, 8192, 3233, 8192, 4490, 1928, 160, 8192, 8192, 8192])
    plan = solve(docs, layout, "slimpack", cost=cost)
    assert plan.merges == ()
    assert max(r.tokens for r in plan.ranks) == 8192
    bfd = solve(docs, layout, "bfd", cost=cost)
    step = simulate_step(plan, cost, layout, SimConfig()).step_time
    assert step == simulate_step(bfd, cost, layout, SimConfig()).step_time


def test_merges_that_pay_are_kept():
    # one 500K-token document among short ones on 4 ranks: merged over the ranks, the step
    # takes about a quarter of the document's time on one rank
    from slimdata.cost import ModelConfig

    small = ModelConfig(
        name="small", layers=4, hidden=256, heads=4, kv_heads=2, ffn=688, vocab=32000, dtype_bytes=4
    )
    cost = CostModel.analytic(small, "h100", "selective")
    layout = Layout(dp=4, memory_gib=60, context=1 << 20, pack_tokens=131072)
    plan = solve(
        documents_from_lengths([500000, 2000, 3000, 2000], 2048), layout, "slimpack", cost=cost
    )
    assert len(plan.merges) == 1 and plan.merges[0].docs == (0,)
    assert max(r.tokens for r in plan.ranks) < 500000 / 2


def test_under_static_cp_merges_are_dropped_only_for_a_plan_that_fits_every_device(monkeypatch):
    # WLB-128K lengths, 4M-token steps on 32 devices as 16 DP ranks of static CP 2, 60 GiB:
    # in the fourth step the plan without its three unforced merge groups is estimated
    # faster (17.78 s, 19.05 s with them), and it fits every device at 59.99 GiB (the free
    # packer counts a pass's gathered K/V; it did not, and peaked at 60.02 GiB), so the
    # merges are dropped; where no plan without them fits every device (read so here), the
    # plan keeps them and fits
    from pathlib import Path

    from slimdata.docsource import load_lengths
    from slimdata.sim import SimConfig, simulate_step
    from slimdata.solver import PlanConfig
    from slimdata.solver.strategies import slimpack as sp

    lengths = load_lengths(Path(__file__).parents[1] / "fixtures/lengths/wlb128k.json.gz")
    layout = Layout(dp=16, cp=2, ranks_per_node=4, memory_gib=60, context=131072)
    devices = Layout(dp=32, memory_gib=60, context=131072)
    rules = PlanConfig(layout=layout, global_batch_tokens=1 << 22, oversize="split")
    batch = rules.batches(documents_from_lengths(lengths))[3]
    config = SimConfig(parallelism="zero1", cp=2)
    plan = solve(batch, layout, "slimpack", 3, LLAMA8B)
    assert plan.merges == () and plan.meta["unforced_merges"] == "dropped"
    sim = simulate_step(plan, LLAMA8B, devices, config)
    assert 59.98 < sim.peak_memory_gib < 60 and round(sim.step_time, 2) == 17.78
    real = sp._Stages.peak

    def merged_only(self, plan, cost, layout, over=None):  # no plan without merges fits
        return real(self, plan, cost, layout, over) if plan.merges else 61 * GIB

    monkeypatch.setattr(sp._Stages, "peak", merged_only)
    kept = solve(batch, layout, "slimpack", 3, LLAMA8B)
    assert len(kept.merges) == 3 and "unforced_merges" not in kept.meta
    sim = simulate_step(kept, LLAMA8B, devices, config)
    assert sim.peak_memory_gib < 60 and round(sim.step_time, 2) == 19.05

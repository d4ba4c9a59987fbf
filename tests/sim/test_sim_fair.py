"""Fair comparison: the plan-independent bound, same-work accounting, the baseline
configuration search and the ``--json`` contract."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_helpers import LENGTHS, linear_cost, mib_cost

from slimdata.cli import cli
from slimdata.cost import CostModel
from slimdata.docsource import documents_from_lengths
from slimdata.errors import ConfigError
from slimdata.sim import SimConfig
from slimdata.sim.bound import batch_work, step_bound
from slimdata.sim.compare import compare_strategies
from slimdata.sim.search import parse_baseline_config
from slimdata.solver import Layout


def test_bound_hand_computed_dp():
    # fwd 1 s/token, bwd 2 s/token: docs of 6 and 2 tokens cost 18 s and 6 s, W = 24 s
    b = step_bound(documents_from_lengths([6, 2]), linear_cost(), dp=2)
    assert b.work == 24.0
    assert b.longest == 9.0  # 18 s over the 2 devices that may share the document
    assert b.value == b.stage == 12.0  # 24 s over 2 devices


def test_bound_hand_computed_pipeline_fill():
    # 2 layers on pp=2, dp=1. 1F1B: chunks of 1/2, stage 1 = 24/2 + (1 + 2) * 1/2 = 13.5.
    # interleaved (4 chunks of 1/4, 2 per device): stage 1 = 12 + 3 * 1/4 = 12.75 -> the bound
    b = step_bound(documents_from_lengths([6, 2]), linear_cost(layers=2), dp=1, pp=2)
    assert b.value == b.stage == 12.75
    assert b.longest == 9.0


def test_bound_counts_attention_pairs():
    # 1 s per pair forward, 2 backward, no linear: a 3-token document has 6 pairs -> 18 s
    cost = linear_cost(fwd=0.0, bwd=0.0, att_f=1.0, att_b=2.0)
    assert step_bound(documents_from_lengths([3]), cost, dp=3).value == 6.0
    assert batch_work(documents_from_lengths([3, 2])).attention_pairs == 6 + 3


def test_same_work_concat_cuts_documents():
    # context 128: concat rows [100 | 28 of doc 2] [72 of doc 2]: pairs 5050 + 406 + 2628
    docs = documents_from_lengths([100, 100])
    cmp = compare_strategies(
        docs,
        Layout(dp=2, context=128, memory_gib=100),
        linear_cost(),
        strategies=["concat", "bfd"],
        global_batch_tokens=256,
    )
    c, b = cmp.results["concat"], cmp.results["bfd"]
    assert (c.tokens, c.attention_pairs, c.same_work) == (200, 8084, False)
    assert (b.tokens, b.attention_pairs, b.same_work) == (200, 10100, True)
    # speedup "vs best" of bfd is against the same-work strategies only (none other here)
    assert math.isnan(cmp.speedups()["bfd"][1])
    assert cmp.speedups()["concat"][1] == pytest.approx(b.step_time / c.step_time)


def test_steps_past_the_epoch_repeat_it_with_a_warning():
    # 400 tokens in steps of 256: two steps (256 + 144); the third repeats the first
    docs = documents_from_lengths([100, 60, 40, 30, 90, 80])
    lay = Layout(dp=2, context=128, memory_gib=100)
    kw = dict(strategies=["bfd"], global_batch_tokens=256)
    cmp = compare_strategies(docs, lay, linear_cost(), steps=3, **kw)
    assert cmp.steps[2] == cmp.steps[0] and cmp.steps[1] != cmp.steps[0]
    assert (
        "the documents fill 2 step(s) of 256 tokens: steps 3 to 3 repeat them from the first"
        in cmp.warnings
    )
    assert not [
        w
        for w in compare_strategies(docs, lay, linear_cost(), steps=2, **kw).warnings
        if "repeat" in w
    ]


def test_the_search_keeps_summaries_and_timelines_are_asked_for():
    # every configuration's simulated step is kept without its timeline (megabytes for a
    # long pipeline); the first step of each strategy gets one when a Gantt chart needs it
    docs = documents_from_lengths([100, 60, 40, 30])
    kw = dict(strategies=["bfd"], global_batch_tokens=256)
    lay = Layout(dp=2, context=128, memory_gib=100)
    plain = compare_strategies(docs, lay, linear_cost(), **kw)
    drawn = compare_strategies(docs, lay, linear_cost(), timelines=True, **kw)
    (_p, summary), (_q, full) = plain.first["bfd"], drawn.first["bfd"]
    assert summary.timeline == {} and summary.memory is None
    assert len(full.timeline["start"]) > 0 and full.memory is not None
    assert full.step_time == summary.step_time and (full.busy == summary.busy).all()


def test_search_finds_better_cp_than_smallest():
    # bfd bins of 512: [504, 8] and [8 x 39]: at cp=1 one rank runs the 504-token document
    # (attention-bound) while the others wait; cp=4 splits both bins over all 4 devices. No K/V
    # bytes (free exchange), lengths multiples of 8 (no padding), sequences below the
    # efficiency curve's first point (chunk factor 1).
    cost = CostModel(
        fwd_lin=1e-3,
        fwd_att=1e-4,
        fwd_const=0.0,
        bwd_lin=2e-3,
        bwd_att=2e-4,
        bwd_const=0.0,
        act_bytes_per_token=1.0,
        kv_bytes_per_token=0.0,
        layers=1,
        hidden=1,
    )
    lay = Layout(dp=4, context=512, memory_gib=100)
    kw = dict(strategies=["bfd"], global_batch_tokens=2048)
    docs = documents_from_lengths([504] + [8] * 40)
    small = compare_strategies(docs, lay, cost, baseline_config="smallest", **kw)
    best = compare_strategies(docs, lay, cost, **kw)
    s, b = small.results["bfd"], best.results["bfd"]
    assert s.cp == 1 and b.cp == 4
    # fwd + bwd = 3 x forward. bin 0: 512 tokens, 504 * 505 / 2 + 36 = 127,296 pairs;
    # bin 1: 312 tokens, 39 * 36 = 1,404 pairs. cp=1: bin 0 alone; cp=4: both, over 4 devices
    bin0, bin1 = 3 * (512e-3 + 127296e-4), 3 * (312e-3 + 1404e-4)
    assert s.step_time == pytest.approx(bin0)
    assert b.step_time == pytest.approx((bin0 + bin1) / 4)
    # bfd: cp 1, 2, 4 screened, and at cp 4 (one DP group of 824 tokens) rows of 1024 too;
    # the Megatron default (concat, smallest CP): cp=1 fits
    assert best.search["configurations"] == 5 and best.search["simulations"] == 5
    tried = [(t["cp"], t["row"]) for t in best.search["tried"]]
    assert tried == [(1, 0), (2, 0), (4, 0), (4, 1024)]
    fixed = compare_strategies(docs, lay, cost, baseline_config="cp=2", **kw)
    assert fixed.results["bfd"].cp == 2


def test_megatron_default_is_concat_smallest_cp_1f1b():
    lay = Layout(dp=4, context=1024, memory_gib=0.6)
    cmp = compare_strategies(
        documents_from_lengths(LENGTHS),
        lay,
        mib_cost(),
        strategies=["bfd"],
        global_batch_tokens=4 * 1024,
    )
    ref = cmp.megatron_default
    assert ref is not None and ref.cp == 2 and ref.schedule == "1f1b"  # 1 GiB rows, 0.6 GiB
    assert cmp.to_dict()["results"]["bfd"]["speedup_vs_megatron_default"] == pytest.approx(
        ref.step_time / cmp.results["bfd"].step_time
    )


def test_baseline_config_parsing():
    assert parse_baseline_config("best").mode == "best"
    assert parse_baseline_config("cp=8").cp == 8
    for bad in ("cp=3", "cp=x", "fastest"):
        with pytest.raises(ConfigError, match=r"power of two"):
            parse_baseline_config(bad)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    lengths=st.lists(st.integers(1, 900), min_size=1, max_size=30),
    dp=st.sampled_from([1, 2, 4]),
    pp=st.sampled_from([1, 2]),
    seed=st.integers(0, 3),
)
def test_bound_never_above_any_same_work_strategy(lengths, dp, pp, seed):
    cost = CostModel.analytic("llama-1b")
    lay = Layout(dp=dp, pp=pp, context=1024, memory_gib=100, mode="lockstep" if pp > 1 else "free")
    cmp = compare_strategies(
        documents_from_lengths(lengths),
        lay,
        cost,
        strategies=["bfd", "wlb", "wlb-ideal", "sorted", "dcp", "slimpack"],
        global_batch_tokens=dp * 1024,
        seed=seed,
    )
    checked = 0
    for r in cmp.results.values():
        assert not r.error
        if r.same_work:
            assert r.bound <= r.step_time * (1 + 1e-9)
            checked += 1
    assert checked >= 5


def test_json_contract(tmp_path):
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(str(n * 8) for n in LENGTHS) + "\n")
    out = tmp_path / "r.json"
    args = ["simulate", "--lengths", str(lengths), "--model", "llama-1b", "--context", "4096"]
    args += ["--dp", "4", "--pp", "2", "--global-batch-tokens", "32768", "--steps", "2"]
    args += ["--strategies", "concat,bfd,wlb,slimpack", "--json", str(out)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    cfg = data["config"]
    for k in ("dp", "pp", "context", "memory_gib", "recompute", "oversize", "baseline_config"):
        assert k in cfg, k
    for k in ("fwd_lin", "bwd_lin", "fwd_att", "bwd_att", "fwd_const", "bwd_const"):
        assert cfg["cost"][k] >= 0
    assert [len(s["lengths"]) > 0 for s in data["steps"]] == [True, True]
    assert set(data["results"]) == {"concat", "bfd", "wlb", "slimpack"}
    for r in data["results"].values():
        assert r.get("failed") or 0 < r["bound"] <= r["step_time"] or not r["same_work"]
        for k in ("imbalance", "peak_memory_gib", "attention_pairs", "tokens", "same_work"):
            assert k in r
        assert set(r["config"]) == {"cp", "micro_batches", "schedule", "merge_groups", "row_tokens"}
        assert r["steps"] == 2 and r["iterations"] >= 2 and r["token_delay"] >= 0
        assert "speedup_vs_best_baseline" in r and "speedup_vs_megatron_default" in r
    assert data["results"]["concat"]["same_work"] is False
    per_step = [sum(s["lengths"]) for s in data["steps"]]
    assert data["results"]["bfd"]["tokens"] == sum(per_step) / len(per_step)
    assert data["results"]["wlb"]["tokens"] == sum(per_step) / len(per_step)  # flush included
    assert data["megatron_default"]["config"]["schedule"] == "1f1b"
    assert data["search"]["simulations"] >= 1


def test_dcp_runs_its_faster_schedule():
    cost = CostModel.analytic("llama-1b")
    lay = Layout(dp=2, pp=2, context=4096, memory_gib=100, mode="lockstep")
    docs = documents_from_lengths([3000, 2500, 900, 800, 700, 600, 500, 400] * 4)
    kw = dict(strategies=["dcp"], global_batch_tokens=4 * 4096)

    def run(choice, schedule):
        cfg = SimConfig(schedule=schedule)
        return compare_strategies(docs, lay, cost, baseline_config=choice, config=cfg, **kw)

    best = run("best", "1f1b").results["dcp"]
    each = [run("smallest", s).results["dcp"].step_time for s in ("1f1b", "interleaved")]
    assert best.step_time == min(each)
    assert best.schedule == ("1f1b", "interleaved")[each.index(min(each))]


def test_wlb_run_is_compared_on_total_time_over_the_same_documents():
    """``wlb`` delays documents: its result is its total run time (flush iterations included)
    over the steps, and it trains exactly the batches' tokens and pairs over the run."""
    from slimdata.sim import simulate_step
    from slimdata.solver import PlanConfig
    from slimdata.solver.strategies.wlb_queue import WlbStream

    cost, steps = mib_cost(), 3
    docs = documents_from_lengths([n * 4 for n in LENGTHS])
    lay = Layout(dp=4, context=1024, memory_gib=100)
    cmp = compare_strategies(
        docs, lay, cost, strategies=["wlb", "wlb-ideal"], steps=steps, baseline_config="cp=1"
    )
    r = cmp.results["wlb"]
    batches = PlanConfig(layout=lay, global_batch_tokens=4 * 1024, seed=0).batches(docs)[:steps]
    stream = WlbStream(lay, 0, cost)
    plans = [stream.step(b, k) for k, b in enumerate(batches)]
    plans += stream.flush(steps)
    assert len(plans) > steps  # outliers still waited after the last step: flushed
    total = sum(simulate_step(p, cost, lay, SimConfig(cp=1)).step_time for p in plans)
    assert r.iterations == len(plans) and r.steps == steps
    assert r.step_time == pytest.approx(total / steps, rel=1e-12)
    assert r.token_delay == pytest.approx(stream.mean_token_delay()) and r.token_delay > 0
    work = [batch_work(b) for b in batches]
    assert r.tokens * steps == sum(w.tokens for w in work) == sum(map(sum, cmp.steps))
    assert r.attention_pairs * steps == pytest.approx(sum(w.attention_pairs for w in work))
    assert r.same_work
    ideal = cmp.results["wlb-ideal"]
    assert ideal.iterations == ideal.steps == steps and ideal.token_delay == 0
    assert cmp.speedups()["wlb"][1] == pytest.approx(ideal.step_time / r.step_time)
    out = cmp.to_dict()["results"]["wlb"]
    assert (out["steps"], out["iterations"]) == (steps, len(plans))


def test_row_lengths_searched():
    from slimdata.sim.search import Evaluator
    from slimdata.solver import solve

    # dp 4, cap 1024, one step of 4096 tokens, longest document 300 tokens
    batch = documents_from_lengths([300, 280, 260, 184] * 4)
    assert sum(d.length for d in batch) == 4096
    ev = Evaluator([batch], Layout(dp=4, context=1024), linear_cost(), SimConfig(), 0, solve)
    # cp 1: 1024 tokens per DP group -> cap / 2 (every document fits it) and cap only
    assert ev.rows(1) == [512, 0]
    # cp 4: one group of 4096 tokens -> also 2 cap and 4 cap (fewer, larger micro-batches)
    assert ev.rows(4) == [512, 0, 2048, 4096]
    longer = documents_from_lengths([600, 424])
    assert Evaluator(
        [longer], Layout(dp=1, context=1024), linear_cost(), SimConfig(), 0, solve
    ).rows(1) == [0]  # 600 > 512: a shorter row would cut a document


def test_search_finds_more_micro_batches_than_the_default_row():
    """pp 2, dp 1 (no CP to search), one context of short documents: rows of the full context
    give the pipeline a single micro-batch (it idles half the time); rows of half the context
    give two, and the search takes them."""
    lengths = [128] * 16  # two steps of 8 documents
    docs = documents_from_lengths(lengths)
    lay = Layout(dp=1, pp=2, context=1024, memory_gib=100, mode="lockstep")
    kw = dict(strategies=["bfd"], global_batch_tokens=1024, config=SimConfig(schedule="1f1b"))
    best = compare_strategies(docs, lay, linear_cost(layers=2), **kw).results["bfd"]
    fixed = compare_strategies(
        docs, lay, linear_cost(layers=2), baseline_config="cp=1", **kw
    ).results["bfd"]
    assert (fixed.row_tokens, fixed.micro_batches) == (1024, 1)
    assert (best.row_tokens, best.micro_batches) == (512, 2)
    assert best.step_time < fixed.step_time
    assert best.same_work and best.tokens == fixed.tokens == 1024


def test_search_asks_slimpack_for_more_micro_batches_with_a_pipeline():
    """slimpack chooses its micro-batches itself (for 1F1B); with ``best`` and pp > 1 the
    search also asks it for 2x and 4x its choice and keeps the fastest. A stand-in solver that
    splits 16 equal documents into the asked number of packs (2 by its own choice): 8 packs
    have the smallest pipeline bubble."""
    from sim_helpers import whole_doc_plan

    from slimdata.sim.search import BaselineConfig, Evaluator, search

    def solve(batch, layout, name, seed, cost, *, step, validate):
        m = layout.microbatches or 2
        return whole_doc_plan([[[128] * (16 // m)] * m], mode="lockstep")

    docs = documents_from_lengths([128] * 16)
    lay = Layout(dp=1, pp=2, context=4096, memory_gib=100, mode="lockstep")
    ev = Evaluator([docs], lay, linear_cost(layers=4), SimConfig(), 0, solve)
    run = search(ev, "slimpack", BaselineConfig("best"))
    assert len(run.plans[0].ranks[0].forward) == 8
    asked = sorted({t["microbatches"] for t in ev.log.tried})
    assert asked == [0, 4, 8]


def test_dcp_runs_at_its_fastest_max_seqlen():
    # one 120,000-token document among 300 short ones on 8 ranks: at the default
    # max_seqlen_per_rank (the 128K token cap) it runs on one rank, which carries the step;
    # the best configuration also tries 64K, 32K and 16K and spreads it over a CP group
    import numpy as np

    cost = CostModel.analytic("llama-8b", "h100", "full")
    rng = np.random.default_rng(0)
    lengths = [120000, *rng.integers(500, 6000, size=300).tolist()]
    docs = documents_from_lengths(lengths, 2048)
    layout = Layout(dp=8, context=131072, memory_gib=60)
    kw = dict(strategies=["dcp"], global_batch_tokens=sum(lengths))
    kw["config"] = SimConfig(parallelism="zero1")
    default = compare_strategies(docs, layout, cost, baseline_config="smallest", **kw)
    best = compare_strategies(docs, layout, cost, baseline_config="best", **kw)
    d, b = default.results["dcp"], best.results["dcp"]
    assert (d.row_tokens, d.merge_groups) == (131072, 0.0)
    assert (b.row_tokens, b.merge_groups) == (16384, 1.0)
    assert d.step_time == pytest.approx(47.23, abs=0.005)  # docs/simulate.md
    assert b.step_time == pytest.approx(20.24, abs=0.005)

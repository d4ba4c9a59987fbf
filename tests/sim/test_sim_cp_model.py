"""The one context-parallel cost model: published efficiency curve, 2*cp padding, chunk
factor, the same for static CP and merge groups."""

from __future__ import annotations

import json

import pytest
from sim_helpers import linear_cost, whole_doc_plan

from slimdata.cost.attention import CURVE_FILE, attention_curve
from slimdata.plan import Document, MergeGroup, MicroPack, RankStep, Slice, StepPlan
from slimdata.sim import SimConfig, simulate_step
from slimdata.solver.layout import Layout


def test_curve_is_the_cited_measurement():
    data = json.loads(CURVE_FILE.read_text())
    assert "pytorch/benchmark" in data["source"] and data["url"].endswith("/pull/2391")
    # flash_v3 TFLOP/s at 512 .. 16K tokens, head dim 128, H100 (the cited table)
    assert data["seqlen"] == [512, 1024, 2048, 4096, 8192, 16384]
    assert data["tflops"] == [430.32, 517.099, 565.544, 590.233, 614.234, 620.73]


def test_curve_points_reproduced():
    c = attention_curve()
    # 430.32 / 620.73, 517.099 / 620.73, ... at the measured lengths
    expect = [0.693248, 0.833050, 0.911095, 0.950869, 0.989535, 1.0]
    got = c.relative([512, 1024, 2048, 4096, 8192, 16384])
    assert got.tolist() == pytest.approx(expect, abs=1e-6)
    # flat beyond the measured range, log-linear between points: 1448 = 2^10.5
    assert c.relative(128) == pytest.approx(0.693248, abs=1e-6)
    assert c.relative(1 << 20) == 1.0
    assert c.relative(1448.15) == pytest.approx((0.833050 + 0.911095) / 2, abs=1e-5)
    assert c.chunk_factor(16384, 2048) == pytest.approx(620.73 / 565.544)


def test_static_cp_pays_the_chunk_factor():
    # one 4096-token sequence, attention only (1e-6 s/pair F, 2e-6 B), cp=2: chunks of 1024;
    # pairs 4096 * 4097 / 2 = 8,390,656; factor 590.233 / 517.099 = 1.141431
    plan = whole_doc_plan([[[4096]]])
    cost = linear_cost(fwd=0.0, bwd=0.0, att_f=1e-6, att_b=2e-6)
    r = simulate_step(plan, cost, Layout(dp=2, context=4096), SimConfig(cp=2))
    assert r.step_time == pytest.approx(3 * 8.390656 * 1.141431 / 2, rel=1e-6)


def test_static_cp_pads_to_twice_cp():
    # 1001 tokens on cp=4 run as 1008 (a multiple of 8): 252 tokens per member, 1 s F + 2 s B
    plan = whole_doc_plan([[[1001]]])
    r = simulate_step(plan, linear_cost(), Layout(dp=4, context=1024), SimConfig(cp=4))
    assert r.step_time == pytest.approx(3 * 252.0)


def test_merge_group_pays_the_same_chunk_factor():
    # a 4096-token document shared by 2 ranks, slices [0,2048) and [2048,4096): each slice is
    # a 2048-token chunk of a 4096-token sequence, factor 590.233 / 565.544 = 1.043655.
    # rank 1's pairs 2048 * 2048 + 2048 * 2049 / 2 = 6,292,480 set the pace (F 1e-6, B 2e-6)
    doc = Document(doc_id=0, length=4096)
    p0 = MicroPack((Slice(0, 0, 2048),), merge=0)
    p1 = MicroPack((Slice(0, 2048, 4096),), merge=0)
    plan = StepPlan(
        step=0,
        strategy="test",
        docs=(doc,),
        ranks=(
            RankStep(rank=0, forward=(p0,), backward=(p0,)),
            RankStep(rank=1, forward=(p1,), backward=(p1,)),
        ),
        merges=(MergeGroup((0, 1), (0,)),),
    ).validate()
    cost = linear_cost(fwd=0.0, bwd=0.0, att_f=1e-6, att_b=2e-6)
    r = simulate_step(plan, cost, Layout(dp=2, context=4096), SimConfig())
    assert r.step_time == pytest.approx(3 * 6.29248 * 1.043655, rel=1e-6)

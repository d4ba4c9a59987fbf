"""Loaders: document shards -> payloads, exact resumption, plan shards with stamp checks."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hooks_helpers import VOCAB
from slimdata.hooks.loader import DocumentLoader, LoaderConfig, PlanShardLoader
from streaming import MDSWriter, StreamingDataset

from slimdata.cost import CostModel
from slimdata.errors import PlanError
from slimdata.slicing import slice_cuts
from slimdata.solver import Layout, solve
from slimdata.solver.planshards import PLAN_COLUMNS, write_plan_shards

pytestmark = pytest.mark.timeout(120)
LENGTHS = [5, 300, 17, 140, 64, 9, 210, 33, 128, 2, 77, 260]


@pytest.fixture(scope="module")
def doc_shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("docs") / "shards"
    rng = np.random.default_rng(0)
    toks = [rng.integers(0, VOCAB, size=n).astype(np.uint32) for n in LENGTHS]
    cols = {
        "tokens": "ndarray:uint32",
        "slices": "ndarray:uint32",
        "length": "int",
        "doc_id": "str",
        "source": "str",
    }
    with MDSWriter(out=str(out), columns=cols, size_limit=4096) as w:
        for i, t in enumerate(toks):
            w.write(
                {
                    "tokens": t,
                    "slices": slice_cuts(len(t), 128).astype(np.uint32),
                    "length": len(t),
                    "doc_id": f"doc{i}",
                    "source": "t",
                }
            )
    return out, toks


def _cut(toks, doc, s):
    """Tokens of slice ``s`` of plan document ``doc`` (a piece of its sample from ``offset``)."""
    return toks[doc.sample][doc.offset + s.start : doc.offset + s.end]


CFG = LoaderConfig(
    layout=Layout(dp=2, context=256, memory_gib=1),
    global_batch_tokens=400,
    strategy="bfd",
    seed=3,
    oversize="split",
)


def test_document_loader_gives_each_rank_its_tokens(doc_shards):
    path, toks = doc_shards
    ds = StreamingDataset(local=str(path), shuffle=False, batch_size=1)
    loaders = [DocumentLoader(ds, rank=r, config=CFG) for r in range(2)]
    seen = []
    for step, (p0, p1) in enumerate(itertools.zip_longest(*loaders)):
        assert p0.plan == p1.plan and p0.plan.step == step
        for p in (p0, p1):
            expect = [_cut(toks, p.plan.docs[s.doc], s) for s in p.plan.ranks[p.rank].slices()]
            np.testing.assert_array_equal(p.tokens, np.concatenate(expect) if expect else [])
        seen += [(d.sample, d.offset, d.length) for d in p0.plan.docs]
    # every token of every document exactly once per epoch
    covered = {i: sorted((o, o + n) for j, o, n in seen if j == i) for i in range(len(LENGTHS))}
    for i, spans in covered.items():
        assert spans[0][0] == 0 and spans[-1][1] == LENGTHS[i]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert loaders[0].state_dict() == {"epoch": 1, "documents": 0, "step": loaders[0].step}
    assert loaders[0].step == step + 1 > 1


def test_document_loader_resumes_exactly(doc_shards):
    path, _ = doc_shards
    ds = StreamingDataset(local=str(path), shuffle=False, batch_size=1)
    full = [(p.plan, p.tokens.tolist()) for p in DocumentLoader(ds, rank=1, config=CFG)]
    assert len(full) >= 3
    first = DocumentLoader(ds, rank=1, config=CFG)
    it = iter(first)
    head = [next(it), next(it)]
    state = first.state_dict()
    assert state["documents"] == sum(
        len({d.sample for d in p.plan.docs}) for p in head
    )  # documents, not pieces
    resumed = DocumentLoader(ds, rank=1, config=CFG)
    resumed.load_state_dict(state)
    rest = [(p.plan, p.tokens.tolist()) for p in resumed]
    assert [(p.plan, p.tokens.tolist()) for p in head] + rest == full
    resumed.load_state_dict({"epoch": 0, "documents": 1, "step": 0})
    if len(first.batches(0)[0]) > 1:
        with pytest.raises(PlanError, match="not a batch boundary"):
            next(iter(resumed))


def test_document_loader_prices_with_the_builds_cost_model(tmp_path):
    # a stock StreamingDataset keeps its directory on streams[0].local, not on .local
    from pathlib import Path

    from slimdata.ingest import BuildConfig, build
    from slimdata.planning import build_cost_model

    src = tmp_path / "a.txt"
    src.write_text("a few words of text " * 40)
    out = tmp_path / "out"
    tok = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_tokenizer.json"
    build(BuildConfig(inputs=(str(src),), tokenizer=str(tok), model="llama-1b"), out)
    ds = StreamingDataset(local=str(out), shuffle=False, batch_size=1)
    loader = DocumentLoader(ds, rank=0, config=CFG)
    assert loader.cost is not None
    assert loader.cost == build_cost_model(out)
    assert loader.cost.layers == 16  # llama-1b's, not the solver's default llama-8b


@pytest.mark.parametrize(
    ("given", "advice"),
    [
        ({}, "LoaderConfig(model=..., recompute='full')"),  # recompute alone changes nothing
        ({"model": "llama-1b"}, "use LoaderConfig(recompute='full')"),
        ({"cost": CostModel.analytic("llama-1b", "h100", "none")}, "cost=CostModel(...)"),
    ],
)
def test_a_memory_refusal_names_a_recompute_option_that_applies(doc_shards, given, advice):
    path, _ = doc_shards
    ds = StreamingDataset(local=str(path), shuffle=False, batch_size=1)
    layout = Layout(dp=2, context=256, memory_gib=0.01)
    cfg = dataclasses.replace(CFG, layout=layout, strategy="slimpack", **given)
    with pytest.raises(PlanError, match="memory cap") as info:
        next(iter(DocumentLoader(ds, rank=0, config=cfg)))
    assert advice in str(info.value)


@pytest.fixture(scope="module")
def plan_shards(doc_shards, tmp_path_factory):
    path, toks = doc_shards
    ds = StreamingDataset(local=str(path), shuffle=False, batch_size=1)
    loader = DocumentLoader(ds, rank=0, config=CFG)
    plans = [solve(b, CFG.layout, "bfd", seed=3, step=i) for i, b in enumerate(loader.batches(0))]
    out = tmp_path_factory.mktemp("plans") / "shards"
    write_plan_shards(plans, out, nodes=1, ranks_per_node=2, tokens_of=lambda i: toks[i])
    return out, plans, toks


def test_plan_shards_index_mode(plan_shards):
    out, plans, toks = plan_shards
    ds = StreamingDataset(local=str(out), shuffle=False, batch_size=1)
    for r in range(2):
        got = list(PlanShardLoader(ds, rank=r, nodes=1, ranks_per_node=2))
        assert [p.plan for p in got] == [pl.rank_view(r) for pl in plans]
        for p in got:
            expect = [_cut(toks, p.plan.docs[s.doc], s) for s in p.plan.ranks[r].slices()]
            np.testing.assert_array_equal(p.tokens, np.concatenate(expect) if expect else [])
    resumed = PlanShardLoader(ds, rank=1, nodes=1, ranks_per_node=2)
    resumed.load_state_dict({"step": 1})
    assert [p.plan.step for p in resumed] == list(range(1, len(plans)))


def test_misaligned_plan_shards_fail_loudly(plan_shards, tmp_path):
    out, _plans, _ = plan_shards
    # a 1-process stream of a 2-rank layout hands rank 0 a payload of rank 1 at some step
    ds = StreamingDataset(local=str(out), shuffle=False, batch_size=1)
    with pytest.raises(PlanError, match="misaligned"):
        list(PlanShardLoader(ds, rank=0, nodes=1, ranks_per_node=2, mode="iterate"))
    # shards written in the wrong order (two payloads swapped)
    bad = tmp_path / "bad"
    samples = [ds[i] for i in range(ds.num_samples)]
    samples[0], samples[1] = samples[1], samples[0]
    with MDSWriter(out=str(bad), columns=PLAN_COLUMNS) as w:
        for s in samples:
            w.write({k: s[k] for k in PLAN_COLUMNS})
    bad_ds = StreamingDataset(local=str(bad), shuffle=False, batch_size=1)
    with pytest.raises(PlanError, match="misaligned"):
        list(
            PlanShardLoader(bad_ds, rank=0, nodes=1, ranks_per_node=2, plan_json=out / "plan.json")
        )

"""Readers of document shards use the slice boundaries the build recorded (the `slices`
column and its manifest copy), never a re-slicing, and refuse a `slices` column, manifest or
cost column that does not agree with the rest of the shard (untrusted files, issue 18)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from slimdata.cli import cli
from slimdata.columns import COLUMNS, COST_COLUMNS
from slimdata.cost import CostModel
from slimdata.docsource import load_shard_documents
from slimdata.errors import ConfigError, InputError
from slimdata.planning import plan_to_shards
from slimdata.slicing import check_cuts, first_bad_tiling
from slimdata.solver import Layout

COST = CostModel.analytic("llama-1b", "h100", "none")
# slices no uniform slicing gives: 128, 256 and 16 tokens; one slice; 256 and 44 tokens
RECORDED = [(0, 128, 384, 400), (0, 40), (0, 256, 300)]
LAYOUT = {"nodes": 1, "ranks_per_node": 2, "global_batch_tokens": 2048, "memory_gib": 8.0}


def write_shards(root: Path, slices, *, manifest_cuts=None, lengths=None, columns_cost=COST):
    """Document shards laid out as `slimdata build` writes them, by hand: sample ``i`` holds
    tokens ``0..n-1`` (``n`` = the last cut point of ``slices[i]``), that slices column, the
    cost columns of ``columns_cost``; the manifest repeats them (``manifest_cuts`` and
    ``lengths`` override what it and the ``length`` column say); the sidecar records
    ``COST`` and ``slice_tokens=128``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from streaming import MDSWriter

    manifest_cuts = manifest_cuts or slices
    lengths = lengths or [c[-1] for c in slices]
    root.mkdir()
    with MDSWriter(out=str(root), columns=COLUMNS) as writer:
        for i, (cuts, length) in enumerate(zip(slices, lengths, strict=True)):
            costs = columns_cost.cuts_costs(np.asarray(cuts))
            writer.write(
                {
                    "tokens": np.arange(cuts[-1], dtype=np.uint32),
                    "slices": np.asarray(cuts, dtype=np.uint32),
                    **{name: getattr(costs, name) for name in COST_COLUMNS},
                    "length": length,
                    "doc_id": f"d{i}",
                    "source": "hand",
                }
            )
    manifest = pa.table(
        {
            "sample": pa.array(range(len(slices)), pa.int64()),
            "doc_id": [f"d{i}" for i in range(len(slices))],
            "source": ["hand"] * len(slices),
            "length": pa.array([c[-1] for c in manifest_cuts], pa.int64()),
            "loss_tokens": pa.array([c[-1] - 1 for c in manifest_cuts], pa.int64()),
            "cuts": pa.array([list(c) for c in manifest_cuts], pa.list_(pa.int64())),
        }
    )
    pq.write_table(manifest, root / "manifest.parquet")
    sidecar = {"cost_model": COST.to_dict(), "slice_tokens": 128}
    (root / "slimdata.json").write_text(json.dumps(sidecar))
    return root


def planned_cuts(out: Path) -> dict[int, tuple[int, ...]]:
    """Sample index -> cut points of that document in the plan shards at ``out``; checks on
    the way that every planned slice runs from one recorded cut point to another."""
    from streaming import LocalDataset

    from slimdata.solver.planshards import read_plan_payload

    cuts: dict[int, tuple[int, ...]] = {}
    dataset = LocalDataset(local=str(out))
    for i in range(len(dataset)):
        _step, rank, plan, _tokens = read_plan_payload(dataset[i])
        for pack in plan.ranks[rank].forward:
            for s in pack.slices:
                doc = plan.docs[s.doc]
                assert doc.offset == 0 and {s.start, s.end} <= set(doc.cuts)
                cuts[doc.sample] = doc.cuts
    return cuts


def test_plan_uses_the_slice_boundaries_the_build_recorded(tmp_path):
    ds = write_shards(tmp_path / "ds", RECORDED)
    assert [d.cuts for d in load_shard_documents(ds)] == RECORDED
    plan_to_shards(tmp_path / "plan", shards=ds, context=1024, **LAYOUT)
    # re-slicing at the default 2048 would give (0, 400), (0, 40), (0, 300)
    assert planned_cuts(tmp_path / "plan") == {0: (0, 128, 384, 400), 1: (0, 40), 2: (0, 256, 300)}


def test_slice_tokens_with_shards_is_refused(tmp_path):
    ds = write_shards(tmp_path / "ds", RECORDED)
    with pytest.raises(ConfigError) as info:
        plan_to_shards(tmp_path / "plan", shards=ds, slice_tokens=256, **LAYOUT)
    assert str(info.value) == (
        f"slice_tokens (--slice-tokens) applies to a lengths file: the documents of {ds} keep "
        "the slices they were built with (slice_tokens in its slimdata.json); rebuild them with "
        "`slimdata build --slice-tokens N` to change it"
    )


def _plan_cli(ds: Path, out: Path):
    args = ["plan", str(ds), "-o", str(out), "--nodes", "1", "--ranks-per-node", "2"]
    args += ["--global-batch-tokens", "2048", "--memory-gib", "8", "--context", "1024"]
    return CliRunner().invoke(cli, args)


@pytest.mark.parametrize(
    ("sample_slices", "message"),
    [
        (
            (0, 50, 40),
            "sample 1: slices column [0, 50, 40] does not tile its 40 tokens (cut points must "
            "rise strictly from 0 to the length): the shard is damaged; rebuild it with "
            "`slimdata build`",
        ),
        (
            (0, 20, 40),
            "sample 1: slices column [0, 20, 40] differs from the manifest's cut points "
            "[0, 40]: the shards and manifest.parquet disagree (modified, or from different "
            "builds); rebuild them with `slimdata build`",
        ),
    ],
)
def test_a_corrupted_slices_column_is_refused(tmp_path, sample_slices, message):
    from slimdata.hooks.loader import DocumentLoader, LoaderConfig
    from streaming import LocalDataset

    slices = [RECORDED[0], sample_slices, RECORDED[2]]
    ds = write_shards(tmp_path / "ds", slices, manifest_cuts=RECORDED)
    result = _plan_cli(ds, tmp_path / "plan")
    assert result.exit_code == 2, result.output
    assert result.output == f"Error: {ds}: {message}\n"
    # the training-time loader reads the same column and refuses it the same way
    config = LoaderConfig(layout=Layout(dp=1, context=1024, memory_gib=8), global_batch_tokens=2048)
    loader = DocumentLoader(
        LocalDataset(local=str(ds)), rank=0, config=config, documents=load_shard_documents(ds)
    )
    with pytest.raises(InputError) as info:
        list(loader)
    assert str(info.value) == message


def test_loader_reading_the_samples_refuses_slices_that_do_not_tile(tmp_path):
    from slimdata.hooks.loader import documents_of
    from streaming import LocalDataset

    ds = write_shards(tmp_path / "ds", [RECORDED[0], (0, 50, 40)], manifest_cuts=RECORDED[:2])
    with pytest.raises(InputError) as info:
        documents_of(LocalDataset(local=str(ds)))
    assert str(info.value).startswith("sample 1: slices column [0, 50, 40] does not tile")
    ds = write_shards(tmp_path / "ds2", RECORDED[:2], lengths=[400, 41])
    with pytest.raises(InputError) as info:
        documents_of(LocalDataset(local=str(ds)))
    assert str(info.value) == (
        "sample 1: holds 40 tokens but its length column says 41: the shard is damaged; "
        "rebuild it with `slimdata build`"
    )


def test_a_corrupted_manifest_cut_list_is_refused(tmp_path):
    ds = write_shards(
        tmp_path / "ds", RECORDED, manifest_cuts=[RECORDED[0], (0, 50, 40), RECORDED[2]]
    )
    result = _plan_cli(ds, tmp_path / "plan")
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"Error: {ds / 'manifest.parquet'}: sample 1: cut points [0, 50, 40] do not tile its 40 "
        "tokens (they must rise strictly from 0 to the length): the manifest is damaged; "
        "rebuild with `slimdata build`\n"
    )
    assert not (tmp_path / "plan").exists()  # refused before anything is written


@pytest.mark.parametrize(
    ("column", "values", "message"),
    [
        ("sample", [0, 1, 5], "its samples are not 0..2, one row each (sample 5 where sample 2"),
        ("sample", [1, 0, 1], "its samples are not 0..2, one row each (sample 1 where sample 2"),
        ("loss_tokens", [399, 40, 299], "sample 1 has 40 loss tokens for 40 tokens"),
        ("loss_tokens", [399, -1, 299], "sample 1 has -1 loss tokens for 40 tokens"),
        ("cuts", [[0, 400], None, [0, 300]], "column 'cuts' is not all integers"),
        ("cuts", [[0, 400], [], [0, 300]], "sample 1: cut points [] do not tile its 40 tokens"),
    ],
)
def test_manifest_rows_are_checked(tmp_path, column, values, message):
    import pyarrow as pa
    import pyarrow.parquet as pq

    ds = write_shards(tmp_path / "ds", [(0, 400), (0, 40), (0, 300)])
    table = pq.read_table(ds / "manifest.parquet")
    kind = table.schema.field(column).type
    table = table.set_column(table.schema.get_field_index(column), column, pa.array(values, kind))
    pq.write_table(table, ds / "manifest.parquet")
    with pytest.raises(InputError) as info:
        load_shard_documents(ds)
    assert str(info.value).startswith(f"{ds / 'manifest.parquet'}: {message}")


def test_cost_columns_must_be_the_recorded_models_unless_another_is_given(tmp_path):
    ds = write_shards(tmp_path / "ds", RECORDED, columns_cost=CostModel.analytic("llama-8b"))
    with pytest.raises(InputError) as info:
        plan_to_shards(tmp_path / "plan", shards=ds, context=1024, **LAYOUT)
    assert "cost column 'fwd' [" in str(info.value)
    assert str(info.value).endswith(
        "the sidecar does not describe these shards; give the cost model explicitly "
        "(--model, --cost-device, --recompute or --cost-profile) or rebuild the shards"
    )
    # a model the user gives prices the slices itself: the columns are not compared
    plan_to_shards(tmp_path / "plan2", shards=ds, context=1024, cost=COST, **LAYOUT)
    assert planned_cuts(tmp_path / "plan2") == dict(enumerate(RECORDED))


@given(
    st.lists(
        st.tuples(st.integers(0, 6), st.lists(st.integers(-1, 7), max_size=5)),
        max_size=5,
    )
)
def test_first_bad_tiling_agrees_with_check_cuts(docs):
    """Reference: check_cuts, one document at a time."""

    def tiles(length, cuts):
        try:
            check_cuts(cuts, length)
        except ConfigError:
            return False
        return True

    expected = next((i for i, (n, c) in enumerate(docs) if not tiles(n, c)), -1)
    lengths = [n for n, _ in docs]
    counts = [len(c) for _, c in docs]
    values = list(itertools.chain.from_iterable(c for _, c in docs))
    assert first_bad_tiling(lengths, counts, values) == expected


@pytest.mark.parametrize(
    ("lengths", "cuts", "bad"),
    [
        ([], [], -1),  # no document
        ([0], [(0,)], -1),  # an empty document has the single cut point 0
        ([5], [()], 0),  # no cut point at all
        ([10, 3], [(0, 4, 10), (0, 3)], -1),  # 10 -> 0 between documents is no fall
        ([10, 3], [(0, 4, 10), (0, 3, 3)], 1),  # a repeated cut point: an empty slice
        ([10, 3], [(0, 4, 4, 10), (0, 3)], 0),
        ([10, 3], [(0, 10), (1, 3)], 1),  # does not start at 0
        ([10, 3], [(0, 9), (0, 3)], 0),  # does not end at the length
    ],
)
def test_first_bad_tiling_ladder(lengths, cuts, bad):
    counts = [len(c) for c in cuts]
    assert first_bad_tiling(lengths, counts, list(itertools.chain.from_iterable(cuts))) == bad


def test_a_built_plan_prices_the_slices_as_the_cost_columns_do(tmp_path):
    """On a real build (128-token slices, default cost model recorded): every planned
    document has its sample's `slices` column as cut points, and a forward pack made of
    whole build slices costs the sum of their `fwd` column entries."""
    from streaming import LocalDataset

    from slimdata.ingest import BuildConfig, build
    from slimdata.solver.planshards import read_plan_payload

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = np.random.default_rng(5)
    for i in range(16):  # mostly one-slice documents, a few of several slices
        n = int(rng.integers(300, 600) if i % 5 == 0 else rng.integers(5, 60))
        words = rng.choice(["alpha", "beta", "slice", "pack", "rank"], n)
        (corpus / f"doc{i}.txt").write_text(" ".join(words))
    tokenizer = str(Path(__file__).resolve().parents[1] / "fixtures" / "tiny_tokenizer.json")
    build(
        BuildConfig(inputs=(str(corpus),), tokenizer=tokenizer, slice_tokens=128), tmp_path / "ds"
    )
    samples = LocalDataset(local=str(tmp_path / "ds"))
    plan_to_shards(tmp_path / "plan", shards=tmp_path / "ds", context=4096, **LAYOUT)
    payloads = LocalDataset(local=str(tmp_path / "plan"))
    priced = sliced = 0
    for i in range(len(payloads)):
        _step, rank, plan, _tokens = read_plan_payload(payloads[i])
        for pack in plan.ranks[rank].forward:
            total = 0.0
            for s in pack.slices:
                doc = plan.docs[s.doc]
                sample = samples[doc.sample]
                assert doc.cuts == tuple(sample["slices"].tolist())
                sliced += len(doc.cuts) > 2
                k = doc.cuts.index(s.start)
                if doc.cuts[k + 1] != s.end:  # a run of several build slices: priced as one
                    break
                total += float(sample["fwd"][k])
            else:
                assert pack.cost == pytest.approx(total, rel=1e-12)
                priced += len(pack.slices)
    assert priced >= 2 and sliced > 0  # not vacuous: slices compared, documents of several


def test_loader_given_plan_shards_says_they_are_not_document_shards(tmp_path):
    # DocumentLoader(StreamingDataset(local="plan/")) by mistake: no raw KeyError 'slices'
    from slimdata.hooks.loader import documents_of
    from streaming import LocalDataset, MDSWriter

    from slimdata.solver.planshards import PLAN_COLUMNS

    values = {"int": 0, "str": "{}", "ndarray:uint32": np.arange(3, dtype=np.uint32)}
    with MDSWriter(out=str(tmp_path / "plan"), columns=PLAN_COLUMNS) as writer:
        writer.write({name: values[kind] for name, kind in PLAN_COLUMNS.items()})
    with pytest.raises(InputError) as info:
        documents_of(LocalDataset(local=str(tmp_path / "plan")))
    assert str(info.value) == (
        f"sample 0: no 'slices' column (columns: {', '.join(sorted(PLAN_COLUMNS))}): these are "
        "plan shards of `slimdata plan`; read them with PlanShardLoader, not as document shards"
    )

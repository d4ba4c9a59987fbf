"""Planning for static CP: ``Layout.cp``, ``slimdata plan --cp``, plan.json and the payload
every process of a CP group reads."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner
from hooks_helpers import VOCAB
from slimdata.hooks.loader import PlanShardLoader
from streaming import StreamingDataset

from slimdata.cli import cli
from slimdata.docsource import documents_from_lengths
from slimdata.errors import ConfigError, PlanError
from slimdata.solver import Layout
from slimdata.solver.epoch import plan_epoch
from slimdata.solver.planshards import check_payload, read_plan_payload, write_plan_shards

pytestmark = pytest.mark.timeout(120)
LENGTHS = [5, 300, 17, 140, 64, 9, 210, 33, 128, 2, 77, 260, 90, 31]
GIB = 1 << 30


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_layout_cp_must_be_a_positive_integer(bad):
    with pytest.raises(ConfigError) as err:
        Layout(dp=2, cp=bad)
    assert str(err.value) == (
        f"cp={bad!r}: static context parallelism needs an integer >= 1 (1: none)"
    )


def test_layout_cp_plans_a_dp_rank_with_its_devices_memory():
    assert Layout(dp=4, memory_gib=3).memory_bytes == 3 * GIB
    assert Layout(dp=2, cp=2, memory_gib=3).memory_bytes == 6 * GIB
    assert Layout(dp=2).cp == 1


def _lengths_file(tmp_path):
    path = tmp_path / "lengths.json"
    path.write_text(json.dumps(LENGTHS))
    return str(path)


def _plan_args(tmp_path, ranks_per_node, cp, out="plan"):
    return [
        "plan",
        "--lengths",
        _lengths_file(tmp_path),
        "--nodes",
        "1",
        "--ranks-per-node",
        str(ranks_per_node),
        "--cp",
        str(cp),
        "--global-batch-tokens",
        "700",
        "--context",
        "512",
        "--slice-tokens",
        "128",
        "--memory-gib",
        "1",
        "-o",
        str(tmp_path / out),
    ]


def test_plan_cp_must_divide_the_ranks(tmp_path):
    res = CliRunner().invoke(cli, _plan_args(tmp_path, 3, 2))
    assert res.exit_code != 0
    assert (
        "cp=2 does not divide the 3 ranks (1 nodes x 3 ranks per node): choose a static CP "
        "size that divides them"
    ) in res.output
    assert not (tmp_path / "plan").exists()


def test_plan_cp_zero_is_refused_by_the_option(tmp_path):
    res = CliRunner().invoke(cli, _plan_args(tmp_path, 4, 0))
    assert res.exit_code == 2 and "Invalid value for '--cp'" in res.output


def test_plan_json_and_payloads_record_cp(tmp_path):
    res = CliRunner().invoke(cli, _plan_args(tmp_path, 4, 2))
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert (summary["cp"], summary["nodes"], summary["ranks_per_node"]) == (2, 1, 4)
    ds = StreamingDataset(local=str(tmp_path / "plan"), shuffle=False, batch_size=1)
    assert ds.num_samples == summary["steps"] * 4 > 0
    for i in range(ds.num_samples):
        _step, rank, plan, _tokens = read_plan_payload(ds[i])
        # two DP ranks of two processes each; the plan knows its CP size
        assert (plan.dp, plan.rank, plan.meta["cp"]) == (2, rank // 2, 2)
    res1 = CliRunner().invoke(cli, _plan_args(tmp_path, 4, 1, out="plan1"))
    assert res1.exit_code == 0, res1.output
    one = json.loads((tmp_path / "plan1" / "plan.json").read_text())
    assert one["cp"] == 1


def test_every_process_of_a_cp_group_reads_its_dp_rank_payload_in_step_order(tmp_path):
    rng = np.random.default_rng(0)
    toks = [rng.integers(0, VOCAB, size=n).astype(np.uint32) for n in LENGTHS]
    docs = documents_from_lengths(LENGTHS, slice_tokens=128)
    docs = [dataclasses.replace(d, sample=i) for i, d in enumerate(docs)]
    layout = Layout(dp=2, cp=2, context=512, memory_gib=1)
    plans = list(plan_epoch(docs, layout, global_batch_tokens=500, strategy="bfd", seed=1))
    assert len(plans) >= 3 and all(p.meta["cp"] == 2 for p in plans)
    out = tmp_path / "shards"
    summary = write_plan_shards(
        plans, out, nodes=2, ranks_per_node=2, tokens_of=lambda i: toks[i], cp=2
    )
    assert summary["cp"] == 2
    ds = StreamingDataset(local=str(out), shuffle=False, batch_size=1)
    seen = 0
    for process in range(4):
        got = list(PlanShardLoader(ds, rank=process, nodes=2, ranks_per_node=2))
        assert [p.rank for p in got] == [process // 2] * len(plans)
        assert [p.plan for p in got] == [pl.rank_view(process // 2) for pl in plans]
        for p in got:
            d = p.plan.docs
            want = [
                toks[d[s.doc].sample][d[s.doc].offset + s.start : d[s.doc].offset + s.end]
                for s in p.plan.ranks[p.rank].slices()
            ]
            np.testing.assert_array_equal(p.tokens, np.concatenate(want) if want else [])
            seen += len(p.tokens)
    assert seen == 2 * sum(pl.tokens for pl in plans)  # both members of each group, every token


def test_a_payload_of_another_dp_rank_is_refused(tmp_path):
    docs = documents_from_lengths(LENGTHS, slice_tokens=128)
    layout = Layout(dp=2, cp=2, context=512, memory_gib=1)
    plans = list(plan_epoch(docs, layout, global_batch_tokens=500, strategy="bfd", seed=1))
    out = tmp_path / "shards"
    write_plan_shards(plans, out, nodes=1, ranks_per_node=4, cp=2)
    ds = StreamingDataset(local=str(out), shuffle=False, batch_size=1)
    sample = next(ds[i] for i in range(ds.num_samples) if ds[i]["rank"] == 2 and ds[i]["step"] == 0)
    assert check_payload(sample, 0, 2, dp=2, cp=2)[0].rank == 1
    with pytest.raises(PlanError, match=r"carries the plan of rank 1, not of DP rank 0 \(cp=4\)"):
        check_payload(sample, 0, 2, dp=2, cp=4)


@pytest.mark.parametrize("bad", ["2", 0, 3])
def test_plan_json_with_a_bad_cp_is_refused(tmp_path, bad):
    docs = documents_from_lengths(LENGTHS, slice_tokens=128)
    layout = Layout(dp=2, cp=2, context=512, memory_gib=1)
    plans = list(plan_epoch(docs, layout, global_batch_tokens=500, strategy="bfd", seed=1))
    out = tmp_path / "shards"
    write_plan_shards(plans, out, nodes=1, ranks_per_node=4, cp=2)
    sidecar = out / "plan.json"
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "cp": bad}))
    ds = StreamingDataset(local=str(out), shuffle=False, batch_size=1)
    with pytest.raises(PlanError) as err:
        PlanShardLoader(ds, rank=0, nodes=1, ranks_per_node=4)
    assert str(err.value) == (
        f"plan.json records cp={bad!r}: need one integer >= 1 dividing the 4 ranks; "
        "re-run `slimdata plan --cp`"
    )

"""Plan shards: alignment against streaming's own partitioner and a real StreamingDataset
read by 2 nodes x 2 ranks simulated through WORLD_SIZE / RANK / LOCAL_WORLD_SIZE / LOCAL_RANK."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from streaming.base.partition import get_partitions

from slimdata.errors import PlanError
from slimdata.solver import Layout, make_batches, solve
from slimdata.solver.planshards import (
    check_payload,
    payload_positions,
    read_plan_payload,
    write_plan_shards,
)

from .conftest import docs_of, unit_cost


@pytest.mark.parametrize(
    ("steps", "nodes", "rpn", "workers"), [(3, 2, 2, 1), (5, 2, 2, 2), (4, 1, 3, 1), (2, 4, 1, 3)]
)
def test_positions_match_streaming_partition(steps, nodes, rpn, workers):
    pos = payload_positions(steps, nodes, rpn, workers)
    ids = get_partitions("orig", steps * nodes * rpn, nodes, nodes, rpn, workers, 1)
    for r in range(nodes * rpn):
        seq = ids[r // rpn, r % rpn, :, :, 0].T.reshape(
            -1
        )  # DataLoader: worker k % W serves batch k
        assert seq[:steps].tolist() == pos[:, r].tolist()
    assert sorted(pos.reshape(-1).tolist()) == list(range(steps * nodes * rpn))


def _plans(n_docs=40, dp=4):
    rng = np.random.default_rng(1)
    # and one document of 1,200 tokens: more than a rank's share of its batch's time, merged
    docs = docs_of([*rng.integers(20, 400, size=n_docs).tolist(), 1200], 128)
    docs = [
        type(d)(doc_id=d.doc_id, length=d.length, cuts=d.cuts, sample=i) for i, d in enumerate(docs)
    ]
    layout = Layout(dp=dp, memory_gib=100)
    plans = [
        solve(b, layout, "slimpack", 0, unit_cost(), step=i)
        for i, b in enumerate(make_batches(docs, 1500, 0))
    ]
    tokens = {d.sample: (np.arange(d.length, dtype=np.uint32) + 1000 * d.sample) for d in docs}
    return plans, tokens


# Both simulated nodes share this machine's /dev/shm, where real nodes each have their own:
# give each node its own range of streaming shared-memory prefixes (test shim only).
READER = r"""
import json, os, sys
import streaming.base.shared.prefix as P
from streaming import StreamingDataset
node = int(os.environ["RANK"]) // int(os.environ["LOCAL_WORLD_SIZE"])
_orig = P._each_prefix_int
P._each_prefix_int = lambda: (i + 10000 * node for i in _orig())
ds = StreamingDataset(local=sys.argv[1], shuffle=False, batch_size=1, num_canonical_nodes=2)
out = [[int(s["step"]), int(s["rank"]), int(s["ntokens"])] for s in ds]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_streaming_dataset_hands_each_rank_its_payloads(tmp_path):
    plans, tokens = _plans()
    out = tmp_path / "plan"
    summary = write_plan_shards(
        plans, out, nodes=2, ranks_per_node=2, tokens_of=tokens.__getitem__, size_limit=1 << 14
    )
    assert summary["steps"] == len(plans) >= 3
    assert json.loads((out / "plan.json").read_text())["num_canonical_nodes"] == 2
    # each simulated node has its own local copy (as on a real cluster)
    for node in range(2):
        shutil.copytree(out, tmp_path / f"node{node}")
    procs = []
    for rank in range(4):
        env = dict(
            os.environ,
            WORLD_SIZE="4",
            RANK=str(rank),
            LOCAL_WORLD_SIZE="2",
            LOCAL_RANK=str(rank % 2),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT="29555",
        )
        env.pop("PYTEST_XDIST_WORKER", None)
        local = str(tmp_path / f"node{rank // 2}")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", READER, local],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for rank, p in enumerate(procs):
        so, se = p.communicate(timeout=240)
        assert p.returncode == 0, se[-2000:]
        got = json.loads(so.strip().splitlines()[-1])
        assert [(s, r) for s, r, _n in got] == [(step, rank) for step in range(len(plans))]
        for step, _r, n in got:
            assert n == plans[step].ranks[rank].tokens


def test_payload_tokens_and_stamp_check(tmp_path):
    from streaming import LocalDataset

    plans, tokens = _plans()
    write_plan_shards(
        plans, tmp_path / "p", nodes=1, ranks_per_node=4, tokens_of=tokens.__getitem__
    )
    ds = LocalDataset(local=str(tmp_path / "p"))
    pos = payload_positions(len(plans), 1, 4)
    for step in range(len(plans)):
        for rank in range(4):
            sample = ds[int(pos[step, rank])]
            plan, toks = check_payload(sample, step, rank)
            assert plan == plans[step].rank_view(rank)
            want = [
                tokens[plan.docs[s.doc].sample][s.start : s.end]
                for p in plan.ranks[rank].forward
                for s in p.slices
            ]
            assert toks.tolist() == (np.concatenate(want).tolist() if want else [])
    with pytest.raises(PlanError, match="misaligned"):
        check_payload(ds[int(pos[0, 1])], 0, 0)
    step, rank, _plan, _t = read_plan_payload(ds[int(pos[1, 2])])
    assert (step, rank) == (1, 2)


def test_write_rejects_wrong_rank_count(tmp_path):
    plans, _ = _plans()
    with pytest.raises(PlanError, match="expected step 0 and 8 ranks"):
        write_plan_shards(plans, tmp_path / "x", nodes=2, ranks_per_node=4)


def test_payloads_hold_one_rank_view_and_old_shards_are_refused(tmp_path):
    from slimdata.hooks.loader import PlanShardLoader
    from streaming import LocalDataset

    from slimdata.errors import PlanFormatError

    plans, tokens = _plans()
    out = tmp_path / "p"
    write_plan_shards(plans, out, nodes=1, ranks_per_node=4, tokens_of=tokens.__getitem__)
    sidecar = json.loads((out / "plan.json").read_text())
    assert sidecar["slimdata_plan_shards"] == 4
    ds = LocalDataset(local=str(out))
    views = [read_plan_payload(ds[i])[2] for i in range(ds.num_samples)]
    # every payload is one rank's view: its own slices, the documents of its slices and of
    # its merge group, and the other members of its group (their merge packs), nothing more
    for v in views:
        g = v.merge_of_rank(v.rank)
        group = v.merges[g] if g is not None else None
        own = {s.doc for s in v.ranks[v.rank].slices()}
        assert set(v.docs) == own | set(group.docs if group else ())
        assert set(v.ranks) == set(group.ranks if group else (v.rank,))
    assert any(v.merges for v in views)  # the merge-group case is exercised
    loader = PlanShardLoader(ds, rank=2, nodes=1, ranks_per_node=4)
    assert [p.plan for p in loader] == [p.rank_view(2) for p in plans]
    # shards of format 1 (a whole StepPlan per payload) are refused before any payload is read
    # and so are shards of format 2 (no per-step records in plan.json) and 3 (no checksums)
    for old in (1, 2, 3):
        (out / "plan.json").write_text(json.dumps({**sidecar, "slimdata_plan_shards": old}))
        with pytest.raises(
            PlanFormatError, match=f"plan shards of format {old}; this slimdata reads format 4"
        ):
            PlanShardLoader(LocalDataset(local=str(out)), rank=0, nodes=1, ranks_per_node=4)


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_damaged_plan_shard_is_an_error_never_a_batch(tmp_path, damage):
    """Bytes flipped in the middle of a shard (the payloads still decode: only the checksums
    see it) or a shard cut short (streaming cannot decode it): iterating the loader raises a
    PlanError before any payload of the damaged part reaches training."""
    from slimdata.hooks.loader import PlanShardLoader
    from streaming import LocalDataset

    plans, tokens = _plans()
    out = tmp_path / "p"
    write_plan_shards(plans, out, nodes=1, ranks_per_node=4, tokens_of=tokens.__getitem__)
    (shard,) = out.glob("shard.*.mds")
    data = bytearray(shard.read_bytes())
    if damage == "flipped":
        mid = len(data) // 2
        data[mid : mid + 64] = bytes(b ^ 0x5A for b in data[mid : mid + 64])
    else:
        data = data[: len(data) // 2]
    shard.write_bytes(bytes(data))
    with pytest.raises(PlanError, match="is damaged"):
        for rank in range(4):
            loader = PlanShardLoader(
                LocalDataset(local=str(out)), rank=rank, nodes=1, ranks_per_node=4
            )
            list(loader)

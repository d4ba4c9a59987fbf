"""plan.json records every step's loss-token total and step-wide digest; PlanShardLoader
checks every payload against them (issue 18): a payload's loss-token total, the denominator
every rank divides its loss by, cannot be proved by the payload alone."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace

import numpy as np
import pytest
from slimdata.hooks.loader import PlanShardLoader
from streaming import LocalDataset, MDSWriter

from slimdata.errors import ConfigError, InputError, PlanError
from slimdata.solver import Layout, planshards, solve
from slimdata.solver.planshards import PLAN_COLUMNS, payload_crc32, write_plan_shards

from .conftest import docs_of, unit_cost

# two steps of four documents over 2 ranks; a document's last token carries no label:
# step 0: 300 + 40 + 520 + 128 tokens, 299 + 39 + 519 + 127 = 984 loss tokens
# step 1: 77 + 900 + 12 + 256 tokens,  76 + 899 + 11 + 255 = 1241 loss tokens
LENGTHS = [300, 40, 520, 128, 77, 900, 12, 256]
LOSS_TOKENS = [984, 1241]
FIX = "the plan shards or plan.json are damaged; re-run `slimdata plan` to rewrite them"


def _tokens(sample: int) -> np.ndarray:
    return np.arange(LENGTHS[sample], dtype=np.uint32) + 1000 * sample


@pytest.fixture
def shards(tmp_path):
    docs = [replace(d, sample=i) for i, d in enumerate(docs_of(LENGTHS, 128))]
    layout = Layout(dp=2, memory_gib=10)
    plans = [
        solve(docs[4 * i : 4 * i + 4], layout, "slimpack", 0, unit_cost(), step=i) for i in range(2)
    ]
    out = tmp_path / "plan"
    write_plan_shards(plans, out, nodes=1, ranks_per_node=2, tokens_of=_tokens)
    return out


def _load(directory, rank, **kw):
    return list(
        PlanShardLoader(LocalDataset(local=str(directory)), rank=rank, ranks_per_node=2, **kw)
    )


def _sidecar(directory):
    return json.loads((directory / "plan.json").read_text())


def _rewrite_payload(src, dst, step, rank, change):
    """Copy plan shards ``src`` to ``dst`` with ``change(payload dict)`` applied to one payload,
    its checksum recomputed (a writer that means it: what the step records must catch)."""
    ds = LocalDataset(local=str(src))
    with MDSWriter(out=str(dst), columns=PLAN_COLUMNS) as w:
        for i in range(ds.num_samples):
            sample = {k: ds[i][k] for k in PLAN_COLUMNS}
            if (sample["step"], sample["rank"]) == (step, rank):
                data = json.loads(sample["plan"])
                change(data)
                sample["plan"] = json.dumps(data)
                tokens = sample["tokens"][: sample["ntokens"]]
                sample["crc32"] = payload_crc32(sample["plan"], tokens)
            w.write(sample)
    shutil.copy(src / "plan.json", dst / "plan.json")


def test_a_good_plan_loads_and_plan_json_holds_the_step_totals(shards):
    sidecar = _sidecar(shards)
    assert sidecar["step_loss_tokens"] == LOSS_TOKENS
    assert len(sidecar["step_digests"]) == 2 and len(set(sidecar["step_digests"])) == 2
    for rank in (0, 1):
        got = _load(shards, rank)
        assert [p.plan.loss_tokens for p in got] == LOSS_TOKENS
        assert [p.plan.step_digest() for p in got] == sidecar["step_digests"]


def test_a_mutated_plan_json_total_is_refused(shards):
    sidecar = _sidecar(shards)
    sidecar["step_loss_tokens"][1] = 1240
    (shards / "plan.json").write_text(json.dumps(sidecar))
    loader = iter(PlanShardLoader(LocalDataset(local=str(shards)), rank=0, ranks_per_node=2))
    assert next(loader).plan.step == 0  # step 0 still agrees
    message = (
        "payload (step 1, rank 0) divides its loss by 1241 loss tokens; plan.json records "
        f"1240 for step 1: {FIX}"
    )
    with pytest.raises(PlanError, match=f"^{re.escape(message)}$"):
        next(loader)


def test_a_mutated_payload_total_is_refused(shards, tmp_path):
    # 1242 still covers the rank's own documents, so the payload alone looks valid
    _rewrite_payload(shards, tmp_path / "bad", 1, 1, lambda d: d.update(loss_tokens=1242))
    assert [p.plan.step for p in _load(tmp_path / "bad", 0)] == [0, 1]  # rank 0 is intact
    message = (
        "payload (step 1, rank 1) divides its loss by 1242 loss tokens; plan.json records "
        f"1241 for step 1: {FIX}"
    )
    with pytest.raises(PlanError, match=f"^{re.escape(message)}$"):
        _load(tmp_path / "bad", 1)


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["meta"].update(seed=1),
        lambda d: d.update(strategy="bfd"),
        lambda d: d["meta"].pop("imbalance"),
    ],
)
def test_a_mutated_step_wide_field_is_refused(shards, tmp_path, change):
    _rewrite_payload(shards, tmp_path / "bad", 0, 1, change)
    message = (
        "payload (step 0, rank 1) disagrees with plan.json on the step's shared fields "
        f"(strategy, mode, merge groups, lockstep schedule or metadata): {FIX}"
    )
    with pytest.raises(PlanError, match=f"^{re.escape(message)}$"):
        _load(tmp_path / "bad", 1)


@pytest.mark.parametrize(
    "records",
    [
        {"step_loss_tokens": LOSS_TOKENS[:1]},
        {"step_loss_tokens": [984, -1]},
        {"step_loss_tokens": [984, 1241.0]},
        {"step_digests": None},
        {"steps": "2"},
    ],
)
def test_damaged_per_step_records_are_refused_before_any_payload(shards, records):
    (shards / "plan.json").write_text(json.dumps({**_sidecar(shards), **records}))
    with pytest.raises(PlanError, match=r"plan.json: per-step records are damaged \(step_loss"):
        PlanShardLoader(LocalDataset(local=str(shards)), rank=0, ranks_per_node=2)


def test_plan_json_is_required_and_can_be_given_apart(shards, tmp_path):
    kept = tmp_path / "kept.json"
    shutil.move(shards / "plan.json", kept)
    with pytest.raises(InputError, match=r"need exactly one plan\.json beside them, found 0"):
        _load(shards, 0)
    assert [p.plan.loss_tokens for p in _load(shards, 0, plan_json=kept)] == LOSS_TOKENS


def test_plan_json_of_other_shards_is_refused(shards):
    # a loader given another layout than the shards were written for
    with pytest.raises(
        ConfigError,
        match=r"nodes=1, ranks_per_node=1: these plan shards were written for nodes=1, "
        r"ranks_per_node=2 \(plan\.json\)",
    ):
        PlanShardLoader(LocalDataset(local=str(shards)), rank=0, ranks_per_node=1)
    # a plan.json of other shards (of 1 rank), given with its own layout
    other = _sidecar(shards)
    (shards / "plan.json").write_text(json.dumps({**other, "ranks_per_node": 1}))
    with pytest.raises(
        PlanError, match=r"plan\.json records 2 steps; the plan shards hold 4 steps of 1 ranks"
    ):
        PlanShardLoader(LocalDataset(local=str(shards)), rank=0, ranks_per_node=1)


@pytest.mark.parametrize("rank", [2, -1, 7])
def test_a_rank_outside_the_plan_is_refused(shards, rank):
    with pytest.raises(
        ConfigError, match=rf"rank={rank}: the plan has 2 ranks \(1 nodes x 2\), numbered 0 to 1"
    ):
        PlanShardLoader(LocalDataset(local=str(shards)), rank=rank, ranks_per_node=2)


def test_plan_json_size_is_capped(shards, monkeypatch):
    monkeypatch.setattr(planshards, "MAX_SIDECAR_BYTES", 100)
    with pytest.raises(PlanError, match=r"unreadable plan sidecar \(over 100 bytes\)"):
        _load(shards, 0)

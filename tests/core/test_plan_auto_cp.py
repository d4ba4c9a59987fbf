"""``slimdata plan --cp auto`` (the default) and plans from compressed builds.

``--cp auto`` keeps ``cp = 1`` unless a document outweighs a device, then plans the epoch at
the static CP size the simulator finds fastest among those that plan every step
(:mod:`slimdata.autocp`). A build written with ``--compression zstd`` is planned from in
place, without writing into it (:mod:`slimdata.localshards`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slimdata.autocp import cp_preference
from slimdata.cli import cli
from slimdata.cost import CostModel
from slimdata.docsource import documents_from_lengths
from slimdata.errors import InputError
from slimdata.localshards import LocalShards

# llama-8b at 32K context (full recompute): a 32,768-token document needs 13.0 GiB, more
# than the 8 GiB of one device. Two of them per step on 2 devices: each needs a merge group
# of both ranks, so cp = 1 has no room for the second; cp = 2 (one DP rank of 2 devices,
# 16 GiB) runs them one after the other.
TWO_BIG = [32768] * 4
FULL_8B = CostModel.analytic("llama-8b", "h100", "full")  # what --context 32768 implies
PLAN = ["--nodes", "1", "--ranks-per-node", "2", "--context", "32768"]


def _plan(tmp_path: Path, lengths: list[int], *extra: str):
    src = tmp_path / "lengths.txt"
    src.write_text("\n".join(map(str, lengths)))
    out = tmp_path / "plan"
    args = ["plan", "--lengths", str(src), *PLAN, "-o", str(out), "--json", "-", *extra]
    return CliRunner().invoke(cli, args), out


def test_auto_keeps_cp_1_when_no_document_outweighs_a_device(tmp_path):
    res, out = _plan(tmp_path, [300, 40, 500, 128] * 4, "--global-batch-tokens", "4096",
                     "--memory-gib", "40")  # fmt: skip
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["cp_choice"] == {
        "cp": 1,
        "reason": "every document fits one device and costs at most 2x its share of a step",
        "screened": [],
        "failed": [],
    }
    assert json.loads((out / "plan.json").read_text())["cp"] == 1


def test_auto_plans_at_the_cp_that_fits_when_cp_1_cannot(tmp_path):
    res, out = _plan(tmp_path, TWO_BIG, "--global-batch-tokens", "65536", "--memory-gib", "8")
    assert res.exit_code == 0, res.output
    choice = json.loads(res.output)["cp_choice"]
    assert choice["cp"] == 2 and choice["failed"] == []
    assert choice["reason"].startswith("a 32,768-token document needs 13.0 GiB")
    screened = {t["cp"]: t for t in choice["screened"]}
    assert set(screened) == {1, 2}
    assert "needs a merge group of 2 ranks" in screened[1]["error"]
    assert screened[2]["step_time"] > 0
    plan_json = json.loads((out / "plan.json").read_text())
    assert plan_json["cp"] == 2 and plan_json["steps"] == 2


# One 32,768-token document among 64 of 512 tokens, one step on 4 devices: it costs 2.52x a
# device's share of the step's time (more than HEAVY = 2x) and needs 13.0 GiB.
ONE_HEAVY = [32768] + [512] * 64
NEEDS = "needs 13.0 GiB, more than the 8.0 GiB budget of a device"
COSTS = "costs 2.52x a device's share of a step's time (more than 2x)"


@pytest.mark.parametrize(
    ("lengths", "ranks", "memory", "reason"),
    [
        (TWO_BIG, "2", "8", f"a 32,768-token document {NEEDS}"),
        (ONE_HEAVY, "4", "40", f"a 32,768-token document {COSTS}"),
        (ONE_HEAVY, "4", "8", f"a 32,768-token document {NEEDS}, and {COSTS}"),
    ],
)
def test_the_reason_for_screening_cp_sizes_names_memory_time_or_both(
    tmp_path, lengths, ranks, memory, reason
):
    res, _out = _plan(tmp_path, lengths, "--ranks-per-node", ranks, "--memory-gib", memory,
                      "--global-batch-tokens", "65536")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["cp_choice"]["reason"] == reason


def test_an_explicit_cp_is_kept_and_fails_clearly(tmp_path):
    res, _out = _plan(tmp_path, TWO_BIG, "--global-batch-tokens", "65536", "--memory-gib", "8",
                      "--cp", "1")  # fmt: skip
    assert res.exit_code == 2 and "needs a merge group of 2 ranks" in res.output
    assert "Traceback" not in res.output


def test_auto_names_every_size_it_tried_when_none_plans(tmp_path):
    res, _out = _plan(tmp_path, TWO_BIG, "--global-batch-tokens", "65536", "--memory-gib", "4")
    assert res.exit_code == 2, res.output
    assert (
        "no static context-parallel size plans every step (--cp auto tried cp=1, cp=2)"
        in res.output
    )
    # alone on a DP rank a document needs its 13.0 GiB of activations and K/V; at cp=2 also
    # the K/V its last pass gathers, 0.25 GiB on each of the rank's 2 devices
    assert "cp=1: document doc_id 2 (32768 tokens, 16 slices) needs 13.0 GiB" in res.output
    assert "cp=2: document doc_id 2 (32768 tokens, 16 slices) needs 13.5 GiB" in res.output


@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5"])
def test_cp_must_be_auto_or_a_positive_integer(tmp_path, bad):
    res, _out = _plan(tmp_path, [100], "--global-batch-tokens", "4096", "--cp", bad)
    assert res.exit_code == 2 and "'--cp'" in res.output and "use 'auto'" in res.output


def test_preference_orders_sizes_by_simulated_time_then_failures():
    docs = documents_from_lengths(TWO_BIG, 2048)
    common = dict(ranks_per_node=2, global_batch_tokens=65536, context=32768, mode="free",
                  strategy="slimpack", seed=0, cost=FULL_8B, oversize="split")  # fmt: skip
    assert cp_preference(docs, ranks=2, memory_gib=8, **common).order == [2, 1]
    # 4 devices: cp = 1 still cannot place two 2-rank groups' documents with room for both
    # (a group of 2 for each), so it is screened; the order lists every power of two once
    order = cp_preference(docs, ranks=4, memory_gib=8, **common).order
    assert sorted(order) == [1, 2, 4]


def _build(tmp_path: Path, name: str, *extra: str) -> Path:
    corpus = Path(__file__).resolve().parents[1] / "fixtures" / "docs.jsonl"
    tok = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_tokenizer.json"
    out = tmp_path / name
    args = ["build", str(corpus), "-o", str(out), "--tokenizer", str(tok), "--slice-tokens", "128"]
    res = CliRunner().invoke(cli, [*args, *extra])
    assert res.exit_code == 0, res.output
    return out


def _payloads(plan_dir: Path) -> list[bytes]:
    from streaming import LocalDataset

    ds = LocalDataset(local=str(plan_dir))
    return [
        json.dumps(ds[i], default=lambda a: a.tolist(), sort_keys=True).encode()
        for i in range(len(ds))
    ]


def test_plan_from_a_compressed_build_equals_the_plan_from_a_raw_one(tmp_path):
    raw = _build(tmp_path, "raw")
    packed = _build(tmp_path, "zstd", "--compression", "zstd")
    assert not list(packed.rglob("*.mds")) and list(packed.rglob("*.mds.zstd"))
    before = sorted(p.relative_to(packed).as_posix() for p in packed.rglob("*"))
    outs = []
    for ds in (raw, packed):
        out = tmp_path / f"plan-{ds.name}"
        args = ["plan", str(ds), "--nodes", "1", "--ranks-per-node", "2", "--context", "1024",
                "--global-batch-tokens", "2048", "--memory-gib", "40", "-o", str(out)]  # fmt: skip
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 0, res.output
        outs.append(out)
    assert len(_payloads(outs[0])) >= 4 and _payloads(outs[0]) == _payloads(outs[1])
    # nothing was written into the build
    assert sorted(p.relative_to(packed).as_posix() for p in packed.rglob("*")) == before


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:20], r"decompresses to 0 bytes but index.json says \d+"),  # truncated
        (lambda b: b"not zstd at all" * 8, r"not a valid zstd shard .*rebuild the dataset"),
    ],
)
def test_a_damaged_compressed_shard_is_a_clear_error(tmp_path, damage, message):
    packed = _build(tmp_path, "zstd", "--compression", "zstd")
    shard = next(packed.rglob("*.mds.zstd"))
    shard.write_bytes(damage(shard.read_bytes()))
    reader = LocalShards(packed)
    with pytest.raises(InputError, match=message):
        for i in range(len(reader)):
            reader[i]
    reader.close()


@pytest.mark.parametrize("delta", [-1, +1])
def test_a_shard_that_does_not_decompress_to_its_indexed_size_is_refused(tmp_path, delta):
    packed = _build(tmp_path, "zstd", "--compression", "zstd")
    index_path = packed / "index.json"
    index = json.loads(index_path.read_text())
    shard = index["shards"][0]
    size = shard["raw_data"]["bytes"]
    shard["raw_data"]["bytes"] = size + delta
    index_path.write_text(json.dumps(index))
    reader = LocalShards(packed)
    said = f"more than {size - 1} bytes" if delta < 0 else f"{size} bytes"
    with pytest.raises(
        InputError, match=f"decompresses to {said} but index.json says {size + delta}"
    ):
        reader[0]
    reader.close()


def test_decompressed_copies_live_outside_the_build_until_closed(tmp_path):
    packed = _build(tmp_path, "zstd", "--compression", "zstd")
    reader = LocalShards(packed)
    rows = [reader[i] for i in range(len(reader))]
    assert len(rows) >= 2 and all(len(r["tokens"]) == r["length"] for r in rows)
    scratch = Path(reader.shards[0].dirname)
    assert scratch != packed and list(scratch.rglob("*.mds"))
    reader.close()
    assert not scratch.exists() and reader.shards[0].dirname == str(packed)


def test_auto_falls_back_to_the_next_size_when_an_epoch_does_not_plan(tmp_path, monkeypatch):
    # the screening order puts cp = 1 first; the epoch cannot plan at cp = 1 (two documents
    # of 13.0 GiB per step on 2 devices of 8 GiB), so the epoch is planned at cp = 2 and the
    # failure is reported; nothing of the failed attempt is left in the output
    import slimdata.autocp as autocp

    monkeypatch.setattr(
        autocp, "cp_preference", lambda *a, **k: autocp.CpChoice([1, 2], "forced order")
    )
    res, out = _plan(tmp_path, TWO_BIG, "--global-batch-tokens", "65536", "--memory-gib", "8")
    assert res.exit_code == 0, res.output
    choice = json.loads(res.output)["cp_choice"]
    assert choice["cp"] == 2 and choice["reason"] == "forced order"
    assert len(choice["failed"]) == 1 and choice["failed"][0].startswith("cp=1: ")
    assert json.loads((out / "plan.json").read_text())["cp"] == 2


def test_cp_auto_says_why_each_rejected_size_fails(tmp_path):
    """A size that cannot plan says what refused it. At cp=2 the solver planned a step that
    needed 4.12 GiB per device (its packs and merge groups left out the K/V a pass gathers
    on every device); it now refuses it, saying why."""
    lengths = tmp_path / "l.txt"
    lengths.write_text("32768\n23414\n19991\n12000\n9000\n5000\n3000\n1000\n")
    args = ["plan", "--lengths", str(lengths), "--nodes", "1", "--ranks-per-node", "8"]
    args += ["--global-batch-tokens", "131072", "--context", "32768", "--memory-gib", "4"]
    result = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[-5].startswith("static CP 4 (--cp auto): the fastest size on the first step ")
    assert "screened because a 32,768-token document needs 13.0 GiB" in lines[-5]
    assert lines[-4].startswith("  cp=1: first step fails: document doc_id 2 (19991 tokens) ")
    assert lines[-3].startswith(
        "  cp=2: first step fails: document doc_id 2 (19991 tokens) needs a merge group of 2 "
        "ranks (memory cap 4.0 GiB per device, 8.0 GiB per DP rank of 2 CP devices) but only "
        "0 of 4 ranks are free"
    )
    assert lines[-2].startswith("  cp=4: first step ") and lines[-2].endswith(" s")


def test_a_size_over_memory_says_by_how_much():
    """A configuration whose simulated step is over memory says by how much (4.12 GiB
    against the 4.00 GiB cap, not "4.0 GiB per device" beside a 4.0 GiB budget)."""
    from types import SimpleNamespace

    from slimdata.sim.search import _screen

    ev = SimpleNamespace(
        log=SimpleNamespace(screened=0),
        layout=SimpleNamespace(memory_gib=4.0),
        plan=lambda name, at, step, schedule: (None, None),
        cannot_fit=lambda plan, cp: False,
        sim=lambda name, at, schedule, step: SimpleNamespace(
            over_memory=True, peak_memory_gib=4.1234
        ),
    )
    at = SimpleNamespace(cp=2)
    assert _screen(ev, "slimpack", at, "1f1b") == "needs 4.12 GiB per device, over the 4.00 GiB cap"

"""`slimdata build --plan` and `slimdata plan SHARDS`: plan shards from real document shards.

Every payload's tokens must equal the tokens of its rank's slices, read from the document
shards, and planning from shards must use the cost model recorded by the build.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from slimdata.cli import cli
from slimdata.cost import CostModel

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TOKENIZER = str(FIXTURES / "tiny_tokenizer.json")


def _corpus(root: Path) -> Path:
    corpus = root / "corpus"
    corpus.mkdir()
    rng = np.random.default_rng(3)
    words = ["alpha", "beta", "gamma", "delta", "slice", "pack", "rank", "merge"]
    for i in range(12):
        n = int(rng.integers(5, 400))
        (corpus / f"doc{i:02d}.txt").write_text(" ".join(rng.choice(words, n)))
    return corpus


def _read(directory: Path) -> list[dict]:
    from streaming import LocalDataset

    ds = LocalDataset(local=str(directory))
    return [ds[i] for i in range(len(ds))]


def test_build_with_plan_payloads_carry_exact_tokens(tmp_path):
    out, plan_dir = tmp_path / "shards", tmp_path / "plan"
    args = [
        "build",
        str(_corpus(tmp_path)),
        "-o",
        str(out),
        "--tokenizer",
        TOKENIZER,
        "--slice-tokens",
        "128",
        "--quiet",
        "--model",
        "llama-1b",
        "--plan",
        str(plan_dir),
        "--nodes",
        "1",
        "--ranks-per-node",
        "2",
        "--global-batch-tokens",
        "1024",
        "--memory-gib",
        "8",
        "--context",
        "1024",
        "--oversize",
        "split",
    ]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    docs = {i: s for i, s in enumerate(_read(out))}
    payloads = _read(plan_dir)
    summary = json.loads((plan_dir / "plan.json").read_text())
    assert len(payloads) == 2 * summary["steps"] and summary["steps"] >= 2

    from slimdata.solver.planshards import read_plan_payload

    seen_tokens = 0
    for sample in payloads:
        step, rank, plan, tokens = read_plan_payload(sample)
        plan.validate()
        expected = [
            docs[plan.docs[s.doc].sample]["tokens"][
                plan.docs[s.doc].offset + s.start : plan.docs[s.doc].offset + s.end
            ]
            for p in plan.ranks[rank].forward
            for s in p.slices
        ]
        expected = np.concatenate(expected) if expected else np.zeros(0, np.uint32)
        assert np.array_equal(tokens, expected), (step, rank)
        seen_tokens += len(tokens)
    # token conservation: the epoch's payloads hold every token of every document once
    assert seen_tokens == sum(len(s["tokens"]) for s in docs.values())
    # the plan used the build's cost model (llama-1b), not the CLI default (llama-8b)
    built = CostModel.from_dict(json.loads((out / "slimdata.json").read_text())["cost_model"])
    assert built.label.startswith("llama-1b")
    # a pack of a rank's own documents (a merge pack's attention runs at its chunk efficiency,
    # slimdata.execution.pack_compute): under an analytic model, no per-call constant, it
    # costs its slices' forward seconds
    first = next(
        p
        for sample in payloads
        for p in read_plan_payload(sample)[2].ranks[int(sample["rank"])].forward
        if p.merge is None and p.slices
    )
    expected_cost = sum(float(built.forward(s.start, s.end)) for s in first.slices)
    assert abs(first.cost - expected_cost) <= 1e-9 * max(1.0, expected_cost)


def test_plan_from_shards_and_layout_errors(tmp_path):
    out = tmp_path / "shards"
    base = [
        "build",
        str(_corpus(tmp_path)),
        "-o",
        str(out),
        "--tokenizer",
        TOKENIZER,
        "--slice-tokens",
        "128",
        "--quiet",
    ]
    res = CliRunner().invoke(cli, [*base, "--plan", str(tmp_path / "p0"), "--nodes", "1"])
    assert res.exit_code == 2 and "--plan needs the training layout" in res.output
    assert "--ranks-per-node" in res.output and "--global-batch-tokens" in res.output
    assert not (out / "index.json").exists()  # refused before building anything
    assert CliRunner().invoke(cli, base).exit_code == 0
    layout = [
        "--nodes",
        "1",
        "--ranks-per-node",
        "2",
        "--global-batch-tokens",
        "2048",
        "--memory-gib",
        "8",
        "--context",
        "2048",
    ]
    res = CliRunner().invoke(cli, ["plan", str(out), *layout, "-o", str(tmp_path / "p1")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["plan", str(out), *layout, "-o", str(tmp_path / "p1")])
    assert res.exit_code == 2 and "not empty" in res.output
    res = CliRunner().invoke(cli, ["plan", str(tmp_path), *layout, "-o", str(tmp_path / "p2")])
    assert res.exit_code == 2 and "no index.json" in res.output


def test_payloads_without_tokens_read_back_empty(tmp_path):
    """Planned from lengths, payloads carry no tokens; MDS stores one pad that must not leak."""
    (tmp_path / "lengths.txt").write_text("300\n40\n900\n")
    out = tmp_path / "plan"
    res = CliRunner().invoke(
        cli,
        [
            "plan",
            "--lengths",
            str(tmp_path / "lengths.txt"),
            "--nodes",
            "1",
            "--ranks-per-node",
            "2",
            "--global-batch-tokens",
            "4096",
            "--memory-gib",
            "8",
            "--context",
            "1024",
            "-o",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    from slimdata.solver.planshards import check_payload, read_plan_payload

    samples = _read(out)
    assert len(samples) == 2
    for sample in samples:
        step, rank, _plan, tokens = read_plan_payload(sample)
        assert tokens.dtype == np.uint32 and len(tokens) == 0
        assert check_payload(sample, step, rank)[1].shape == (0,)


def test_plan_derives_the_memory_budget_simulate_derives(tmp_path):
    # without --memory-gib, `plan` leaves room for the same model states as `simulate`
    from slimdata.cli import cli

    lengths = tmp_path / "lengths.json"
    lengths.write_text(json.dumps([3000, 1200, 700, 5000, 90, 2400]))
    common = ["--lengths", str(lengths), "--model", "llama-1b", "--context", "4096"]
    res = CliRunner().invoke(
        cli,
        [
            "plan",
            *common,
            "--nodes",
            "1",
            "--ranks-per-node",
            "2",
            "--global-batch-tokens",
            "8192",
            "--parallelism",
            "ddp",
            "-o",
            str(tmp_path / "p"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "memory budget" in res.output and "ddp, adam, dp=2" in res.output
    planned = json.loads((tmp_path / "p" / "plan.json").read_text())["memory_gib"]
    res = CliRunner().invoke(
        cli,
        [
            "simulate",
            *common,
            "--dp",
            "2",
            "--parallelism",
            "ddp",
            "--strategies",
            "bfd",
            "--json",
            str(tmp_path / "s.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "s.json").read_text())["config"]["memory_gib"] == planned
    assert 0 < planned < 80


def test_simulate_on_shards_uses_the_cost_model_the_build_recorded(tmp_path):
    # shards built for llama-1b: without cost options `simulate` prices them with that model
    # (as `plan` does), not with its own default llama-8b; a cost option given wins
    from slimdata.cli import cli
    from slimdata.ingest import BuildConfig, build

    src = tmp_path / "docs.jsonl"
    src.write_text("".join(f'{{"text": "{"word " * (40 + 7 * i)}"}}\n' for i in range(12)))
    tokenizer = str(Path(__file__).resolve().parents[1] / "fixtures" / "tiny_tokenizer.json")
    build(BuildConfig(inputs=(str(src),), tokenizer=tokenizer, model="llama-1b"), tmp_path / "ds")
    built = json.loads((tmp_path / "ds" / "slimdata.json").read_text())["cost_model"]["label"]
    args = ["simulate", str(tmp_path / "ds"), "--dp", "2", "--strategies", "bfd", "--json"]
    res = CliRunner().invoke(cli, [*args, str(tmp_path / "a.json")])
    assert res.exit_code == 0, res.output
    config = json.loads((tmp_path / "a.json").read_text())["config"]
    assert config["cost_model"] == built and "llama-1b" in built
    more = ["--model", "llama-1b", "--cost-device", "a100"]
    res = CliRunner().invoke(cli, [*args, str(tmp_path / "b.json"), *more])
    assert res.exit_code == 0, res.output
    given = json.loads((tmp_path / "b.json").read_text())["config"]["cost_model"]
    assert given != built and "a100" in given


def test_build_overwrite_replaces_the_plan_shards_too(tmp_path):
    """A rerun of `build --plan DIR` needs --overwrite for both directories, and it replaces
    both."""
    layout = ["--nodes", "1", "--ranks-per-node", "2", "--global-batch-tokens", "1024"]
    layout += ["--memory-gib", "8", "--context", "1024", "--plan", str(tmp_path / "plan")]
    build = ["build", str(_corpus(tmp_path)), "-o", str(tmp_path / "shards"), "--tokenizer"]
    build += [TOKENIZER, "--slice-tokens", "128", "--quiet", "--model", "llama-1b", *layout]
    assert CliRunner().invoke(cli, [*build, "--seed", "1"]).exit_code == 0
    res = CliRunner().invoke(cli, [*build, "--overwrite"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "plan" / "plan.json").read_text())["seed"] == 0


def test_build_resume_solves_the_plan_again(tmp_path):
    """A `build --plan DIR` stopped in its plan stage (or finished) is finished by the same
    command with --resume: the plan shards in DIR are solved and written again, not refused."""
    layout = ["--nodes", "1", "--ranks-per-node", "2", "--global-batch-tokens", "1024"]
    layout += ["--memory-gib", "8", "--context", "1024", "--plan", str(tmp_path / "plan")]
    build = ["build", str(_corpus(tmp_path)), "-o", str(tmp_path / "shards"), "--tokenizer"]
    build += [TOKENIZER, "--slice-tokens", "128", "--quiet", "--model", "llama-1b", *layout]
    assert CliRunner().invoke(cli, build).exit_code == 0
    first = (tmp_path / "plan" / "plan.json").read_text()
    (tmp_path / "plan" / "plan.json").write_text(first.replace('"steps"', '"stale"'))
    res = CliRunner().invoke(cli, [*build, "--resume"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "plan" / "plan.json").read_text() == first
    # a --plan directory that holds something else is still refused
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep")
    res = CliRunner().invoke(cli, [*build, "--resume", "--plan", str(tmp_path / "other")])
    assert res.exit_code == 2 and "notes.txt" not in res.output
    assert (tmp_path / "other" / "notes.txt").read_text() == "keep"


def test_build_resume_finishes_a_plan_killed_while_it_wrote_its_shards(tmp_path):
    """What a `build --plan DIR` killed in its plan's writing leaves in DIR (the request and a
    shard cut short: tests/core/test_plan_interrupted.py) is written again, to the same
    bytes, by the same command with --resume or --overwrite."""
    layout = ["--nodes", "1", "--ranks-per-node", "2", "--global-batch-tokens", "1024"]
    layout += ["--memory-gib", "8", "--context", "1024", "--plan", str(tmp_path / "plan")]
    build = ["build", str(_corpus(tmp_path)), "-o", str(tmp_path / "shards"), "--tokenizer"]
    build += [TOKENIZER, "--slice-tokens", "128", "--quiet", "--model", "llama-1b", *layout]
    assert CliRunner().invoke(cli, build).exit_code == 0
    plan = tmp_path / "plan"
    whole = {p.name: p.read_bytes() for p in sorted(plan.iterdir())}
    assert sorted(whole) == ["index.json", "plan.json", "plan_request.json", "shard.00000.mds"]
    for flag in ("--resume", "--overwrite"):
        for name in ("index.json", "plan.json"):
            (plan / name).unlink()
        (plan / "shard.00000.mds").write_bytes(whole["shard.00000.mds"][:100])
        res = CliRunner().invoke(cli, [*build, flag])
        assert res.exit_code == 0, res.output
        assert {p.name: p.read_bytes() for p in sorted(plan.iterdir())} == whole


def test_build_plan_takes_cp_as_plan_does(tmp_path):
    """`build --plan` has `plan`'s layout options, `--cp` included, with the same default
    (auto): the plan shards it writes equal those `slimdata plan` writes from the same shards
    with the same options, and `--cp 2` plans DP rank groups of two devices."""
    out = tmp_path / "shards"
    layout = ["--nodes", "1", "--ranks-per-node", "2", "--global-batch-tokens", "1024"]
    layout += ["--memory-gib", "8", "--context", "1024"]
    build = ["build", str(_corpus(tmp_path)), "-o", str(out), "--tokenizer", TOKENIZER]
    build += ["--slice-tokens", "128", "--quiet", "--model", "llama-1b", *layout]
    res = CliRunner().invoke(cli, [*build, "--plan", str(tmp_path / "auto")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["plan", str(out), *layout, "-o", str(tmp_path / "planned")])
    assert res.exit_code == 0, res.output
    sidecar = json.loads((tmp_path / "auto" / "plan.json").read_text())
    assert sidecar == json.loads((tmp_path / "planned" / "plan.json").read_text())
    assert [p["plan"] for p in _read(tmp_path / "auto")] == [
        p["plan"] for p in _read(tmp_path / "planned")
    ]
    again = [*build, "--resume", "--plan", str(tmp_path / "cp2"), "--cp", "2"]
    res = CliRunner().invoke(cli, again)
    assert res.exit_code == 0, res.output
    sidecar = json.loads((tmp_path / "cp2" / "plan.json").read_text())
    assert sidecar["cp"] == 2 and len(_read(tmp_path / "cp2")) == 2 * sidecar["steps"]


def test_build_plan_layout_is_checked_before_the_build(tmp_path):
    """A layout `plan` would refuse fails before the corpus is tokenized: no output, no
    plan directory."""
    out, plan = tmp_path / "shards", tmp_path / "plan"
    build = ["build", str(_corpus(tmp_path)), "-o", str(out), "--tokenizer", TOKENIZER]
    build += ["--quiet", "--plan", str(plan), "--nodes", "1", "--ranks-per-node", "8"]
    build += ["--global-batch-tokens", "100000", "--memory-gib", "8"]
    res = CliRunner().invoke(cli, [*build, "--cp", "3"])
    assert (res.exit_code, res.output) == (
        2,
        "Error: cp=3 does not divide the 8 ranks (1 nodes x 8 ranks per node): choose a "
        "static CP size that divides them\n",
    )
    assert not out.exists()
    res = CliRunner().invoke(cli, [*build, "--mode", "free", "--parallelism", "fsdp"])
    assert res.exit_code == 2 and res.output.startswith("Error: --mode free with --parallelism")
    plan.mkdir()
    (plan / "notes.txt").write_text("keep")
    res = CliRunner().invoke(cli, build)
    assert (res.exit_code, res.output) == (
        2,
        f"Error: {plan} exists and is not empty; pass --overwrite to replace it or choose a "
        "new output directory\n",
    )
    assert not out.exists() and [p.name for p in plan.iterdir()] == ["notes.txt"]


def test_build_layout_options_need_plan(tmp_path):
    """Without --plan the layout options would be ignored: giving one is an error (--context
    aside, which also picks --recompute auto's policy)."""
    out = tmp_path / "shards"
    build = ["build", str(_corpus(tmp_path)), "-o", str(out), "--tokenizer", TOKENIZER]
    res = CliRunner().invoke(cli, [*build, "--nodes", "2", "--ranks-per-node", "8", "--cp", "2"])
    assert (res.exit_code, res.output) == (
        2,
        "Error: --nodes, --ranks-per-node, --cp: the layout of a plan, which needs --plan DIR; "
        "give --plan DIR to write plan shards too, or leave them out\n",
    )
    assert not out.exists()
    res = CliRunner().invoke(cli, [*build, "--quiet", "--context", "4096"])
    assert (res.exit_code, res.output) == (0, "")
    sidecar = json.loads((out / "slimdata.json").read_text())
    assert sidecar["recompute"] == "selective"  # --context 4096 < 32K under --recompute auto

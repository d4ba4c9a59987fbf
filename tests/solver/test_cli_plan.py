import json

import pytest
from click.testing import CliRunner

from slimdata.cli import cli


def test_plan_from_lengths(tmp_path):
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(str(n) for n in [300, 5000, 120, 800, 64, 2000, 90, 4000]))
    out = tmp_path / "out"
    args = [
        "plan",
        "--lengths",
        str(lengths),
        "--nodes",
        "1",
        "--ranks-per-node",
        "2",
        "--global-batch-tokens",
        "4096",
        "--memory-gib",
        "40",
        "--context",
        "4096",
        "--oversize",
        "split",
        "--model",
        "llama-1b",
        "-o",
        str(out),
    ]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "plan.json").read_text())
    assert summary["tokens"] == 12374 and summary["strategy"] == "slimpack"
    res = CliRunner().invoke(cli, args)  # output exists
    assert res.exit_code != 0 and "not empty" in res.output


def test_plan_oversize_error_names_document(tmp_path):
    lengths = tmp_path / "l.txt"
    lengths.write_text("300\n9000\n")
    res = CliRunner().invoke(
        cli,
        [
            "plan",
            "--lengths",
            str(lengths),
            "--nodes",
            "1",
            "--ranks-per-node",
            "2",
            "--global-batch-tokens",
            "4096",
            "--memory-gib",
            "40",
            "--context",
            "4096",
            "--oversize",
            "error",
            "-o",
            str(tmp_path / "o"),
        ],
    )
    assert res.exit_code != 0 and "doc_id 1 has 9000 tokens" in res.output


def test_plan_twice_writes_byte_identical_files(tmp_path):
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(str(n) for n in [300, 40, 2000, 128, 77, 900, 12, 256] * 6))
    trees = []
    for name in ("a", "b"):
        args = ["plan", "--lengths", str(lengths), "--nodes", "1", "--ranks-per-node", "2"]
        args += ["--global-batch-tokens", "4096", "--memory-gib", "40", "-o", str(tmp_path / name)]
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 0, res.output
        root = tmp_path / name
        trees.append({p.name: p.read_bytes() for p in sorted(root.iterdir())})
    assert len(trees[0]) >= 3 and trees[0] == trees[1]
    assert b"solve_ms" not in b"".join(trees[0].values())


def test_a_document_no_group_holds_names_the_cap_per_device_and_per_cp_rank(tmp_path):
    """Under static CP a DP rank is planned with its CP devices' memory together; the error
    gives the cap as the user set it (per device) and per DP rank, and suggests only what
    helps: the 92,556-token document is within --context, so --oversize is not one of them,
    and its 46 slices already span both DP ranks, so finer slices are not either. Alone on
    a DP rank it needs 38.2 GiB: its 36.8 GiB of activations and K/V, and on each of the 2
    devices the 0.7 GiB of K/V its last pass gathers (the execution model's rule)."""
    lengths = tmp_path / "l.txt"
    lengths.write_text("92556\n1000\n3000\n500\n")
    args = ["plan", "--lengths", str(lengths), "--nodes", "1", "--ranks-per-node", "4"]
    args += ["--global-batch-tokens", "131072", "--memory-gib", "2", "--cp", "2"]
    res = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    assert (
        "needs 38.2 GiB but the memory cap is 2.0 GiB per device, 4.0 GiB per DP rank of 2 CP "
        "devices and even 2 merged ranks cannot hold it"
    ) in res.output
    assert res.output.rstrip().endswith(
        ": raise --memory-gib, or use more devices (--nodes, --ranks-per-node)"
    )
    assert "Traceback" not in res.output and not (tmp_path / "out").exists()


def test_fsdp_plans_are_lockstep_and_solved_without_recompute(tmp_path):
    """FSDP runs only lockstep plans solved without recompute: --parallelism fsdp plans
    lockstep by default, refuses --mode free, and refuses a cost model with recompute."""
    lengths = tmp_path / "l.txt"
    lengths.write_text("5000\n300\n200\n3000\n")
    args = ["plan", "--lengths", str(lengths), "--nodes", "1", "--ranks-per-node", "2"]
    args += ["--global-batch-tokens", "8192", "--memory-gib", "20", "--parallelism", "fsdp"]
    runner = CliRunner()
    res = runner.invoke(cli, [*args, "--recompute", "none", "-o", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "a" / "plan.json").read_text())["mode"] == "lockstep"
    res = runner.invoke(
        cli, [*args, "--recompute", "none", "--mode", "free", "-o", str(tmp_path / "b")]
    )
    assert res.exit_code == 2 and not (tmp_path / "b").exists()
    assert res.output == (
        "Error: --mode free with --parallelism fsdp: FSDP runs only lockstep plans (every rank "
        "makes the same calls); use --mode lockstep or leave --mode out\n"
    )
    res = runner.invoke(cli, [*args, "--recompute", "full", "-o", str(tmp_path / "c")])
    assert res.exit_code == 2 and not (tmp_path / "c").exists()
    assert res.output == (
        "Error: --parallelism fsdp: the cost model assumes full recompute, which run_step does "
        "not run under FSDP; plan with --recompute none (and a --memory-gib that holds the "
        "activations)\n"
    )
    # without fsdp the default mode stays free
    res = runner.invoke(cli, [*args[:-2], "-o", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "d" / "plan.json").read_text())["mode"] == "free"


def test_an_error_every_cp_size_shares_is_given_alone(tmp_path):
    """--cp auto tried only cp=1 and failed for a reason static CP does not change (a document
    longer than --context under --oversize error): the error is that reason, not a CP one."""
    lengths = tmp_path / "l.txt"
    lengths.write_text("33207\n300\n")
    args = ["plan", "--lengths", str(lengths), "--nodes", "1", "--ranks-per-node", "8"]
    args += ["--global-batch-tokens", "32768", "--context", "4096", "--oversize", "error"]
    res = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "o")])
    assert res.exit_code == 2 and not (tmp_path / "o").exists()
    assert res.output == (
        "Error: document doc_id 0 has 33207 tokens, more than the context 4096: raise --context "
        "or choose --oversize split|truncate\n"
    )


@pytest.mark.parametrize(
    ("gbt", "warning"),
    [
        ("1", "steps hold 3,500 tokens on average, not the 1 of --global-batch-tokens (a step takes whole documents, at least one)"),
        ("100000", "steps hold 7,000 tokens on average, not the 100,000 of --global-batch-tokens (the documents hold 7,000 tokens in all)"),
        ("7000", None),
    ],
)  # fmt: skip
def test_plan_says_when_steps_do_not_hold_the_batch_asked_for(tmp_path, gbt, warning):
    """The warning `simulate` gives, on standard error: `--json -` keeps standard output JSON."""
    (tmp_path / "l.txt").write_text("4000\n3000\n")
    args = ["plan", "--lengths", str(tmp_path / "l.txt"), "--nodes", "1", "--ranks-per-node"]
    args += ["2", "--global-batch-tokens", gbt, "--memory-gib", "40", "--context", "8192"]
    result = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "p"), "--json", "-"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["warnings"] == ([warning] if warning else [])
    assert result.stderr == (f"warning: {warning}\n" if warning else "")


def test_an_existing_output_is_replaced_only_with_overwrite_and_only_if_it_holds_a_plan(tmp_path):
    (tmp_path / "l.txt").write_text("4000\n3000\n")
    out = tmp_path / "p"
    args = ["plan", "--lengths", str(tmp_path / "l.txt"), "--nodes", "1", "--ranks-per-node"]
    args += ["2", "--global-batch-tokens", "7000", "--memory-gib", "40", "--context", "8192"]
    args += ["-o", str(out)]
    assert CliRunner().invoke(cli, [*args, "--seed", "1"]).exit_code == 0
    (out / "stale.txt").write_text("from the first plan")
    result = CliRunner().invoke(cli, args)
    assert (result.exit_code, result.output) == (
        2,
        f"Error: {out} exists and is not empty: it holds finished plan shards (plan.json); pass "
        "--overwrite to replace them or choose a new output directory\n",
    )
    result = CliRunner().invoke(cli, [*args, "--overwrite"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "plan.json").read_text())["seed"] == 0
    assert not (out / "stale.txt").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    result = CliRunner().invoke(cli, [*args[:-1], str(other), "--overwrite"])
    assert (result.exit_code, result.output) == (
        2,
        f"Error: refusing to --overwrite {other}: it does not look like plan shards (no "
        "plan.json or plan_request.json); remove it yourself if you mean it\n",
    )
    assert [p.name for p in other.iterdir()] == ["precious.txt"]


def test_a_bad_lengths_file_is_reported_before_the_memory_budget(tmp_path):
    # 2 ranks of llama-8b under zero1 do not hold the model states in the default budget:
    # the bad file is still what the user hears about first
    bad = tmp_path / "bad.json"
    bad.write_text('{"a":1}\n')
    args = ["plan", "--lengths", str(bad), "--nodes", "1", "--ranks-per-node", "2"]
    args += ["--global-batch-tokens", "100000", "-o", str(tmp_path / "p")]
    result = CliRunner().invoke(cli, args)
    assert (result.exit_code, result.output) == (
        2,
        f"Error: {bad}:1: '{{\"a\":1}}' is not an integer length\n",
    )
    assert not (tmp_path / "p").exists()

"""Every numeric option of every command refuses nan, inf, zero and negatives (where they
make no sense) with a clear `Error: Invalid value for '--x'` and exit 2, before any work
(issue 18). One validation layer: the option types of slimdata.cli.options."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from slimdata.cli import cli
from slimdata.cost import resolve_cost_model
from slimdata.errors import ConfigError
from slimdata.sim.compare import compare_strategies
from slimdata.solver import Layout

GOOD = {
    "--nodes": "1",
    "--ranks-per-node": "2",
    "--global-batch-tokens": "4096",
    "--memory-gib": "40",
}
LAYOUT = ["--nodes", "--ranks-per-node", "--global-batch-tokens", "--memory-gib", "--context"]
NUMERIC = {
    "build": [
        "--slice-tokens",
        "--truncate",
        "--workers",
        "--task-bytes",
        *LAYOUT,
        "--seed",
        "--workers-per-rank",
    ],
    "plan": ["--slice-tokens", *LAYOUT, "--seed", "--workers-per-rank"],
    "simulate": [
        "--context",
        "--dp",
        "--pp",
        "--ranks-per-node",
        "--global-batch-tokens",
        "--memory-gib",
        "--cp-overlap",
        "--steps",
        "--seed",
        "--jobs",
    ],
}
ZERO_OK = {"--seed", "--cp-overlap"}


def base_args(command, tmp_path):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("100\n200\n")
    if command == "build":
        return ["build", str(lengths), "-o", str(tmp_path / "out")]
    if command == "plan":
        layout = [a for k, v in GOOD.items() for a in (k, v)]
        return ["plan", "--lengths", str(lengths), *layout, "-o", str(tmp_path / "plan")]
    return ["simulate", "--lengths", str(lengths)]


CASES = [
    (command, option, value)
    for command, options in NUMERIC.items()
    for option in options
    for value in ("nan", "inf", "-inf", "-1", "0")
    if not (value == "0" and option in ZERO_OK)
]


@pytest.mark.parametrize(("command", "option", "value"), CASES)
def test_bad_numeric_value_is_a_clear_error(tmp_path, command, option, value):
    result = CliRunner().invoke(cli, [*base_args(command, tmp_path), option, value])
    assert result.exit_code == 2, result.output
    assert f"Error: Invalid value for '{option}'" in result.output
    assert "Traceback" not in result.output and result.exception.__class__ is SystemExit
    assert not (tmp_path / "out").exists() and not (tmp_path / "plan").exists()


def test_library_refuses_nan_memory_and_zero_batch():
    with pytest.raises(ConfigError, match="memory_gib=nan must be a finite number > 0"):
        Layout(dp=2, memory_gib=float("nan"))
    with pytest.raises(ConfigError, match="global_batch_tokens=0 must be >= 1"):
        compare_strategies(
            [],
            Layout(dp=2),
            resolve_cost_model("llama-8b", "h100", "selective", None),
            strategies=["bfd"],
            global_batch_tokens=0,
        )


@pytest.mark.parametrize(
    ("command", "option", "value", "message"),
    [
        ("simulate", "--json", "missing/x.json", "missing/x.json: the folder missing does not exist"),
        ("simulate", "--gantt", "missing/g.png", "missing/g.png: the folder missing does not exist"),
        ("simulate", "--gantt", "g.txt", "g.txt: not an image file name; end it in one of "),
        ("simulate", "--json", ".", ". is a folder, not a file"),
        ("plan", "--json", "missing/p.json", "missing/p.json: the folder missing does not exist"),
        ("stats", "--json", "missing/s.json", "missing/s.json: the folder missing does not exist"),
        ("profile", "--output", "missing/p.json", "missing/p.json: the folder missing does not exist"),
        ("stats", "--plots", "lengths.txt", "Directory 'lengths.txt' is a file."),
        ("stats", "--plots", "missing/deeper", "the folder missing does not exist"),
    ],
)  # fmt: skip
def test_an_output_path_that_cannot_be_written_is_refused_before_any_work(
    tmp_path, monkeypatch, command, option, value, message
):
    """Each output file or folder is checked when the options are read: an unwritable one
    used to end in a traceback after the work (and, for `plan`, after its shards)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lengths.txt").write_text("100\n200\n")
    source = {"stats": [str(tmp_path)], "profile": ["--model", "llama-1b"]}.get(
        command, ["--lengths", "lengths.txt"]
    )
    layout = [part for item in GOOD.items() for part in item]
    extra = [*layout, "-o", "out"] if command == "plan" else []
    result = CliRunner().invoke(cli, [command, *source, *extra, option, value])
    assert result.exit_code == 2, result.output
    assert f"Error: Invalid value for '{option}'" in result.output
    assert message in result.output
    assert not (tmp_path / "out").exists() and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("lengths.txt/x", "Error: lengths.txt/x: lengths.txt is a file, not a folder"),
        ("lengths.txt/x/y", "Error: lengths.txt/x/y: lengths.txt is a file, not a folder"),
        ("gone", "Error: gone: gone is a link to missing/out, which does not exist"),
        ("gone/x", "Error: gone/x: gone is a link to missing/out, which does not exist"),
    ],
)
def test_plan_output_that_cannot_be_a_folder_is_refused_before_the_solve(
    tmp_path, monkeypatch, output, message
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lengths.txt").write_text("100\n200\n")
    (tmp_path / "gone").symlink_to("missing/out")  # a dangling link
    layout = [part for item in GOOD.items() for part in item]
    result = CliRunner().invoke(cli, ["plan", "--lengths", "lengths.txt", *layout, "-o", output])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_plan_output_the_system_refuses_to_make_is_a_clear_error(tmp_path, monkeypatch):
    from pathlib import Path

    def refused(*_args, **_kwargs):
        raise OSError(30, "Read-only file system")

    (tmp_path / "lengths.txt").write_text("100\n200\n")
    monkeypatch.setattr(Path, "mkdir", refused)
    layout = [part for item in GOOD.items() for part in item]
    out = str(tmp_path / "p")
    result = CliRunner().invoke(
        cli, ["plan", "--lengths", str(tmp_path / "lengths.txt"), *layout, "-o", out]
    )
    assert result.exit_code == 2, result.output
    assert f"Error: {out}: cannot make the folder (Read-only file system)" in result.output


def test_a_write_the_disk_refuses_is_a_clear_error(tmp_path, monkeypatch):
    from pathlib import Path

    from slimdata.cli.options import write_json
    from slimdata.errors import InputError

    def full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(InputError, match=r"x.json: cannot write it \(No space left on device\)$"):
        write_json({"a": 1}, str(tmp_path / "x.json"))


def test_more_pipeline_stages_than_layers_is_refused(tmp_path):
    """llama-8b has 32 layers: 32 stages simulate (one layer each), 33 are refused at once
    (a 64-stage slimpack search used to run for minutes)."""
    (tmp_path / "l.txt").write_text("100\n200\n")
    args = ["simulate", "--lengths", str(tmp_path / "l.txt"), "--dp", "1", "--strategies", "bfd"]
    result = CliRunner().invoke(cli, [*args, "--pp", "33"])
    assert result.exit_code == 2, result.output
    assert result.output == (
        "Error: pp=33: more pipeline stages than the model's 32 layers (each stage holds at "
        "least one)\n"
    )
    assert CliRunner().invoke(cli, [*args, "--pp", "32"]).exit_code == 0


@pytest.mark.parametrize("recompute", ["full", "none"])
def test_a_strategy_that_fits_nowhere_is_told_only_what_would_help(tmp_path, recompute):
    """The advice names --recompute full only when the cost model does not assume it."""
    (tmp_path / "l.txt").write_text("4000\n3000\n")
    args = ["simulate", "--lengths", str(tmp_path / "l.txt"), "--dp", "2", "--strategies"]
    args += ["bfd", "--memory-gib", "0.01", "--recompute", recompute]
    result = CliRunner().invoke(cli, args)
    # the table is printed, then the run ends as an error: no strategy fits
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[-1].startswith("Error: no strategy fits --memory-gib 0.01 ")
    (line,) = [x for x in result.output.splitlines() if x.startswith("bfd")]
    advice = "raise --memory-gib, use --recompute full, a larger --pp or a smaller --context"
    if recompute == "full":
        advice = advice.replace("use --recompute full, ", "")
    assert "failed: does not fit --memory-gib 0.01 even with static CP 2 (" in line
    assert line.endswith(f"); {advice}")


def test_a_derived_budget_is_named_by_its_value_not_as_an_option_not_given(tmp_path):
    """Without --memory-gib the budget is 90% of the device minus model states (12.17 GiB for
    llama-8b under fsdp on 2 H100s): messages name it so, never as `--memory-gib 12.1719`."""
    (tmp_path / "l.txt").write_text("500000\n300\n")
    args = ["simulate", "--lengths", str(tmp_path / "l.txt"), "--dp", "2", "--strategies"]
    args += ["bfd", "--context", "524288", "--parallelism", "fsdp"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    budget = "the default 12.17 GiB budget (90% of device memory minus model states)"
    (row,) = [x for x in result.output.splitlines() if x.startswith("bfd")]
    assert row.split(None, 1)[1].startswith(f"failed: does not fit {budget} even with static CP 2")
    assert result.output.splitlines()[-1] == (
        f"Error: no strategy fits {budget} per device (each failed or went over it, above): "
        "raise --memory-gib, use more devices or a larger --pp, or lower --context"
    )
    assert "--memory-gib 12" not in result.output


@pytest.mark.parametrize(
    ("gbt", "warning"),
    [
        ("1", "steps hold 4,000 tokens on average, not the 1 of --global-batch-tokens (a step takes whole documents, at least one)"),
        ("100000", "steps hold 7,000 tokens on average, not the 100,000 of --global-batch-tokens (the documents hold 7,000 tokens in all)"),
        ("7000", None),
    ],
)  # fmt: skip
def test_simulate_says_when_steps_do_not_hold_the_batch_asked_for(tmp_path, gbt, warning):
    (tmp_path / "l.txt").write_text("4000\n3000\n")
    args = ["simulate", "--lengths", str(tmp_path / "l.txt"), "--dp", "2", "--strategies", "bfd"]
    result = CliRunner().invoke(cli, [*args, "--global-batch-tokens", gbt, "--memory-gib", "40"])
    assert result.exit_code == 0, result.output
    found = [x for x in result.output.splitlines() if x.startswith("warning: steps hold")]
    assert found == ([f"warning: {warning}"] if warning else [])


def test_interleaving_one_stage_is_simulated_as_1f1b_and_said(tmp_path):
    (tmp_path / "l.txt").write_text("4000\n3000\n")
    args = ["simulate", "--lengths", str(tmp_path / "l.txt"), "--dp", "2", "--strategies", "bfd"]
    args += ["--global-batch-tokens", "7000", "--memory-gib", "40", "--schedule", "interleaved"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    (row,) = [x for x in result.output.splitlines() if x.startswith("bfd")]
    assert row.split()[2] == "1f1b"
    assert "warning: --schedule interleaved needs --pp > 1; simulated 1f1b" in result.output


@pytest.mark.parametrize(
    ("extra", "note"),
    [
        (["--schedule", "interleaved"], "interleaved"),
        (["--schedule", "1f1b"], "1f1b"),
        (["--schedule", "interleaved", "--baseline-config", "smallest"], None),
        (["--schedule", "interleaved", "--baseline-config", "cp=1"], None),
        ([], None),
    ],
)
def test_a_schedule_the_best_baseline_search_chooses_itself_is_noted(tmp_path, extra, note):
    """With --pp > 1, --baseline-config best searches 1F1B and interleaved per strategy: a
    --schedule given there is not imposed, and standard error says so."""
    (tmp_path / "l.txt").write_text("4000\n3000\n")
    args = ["simulate", "--lengths", str(tmp_path / "l.txt"), "--dp", "2", "--pp", "2"]
    args += ["--strategies", "bfd", "--memory-gib", "40", "--context", "8192", *extra]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        "note: --baseline-config best chooses each strategy's pipeline schedule (column sched), "
        f"so --schedule {note} is not imposed; use --baseline-config smallest or cp=N to run "
        f"{note}\n"
        if note
        else ""
    )


def test_a_budget_below_a_tenth_of_a_gib_is_printed_as_given_and_nothing_fitting_fails(tmp_path):
    """--memory-gib 0.001 is printed as 0.001 GiB, never 0.0; when every strategy fails or
    goes over it, the table is still printed and the run exits 2 with one error line."""
    (tmp_path / "l.txt").write_text("5000\n300\n200\n")
    args = ["simulate", "--lengths", str(tmp_path / "l.txt"), "--dp", "2"]
    result = CliRunner().invoke(cli, [*args, "--memory-gib", "0.001"])
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert "memory budget 0.001 GiB per device: --memory-gib" in lines
    assert lines[-1] == (
        "Error: no strategy fits --memory-gib 0.001 per device (each failed or went over "
        "it, above): raise --memory-gib, use more devices or a larger --pp, or lower --context"
    )
    assert "0.0 GiB" not in result.output and "Traceback" not in result.output
    assert CliRunner().invoke(cli, [*args, "--memory-gib", "60"]).exit_code == 0


@pytest.mark.parametrize(
    ("option", "text", "error"),
    [
        ("--model", '{"layers": 0}', "model config has no ['hidden', 'heads', 'kv_heads', 'ffn', 'vocab']; it needs ['layers', 'hidden', 'heads', 'kv_heads', 'ffn', 'vocab']"),
        ("--model", "[1, 2]", "model config {path}: a JSON object of ['layers', 'hidden', 'heads', 'kv_heads', 'ffn', 'vocab'] or a Hugging Face config.json, not list"),
        ("--model", '{"num_hidden_layers": 2}', "Hugging Face config of 'bad' has no ['hidden_size', 'num_attention_heads', 'intermediate_size', 'vocab_size']"),
        ("--cost-profile", "[]", "{path} is not a slimdata cost profile (missing 'slimdata_cost_profile': 1)"),
    ],
)  # fmt: skip
def test_a_model_or_cost_file_of_the_wrong_shape_is_one_error_line(tmp_path, option, text, error):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    (tmp_path / "l.txt").write_text("100\n200\n")
    args = ["simulate", "--lengths", str(tmp_path / "l.txt"), "--dp", "2", option, str(bad)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert result.output == f"Error: {error.format(path=bad)}\n"


@pytest.mark.parametrize(
    ("device", "error"),
    [
        ("tpu", "--torch-device 'tpu' is not a torch device (cpu, cuda, cuda:1)"),
        ("mps", "--torch-device mps: profile measures on cpu or cuda"),
    ],
)
def test_profile_refuses_a_device_it_cannot_measure_on(tmp_path, device, error):
    args = ["profile", "--model", "llama-1b", "--torch-device", device, "-o", str(tmp_path / "p")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert result.output == f"Error: {error}\n"
    assert not (tmp_path / "p").exists()


def test_a_baseline_cp_that_does_not_divide_dp_is_refused_before_simulating(tmp_path):
    (tmp_path / "l.txt").write_text("100\n200\n")
    args = ["simulate", "--lengths", str(tmp_path / "l.txt"), "--dp", "8"]
    result = CliRunner().invoke(cli, [*args, "--baseline-config", "cp=16"])
    assert result.exit_code == 2, result.output
    assert result.output == (
        "Error: --baseline-config cp=16 does not divide --dp 8: static CP takes its ranks out "
        "of the data-parallel ones\n"
    )


def test_strategies_naming_none_is_said_so(tmp_path):
    (tmp_path / "l.txt").write_text("100\n200\n")
    args = ["simulate", "--lengths", str(tmp_path / "l.txt"), "--dp", "2", "--memory-gib", "20"]
    result = CliRunner().invoke(cli, [*args, "--strategies", " , "])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error: --strategies ' , ': names no strategy; use 'all' or ")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--slice-tokens", "abc", "'abc': not a comma list of integers (e.g. 32,64,128)"),
        ("--prefixes", "abc", "'abc': not a comma list of integers"),
        ("--pack-sizes", "1.5", "'1.5': not a comma list of integers"),
        ("--slice-tokens", "32,", "'32,': an empty item (write e.g. 32,64,128)"),
        ("--slice-tokens", "1000000000", "'1000000000': each must be from 1 to 1,048,576"),
        ("--prefixes", "-1", "'-1': each must be from 0 to 1,048,576"),
        ("--pack-sizes", "0", "'0': each must be from 1 to 1,048,576"),
        ("--slice-tokens", "32,32", "'32,32': a size is listed twice"),
    ],
)
def test_profile_grid_lists_are_checked_before_torch_loads(tmp_path, option, value, message):
    args = ["profile", "--model", "llama-1b", "-o", str(tmp_path / "p.json"), option, value]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert f"Error: Invalid value for '{option}': {message}" in result.output
    assert not (tmp_path / "p.json").exists() and "Traceback" not in result.output


@pytest.mark.parametrize("parallelism", ["fsdp", "ddp"])
def test_fsdp_memory_refusal_does_not_advise_the_recompute_fsdp_refuses(tmp_path, parallelism):
    (tmp_path / "l.txt").write_text("131072\n1000\n")
    args = ["plan", "--lengths", str(tmp_path / "l.txt"), "--nodes", "1", "--ranks-per-node", "2",
            "--global-batch-tokens", "132072", "--context", "131072", "--memory-gib", "20",
            "--parallelism", parallelism, "--recompute", "none", "--cp", "1", "-o", str(tmp_path / "p")]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "raise --memory-gib, or use more devices (--nodes, --ranks-per-node)" in result.output
    advised = "or use --recompute full (this cost model assumes none recompute)" in result.output
    assert advised == (parallelism == "ddp")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["simulate", "--dp", "99999999999999999999"], "Invalid value for '--dp'"),
        (["simulate", "--dp", "131073"], "131073 is not in the range 1<=x<=131072"),
        (["simulate", "--ranks-per-node", "131073"], "Invalid value for '--ranks-per-node'"),
        (["plan", "--nodes", "131073"], "Invalid value for '--nodes'"),
        (["plan", "--nodes", "1024", "--ranks-per-node", "1024"],
         "--nodes 1024 x --ranks-per-node 1024 = 1,048,576 ranks, more than 131,072"),
    ],
)  # fmt: skip
def test_more_ranks_than_any_cluster_is_refused_at_once(tmp_path, args, message):
    """A typo of many digits used to run until memory ran out."""
    (tmp_path / "l.txt").write_text("100\n200\n")
    extra = ["--lengths", str(tmp_path / "l.txt")]
    if args[0] == "plan":
        rest = {"--nodes": "1", "--ranks-per-node": "2", "--global-batch-tokens": "4096"}
        rest.update(dict(zip(args[1::2], args[2::2], strict=True)))
        args = ["plan", *[p for kv in rest.items() for p in kv], "-o", str(tmp_path / "p")]
    result = CliRunner().invoke(cli, [*args, *extra])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "p").exists()


def test_a_layout_of_more_ranks_than_any_cluster_is_refused():
    with pytest.raises(ConfigError, match="dp=131073, ranks_per_node=8: at most 131,072 each"):
        Layout(dp=131073)


@pytest.mark.parametrize(
    ("grid", "refused"),
    [
        (["--slice-tokens", "64", "--prefixes", "0"], True),  # one point per pack size
        (["--slice-tokens", "64", "--prefixes", "0,256,1024"], True),  # per token = per slice
        (["--slice-tokens", "64,128", "--prefixes", "0"], True),  # pairs ~ tokens on 2 lengths
        (["--slice-tokens", "64,128", "--prefixes", "0,256"], False),
        (["--slice-tokens", "32,64,128", "--prefixes", "0"], False),
    ],
)
def test_profile_grid_that_cannot_tell_the_terms_apart_is_refused(tmp_path, grid, refused):
    from slimdata.cost.profiling import ProfileConfig

    values = [tuple(int(x) for x in v.split(",")) for v in grid[1::2]]
    if not refused:  # the grid is accepted (not run here: a profile takes minutes on a CPU)
        ProfileConfig(slice_tokens=values[0], prefixes=values[1])
        return
    args = ["profile", "--model", "llama-1b", "-o", str(tmp_path / "p.json"), *grid]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "cannot tell the cost per token, per causal pair and per slice apart" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "p.json").exists()


def test_profile_grid_cut_by_max_point_tokens_names_it():
    # 3 slice lengths x 2 prefixes, one slice a pack, tell the terms apart; within
    # max_point_tokens=1,000 only the two slices without a prefix are left (128 and 512
    # tokens), which do not: the advice is about max_point_tokens, not the grid's lengths
    from slimdata.cost.profiling import ProfileConfig, profile_points

    with pytest.raises(ConfigError) as refused:
        ProfileConfig(
            slice_tokens=(128, 512, 2048),
            prefixes=(0, 4096),
            pack_sizes=(1,),
            max_point_tokens=1000,
        )
    assert str(refused.value) == (
        "the profile grid (slice_tokens=(128, 512, 2048), prefixes=(0, 4096), "
        "pack_sizes=(1,), 2 point(s) of 6 within max_point_tokens=1000) cannot tell the cost "
        "per token, per causal pair and per slice apart: the points above max_point_tokens "
        "are left out; raise it, or give smaller slice lengths or prefixes"
    )
    whole = ProfileConfig(slice_tokens=(128, 512, 2048), prefixes=(0, 4096), pack_sizes=(1,))
    assert len(profile_points(whole)) == 6  # accepted


def test_the_default_budget_names_the_device_preset_it_comes_from(tmp_path):
    # a cost profile measured on a CPU still takes its default budget from --cost-device
    # (h100 unless given): the account says so
    (tmp_path / "l.txt").write_text("4000\n3000\n9000\n")
    args = ["plan", "--lengths", str(tmp_path / "l.txt"), "--nodes", "1", "--global-batch-tokens"]
    args += ["16000", "-o", str(tmp_path / "p")]
    small = CliRunner().invoke(cli, [*args, "--ranks-per-node", "2"])
    assert (small.exit_code, small.output) == (
        2,
        "Error: model states need 74.8 GiB per device, more than 90% of the 80 GiB of "
        "--cost-device h100 (zero1, dp=2, pp=1): use --parallelism fsdp, or give --memory-gib\n",
    )
    a100 = CliRunner().invoke(cli, [*args, "--ranks-per-node", "8", "--cost-device", "a100"])
    assert a100.exit_code == 0, a100.output
    # zero1 over 8 ranks: 4 + 12 / 8 bytes for each of 8.03B parameters = 41.1 GiB; 72 - 41.1
    assert (
        "memory budget 30.9 GiB per device: 90% of the 80 GiB of --cost-device a100 minus "
        "41.1 GiB of model states" in a100.output
    )

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
    assert f"Error: Invalid value for '{option}': " in result.output
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

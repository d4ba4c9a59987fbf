"""One CLI vocabulary: the same option name, meaning and default for the same concept in every
command; the former names keep working with a warning; every command's --help shows an example."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from slimdata.cli import COMMANDS, cli

LENGTHS = "\n".join(str(300 + 37 * i % 900) for i in range(120)) + "\n"
SIM = ["--model", "llama-1b", "--context", "4096", "--dp", "2", "--strategies", "bfd"]


@pytest.fixture
def lengths(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text(LENGTHS)
    return str(path)


def _run(args):
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    return res


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_help_has_an_example(command):
    text = _run([command, "--help"]).output
    assert "Example" in text and f"slimdata {command} " in text


def test_cost_device_is_one_option_and_device_its_former_name(lengths, tmp_path):
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    _run(["simulate", "--lengths", lengths, *SIM, "--cost-device", "a100", "--json", str(new)])
    res = _run(["simulate", "--lengths", lengths, *SIM, "--device", "a100", "--json", str(old)])
    assert "--device is now --cost-device" in res.output
    a, b = json.loads(new.read_text()), json.loads(old.read_text())
    assert a["config"]["device"] == b["config"]["device"] == "a100"
    assert a["results"]["bfd"]["step_time"] == b["results"]["bfd"]["step_time"]
    assert "--cost-device" in _run(["plan", "--help"]).output
    assert "--device " not in _run(["simulate", "--help"]).output
    assert "--torch-device" in _run(["profile", "--help"]).output


def test_json_goes_to_a_file_or_to_stdout_alone(lengths, tmp_path):
    out = tmp_path / "r.json"
    res = _run(["simulate", "--lengths", lengths, *SIM, "--json", str(out)])
    assert "bfd" in res.output  # the table, and the file
    to_file = json.loads(out.read_text())
    res = _run(["simulate", "--lengths", lengths, *SIM, "--json"])
    step_time = to_file["results"]["bfd"]["step_time"]
    assert json.loads(res.output)["results"]["bfd"]["step_time"] == step_time  # JSON alone
    res = _run(["simulate", "--lengths", lengths, *SIM, "--json", "-"])
    assert json.loads(res.output)["results"]["bfd"]["step_time"] == step_time


def test_plan_output_and_its_former_name(lengths, tmp_path):
    layout = ["--nodes", "1", "--ranks-per-node", "2", "--global-batch-tokens", "16384"]
    layout += ["--context", "4096", "--model", "llama-1b", "--lengths", lengths]
    res = _run(["plan", *layout, "--output", str(tmp_path / "a"), "--json"])
    summary = json.loads(res.output)
    assert summary["steps"] >= 1 and (tmp_path / "a" / "index.json").is_file()
    res = _run(["plan", *layout, "--out", str(tmp_path / "b")])
    assert "--out is now --output" in res.output and (tmp_path / "b" / "index.json").is_file()
    res = CliRunner().invoke(cli, ["plan", *layout])
    assert res.exit_code == 2 and "--output" in res.output
    both = ["--out", str(tmp_path / "c"), "--output", str(tmp_path / "d")]
    res = CliRunner().invoke(cli, ["plan", *layout, *both])
    assert res.exit_code == 2 and "--out and --output both given; give --output only" in res.output
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()
    bare = [a for a in layout if a != lengths and a != "--lengths"]
    res = CliRunner().invoke(cli, ["plan", *bare, "-o", str(tmp_path / "e")])
    assert res.exit_code == 2, res.output
    assert "give SHARDS (a `slimdata build` output) or --lengths FILE, one of them" in res.output


def test_simulate_takes_shards_as_an_argument_like_plan_and_stats(tmp_path):
    res = CliRunner().invoke(cli, ["simulate", str(tmp_path / "missing")])
    assert res.exit_code == 2 and "does not exist" in res.output
    res = CliRunner().invoke(cli, ["simulate", "--model", "llama-1b"])
    assert res.exit_code == 2 and "SHARDS" in res.output and "--lengths" in res.output

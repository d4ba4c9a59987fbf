"""Untrusted files (lengths files, index.json) are validated before use, at bounded cost:
a clear `Error: ...` (exit 2), never a traceback or an allocation a file asks for (issue 18)."""

from __future__ import annotations

import gzip

import pytest
from click.testing import CliRunner

from slimdata.cli import cli
from slimdata.docsource import load_lengths
from slimdata.errors import ConfigError, InputError
from slimdata.slicing import MAX_DOCUMENT_TOKENS, check_length, slice_cuts

LAYOUT = ["--nodes", "1", "--ranks-per-node", "2", "--global-batch-tokens", "4096"]
LAYOUT += ["--memory-gib", "40"]


def plan_cli(tmp_path, *args):
    return CliRunner().invoke(cli, ["plan", *args, *LAYOUT, "-o", str(tmp_path / "plan")])


def test_length_of_ten_to_the_fifteen_is_refused_before_allocation(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("100\n1000000000000000\n")
    result = plan_cli(tmp_path, "--lengths", str(path))
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"Error: {path}:2: length 1000000000000000 exceeds the maximum of 2147483647 tokens "
        "per document (int32 attention offsets); split the document\n"
    )
    assert not (tmp_path / "plan").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 1e400]", "entry 2: length inf is not an integer"),
        ("[1, 2.5]", "entry 2: length 2.5 is not an integer"),
        ('[1, "3"]', "entry 2: length '3' is not an integer"),
        ("[1, true]", "entry 2: length True is not an integer"),
        ("[1, [2]]", "entry 2: length [2] is not an integer"),
        ("[5, 10000000000000000000000]", "entry 2: length 10000000000000000000000 exceeds"),
        ("[3, -4]", "entry 2: length -4 is negative"),
        ("[3, 0]", "entry 2: length is 0; lengths must be positive"),
        ('{"a": 1}', "1: '{\"a\": 1}' is not an integer length"),
        ("9" * 5000, "is not an integer length"),
        ("[" * 100_000, "invalid JSON list"),
        ("12\nx\n", "2: 'x' is not an integer length"),
        ("\n\n", "no lengths found"),
    ],
)
def test_bad_lengths_files_name_the_entry(tmp_path, content, message):
    path = tmp_path / "lengths.txt"
    path.write_text(content)
    with pytest.raises(InputError) as info:
        load_lengths(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_truncated_gzip_lengths_file_is_a_clear_error(tmp_path):
    path = tmp_path / "lengths.gz"
    path.write_bytes(gzip.compress(b"1\n2\n3\n" * 1000)[:40])
    with pytest.raises(InputError, match="cannot read lengths file"):
        load_lengths(path)


def test_largest_length_is_accepted_and_one_more_is_not():
    assert check_length(MAX_DOCUMENT_TOKENS) == MAX_DOCUMENT_TOKENS
    with pytest.raises(ConfigError, match="exceeds the maximum of 2147483647"):
        slice_cuts(MAX_DOCUMENT_TOKENS + 1, 128)

"""A document shard damaged after its build: ``slimdata plan`` reads every sample it plans
and refuses one the shard reader cannot decode, or whose token ids its tokenizer never
writes, with one clear line (exit code 2), never a traceback or a plan of bad tokens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner
from streaming import LocalDataset

from slimdata.cli import cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _build(tmp_path: Path) -> Path:
    out = tmp_path / "build"
    args = ["build", str(FIXTURES / "docs.jsonl"), "-o", str(out), "--tokenizer",
            str(FIXTURES / "tiny_tokenizer.json"), "--slice-tokens", "128"]  # fmt: skip
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    return out


def _plan(build: Path, tmp_path: Path):
    args = ["plan", str(build), "--nodes", "1", "--ranks-per-node", "2", "--context", "1024",
            "--global-batch-tokens", "2048", "--memory-gib", "40", "-o", str(tmp_path / "p")]  # fmt: skip
    return CliRunner().invoke(cli, args)


def test_a_shard_whose_header_is_overwritten_is_a_clear_error(tmp_path):
    build = _build(tmp_path)
    shard = sorted(build.rglob("*.mds"))[0]
    data = bytearray(shard.read_bytes())
    data[:64] = b"\xff" * 64  # the sample count and offsets; the size is unchanged
    shard.write_bytes(bytes(data))
    res = _plan(build, tmp_path)
    assert res.exit_code == 2, res.output
    assert "the shard reader cannot decode it" in res.output
    assert "rebuild it with `slimdata build`" in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_a_token_id_outside_the_vocabulary_is_refused(tmp_path):
    build = _build(tmp_path)
    vocab = json.loads((build / "slimdata.json").read_text())["tokenizer"]["vocab_size"]
    shard = sorted(build.rglob("*.mds"))[0]
    tokens = np.asarray(LocalDataset(local=str(build))[0]["tokens"])
    data = shard.read_bytes()
    at = data.find(tokens.tobytes())
    assert at >= 0 and data.count(tokens.tobytes()) == 1
    bad = np.array([0xFFFFFFFF], dtype=tokens.dtype).tobytes()  # the same byte count
    shard.write_bytes(data[:at] + bad + data[at + len(bad) :])
    res = _plan(build, tmp_path)
    assert res.exit_code == 2, res.output
    assert f"token id {0xFFFFFFFF} is not below the vocabulary size {vocab}" in res.output
    assert not (tmp_path / "p").exists() or not list((tmp_path / "p").rglob("*.mds"))


def test_an_index_whose_column_names_were_edited_is_refused(tmp_path):
    build = _build(tmp_path)
    index = json.loads((build / "index.json").read_text())
    names = index["shards"][0]["column_names"]
    names[names.index("tokens")] = "toks"
    (build / "index.json").write_text(json.dumps(index))
    res = _plan(build, tmp_path)
    assert res.exit_code == 2, res.output
    assert ": no column 'tokens' (the shard's index.json names" in res.output
    assert "'toks'" in res.output and "Traceback" not in res.output

"""CLI (CliRunner) for build and stats, pipelines, default corpus planning, stats values."""

from __future__ import annotations

import json

import numpy as np
import pytest
from build_helpers import FIXTURES, TINY_TOKENIZER, read_shards
from click.testing import CliRunner

from pipelines import PIPELINES
from slimdata.cli import cli
from slimdata.corpus import DEFAULT_CORPUS_SOURCE, stdlib_root
from slimdata.errors import ConfigError
from slimdata.ingest import BuildConfig, plan_build
from slimdata.stats import shard_stats


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "out"
    result = CliRunner().invoke(
        cli,
        [
            "build",
            str(FIXTURES / "docs.jsonl"),
            str(FIXTURES / "text"),
            "-o",
            str(out),
            "--tokenizer",
            TINY_TOKENIZER,
            "--slice-tokens",
            "256",
            "--model",
            "llama-1b",
            "--compression",
            "zstd",
            "--quiet",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    return out, json.loads(result.output)


def test_cli_build_options_reach_the_output(built):
    out, sidecar = built
    assert (
        sidecar["slice_tokens"] == 256
        and sidecar["model"] == "llama-1b"
        and sidecar["compression"] == "zstd"
    )
    # --recompute auto (the default) at the default 128K --context: full, as plan/simulate
    assert sidecar["cost_model"]["label"] == "llama-1b@h100/full"
    samples, _ = read_shards(out)
    assert len(samples) == sidecar["counts"]["documents"] == 8
    assert all(np.all(s["slices"][1:-1] % 256 == 0) for s in samples)


def test_stats_values_by_hand(built):
    out, _ = built
    stats = shard_stats(out)
    lengths = np.array(sorted(s["length"] for s in read_shards(out)[0]), dtype=float)
    assert stats["documents"] == 8 and stats["tokens"] == lengths.sum()
    assert stats["length"]["max"] == lengths.max() and stats["length"]["p50"] == np.percentile(
        lengths, 50
    )
    top = stats["tail"]["top_1pct"]  # one document: the longest
    assert top["documents"] == 1
    assert top["token_share"] == pytest.approx(lengths[-1] / lengths.sum())
    pairs = lengths * (lengths + 1) / 2
    assert top["attention_share"] == pytest.approx(pairs[-1] / pairs.sum())
    assert top["attention_share"] > top["token_share"]  # the tail's outsized compute


def test_cli_stats_text_json_and_plots(built, tmp_path):
    out, _ = built
    runner = CliRunner()
    text = runner.invoke(cli, ["stats", str(out)])
    assert text.exit_code == 0 and "documents    8" in text.output and "attention%" in text.output
    res = runner.invoke(cli, ["stats", str(out), "--json", "--plots", str(tmp_path / "plots")])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["documents"] == 8 and data["quarantined"] == 0
    for name in ("lengths.png", "shares.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pipelines_are_configs_and_cli_overrides_them(tmp_path):
    assert set(PIPELINES) >= {"code", "web", "books", "stdlib"}
    assert all(isinstance(recipe(), BuildConfig) for recipe in PIPELINES.values())
    out = tmp_path / "out"
    res = CliRunner().invoke(
        cli,
        [
            "build",
            "--pipeline",
            "books",
            str(FIXTURES / "text"),
            "-o",
            str(out),
            "--tokenizer",
            TINY_TOKENIZER,
            "--quiet",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    sidecar = json.loads(res.output)
    assert sidecar["slice_tokens"] == 4096  # from the recipe
    assert sidecar["counts"]["documents"] == 2  # books keeps .txt/.md, not sub/beta.py
    res = CliRunner().invoke(
        cli,
        [
            "build",
            "--pipeline",
            "code",
            str(FIXTURES / "text"),
            "-o",
            str(tmp_path / "c"),
            "--tokenizer",
            TINY_TOKENIZER,
            "--slice-tokens",
            "128",
            "--quiet",
            "--json",
        ],
    )
    assert (
        json.loads(res.output)["slice_tokens"] == 128
        and json.loads(res.output)["counts"]["documents"] == 1
    )


def test_default_corpus_is_the_stdlib_without_site_packages():
    config, tok, _, tasks, _plan = plan_build(BuildConfig())
    assert config.source == DEFAULT_CORPUS_SOURCE and tok.eos_id == 1
    files = [f for t in tasks for f in t.files]
    assert len(files) > 500 and "json/decoder.py" in files
    assert not any(
        "site-packages" in f or f.endswith(".pyc") or not f.endswith(".py") for f in files
    )
    assert {t.path for t in tasks} == {str(stdlib_root().resolve())}


def test_config_validation_names_the_fix():
    with pytest.raises(ConfigError, match="multiple of 128"):
        BuildConfig(slice_tokens=1000)
    with pytest.raises(ConfigError, match="truncate=1"):
        BuildConfig(truncate=1)
    with pytest.raises(ConfigError, match="64mb"):
        BuildConfig(size_limit="lots")


def test_interrupted_build_says_how_to_resume(tmp_path, monkeypatch):
    # Ctrl-C: click alone prints "Aborted!"; the finished tasks are kept for --resume
    import slimdata.ingest

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(slimdata.ingest, "build", interrupted)
    (tmp_path / "a.txt").write_text("text")
    args = ["build", str(tmp_path / "a.txt"), "-o", str(tmp_path / "out"), "--quiet"]
    res = CliRunner().invoke(cli, [*args, "--tokenizer", TINY_TOKENIZER])
    assert res.exit_code == 130
    assert res.output == (
        f"interrupted: the finished tasks in {tmp_path / 'out'} are kept; rerun the same "
        "command with --resume to continue\n"
    )


def test_build_logs_plain_progress_lines_when_stderr_is_no_terminal(tmp_path, monkeypatch):
    """A build whose standard error is a file (CliRunner's, like a job's log) writes one plain
    progress line per update, no tqdm bar and no carriage return; the last one at 100%."""
    import slimdata.ingest.run as run

    monkeypatch.setattr(run, "LOG_PROGRESS_SECONDS", 0.0)  # a line for every finished task
    out = tmp_path / "out"
    args = ["build", str(FIXTURES / "docs.jsonl"), str(FIXTURES / "text"), "-o", str(out)]
    result = CliRunner().invoke(cli, [*args, "--tokenizer", TINY_TOKENIZER, "--workers", "1"])
    assert result.exit_code == 0, result.output
    sidecar = json.loads((out / "slimdata.json").read_text())
    lines = result.stderr.splitlines()
    assert "\r" not in result.stderr and len(lines) == sidecar["counts"]["tasks"] >= 2
    assert all(line.startswith("build: ") for line in lines)
    documents, tokens = sidecar["counts"]["documents"], sidecar["counts"]["tokens"]
    assert lines[-1].startswith("build: 100% of ")
    assert f"B read, {documents} documents, {tokens:,} tokens, " in lines[-1]


def test_gz_compression_warns_that_builds_are_not_byte_identical(tmp_path):
    src = tmp_path / "txt"
    src.mkdir()
    (src / "a.txt").write_text("plain text\n")
    args = ["build", str(src), "--tokenizer", TINY_TOKENIZER, "--quiet", "-o"]
    warning = (
        "warning: --compression gz shards are not byte-identical from build to build (gzip "
        "stamps the time); zstd or br are"
    )
    gz = CliRunner().invoke(cli, [*args, str(tmp_path / "gz"), "--compression", "gz:6"])
    assert gz.exit_code == 0, gz.output
    assert gz.stderr.splitlines() == [warning]
    zstd = CliRunner().invoke(cli, [*args, str(tmp_path / "zstd"), "--compression", "zstd"])
    assert zstd.exit_code == 0 and zstd.stderr == ""

"""Parallel builds: workers prepare tasks without the writer stack (no streaming, no torch)
while the parent imports it, and the bytes equal a serial build."""

from __future__ import annotations

import subprocess
import sys

import pytest
from build_helpers import TINY_TOKENIZER, cli_build_cmd, make_text_corpus, tiny_config, tree_bytes

from slimdata.errors import ConfigError
from slimdata.ingest import BuildConfig, build
from slimdata.ingest.config import COMPRESSIONS, HASHES
from slimdata.ingest.run import plan_build
from slimdata.ingest.task import Prepared, TaskJob, collect_task, write_task
from slimdata.readers import Rejected


def test_option_tables_equal_streaming_registries():
    from streaming.base.compression import get_compressions
    from streaming.base.hashing import get_hashes

    assert set(get_compressions()) == COMPRESSIONS and len(COMPRESSIONS) == 58
    assert set(get_hashes()) == HASHES and len(HASHES) == 17


def test_unknown_writer_options_are_refused_before_any_work(tmp_path):
    corpus = make_text_corpus(tmp_path)
    with pytest.raises(ConfigError, match="compression='zstd:23'"):
        build(tiny_config(corpus, compression="zstd:23"), tmp_path / "a")
    with pytest.raises(ConfigError, match=r"hashes \['sha2'\]"):
        build(tiny_config(corpus, hashes=("sha1", "sha2")), tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_preparing_a_task_imports_neither_streaming_nor_torch(tmp_path):
    corpus = make_text_corpus(tmp_path)
    code = f"""
import sys
from slimdata.ingest import BuildConfig
from slimdata.ingest.run import plan_build
from slimdata.ingest.task import TaskJob, collect_task
config = BuildConfig(inputs=({str(corpus)!r},), tokenizer={TINY_TOKENIZER!r}, slice_tokens=128)
config, tok, cost, tasks, plan = plan_build(config)
chunks = collect_task(TaskJob(index=0, task=tasks[0], output="unused", config=config, cost_model=cost))
assert sum(len(c) for c in chunks) == 24, chunks
bad = sorted(m for m in ("streaming", "torch", "pyarrow") if m in sys.modules)
assert not bad, bad
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_prepared_then_written_equals_serial_task(tmp_path):
    corpus = make_text_corpus(tmp_path)
    (corpus / "empty.txt").write_text("   \n")
    config, _tok, cost, tasks, _plan = plan_build(tiny_config(corpus))
    job = TaskJob(
        index=0, task=tasks[0], output=str(tmp_path / "p"), config=config, cost_model=cost
    )
    chunks = collect_task(job)
    kinds = [type(item) for chunk in chunks for item in chunk]
    assert kinds.count(Prepared) == 24 and kinds.count(Rejected) == 1
    first = next(item for chunk in chunks for item in chunk if isinstance(item, Prepared))
    assert first.sample["length"] == len(first.sample["tokens"]) == first.cuts[-1]
    assert first.sample["tokens"][-1] == 0  # EOS of the tiny tokenizer
    result = write_task(job, chunks)
    build(config, tmp_path / "serial")
    assert result.documents == 24 and result.quarantined == 1
    assert tree_bytes(tmp_path / "p" / "task-00000") == tree_bytes(
        tmp_path / "serial" / "task-00000"
    )


def test_cli_parallel_build_in_fresh_process_equals_serial(tmp_path):
    """A fresh process has not imported streaming: its workers fork first and tokenize
    while the parent imports the writer stack, then the parent writes their tasks."""
    corpus = make_text_corpus(tmp_path, files=40, seed=3)
    config = BuildConfig(
        inputs=(str(corpus),),
        tokenizer=TINY_TOKENIZER,
        slice_tokens=128,
        task_bytes=600,
        compression="zstd",
    )
    reference = build(config, tmp_path / "serial")
    assert reference.sidecar["counts"]["tasks"] >= 8
    out = tmp_path / "parallel"
    cmd = cli_build_cmd(corpus, out, "--workers", "3")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert tree_bytes(out) == tree_bytes(tmp_path / "serial")
